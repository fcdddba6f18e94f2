"""Encoding with a SentenceTransformer and top-k search with faiss.

Scores are inner products of [CLS] vectors, as in the paper (no
normalisation), so every index below uses ``METRIC_INNER_PRODUCT``.
"""
import contextlib
from typing import Dict, List, Optional, Sequence, Tuple

import faiss
import numpy as np
import torch

# Named presets for ``--index``; anything else is passed to faiss.index_factory.
INDEX_PRESETS = {
    "flat": "Flat",  # exact search: the default, as in the paper
    "ivf": "IVF{nlist},Flat",
    "hnsw": "HNSW{hnsw_m},Flat",
    "pq": "PQ{pq_m}",
    "ivfpq": "IVF{nlist},PQ{pq_m}",
}


def pick_device(device: Optional[str] = None) -> str:
    if device:
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


def autocast(device: str, precision: str):
    """fp16/bf16 autocast on CUDA only: CPU autocast is slow and changes results."""
    if precision == "fp32" or not str(device).startswith("cuda"):
        return contextlib.nullcontext()
    dtype = torch.float16 if precision == "fp16" else torch.bfloat16
    return torch.autocast("cuda", dtype=dtype)


def load_model(path: str, device: Optional[str] = None, max_seq_length: Optional[int] = None):
    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(path), device=pick_device(device))
    if max_seq_length:
        model.max_seq_length = max_seq_length
    return model


def encode(model, texts: Sequence[str], batch_size: int = 64, precision: str = "fp32",
           show_progress: bool = True, desc: str = "encode") -> np.ndarray:
    """float32 C-contiguous embeddings (what faiss wants), with a tqdm bar."""
    if len(texts) == 0:
        return np.zeros((0, model.get_embedding_dimension()), dtype=np.float32)
    was_training = model.training
    model.eval()
    with torch.inference_mode(), autocast(model.device.type, precision):
        emb = model.encode(list(texts), batch_size=batch_size, show_progress_bar=show_progress,
                           convert_to_numpy=True, normalize_embeddings=False)
    model.train(was_training)
    return np.ascontiguousarray(emb, dtype=np.float32)


def build_index(emb: np.ndarray, kind: str = "flat", nlist: int = 1024, pq_m: int = 64,
                hnsw_m: int = 32, nprobe: int = 32, ef_search: int = 128):
    """An inner-product faiss index over ``emb``; trains IVF/PQ on ``emb`` itself."""
    dim = emb.shape[1]
    spec = INDEX_PRESETS.get(kind, kind)
    # IVF needs fewer lists than training vectors; shrink rather than fail on small corpora
    nlist = max(1, min(nlist, emb.shape[0] // 39 or 1))
    spec = spec.format(nlist=nlist, pq_m=pq_m, hnsw_m=hnsw_m)
    index = faiss.index_factory(dim, spec, faiss.METRIC_INNER_PRODUCT)
    if not index.is_trained:
        index.train(emb)
    index.add(emb)
    ivf = faiss.try_extract_index_ivf(index) if "IVF" in spec else None
    if ivf is not None:
        ivf.nprobe = nprobe
    if "HNSW" in spec:
        faiss.downcast_index(index).hnsw.efSearch = ef_search
    return index


def search(index, queries: np.ndarray, k: int, batch_size: int = 4096) -> Tuple[np.ndarray, np.ndarray]:
    """(scores, ids), each (n_queries, k'); k' = min(k, index size)."""
    k = min(k, index.ntotal)
    scores, ids = [], []
    for start in range(0, len(queries), batch_size):
        s, i = index.search(np.ascontiguousarray(queries[start:start + batch_size], dtype=np.float32), k)
        scores.append(s)
        ids.append(i)
    if not scores:
        return np.zeros((0, k), np.float32), np.zeros((0, k), np.int64)
    return np.concatenate(scores), np.concatenate(ids)


def to_run(qids: Sequence[str], doc_ids: Sequence[str], scores: np.ndarray, ids: np.ndarray) -> Dict[str, Dict[str, float]]:
    run: Dict[str, Dict[str, float]] = {}
    for qid, srow, irow in zip(qids, scores, ids):
        run[qid] = {doc_ids[i]: float(s) for s, i in zip(srow, irow) if i >= 0}
    return run


class DenseRetriever:
    """Corpus embeddings + faiss index for one model; re-encode after training."""

    def __init__(self, model, corpus: Dict[str, str], batch_size: int = 64, precision: str = "fp32",
                 index: str = "flat", show_progress: bool = True, **index_kwargs):
        self.model = model
        self.doc_ids: List[str] = list(corpus)
        self.batch_size = batch_size
        self.precision = precision
        self.show_progress = show_progress
        emb = encode(model, [corpus[d] for d in self.doc_ids], batch_size, precision, show_progress, "corpus")
        self.index = build_index(emb, index, **index_kwargs)

    def retrieve(self, queries: Dict[str, str], k: int = 1000) -> Dict[str, Dict[str, float]]:
        qids = list(queries)
        q = encode(self.model, [queries[i] for i in qids], self.batch_size, self.precision,
                   self.show_progress, "queries")
        scores, ids = search(self.index, q, k)
        return to_run(qids, self.doc_ids, scores, ids)
