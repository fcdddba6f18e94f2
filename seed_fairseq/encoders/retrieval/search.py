"""Encoding with a SentenceTransformer and top-k search with faiss.

Scores are inner products of the model's vectors, so every index below uses
``METRIC_INNER_PRODUCT``: the dot product of a model that compares by it (the papers'
[CLS] vectors), the cosine of one that compares by cosine, whose vectors are unit-normalised
(its ``Normalize`` module, added at load when its folder declares cosine without one:
the built-in representations at the end of this file).
"""

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence, Tuple

import numpy as np
import torch

from ...base.representation import PAPERS, SIMILARITIES
from ...base.retrieval_data import DataFormatError
from ...base.vocabulary.tokenizer import TokenizerError, broken_json, check_tokenizer_fits
from ..hf.folder import CONFIG, HFFolderError, check_folder
from ..hf.folder import check_finite as check_finite_weights
from ..hf.sentence import declared_similarity, module_list, st_modules
from . import representations
from .index import SearchError, build_index, check_finite, make_index, search, to_run
from .precision import PRECISIONS, autocast, quantized_int8
from .representations import Representation

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

    from .representations import Retriever


def pick_device(device: Optional[str] = None) -> str:
    if device:
        return device
    return "cuda" if torch.cuda.is_available() else "cpu"


# where load_model notes the folder a model came from (messages about its vectors name it)
FOLDER_ATTR = "seed_fairseq_folder"


def load_model(
    path: str,
    device: Optional[str] = None,
    max_seq_length: Optional[int] = None,
    representation: Optional[str] = None,
    sparse_top_k: Optional[int] = None,
) -> "SentenceTransformer":
    """A SentenceTransformer from a local folder; a bad folder is a :class:`DataFormatError`.

    Only local folders: sentence-transformers would look a missing path up on
    the Hugging Face hub (a network wait, then a long traceback).

    ``representation``: ``own`` (the folder's sentence-transformers modules as written,
    compared by its similarity: :func:`similarity`), ``cls`` (the papers' [CLS] vector and dot
    product), another registered one (``representations.py``; ``dupmae``: DupMAE's dense +
    sparse representation, ``seed_fairseq/encoders/dupmae/``, whose head files the folder must hold) or
    None: what the folder declares (``dupmae`` with its head files, else ``own``).
    ``sparse_top_k`` overrides the DupMAE head's top-k.
    """
    chosen = representations.get(representation) if representation is not None else None
    folder = Path(path)
    if not folder.exists():
        raise DataFormatError(folder, None, "model folder not found")
    if not folder.is_dir():
        raise DataFormatError(folder, None, "not a folder (expected an exported or sentence-transformers model)")
    # modules.json vetted (hf.sentence.module_list: sentence-transformers' own classes, paths inside the folder)
    encoder = transformer_folder(folder)
    if encoder is not None and (encoder / CONFIG).is_file():
        try:
            check_folder(encoder)  # config.json and the weights, before a model is built from them
        except HFFolderError as e:
            raise DataFormatError(e.path, None, e.problem) from None
    from sentence_transformers import SentenceTransformer  # seconds to import: after the cheap checks

    try:
        model = SentenceTransformer(str(folder), device=pick_device(device), local_files_only=True)
    except Exception as e:  # transformers and sentence-transformers raise many kinds for a folder
        bad = broken_json(encoder) if encoder is not None and encoder.is_dir() else None
        if bad is not None:
            raise DataFormatError(bad.path, None, bad.problem) from None
        lines = str(e).strip().splitlines()
        raise DataFormatError(
            folder, None, f"cannot load a model from this folder: {lines[0] if lines else type(e).__name__}"
        ) from None
    check_vocabulary(model, encoder or folder)
    try:
        check_finite_weights(model.named_parameters(), encoder or folder)
    except HFFolderError as e:
        raise DataFormatError(e.path, None, e.problem) from None
    limit = position_limit(model)
    if not max_seq_length and limit is not None and (model.max_seq_length or limit) > limit:
        # sentence-transformers caps the tokenizer's length at max_position_embeddings, which for
        # RoBERTa-style models is 2 rows more than the tokens they take (position_limit)
        model.max_seq_length = limit
    if max_seq_length:
        if max_seq_length < 1:
            raise ValueError(f"max_seq_length must be >= 1, got {max_seq_length}")
        if limit is not None and max_seq_length > limit:
            # more tokens than position embeddings: an index error deep in the
            # model on the first long text; the model cannot read further anyway
            print(
                f"note: {folder}: --max-seq-length {max_seq_length} is more than the model's {limit} "
                f"positions; using {limit}",
                file=sys.stderr,
            )
            max_seq_length = limit
        model.max_seq_length = max_seq_length
    model = (chosen or representations.of_folder(folder)).load(model, folder, sparse_top_k)
    setattr(model, FOLDER_ATTR, str(folder))
    return model


