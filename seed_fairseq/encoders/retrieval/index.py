"""The faiss side of search: inner-product indexes (``--index`` presets or any faiss factory string),
top-k search in batches, and runs for ir_measures."""

from typing import TYPE_CHECKING, Dict, Sequence, Tuple

import numpy as np

if TYPE_CHECKING:
    import faiss

# Named presets for ``--index``; anything else is passed to faiss.index_factory.
INDEX_PRESETS = {
    "flat": "Flat",  # exact search: the default, as in the paper
    "ivf": "IVF{nlist},Flat",
    "hnsw": "HNSW{hnsw_m},Flat",
    "pq": "PQ{pq_m}",
    "ivfpq": "IVF{nlist},PQ{pq_m}",
}


class SearchError(ValueError):
    """Search settings that cannot work (an unknown ``--index`` string, PQ sizes
    that do not fit the dimension, an empty corpus); ``str()`` is one line."""


class NonFiniteError(SearchError):
    """Vectors (or a training loss) holding NaN or an infinity: faiss would drop them silently
    (-1 ids) and the metrics would read 0.0 as a result; ``str()`` is one line naming the model."""


def check_finite(vectors: np.ndarray, what: str, hint: str = "") -> None:
    """:class:`NonFiniteError` naming ``what`` when rows of ``vectors`` hold NaN or an infinity (every index
    and search checks what it is given, whatever encoded it)."""
    bad = int((~np.isfinite(vectors).reshape(len(vectors), -1).all(axis=1)).sum()) if vectors.size else 0
    if bad:
        raise NonFiniteError(
            f"{what}: {bad} of {len(vectors)} vectors hold NaN or infinite values{hint}: a broken model, or one "
            "whose training diverged, is never searched or scored"
        )


def build_index(
    emb: np.ndarray,
    kind: str = "flat",
    nlist: int = 1024,
    pq_m: int = 64,
    hnsw_m: int = 32,
    nprobe: int = 32,
    ef_search: int = 128,
) -> "faiss.Index":
    """An inner-product faiss index over ``emb``; trains IVF/PQ on ``emb`` itself.

    Raises :class:`SearchError` for an empty ``emb`` (faiss would fail an
    assertion) and for settings faiss refuses.
    """
    import faiss  # here, not at the top: encoding needs no faiss (the GPU image has none)

    if emb.ndim != 2 or emb.shape[0] == 0:
        raise SearchError("cannot build an index over an empty corpus")
    check_finite(emb, "the corpus")
    # IVF needs fewer lists than training vectors; shrink rather than fail on small corpora
    nlist = max(1, min(nlist, emb.shape[0] // 39 or 1))
    index = make_index(emb.shape[1], kind, nlist=nlist, pq_m=pq_m, hnsw_m=hnsw_m)
    try:
        if not index.is_trained:
            index.train(emb)
        index.add(emb)
    except RuntimeError as e:
        raise SearchError(
            f"--index {kind!r}: faiss cannot train it on {emb.shape[0]} vectors: {_faiss_message(e)}"
        ) from None
    spec = INDEX_PRESETS.get(kind, kind)
    ivf = faiss.try_extract_index_ivf(index) if "IVF" in spec else None
    if ivf is not None:
        ivf.nprobe = nprobe
    if "HNSW" in spec:
        faiss.downcast_index(index).hnsw.efSearch = ef_search
    return index


def _faiss_message(e: Exception) -> str:
    # faiss errors are multi-line C++ reports; the line naming the problem is enough
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    useful = [line for line in lines if line.lower().startswith("error")] or lines
    return useful[0] if useful else type(e).__name__


def make_index(dim: int, kind: str = "flat", nlist: int = 1024, pq_m: int = 64, hnsw_m: int = 32) -> "faiss.Index":
    """An empty, untrained inner-product index; :class:`SearchError` for a spec faiss refuses.

    Cheap, so callers check ``--index`` with it before encoding a corpus.
    """
    import faiss

    for name, value in (("nlist", nlist), ("pq_m", pq_m), ("hnsw_m", hnsw_m)):
        if value < 1:
            raise SearchError(f"{name} must be >= 1, got {value}")
    spec = INDEX_PRESETS.get(kind, kind)
    try:
        spec = spec.format(nlist=nlist, pq_m=pq_m, hnsw_m=hnsw_m)
        return faiss.index_factory(dim, spec, faiss.METRIC_INNER_PRODUCT)
    except (RuntimeError, KeyError, IndexError, ValueError) as e:
        raise SearchError(
            f"--index {kind!r}: faiss cannot build {spec!r} for dimension {dim}: {_faiss_message(e)}"
        ) from None


def search(index: "faiss.Index", queries: np.ndarray, k: int, batch_size: int = 4096) -> Tuple[np.ndarray, np.ndarray]:
    """(scores, ids), each (n_queries, k'); k' = min(k, index size)."""
    if k < 1:
        raise ValueError(f"k must be >= 1, got {k}")
    k = min(k, index.ntotal)
    check_finite(queries, "the queries")
    scores, ids = [], []
    for start in range(0, len(queries), batch_size):
        s, i = index.search(np.ascontiguousarray(queries[start : start + batch_size], dtype=np.float32), k)
        scores.append(s)
        ids.append(i)
    if not scores:
        return np.zeros((0, k), np.float32), np.zeros((0, k), np.int64)
    return np.concatenate(scores), np.concatenate(ids)


def to_run(
    qids: Sequence[str], doc_ids: Sequence[str], scores: np.ndarray, ids: np.ndarray
) -> Dict[str, Dict[str, float]]:
    run: Dict[str, Dict[str, float]] = {}
    for qid, srow, irow in zip(qids, scores, ids):
        run[qid] = {doc_ids[i]: float(s) for s, i in zip(srow, irow) if i >= 0}
    return run
