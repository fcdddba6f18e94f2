"""DupMAE's own representation in retrieval: dense projected [CLS] + top-k sparse
vocabulary entries at their indices (paper, Eq. 10-12), for fine-tuning and search.

* A model folder declares the representation with ``dupmae.json`` +
  ``dupmae_head.safetensors`` beside its standard sentence-transformers files
  (``seed_fairseq/encoders/dupmae/head.py`` documents them); :func:`load_dupmae_model`
  builds a ``SentenceTransformer`` whose last module is the
  :class:`~seed_fairseq.encoders.dupmae.head.DupMAEHead`.  Its ``sentence_embedding``
  is ``[h_hat ; mu_hat scattered over |V|]``, so sentence-transformers' dot-product
  losses train exactly Eq. 13 (in-batch, plus hard negatives with ``finetune.py``);
  :func:`save_model` writes the folder back in the same layout.
* Search (:class:`HybridIndex`): the dense part in faiss, the sparse part as a
  scipy CSR matrix (documents x vocabulary; a sparse matrix product = an
  inverted index).  The combined top-k is EXACT with a flat faiss index: both
  lists are read to depth k' and the candidates rescored exactly; every document
  outside both lists scores at most (k'-th dense) + (k'-th sparse), so once the
  k-th candidate reaches that bound the result equals exhaustive scoring;
  otherwise k' grows (the threshold algorithm of Fagin et al.).  With an
  approximate faiss index the dense list, hence the result, is approximate.

Scores are Eq. 12 with the same top-k on both sides: the sparse dot product
runs over the indices a query and a document share.  (Read literally, Eq. 12
sums over the document's indices with the query's full vector; encode the
queries with ``top_k`` = the vocabulary's selectable size for that reading.)
"""

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import scipy.sparse as sp
import torch

from ...base.retrieval_data import DataFormatError
from ..retrieval import representations
from ..retrieval.index import SearchError, build_index, make_index, search, to_run
from ..retrieval.precision import PRECISIONS, autocast, quantized_int8
from ..retrieval.search import check_vectors, length_order
from .head import CONFIG_FILE, DupMAEHead, HeadFileError, check_top_k, has_head, load_head

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer



def dupmae_head(model: "SentenceTransformer") -> Optional[DupMAEHead]:
    """The model's DupMAE head (its last module), or None for a [CLS] model."""
    try:
        last = model[len(model) - 1]
    except (TypeError, IndexError, KeyError):
        return None
    return last if isinstance(last, DupMAEHead) else None


def folder_representation(folder: Union[str, Path]) -> str:
    """What a model folder declares: ``dupmae`` when it holds ``dupmae.json``, else ``cls``."""
    return "dupmae" if has_head(folder) else "cls"


def load_dupmae_model(
    cls_model: "SentenceTransformer", folder: Union[str, Path], sparse_top_k: Optional[int] = None
) -> "SentenceTransformer":
    """``cls_model`` (the folder loaded as a [CLS] SentenceTransformer) with the folder's
    DupMAE head in place of the [CLS] pooling; :class:`DataFormatError` naming the file
    when the head is missing or broken."""
    from sentence_transformers import SentenceTransformer

    try:
        head = load_head(folder)
    except HeadFileError as e:
        raise DataFormatError(e.path, None, str(e).split(": ", 1)[1]) from None
    check_head_fits(head, cls_model, Path(folder) / CONFIG_FILE)
    if sparse_top_k is not None:
        try:
            head.head_config["top_k"] = check_top_k(
                sparse_top_k, head.vocab_size, int(head.special.sum()), "--sparse-top-k"
            )
        except ValueError as e:
            raise DataFormatError(Path(folder) / CONFIG_FILE, None, str(e)) from None
    head.to(cls_model.device)
    return SentenceTransformer(modules=[cls_model[0], head], device=str(cls_model.device))


