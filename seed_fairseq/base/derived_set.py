"""A retrieval set derived from held-out documents (every paragraph a passage, one removed
sentence a query) and written in BEIR's layout; the readers are ``retrieval_data.py``'s."""

import json
import math
import random
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from .fileio import atomic_path


def write_beir(
    folder,
    corpus: Dict[str, str],
    queries: Dict[str, str],
    qrels_by_split: Dict[str, Dict[str, Dict[str, int]]],
    titles: Optional[Dict[str, str]] = None,
) -> Path:
    """Write a BEIR folder (used for the retrieval set derived from raw text).

    Each file is written atomically; callers that need the folder as a whole to
    appear at once build it beside its final place and rename it.
    """
    folder = Path(folder)
    (folder / "qrels").mkdir(parents=True, exist_ok=True)
    with atomic_path(folder / "corpus.jsonl") as tmp, open(tmp, "w", encoding="utf-8") as f:
        for did, text in corpus.items():
            obj = {"_id": did, "title": (titles or {}).get(did, ""), "text": text}
            f.write(json.dumps(obj, ensure_ascii=False) + "\n")
    with atomic_path(folder / "queries.jsonl") as tmp, open(tmp, "w", encoding="utf-8") as f:
        for qid, text in queries.items():
            f.write(json.dumps({"_id": qid, "text": text}, ensure_ascii=False) + "\n")
    for split, qrels in qrels_by_split.items():
        with atomic_path(folder / "qrels" / f"{split}.tsv") as tmp, open(tmp, "w", encoding="utf-8") as f:
            f.write("query-id\tcorpus-id\tscore\n")
            for qid, rels in qrels.items():
                for did, rel in rels.items():
                    f.write(f"{qid}\t{did}\t{rel}\n")
    return folder


def subsample(ids: Sequence[str], fraction: float, seed: int) -> List[str]:
    """A deterministic fraction of ``ids`` (at least one), independent of their order.

    Sorting first makes the subset depend only on the set of ids and the seed,
    so few-shot runs of different models see exactly the same labels; nested
    fractions share a prefix of the same permutation (10% is inside 20%).
    """
    if not 0.0 < fraction <= 1.0:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    ordered = sorted(ids)
    random.Random(seed).shuffle(ordered)
    keep = set(ordered[: max(1, math.ceil(fraction * len(ordered)))])
    return [i for i in ids if i in keep]


# ---------------------------------------------------------------------------
# A retrieval set derived from raw text (used by examples/reproduce_small.py)
# ---------------------------------------------------------------------------


def split_sentences(paragraph: str) -> List[str]:
    return [s.strip() for s in re.split(r"(?<=[.!?])\s+", paragraph.strip()) if s.strip()]


@dataclass
class DerivedSetStats:
    documents: int = 0
    passages: int = 0
    queries: Dict[str, int] = field(default_factory=dict)


QUERY_ID = re.compile(r"q(\d+)p(\d+)")


def query_document(qid: str) -> Optional[str]:
    """The document a derived query was taken from (``"q12p3"`` -> ``"d12"``, the prefix its
    passages' ids share), or None for an id ``derive_retrieval_set`` did not write."""
    m = QUERY_ID.fullmatch(qid)
    return f"d{m.group(1)}" if m else None


def derive_retrieval_set(
    text_file, out_dir, seed: int = 1, dev_fraction: float = 0.15, test_fraction: float = 0.35, min_sentences: int = 3
) -> DerivedSetStats:
    """Sentence -> source-paragraph retrieval from a fairseq-style text file.

    Input: one paragraph per line, documents separated by blank lines.
    Corpus: every paragraph is a passage.  For every paragraph with at least
    ``min_sentences`` sentences, one sentence (chosen with ``seed``) becomes a
    query and is *removed* from its passage, so the query has to be matched by
    meaning and shared vocabulary, not by finding itself.  Queries are split by
    *document*, so no test query comes from an article seen in fine-tuning;
    other paragraphs of the same article stay in the corpus as hard negatives.
    """
    text = Path(text_file).read_text(encoding="utf-8")
    docs = [[p.strip() for p in d.splitlines() if p.strip()] for d in text.split("\n\n") if d.strip()]
    rng = random.Random(seed)
    order = list(range(len(docs)))
    rng.shuffle(order)
    n_test = max(1, round(test_fraction * len(docs)))
    n_dev = max(1, round(dev_fraction * len(docs)))
    split_of = {}
    for rank, d in enumerate(order):
        split_of[d] = "test" if rank < n_test else "dev" if rank < n_test + n_dev else "train"

    corpus: Dict[str, str] = {}
    queries: Dict[str, str] = {}
    qrels: Dict[str, Dict[str, Dict[str, int]]] = {"train": {}, "dev": {}, "test": {}}
    for d, paragraphs in enumerate(docs):
        for p, para in enumerate(paragraphs):
            pid = f"d{d}p{p}"
            sents = split_sentences(para)
            if len(sents) >= min_sentences:
                k = rng.randrange(len(sents))
                qid = f"q{d}p{p}"  # query_document() reads it back
                queries[qid] = sents[k]
                qrels[split_of[d]][qid] = {pid: 1}
                sents = sents[:k] + sents[k + 1 :]
            corpus[pid] = " ".join(sents)
    write_beir(out_dir, corpus, queries, qrels)
    return DerivedSetStats(documents=len(docs), passages=len(corpus), queries={s: len(q) for s, q in qrels.items()})
