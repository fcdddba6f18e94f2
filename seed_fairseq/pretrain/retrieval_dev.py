"""Zero-shot retrieval on a labelled dev set, scored with the model being pre-trained.

``--retrieval-dev DIR`` (a BEIR or MS MARCO folder, ``retrieval_data.py``): at every
validation the current model's representations of the dev queries and documents
(``model.sentence_embedding``: pooled as ``--bottleneck-pooling``, [CLS] by default, unit
vectors with ``--retrieval-similarity cosine``), exact search by inner product, nDCG@10,
MRR@10 and recall@100 with ``ir_measures``.  This is what ``examples/retrieval/evaluate.py``
computes for the exported model (a sentence-transformers model with that pooling and
similarity, the exact ``flat`` index, texts cut at the model's length), so a checkpoint kept
for its ``dev_ndcg10`` is the one whose export retrieves best -- on the subset below.

The folder is read and tokenised once (``load_dev_set``, at task setup) with the data
folder's own tokenizer (``vocabulary/text_ids.py``), cut to ``--tokens-per-sample``.  To
keep validation cheap a deterministic subset is scored: at most ``max_queries`` judged
queries (a seeded sample), every document judged for them, and other documents of the
corpus (a seeded sample) up to ``max_docs``.  A smaller corpus than the real one makes
the numbers higher than a full evaluation's; they compare checkpoints of one run (and the
start), not other benchmarks.
"""

import hashlib
import random
from dataclasses import dataclass
from typing import Callable, Dict, List, Sequence, Tuple

import torch
from fairseq import metrics

from ..base.retrieval_data import RetrievalData
from ..base.vocabulary.text_ids import TextIds
from . import diagnostics

TOP_K = 100  # the run's depth: recall@100 needs 100, nDCG@10 and MRR@10 read the top 10
SEED = 0  # the subset's sample: the same for every run on the same folder
PREFIX = diagnostics.PREFIX + "dev_"
# logged name -> ir_measures measure (its name: "ir_measures.nDCG@10" ...)
MEASURES = {"dev_ndcg10": "nDCG@10", "dev_mrr10": "RR@10", "dev_recall100": "R@100"}


@dataclass
class DevSet:
    """The scored subset of a dev split, tokenised."""

    qids: List[str]
    queries: List[torch.Tensor]  # dictionary ids, <s> .. </s>
    doc_ids: List[str]
    docs: List[torch.Tensor]
    qrels: Dict[str, Dict[str, int]]
    judged_docs: int  # of ``docs``: judged for the queries (the rest fill up to the cap)
    identity: str  # sha256 of the ids and tokens: a start score is compared with the same set only

    def describe(self) -> str:
        return (
            f"{len(self.qids)} queries, {len(self.doc_ids)} documents ({self.judged_docs} judged for them, "
            f"{len(self.doc_ids) - self.judged_docs} others)"
        )


def _sample(ids: Sequence[str], n: int) -> List[str]:
    """``n`` of ``ids`` (none for n <= 0, all when there are no more), in their own order; the
    choice depends only on the set of ids (sorted before the seeded sample)."""
    if n >= len(ids):
        return list(ids)
    keep = set(random.Random(SEED).sample(sorted(ids), max(n, 0)))
    return [i for i in ids if i in keep]


def select(data: RetrievalData, max_queries: int, max_docs: int) -> Tuple[List[str], List[str], int]:
    """(query ids, document ids, how many of the documents are judged): see the module docstring.
    Every judged document of the chosen queries is kept, even beyond ``max_docs``."""
    qids = data.query_ids()
    qids = _sample(qids, max_queries) if max_queries > 0 else qids  # 0: all
    judged = {d for q in qids for d in data.qrels[q] if d in data.corpus}
    others = [d for d in data.corpus if d not in judged]
    fill = set(_sample(others, max_docs - len(judged) if max_docs > 0 else len(others)))
    doc_ids = [d for d in data.corpus if d in judged or d in fill]
    return qids, doc_ids, len(judged)