def check_head_fits(head: DupMAEHead, cls_model: "SentenceTransformer", config_path: Path) -> None:
    """The head reads the encoder's hidden states and scores its vocabulary: a head of
    another width is a matmul error on the first text, one of another vocabulary puts
    its sparse entries at the wrong token ids.  :class:`DataFormatError` naming
    ``dupmae.json``."""
    try:
        embeddings = cls_model[0].auto_model.get_input_embeddings()
    except (AttributeError, IndexError, KeyError, TypeError):
        return  # not a transformers encoder: nothing to compare
    rows, width = embeddings.weight.shape
    hidden = getattr(cls_model[0].auto_model.config, "hidden_size", width)
    if head.head_config["hidden_size"] != hidden or head.vocab_size != rows:
        raise DataFormatError(
            config_path,
            None,
            f"a head for hidden size {head.head_config['hidden_size']} and {head.vocab_size} vocabulary entries, "
            f"but the encoder has hidden size {hidden} and {rows} word-embedding rows: another model's head",
        )


def save_model(model: "SentenceTransformer", folder: Union[str, Path]) -> None:
    """Save a model as a standard sentence-transformers folder; a DupMAE model keeps its
    [CLS]-pooling layout (readable without this package) plus the two head files."""
    head = dupmae_head(model)
    if head is None:
        model.save(str(folder))
        return
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling

    transformer = model[0]
    pooling = Pooling(transformer.get_embedding_dimension(), pooling_mode="cls")
    SentenceTransformer(modules=[transformer, pooling], device="cpu").save(str(folder))
    head.save(folder)


# ---------------------------------------------------------------------------------------------
# encoding
# ---------------------------------------------------------------------------------------------


def _preprocess(model, texts):
    prep = getattr(model, "preprocess", None)
    return prep(texts) if prep is not None else model.tokenize(texts)


def encode_dupmae(
    model: "SentenceTransformer",
    texts: Sequence[str],
    batch_size: int = 64,
    precision: str = "fp32",
    show_progress: bool = True,
    desc: str = "encode",
    top_k: Optional[int] = None,
) -> Tuple[np.ndarray, sp.csr_matrix]:
    """(dense (n, d') float32, sparse (n, |V|) CSR float32 with k entries a row at their vocabulary ids)."""
    from sentence_transformers.util import batch_to_device
    from tqdm import tqdm

    if dupmae_head(model) is None:
        raise ValueError("not a DupMAE model (its last module is not a DupMAEHead)")
    if precision not in PRECISIONS:
        raise SearchError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    # int8: a quantised copy (encoder and head), as search.encode does
    runner = quantized_int8(model) if precision == "int8" else model
    head = dupmae_head(runner)
    k = head.top_k if top_k is None else top_k
    dense, values, indices = [], [], []
    was_training, scatter = model.training, head.scatter
    model.eval()
    head.scatter = False
    order = length_order(model, texts)  # fewest pads per batch; rows are put back in input order below
    try:
        with torch.inference_mode(), autocast(model.device.type, precision):
            for start in tqdm(range(0, len(texts), batch_size), desc=desc, disable=not show_progress):
                batch = [texts[i] for i in order[start : start + batch_size]]
                features = batch_to_device(_preprocess(model, batch), model.device)
                out = runner[0](features)
                d, v, i = head.represent(out["token_embeddings"], out["attention_mask"], out["input_ids"], top_k=k)
                dense.append(d.float().cpu().numpy())
                values.append(v.float().cpu().numpy())
                indices.append(i.cpu().numpy())
    finally:
        head.scatter = scatter
        model.train(was_training)
    n = len(texts)
    if n == 0:
        return np.zeros((0, head.dim), np.float32), sp.csr_matrix((0, head.vocab_size), dtype=np.float32)
    inverse = np.empty(n, dtype=np.int64)
    inverse[order] = np.arange(n)
    dense = np.ascontiguousarray(np.concatenate(dense)[inverse], dtype=np.float32)
    values = np.concatenate(values)[inverse]
    check_vectors(model, np.concatenate([dense, values], axis=1), desc, precision)  # both halves of Eq. 12
    return dense, sparse_rows(values, np.concatenate(indices)[inverse], head.vocab_size)