def transformer_folder(folder: Path) -> Optional[Path]:
    """The folder of the model's transformers module: the one ``modules.json`` names
    (usually the folder itself), the folder itself without ``modules.json`` (a plain
    HuggingFace folder), None when no module is a Transformer (static embeddings)."""
    modules = module_list_or_none(folder)
    if modules is None:
        return folder
    return next((folder / path for kind, path in modules if kind == "Transformer"), None)


def check_vocabulary(model: "SentenceTransformer", folder: Path) -> None:
    """The loaded tokenizer is the model's own (``vocabulary.tokenizer.check_tokenizer_fits``).

    Without its tokenizer files, sentence-transformers builds a near-empty tokenizer
    that turns every word into ``<unk>``: evaluation would print metrics of noise and
    fine-tuning would train on it.  Refused here, before any text is encoded."""
    try:
        rows = model[0].auto_model.get_input_embeddings().num_embeddings
        tokenizer = model.tokenizer
    except (AttributeError, IndexError, KeyError, TypeError):
        return  # not a transformers module (static embeddings): nothing to compare
    try:
        check_tokenizer_fits(tokenizer, rows, folder)
    except TokenizerError as e:
        raise DataFormatError(e.path, None, e.problem) from None


def position_limit(model: "SentenceTransformer") -> Optional[int]:
    """Tokens the model's position embeddings can take (None if unknown).

    RoBERTa / XLM-R position ids start after the padding index, so they lose
    ``pad_token_id + 1`` positions (66 embeddings -> 64 tokens).
    """
    try:
        config = model[0].auto_model.config
    except (AttributeError, IndexError, KeyError, TypeError):
        return None
    n = getattr(config, "max_position_embeddings", None)
    if not isinstance(n, int):
        return None
    if getattr(config, "model_type", "") in ("roberta", "xlm-roberta", "camembert"):
        n -= (config.pad_token_id if config.pad_token_id is not None else 1) + 1
    return n if n > 0 else None


def length_order(model: "SentenceTransformer", texts: Sequence[str]) -> np.ndarray:
    """Indices of ``texts`` from the most to the fewest tokens (ties: input order).

    Batches of similar lengths waste little on padding. Token counts come from the
    model's own (fast) tokenizer in one batch call, truncated like the model
    truncates; sentence-transformers sorts by characters, a rougher proxy.
    """
    return np.argsort(-token_lengths(model, texts)[0], kind="stable")


def token_lengths(model: "SentenceTransformer", texts: Sequence[str]) -> Tuple[np.ndarray, bool]:
    """(token count of each text, cut at ``model.max_seq_length``; True if they are tokens,
    False if the tokenizer failed and they are character counts)."""
    tokenizer = getattr(model, "tokenizer", None)
    try:
        ids = tokenizer(
            list(texts),
            truncation=True,
            max_length=model.max_seq_length,
            return_attention_mask=False,
            return_token_type_ids=False,
        )["input_ids"]
        return np.fromiter((len(i) for i in ids), dtype=np.int64, count=len(texts)), True
    except (TypeError, KeyError, AttributeError, ValueError):
        return np.fromiter((len(t) for t in texts), dtype=np.int64, count=len(texts)), False


def length_source(model: "SentenceTransformer", requested: Optional[int]) -> str:
    """One line: the sequence length texts are cut at, and why (for the drivers' stderr)."""
    why = "--max-seq-length" if requested else "the model's max_seq_length; --max-seq-length N changes it"
    if requested and model.max_seq_length != requested:
        why = f"--max-seq-length {requested}, capped at the model's positions"
    return (
        f"note: texts are cut at {model.max_seq_length} tokens ({why}); a batch is padded to its longest text, "
        "so a lower limit is faster only when it cuts texts"
    )


def length_note(desc: str, lengths: np.ndarray, limit: Optional[int]) -> str:
    """One line: how long the encoded texts are against the limit they are cut at."""
    cut = int((lengths >= limit).sum()) if limit else 0
    longest = int(lengths.max()) if len(lengths) else 0
    return (
        f"note: {desc}: {len(lengths)} texts, longest {longest}{'+' if cut else ''} tokens, "
        f"{cut} cut at the {limit}-token limit"
    )


def _features(model, texts: List[str]) -> dict:
    # sentence-transformers >= 5: preprocess; before: tokenize (deprecated since)
    prepare = getattr(model, "preprocess", None) or model.tokenize
    return prepare(texts)


