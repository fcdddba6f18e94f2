"""DupMAE's retrieval representation on top of an exported encoder (paper, Eq. 10-12),
and the two files that carry it in an export folder.

    h_hat = W_cls^T h                     the [CLS] vector projected to d' dims (Eq. 10)
    mu    = max_t MLMHead(e_t)            the vocabulary logits of the ordinary tokens, max-pooled (Eq. 6-7)
    mu_hat = {i: mu[i] | i in top-k(mu)}  k entries KEPT AT THEIR VOCABULARY INDICES (Eq. 11)
    <q, d> = h_hat_q . h_hat_d + sum over shared indices of mu_hat_q[i] mu_hat_d[i]   (Eq. 12)

The encoder itself stays the standard ``XLMRobertaModel`` folder of the export;
DupMAE adds, in the same folder:

``dupmae.json``
    ``{"format": "seed_fairseq.dupmae", "version": 1, "hidden_size": d, "dim": d',
    "vocab_size": |V|, "top_k": k, "special_ids": [...], "activation": "gelu",
    "layer_norm_eps": 1e-5, "cls_projection": "<how W_cls was made>"}``
``dupmae_head.safetensors``
    ``cls_projection.weight`` (d', d) and the vocabulary projection -- the MLM head
    of pre-training (the paper's d x |V| "linear projection unit" is, as in the
    reference code, the tied MLM head): ``dense.weight`` (d, d), ``dense.bias``,
    ``layer_norm.weight``, ``layer_norm.bias``, ``weight`` (|V|, d; a copy of the
    word embeddings it was tied to), ``bias`` (|V|).

:func:`load_head` reads them back (:class:`HeadFileError` naming the file for
anything missing or inconsistent).  ``seed_fairseq.encoders.dupmae.retriever`` plugs the
head into sentence-transformers for fine-tuning and search.

Pooled positions: tokens that are not special (``special_ids``: ``<s> <pad>
</s> <unk> <mask>``) under the attention mask; the same ids are never selected
for the top-k.  A text without such a token has ``mu = 0`` (no sparse part).
"""

import json
from pathlib import Path
from typing import Dict, Optional, Sequence, Tuple

import numpy as np
import torch
import torch.nn as nn
import torch.nn.functional as F

from ...base.fileio import atomic_path, write_json_atomic
from ...pretrain.modules.vocab_pool import vocab_max_pool

CONFIG_FILE = "dupmae.json"
WEIGHTS_FILE = "dupmae_head.safetensors"
FORMAT = "seed_fairseq.dupmae"
VERSION = 1
DEFAULT_DIM = 384  # the paper's "CLS:384, OT:384"
DEFAULT_TOP_K = 384

ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_new": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "tanh": torch.tanh,
}


class HeadFileError(ValueError):
    """A DupMAE head file that is missing or does not fit; ``str()`` is ``FILE: problem``."""

    def __init__(self, path, problem: str):
        self.path = str(path)
        super().__init__(f"{path}: {problem}")


def check_dim(dim: int, hidden_size: int, option: str = "--dupmae-dim") -> int:
    if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
        raise ValueError(f"{option} must be an integer >= 1, got {dim!r}")
    if dim > hidden_size:
        raise ValueError(f"{option} {dim} is larger than the encoder's hidden size {hidden_size} (d' must be <= d)")
    return dim


def check_top_k(top_k: int, vocab_size: int, n_special: int, option: str = "--dupmae-top-k") -> int:
    ordinary = vocab_size - n_special
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"{option} must be an integer >= 1, got {top_k!r}")
    if top_k > ordinary:
        raise ValueError(
            f"{option} {top_k} is larger than the vocabulary: {vocab_size} entries, {ordinary} of them "
            f"selectable (the {n_special} special symbols are never kept)"
        )
    return top_k


