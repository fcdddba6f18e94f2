"""Hard negatives for dual-encoder fine-tuning: BM25 (DPR) or the model's own
faiss top-k (ANCE), every judged document excluded.

Why not sentence-transformers' ``util.mine_hard_negatives``: it excludes only
the given positive of each (query, positive) pair, where IR qrels also judge
near-misses with 0 (we exclude every judged document), it mines with the
model only (DPR's negatives come from BM25), and it brute-forces the corpus
in torch (ANCE rounds here reuse the faiss index of ``index.py``, with its
approximate-index options for large corpora).
"""

from typing import TYPE_CHECKING, Dict, List, Sequence

from ...base.retrieval_data import RetrievalData
from .bm25 import BM25
from .search import make_retriever

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

    from .config import FinetuneConfig


def mine_bm25(data: RetrievalData, qids: Sequence[str], k: int) -> Dict[str, List[str]]:
    bm25 = BM25(data.corpus)
    run = bm25.retrieve({q: data.queries[q] for q in qids}, k=k + 10)
    return {q: _ranked_non_positives(run.get(q, {}), data.qrels.get(q, {}), k) for q in qids}


def mine_dense(
    model: "SentenceTransformer", data: RetrievalData, qids: Sequence[str], k: int, cfg: "FinetuneConfig", **index_kw
) -> Dict[str, List[str]]:
    retriever = make_retriever(
        model,
        data.corpus,
        batch_size=cfg.encode_batch_size,
        precision=cfg.precision,
        index=cfg.index,
        show_progress=cfg.show_progress,
        **index_kw,
    )
    run = retriever.retrieve({q: data.queries[q] for q in qids}, k=k + 10)
    return {q: _ranked_non_positives(run.get(q, {}), data.qrels.get(q, {}), k) for q in qids}


def _ranked_non_positives(scores: Dict[str, float], rels: Dict[str, int], k: int) -> List[str]:
    # every judged document is excluded, not only positives: a judged 0 may be a near-miss label
    ranked = sorted(scores, key=lambda d: -scores[d])
    return [d for d in ranked if d not in rels][:k]


def unjudged_count(data: RetrievalData, qid: str) -> int:
    """How many corpus documents could be a negative of ``qid``: every judged
    document is excluded (a judged 0 may be a near-miss label)."""
    return len(data.corpus) - sum(1 for d in data.qrels.get(qid, {}) if d in data.corpus)


def negatives_per_query(data: RetrievalData, qids: Sequence[str], num_negatives: int) -> Dict[str, int]:
    """Hard negatives each query gets: ``num_negatives`` (``--num-negatives``; 0 with
    ``--negatives none``), or fewer when the corpus does not have that many documents
    left once the query's judged ones are excluded."""
    return {q: min(num_negatives, unjudged_count(data, q)) for q in qids}