def encode(
    model: "SentenceTransformer",
    texts: Sequence[str],
    batch_size: int = 64,
    precision: str = "fp32",
    show_progress: bool = True,
    desc: str = "encode",
    sort_by_length: bool = True,
) -> np.ndarray:
    """float32 C-contiguous embeddings (what faiss wants), in the order of ``texts``.

    The texts are encoded in batches of similar token counts (``length_order``)
    under ``torch.inference_mode``, in ``precision`` (``precision.py``: autocast,
    dynamic int8). Batches go through the model's own preprocessing and
    forward, as in ``SentenceTransformer.encode``; in fp32 the result does not
    depend on the order of the batches (``sort_by_length=False`` keeps the input
    order, tested).
    """
    if precision not in PRECISIONS:
        raise SearchError(f"precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
    dim = model.get_embedding_dimension()
    out = np.zeros((len(texts), dim), dtype=np.float32)
    if len(texts) == 0:
        return out
    from sentence_transformers.util import batch_to_device
    from tqdm import tqdm

    runner = quantized_int8(model) if precision == "int8" else model
    order = np.arange(len(texts))
    if sort_by_length:
        lengths, are_tokens = token_lengths(model, texts)
        order = np.argsort(-lengths, kind="stable")
        if show_progress and are_tokens:  # beside the progress bar: what the encoding costs
            print(length_note(desc, lengths, model.max_seq_length), file=sys.stderr)
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode(), autocast(model.device.type, precision), tqdm(
            total=len(texts), desc=desc, unit=" texts", disable=not show_progress
        ) as bar:
            for start in range(0, len(texts), batch_size):
                rows = order[start : start + batch_size]
                features = batch_to_device(_features(model, [texts[i] for i in rows]), model.device)
                emb = runner(features)["sentence_embedding"]
                out[rows] = emb.float().cpu().numpy()
                bar.update(len(rows))
    finally:
        model.train(was_training)
    check_vectors(model, out, desc, precision)
    return out


def check_vectors(model: "SentenceTransformer", vectors: np.ndarray, desc: str, precision: str) -> None:
    """``index.check_finite`` naming the model's folder (and ``precision``, an overflow's suspect)."""
    hint = "" if precision in ("fp32", "int8") else f" (encoded in {precision}: try --precision fp32)"
    check_finite(vectors, f"{getattr(model, FOLDER_ATTR, None) or 'the model'} ({desc})", hint)


def make_retriever(model: "SentenceTransformer", corpus: Dict[str, str], **kwargs) -> "Retriever":
    """The retriever of the model's representation (``representations.of_model``): :class:`DenseRetriever`
    for [CLS], ``DupMAERetriever`` for DupMAE's (same arguments and ``retrieve``)."""
    return representations.of_model(model).retriever(model, corpus, **kwargs)


class DenseRetriever:
    """Corpus embeddings + faiss index for one model; re-encode after training."""

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
        self.model = model
        self.doc_ids: List[str] = list(corpus)
        self.batch_size = batch_size
        self.precision = precision
        self.show_progress = show_progress
        if not self.doc_ids:
            raise SearchError("cannot build an index over an empty corpus")
        # a bad --index must fail before the corpus is encoded, not after
        make_index(
            model.get_embedding_dimension(), index, **{k: v for k, v in index_kwargs.items() if k in ("pq_m", "hnsw_m")}
        )
        emb = encode(model, [corpus[d] for d in self.doc_ids], batch_size, precision, show_progress, "corpus")
        self.index = build_index(emb, index, **index_kwargs)

    def retrieve(self, queries: Dict[str, str], k: int = 1000) -> Dict[str, Dict[str, float]]:
        qids = list(queries)
        q = encode(
            self.model, [queries[i] for i in qids], self.batch_size, self.precision, self.show_progress, "queries"
        )
        scores, ids = search(self.index, q, k)
        return to_run(qids, self.doc_ids, scores, ids)


# ---------------------------------------------------------------------------------------------
# the built-in representations: the folder's own, and the papers' [CLS] vector
# ---------------------------------------------------------------------------------------------

# where load_model notes the similarity it read from the folder (sentence-transformers' own
# similarity_fn_name says "cosine" for a model that never set one)
SIMILARITY_ATTR = "seed_fairseq_similarity"


def normalizes(model: "SentenceTransformer") -> bool:
    """Does the model's last module L2-normalise its vectors (sentence-transformers' ``Normalize``)?"""
    try:
        return type(model[len(model) - 1]).__name__ == "Normalize"
    except (TypeError, IndexError, KeyError):
        return False


def similarity(model: "SentenceTransformer") -> str:
    """``cosine`` or ``dot``: how ``model`` compares its vectors, as :func:`load_model` read it from
    its folder; for a model built in memory, cosine when it normalises, else the dot product."""
    declared = getattr(model, SIMILARITY_ATTR, None)
    if declared in SIMILARITIES:
        return declared
    return "cosine" if normalizes(model) else "dot"


# marks a Normalize module load_model appended (a cosine model without one): never saved with the model
ADDED_AT_LOAD = "seed_fairseq_added_at_load"


def _with_similarity(model: "SentenceTransformer", name: str) -> "SentenceTransformer":
    """``model`` comparing by ``name``: unit vectors for cosine (a ``Normalize`` module appended when
    it has none, so the inner-product index and the dot-product losses see cosines; marked
    :data:`ADDED_AT_LOAD`, so that :func:`_save` writes the model without it, as its folder was)."""
    if name == "cosine" and not normalizes(model):
        normalize = st_modules()[2]()
        setattr(normalize, ADDED_AT_LOAD, True)
        model.append(normalize)
    model.similarity_fn_name = name  # what sentence-transformers' similarity() and save() use
    setattr(model, SIMILARITY_ATTR, name)
    return model


def module_list_or_none(folder: Path) -> Optional[list]:
    """``hf.sentence.module_list`` of ``folder`` (None: no ``modules.json``), a bad file a DataFormatError."""
    try:
        return module_list(folder)
    except HFFolderError as e:
        raise DataFormatError(e.path, None, e.problem) from None


def _no_sparse_top_k(folder: Path, sparse_top_k: Optional[int], how: str) -> None:
    if sparse_top_k is not None:
        raise DataFormatError(folder, None, f"--sparse-top-k applies to DupMAE's representation; this model is {how}")


def _load_own(model: "SentenceTransformer", folder: Path, sparse_top_k: Optional[int]) -> "SentenceTransformer":
    """The folder's model as its sentence-transformers modules say, compared by its similarity; a
    plain HuggingFace folder (no ``modules.json``: sentence-transformers would pool it by its own
    default, the mean) has no representation of its own and gets the papers' [CLS] and dot product,
    as its import does (``hf/sentence.py``)."""
    if module_list_or_none(folder) is None:
        return _load_cls(model, folder, sparse_top_k)
    _no_sparse_top_k(folder, sparse_top_k, "loaded with its own sentence-transformers modules")
    try:
        name = declared_similarity(folder, normalizes(model))
    except HFFolderError as e:
        raise DataFormatError(e.path, None, e.problem) from None
    return _with_similarity(model, name)


def _load_cls(model: "SentenceTransformer", folder: Path, sparse_top_k: Optional[int]) -> "SentenceTransformer":
    """The folder's encoder with [CLS] pooling and the dot product (its own pooling and
    normalisation left out)."""
    from sentence_transformers import SentenceTransformer

    _no_sparse_top_k(folder, sparse_top_k, "loaded with [CLS] pooling")
    Pooling = st_modules()[1]
    encoder = model[0]
    # sentence-transformers >= 5 renamed get_word_embedding_dimension
    dim = getattr(encoder, "get_embedding_dimension", None) or getattr(encoder, "get_word_embedding_dimension", None)
    if dim is None:
        raise DataFormatError(folder, None, "its first module is not an encoder whose [CLS] vector could be taken")
    pooling = Pooling(dim(), pooling_mode=PAPERS.st_pooling)
    cls = SentenceTransformer(modules=[encoder, pooling], device=str(model.device))
    return _with_similarity(cls, PAPERS.similarity)


def _save(model: "SentenceTransformer", folder: Path) -> None:
    """``model`` written as its folder was: without a ``Normalize`` module load_model appended."""
    if getattr(model[len(model) - 1], ADDED_AT_LOAD, False):
        model = model_without_last(model)
    model.save(str(folder))


def model_without_last(model: "SentenceTransformer") -> "SentenceTransformer":
    """A SentenceTransformer of ``model``'s modules but the last (shared, not copied), with its similarity."""
    from sentence_transformers import SentenceTransformer

    modules = [model[i] for i in range(len(model) - 1)]
    return SentenceTransformer(modules=modules, device=str(model.device), similarity_fn_name=model.similarity_fn_name)


OWN = representations.register(
    Representation(
        name=representations.BUILT_IN,
        declared_by=lambda folder: False,  # the default: what a folder declaring nothing else is
        load=_load_own,
        owns=lambda model: True,
        retriever=DenseRetriever,
        save=_save,
    )
)
CLS = representations.register(
    Representation(
        name="cls",
        declared_by=lambda folder: False,  # chosen explicitly (--representation cls)
        load=_load_cls,
        owns=lambda model: False,  # a loaded [CLS] model is an ordinary sentence-transformers model (own)
        retriever=DenseRetriever,
        save=_save,
    )
)