def sparse_rows(values: np.ndarray, indices: np.ndarray, vocab_size: int) -> sp.csr_matrix:
    """CSR (n, vocab_size): row r holds ``values[r]`` at columns ``indices[r]`` (explicit zeros dropped)."""
    n, k = values.shape
    m = sp.csr_matrix(
        (values.astype(np.float32).ravel(), indices.astype(np.int64).ravel(), np.arange(0, n * k + 1, k)),
        shape=(n, vocab_size),
    )
    m.sum_duplicates()
    m.eliminate_zeros()
    m.sort_indices()
    return m


# ---------------------------------------------------------------------------------------------
# scoring and search
# ---------------------------------------------------------------------------------------------


def eq12_scores(q_dense: np.ndarray, q_sparse, d_dense: np.ndarray, d_sparse) -> np.ndarray:
    """(n_queries, n_docs) float64: dense dot + sparse dot over shared indices (Eq. 12), exhaustively."""
    dense = np.asarray(q_dense, np.float64) @ np.asarray(d_dense, np.float64).T
    return dense + (sp.csr_matrix(q_sparse, dtype=np.float64) @ sp.csr_matrix(d_sparse, dtype=np.float64).T).toarray()


class HybridIndex:
    """Exact top-k of Eq. 12 over a corpus: faiss for the dense part, CSR for the sparse part."""

    def __init__(self, dense: np.ndarray, sparse, kind: str = "flat", **index_kwargs):
        if dense.ndim != 2 or dense.shape[0] == 0:
            raise SearchError("cannot build an index over an empty corpus")
        sparse = sp.csr_matrix(sparse, dtype=np.float32)
        if sparse.shape[0] != dense.shape[0]:
            raise ValueError(f"{dense.shape[0]} dense rows but {sparse.shape[0]} sparse rows")
        self.dense = np.ascontiguousarray(dense, dtype=np.float32)
        self.sparse = sparse
        self.inverted = sparse.T.tocsr()  # vocabulary x documents: the postings lists
        self.exact_dense = kind == "flat"
        self.index = build_index(self.dense, kind, **index_kwargs)

    @property
    def ntotal(self) -> int:
        return self.dense.shape[0]

    def search(self, q_dense: np.ndarray, q_sparse, k: int) -> Tuple[np.ndarray, np.ndarray]:
        """(scores float64, ids int64), each (n_queries, min(k, corpus)), best first."""
        if k < 1:
            raise ValueError(f"k must be >= 1, got {k}")
        n_docs = self.ntotal
        k = min(k, n_docs)
        q_dense = np.ascontiguousarray(q_dense, dtype=np.float32)
        q_sparse = sp.csr_matrix(q_sparse, dtype=np.float32)
        n_q = q_dense.shape[0]
        scores = np.zeros((n_q, k), np.float64)
        ids = np.zeros((n_q, k), np.int64)
        # the sparse scores of a query block against every document: bounded memory
        block = max(1, min(256, (1 << 24) // max(n_docs, 1)))
        for start in range(0, n_q, block):
            rows = range(start, min(start + block, n_q))
            product = (q_sparse[start : rows.stop] @ self.inverted).tocsr()  # block x documents
            pending = list(rows)
            depth = min(n_docs, max(2 * k, k + 16))
            while pending:
                _, dense_ids = search(self.index, q_dense[pending], depth)
                retry = []
                for j, r in enumerate(pending):
                    found = self._top_k(q_dense[r], q_sparse[r], product, r - start, dense_ids[j], depth, k)
                    if found is None:
                        retry.append(r)
                    else:
                        scores[r], ids[r] = found
                pending = retry
                depth = min(n_docs, depth * 4)
        return scores, ids

    def _exact(self, q_dense, q_sparse_row, docs: np.ndarray) -> np.ndarray:
        dense = self.dense[docs].astype(np.float64) @ q_dense.astype(np.float64)
        sparse = (self.sparse[docs].astype(np.float64) @ q_sparse_row.T.astype(np.float64)).toarray().ravel()
        return dense + sparse

    def _top_k(self, q_dense, q_sparse_row, product, row, dense_ids, depth, k):
        n_docs = self.ntotal
        if depth >= n_docs:  # the whole corpus: exhaustive
            docs = np.arange(n_docs)
            combined = self._exact(q_dense, q_sparse_row, docs)
            best = np.lexsort((docs, -combined))[:k]
            return combined[best], docs[best]
        lo, hi = product.indptr[row], product.indptr[row + 1]
        cols, vals = product.indices[lo:hi], product.data[lo:hi].astype(np.float64)
        implicit = n_docs - len(cols)  # documents sharing no index: sparse score 0
        # the depth-th largest sparse score over ALL documents (implicit zeros included)
        merged = np.concatenate([vals, np.zeros(min(implicit, depth))])
        kth_sparse = np.partition(merged, len(merged) - depth)[len(merged) - depth]
        sparse_bound = max(kth_sparse, 0.0) if implicit else kth_sparse
        dense_ids = dense_ids[dense_ids >= 0]
        kth_dense = float(self.dense[dense_ids[-1]].astype(np.float64) @ q_dense.astype(np.float64))
        docs = np.union1d(dense_ids, cols[vals >= kth_sparse])
        combined = self._exact(q_dense, q_sparse_row, docs)
        best = np.lexsort((docs, -combined))[:k]
        bound = kth_dense + sparse_bound
        slack = 1e-6 * (abs(kth_dense) + abs(sparse_bound) + 1.0)  # float32 faiss vs float64 rescoring
        if len(best) < k or combined[best[-1]] < bound + slack:
            return None  # a document outside both lists could still enter the top-k
        return combined[best], docs[best]


class DupMAERetriever:
    """Corpus representations + :class:`HybridIndex` for one DupMAE model (``DenseRetriever``'s interface)."""

    def __init__(
        self,
        model: "SentenceTransformer",
        corpus: Dict[str, str],
        batch_size: int = 64,
        precision: str = "fp32",
        index: str = "flat",
        show_progress: bool = True,
        **index_kwargs,
    ):
        head = dupmae_head(model)
        if head is None:
            raise ValueError("DupMAERetriever needs a model loaded with the DupMAE representation")
        self.model = model
        self.doc_ids: List[str] = list(corpus)
        self.batch_size = batch_size
        self.precision = precision
        self.show_progress = show_progress
        if not self.doc_ids:
            raise SearchError("cannot build an index over an empty corpus")
        # a bad --index must fail before the corpus is encoded, not after
        make_index(head.dim, index, **{k: v for k, v in index_kwargs.items() if k in ("pq_m", "hnsw_m")})
        dense, sparse = encode_dupmae(
            model, [corpus[d] for d in self.doc_ids], batch_size, precision, show_progress, "corpus"
        )
        if index != "flat" and show_progress:
            print(f"note: --index {index}: the dense candidates, hence the top-k, are approximate", file=sys.stderr)
        self.index = HybridIndex(dense, sparse, index, **index_kwargs)

    def retrieve(self, queries: Dict[str, str], k: int = 1000) -> Dict[str, Dict[str, float]]:
        qids = list(queries)
        dense, sparse = encode_dupmae(
            self.model, [queries[i] for i in qids], self.batch_size, self.precision, self.show_progress, "queries"
        )
        scores, ids = self.index.search(dense, sparse, k)
        return to_run(qids, self.doc_ids, scores, ids)


def _mark_finetuned(model: "SentenceTransformer", tool: str) -> None:
    dupmae_head(model).head_config["cls_projection"] += f"; then fine-tuned by {tool}"


REPRESENTATION = representations.register(
    representations.Representation(
        name="dupmae",
        declared_by=has_head,
        load=load_dupmae_model,
        owns=lambda model: dupmae_head(model) is not None,
        retriever=DupMAERetriever,
        save=save_model,
        mark_finetuned=_mark_finetuned,
    )
)
