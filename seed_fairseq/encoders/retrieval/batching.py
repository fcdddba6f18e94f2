"""The training examples of fine-tuning: which queries train, their hard negatives, and batches
without a text twice (``training.py`` runs them through sentence-transformers' loop)."""

import random
import sys
from collections import deque
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence

from ...base.retrieval_data import DataFormatError, RetrievalData
from .config import FinetuneConfig
from .negatives import negatives_per_query

if TYPE_CHECKING:
    from sentence_transformers import InputExample


def wanted_negatives(cfg: FinetuneConfig) -> int:
    """Hard negatives a query should get: ``--num-negatives``, none with ``--negatives none``."""
    return 0 if cfg.negatives == "none" else cfg.num_negatives


class NoDuplicateBatches:
    """Batch sampler: reshuffled every epoch, no text twice in one batch, and
    every example of a batch with the same number of texts.

    With in-batch negatives a passage that is one query's positive and another's
    hard negative in the same batch would be a false negative.  Why not
    sentence-transformers' own: ``NoDuplicatesBatchSampler`` works on a
    ``datasets.Dataset`` for ``SentenceTransformerTrainer`` (we train with
    ``old_fit`` over ``InputExample`` lists, without ``datasets``/``accelerate``)
    and does not group by width, and the older ``NoDuplicatesDataLoader`` loops
    forever when a batch cannot be filled; here conflicting examples are
    deferred to a later batch instead.  Examples of
    queries that got fewer hard negatives (tiny corpora) are deferred the same
    way: the collate function zips the texts column by column, so a mixed batch
    would silently drop the extra negatives of the longer examples.
    """

    def __init__(self, examples, batch_size: int, seed: int):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.keys = [frozenset(t.strip().lower() for t in ex.texts) for ex in examples]
        self.sizes = [len(ex.texts) for ex in examples]
        self.batch_size = batch_size
        self.rng = random.Random(seed)

    def __len__(self):
        return max(1, len(self.keys) // self.batch_size) if self.keys else 0

    def __iter__(self):
        pending = deque(self.rng.sample(range(len(self.keys)), len(self.keys)))
        for _ in range(len(self)):
            batch, seen, deferred, size = [], set(), [], None
            while pending and len(batch) < self.batch_size:
                i = pending.popleft()
                if self.keys[i] & seen or (size is not None and self.sizes[i] != size):
                    deferred.append(i)
                else:
                    batch.append(i)
                    seen |= self.keys[i]
                    size = self.sizes[i]
            pending.extendleft(reversed(deferred))
            if not batch:
                return
            yield batch


def check_training_data(
    data: RetrievalData, cfg: FinetuneConfig, qids: Optional[Sequence[str]] = None, log: bool = True
) -> List[str]:
    """The training queries (with a positive in the corpus), or a :class:`DataFormatError`
    naming the data when the loss could not get a single negative.

    Called before any model is loaded or output written.  Logs a note (unless
    ``log`` is False) when some queries get fewer hard negatives than asked for.
    """
    where = data.folder or data.name or "training data"
    if qids is None:
        qids = [q for q in data.query_ids() if data.positives(q)]
    if not qids:
        raise DataFormatError(
            data.qrels_path or where,
            None,
            f"no training query of split {data.split!r} has a relevant document that is in "
            f"the corpus ({data.missing_docs} judged documents are missing from it)",
        )
    counts = negatives_per_query(data, qids, wanted_negatives(cfg))
    n_docs = len(data.corpus)
    if cfg.loss == "triplet" and not any(counts.values()):
        raise DataFormatError(
            where,
            None,
            f"no negatives possible: each of the {n_docs} corpus documents is "
            "judged for every training query, and --loss triplet needs a "
            "document that is not judged for the query",
        )
    if cfg.loss == "mnrl" and not any(counts.values()):
        # no hard negative anywhere: only in-batch negatives, i.e. other queries'
        # positives, and a batch never holds the same text twice
        distinct = {data.corpus[d].strip().lower() for q in qids for d in data.positives(q)}
        if len(distinct) < 2:
            raise DataFormatError(
                where,
                None,
                f"no negatives possible: the corpus has {n_docs} document(s), "
                "each judged for every training query, and every training query "
                "has the same positive passage, so the loss has nothing to rank "
                "it against",
            )
    short = [q for q in qids if counts[q] < cfg.num_negatives] if cfg.negatives != "none" else []
    if short and log:
        fewest = min(counts[q] for q in short)
        print(
            f"note: {where}: {len(short)} of {len(qids)} training queries have fewer than {cfg.num_negatives} "
            f"unjudged documents in the corpus ({n_docs} documents), so they get fewer hard negatives "
            f"(as few as {fewest}, e.g. query {short[0]!r})",
            file=sys.stderr,
        )
    return list(qids)


def sample_negatives(pool: Sequence[str], doc_ids: Sequence[str], judged, want: int, rng: random.Random) -> List[str]:
    """``want`` distinct documents, none judged for the query: from the mined
    ``pool`` first, then at random from the whole corpus.  Fewer only if the
    corpus has fewer; ``want`` must not exceed what it has (see
    :func:`negatives_per_query`), but even then this returns instead of looping.
    """
    negs = rng.sample(list(pool), min(want, len(pool)))
    if len(negs) >= want:
        return negs
    # too few mined candidates (tiny corpora, queries without BM25 matches): pad
    # at random.  Rejection sampling is fast when the judged documents are a small
    # part of the corpus, but the draws are bounded: in a tiny corpus they could
    # keep hitting judged documents, so the rest is picked from an explicit list.
    taken = set(negs)
    for _ in range(4 * want + 16):
        if len(negs) >= want:
            return negs
        d = rng.choice(doc_ids)
        if d not in judged and d not in taken:
            negs.append(d)
            taken.add(d)
    if len(negs) < want:
        rest = [d for d in doc_ids if d not in judged and d not in taken]
        negs.extend(rng.sample(rest, min(want - len(negs), len(rest))))
    return negs


def build_examples(
    data: RetrievalData,
    qids: Sequence[str],
    negatives: Optional[Dict[str, List[str]]],
    cfg: FinetuneConfig,
    rng: random.Random,
) -> List["InputExample"]:
    """InputExamples: (query, positive, hard negatives...) for MNRL, one
    (query, positive, negative) triplet per negative for the triplet loss.

    A query gets ``negatives_per_query`` hard negatives (fewer than
    ``cfg.num_negatives`` only in tiny corpora); with the triplet loss a query
    without any gives no example.
    """
    from sentence_transformers import InputExample

    doc_ids = list(data.corpus)
    counts = negatives_per_query(data, qids, wanted_negatives(cfg))
    examples = []
    for q in qids:
        judged = data.qrels.get(q, {})
        for pos in data.positives(q):
            texts = [data.queries[q], data.corpus[pos]]
            if negatives is None:
                examples.append(InputExample(texts=texts))
                continue
            negs = sample_negatives(negatives.get(q, []), doc_ids, judged, counts[q], rng)
            if cfg.loss == "triplet":
                examples.extend(InputExample(texts=texts + [data.corpus[n]]) for n in negs)
            else:
                examples.append(InputExample(texts=texts + [data.corpus[n] for n in negs]))
    return examples