class DupMAEHead(nn.Module):
    """[CLS] projection + vocabulary projection over a transformer's token embeddings.

    As a sentence-transformers module (after the ``Transformer`` module) it
    reads ``token_embeddings``, ``attention_mask`` and ``input_ids`` and adds
    ``dupmae_dense`` (batch, d'), ``dupmae_values`` / ``dupmae_indices``
    (batch, k) and ``sentence_embedding`` = ``[h_hat ; mu_hat scattered over
    |V|]`` (batch, d' + |V|), whose dot products are exactly Eq. 12 -- what
    fine-tuning (Eq. 13) trains with.  ``scatter = False`` skips that
    (batch, |V|) tensor when only the sparse entries are wanted (search).
    """

    def __init__(
        self,
        hidden_size: int,
        vocab_size: int,
        dim: int,
        top_k: int,
        special_ids: Sequence[int],
        activation: str = "gelu",
        layer_norm_eps: float = 1e-5,
        cls_projection: str = "",
    ):
        super().__init__()
        if activation not in ACTIVATIONS:
            raise ValueError(f"activation {activation!r} is not one of {sorted(ACTIVATIONS)}")
        self.head_config = {
            "hidden_size": int(hidden_size),
            "dim": check_dim(dim, hidden_size),
            "vocab_size": int(vocab_size),
            "top_k": check_top_k(top_k, vocab_size, len(set(special_ids))),
            "special_ids": sorted({int(i) for i in special_ids}),
            "activation": activation,
            "layer_norm_eps": float(layer_norm_eps),
            "cls_projection": cls_projection,
        }
        self.cls_projection = nn.Linear(hidden_size, dim, bias=False)
        self.dense = nn.Linear(hidden_size, hidden_size)
        self.layer_norm = nn.LayerNorm(hidden_size, eps=layer_norm_eps)
        self.weight = nn.Parameter(torch.zeros(vocab_size, hidden_size))
        self.bias = nn.Parameter(torch.zeros(vocab_size))
        special = torch.zeros(vocab_size, dtype=torch.bool)
        special[self.head_config["special_ids"]] = True
        self.register_buffer("special", special, persistent=False)
        self.scatter = True

    @property
    def top_k(self) -> int:
        return self.head_config["top_k"]

    @property
    def dim(self) -> int:
        return self.head_config["dim"]

    @property
    def vocab_size(self) -> int:
        return self.head_config["vocab_size"]

    def get_sentence_embedding_dimension(self) -> int:
        return self.dim + self.vocab_size

    get_embedding_dimension = get_sentence_embedding_dimension

    # -- the representation -----------------------------------------------------------------

    def pool_positions(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        return attention_mask.bool() & ~self.special[input_ids]

    def vocabulary_vector(self, token_embeddings: torch.Tensor, pool: torch.Tensor) -> torch.Tensor:
        """mu (batch, |V|): the MLM head's logits max-pooled over ``pool``; 0 for a text without pooled tokens."""
        hidden = self.layer_norm(ACTIVATIONS[self.head_config["activation"]](self.dense(token_embeddings)))
        mu, _ = vocab_max_pool(hidden, self.weight, self.bias, pool)
        return torch.where(pool.any(1, keepdim=True), mu, torch.zeros_like(mu))

    def sparsify(self, mu: torch.Tensor, top_k: Optional[int] = None) -> Tuple[torch.Tensor, torch.Tensor]:
        """(values, indices), each (batch, k): the top-k ordinary entries of ``mu`` at their vocabulary ids."""
        k = self.top_k if top_k is None else check_top_k(top_k, self.vocab_size, int(self.special.sum()), "top_k")
        _, indices = mu.detach().masked_fill(self.special, float("-inf")).topk(k, dim=-1)
        return mu.gather(1, indices), indices

    def represent(
        self, token_embeddings, attention_mask, input_ids, top_k: Optional[int] = None
    ) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(dense (batch, d'), values (batch, k), indices (batch, k))."""
        dense = self.cls_projection(token_embeddings[:, 0])
        mu = self.vocabulary_vector(token_embeddings, self.pool_positions(input_ids, attention_mask))
        values, indices = self.sparsify(mu, top_k)
        return dense, values, indices

    def forward(self, features: Dict[str, torch.Tensor]) -> Dict[str, torch.Tensor]:
        dense, values, indices = self.represent(
            features["token_embeddings"], features["attention_mask"], features["input_ids"]
        )
        features.update(dupmae_dense=dense, dupmae_values=values, dupmae_indices=indices)
        if self.scatter:
            sparse = torch.zeros(dense.size(0), self.vocab_size, dtype=values.dtype, device=values.device)
            features["sentence_embedding"] = torch.cat([dense, sparse.scatter(1, indices, values)], dim=1)
        return features

    # -- files ---------------------------------------------------------------------------------

    def save(self, folder, **unused) -> None:
        """Write ``dupmae.json`` and ``dupmae_head.safetensors`` into ``folder`` (atomically)."""
        from safetensors.torch import save_file

        folder = Path(folder)
        tensors = {k: v.detach().float().cpu().contiguous() for k, v in self.state_dict().items()}
        with atomic_path(folder / WEIGHTS_FILE) as tmp:
            save_file(tensors, str(tmp))
        write_json_atomic(folder / CONFIG_FILE, {"format": FORMAT, "version": VERSION, **self.head_config})

    @classmethod
    def load(cls, folder, **unused) -> "DupMAEHead":
        return load_head(folder)


def has_head(folder) -> bool:
    """Does ``folder`` declare the DupMAE representation (it has ``dupmae.json``)?"""
    return (Path(folder) / CONFIG_FILE).is_file()


def load_head(folder) -> DupMAEHead:
    """The head of an export / fine-tuned folder; :class:`HeadFileError` naming the file otherwise."""
    from safetensors import SafetensorError
    from safetensors.torch import load_file

    folder = Path(folder)
    cfg_path, weights_path = folder / CONFIG_FILE, folder / WEIGHTS_FILE
    if not cfg_path.is_file():
        raise HeadFileError(
            cfg_path,
            "not found: the folder has no DupMAE representation (export it from a "
            "DupMAE checkpoint, or with --representation dupmae)",
        )
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as e:
        raise HeadFileError(cfg_path, f"not readable JSON ({e})") from None
    if not isinstance(cfg, dict) or cfg.get("format") != FORMAT:
        raise HeadFileError(cfg_path, f'not a DupMAE head configuration (no "format": "{FORMAT}")')
    if cfg.get("version") != VERSION:
        raise HeadFileError(cfg_path, f"version {cfg.get('version')!r} is not supported (this code reads {VERSION})")
    if not weights_path.is_file():
        raise HeadFileError(
            weights_path,
            f"not found: {CONFIG_FILE} declares the DupMAE representation, whose "
            "projection weights belong in this file",
        )
    try:
        keys = ("hidden_size", "vocab_size", "dim", "top_k", "special_ids")
        head = DupMAEHead(
            *(cfg[k] for k in keys),
            activation=cfg.get("activation", "gelu"),
            layer_norm_eps=cfg.get("layer_norm_eps", 1e-5),
            cls_projection=cfg.get("cls_projection", ""),
        )
    except (KeyError, TypeError, ValueError) as e:
        raise HeadFileError(cfg_path, f"invalid configuration: {e}") from None
    try:
        state = load_file(str(weights_path))
    except (OSError, SafetensorError) as e:
        raise HeadFileError(weights_path, f"not a readable safetensors file ({e})") from None
    expected = head.state_dict()
    missing = sorted(set(expected) - set(state))
    unexpected = sorted(set(state) - set(expected))
    if missing or unexpected:
        raise HeadFileError(weights_path, f"tensors missing {missing}, unexpected {unexpected}")
    for k, v in expected.items():
        if tuple(state[k].shape) != tuple(v.shape):
            raise HeadFileError(
                weights_path, f"{k} has shape {tuple(state[k].shape)}, {CONFIG_FILE} implies {tuple(v.shape)}"
            )
    head.load_state_dict(state)
    return head


# ---------------------------------------------------------------------------------------------
# W_cls: the paper learns it in fine-tuning (Eq. 10 appears only with the representation);
# an export starts it from the [CLS] vectors of the data
# ---------------------------------------------------------------------------------------------


def cls_projection_from_vectors(vectors: np.ndarray, dim: int) -> np.ndarray:
    """(dim, d): the identity when ``dim == d``; otherwise the top-``dim`` right singular
    vectors of the UNCENTRED [CLS] matrix, i.e. the rank-``dim`` orthogonal projection that
    best preserves the dot products of these vectors (Eckart-Young).  Signs are fixed (the
    largest-magnitude entry of each row positive) so the result does not depend on LAPACK."""
    vectors = np.asarray(vectors, dtype=np.float64)
    d = vectors.shape[1]
    check_dim(dim, d)
    if dim == d:
        return np.eye(d)
    _, _, vt = np.linalg.svd(vectors, full_matrices=True)
    rows = vt[:dim]
    signs = np.sign(rows[np.arange(dim), np.abs(rows).argmax(1)])
    return rows * signs[:, None]