def load_dev_set(data: RetrievalData, text_ids: TextIds, max_queries: int, max_docs: int, max_len: int) -> DevSet:
    """The scored subset of ``data``, tokenised once with ``text_ids`` and cut to ``max_len`` ids."""
    qids, doc_ids, judged = select(data, max_queries, max_docs)
    queries = text_ids([data.queries[q] for q in qids], max_len)
    docs = text_ids([data.corpus[d] for d in doc_ids], max_len)
    digest = hashlib.sha256()
    for ids, tokens in ((qids, queries), (doc_ids, docs)):
        for i, t in zip(ids, tokens):
            digest.update(f"{i}\t{' '.join(map(str, t))}\n".encode())
    return DevSet(
        qids=qids,
        queries=[torch.tensor(t, dtype=torch.long) for t in queries],
        doc_ids=doc_ids,
        docs=[torch.tensor(t, dtype=torch.long) for t in docs],
        qrels={q: dict(data.qrels[q]) for q in qids},
        judged_docs=judged,
        identity=digest.hexdigest(),
    )


def encode(model, seqs: Sequence[torch.Tensor], pad: int, batch_size: int = 32) -> torch.Tensor:
    """fp32 representations of ``seqs`` in their order, batched longest first (little padding)."""
    order = sorted(range(len(seqs)), key=lambda i: -seqs[i].numel())
    vectors = diagnostics.encode_sentences(model, [seqs[i] for i in order], pad, batch_size)
    out = torch.empty_like(vectors)
    out[torch.tensor(order, device=vectors.device)] = vectors
    return out


def run(model, dev: DevSet, pad: int) -> Dict[str, Dict[str, float]]:
    """{qid: {doc id: score}}: the top ``TOP_K`` documents of every query by inner product of the
    representations (the cosine with ``--retrieval-similarity cosine``)."""
    with torch.no_grad():
        scores = encode(model, dev.queries, pad) @ encode(model, dev.docs, pad).t()
        top, idx = scores.topk(min(TOP_K, len(dev.doc_ids)), dim=1)
    return {
        q: {dev.doc_ids[j]: float(s) for s, j in zip(srow, irow)}
        for q, srow, irow in zip(dev.qids, top.tolist(), idx.tolist())
    }


def scores(model, dev: DevSet, pad: int) -> Dict[str, float]:
    """{logged name: mean over the dev queries}.  Every query has a full run, so
    ``ir_measures``' mean over the run's queries is the mean over the judged ones."""
    import ir_measures

    measures = {name: ir_measures.parse_measure(m) for name, m in MEASURES.items()}
    means = ir_measures.calc_aggregate(list(measures.values()), dev.qrels, run(model, dev, pad))
    return {name: float(means[m]) for name, m in measures.items()}


def logs(values: Dict[str, float], queries: int) -> Dict[str, float]:
    """The validation's logging output of ``values`` (summed over workers by fairseq; the
    workers that do not score it give the same keys, zero: ``logs({}, 0)``)."""
    out = {f"{PREFIX}{name[len('dev_'):]}_sum": values.get(name, 0.0) * queries for name in MEASURES}
    out[PREFIX + "queries"] = queries
    return out


def means(total: Callable[[str], float]) -> Dict[str, float]:
    """{logged name: mean} from ``total(key)``, a key's sum over the logging outputs (empty
    when the dev set was not scored: training logs, another worker's)."""
    queries = total(PREFIX + "queries")
    if queries <= 0:
        return {}
    return {name: total(f"{PREFIX}{name[len('dev_'):]}_sum") / queries for name in MEASURES}


def reduce(total: Callable[[str], float]) -> Dict[str, float]:
    """Log the dev scores of a validation (``means``); the scores logged."""
    values = means(total)
    for name, value in values.items():
        metrics.log_scalar(name, value, total(PREFIX + "queries"), round=4)
    return values
