"""The DupMAE part of the HuggingFace export: the head files beside the encoder folder.

What is exported (``head.py`` documents the files):

* the vocabulary projection = the checkpoint's MLM head (``encoder.lm_head.*``),
  the "linear projection unit" DupMAE's bag-of-words decoder was pre-trained
  through (a checkpoint without it is refused, naming the file and the keys);
* ``W_cls`` (d x d'): the paper introduces it only with the representation
  (Eq. 10) -- nothing trains it in pre-training, and fine-tuning (Eq. 13) learns
  it with the encoder.  The export starts it from the data: the identity when
  d' = d, otherwise the orthogonal projection onto the top-d' singular
  directions of the UNCENTRED [CLS] vectors of up to 2048 texts of the data's
  ``valid`` split -- the rank-d' map that best preserves their dot products, so
  the exported representation is already usable before fine-tuning.

:data:`EXPORTER` is the ``dupmae`` exporter of ``seed_fairseq.encoders.hf.representation`` (found through
the ``seed_fairseq.exporters`` entry point).  Checked before the folder appears: the head, run on the exported encoder's
outputs, gives the dense and vocabulary vectors that the fairseq model computes
with its own MLM head (plain logits, plain max), on real text and edge cases.
"""

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Optional, Sequence, Tuple

import numpy as np
import torch

from ...base.vocabulary.dictionary import is_ordinary
from ..hf import representation
from ..hf.representation import ExportError, ExportJob
from .head import DEFAULT_DIM, DEFAULT_TOP_K, DupMAEHead, check_dim, check_top_k, cls_projection_from_vectors

LM_HEAD_KEYS = {
    "dense.weight": "encoder.lm_head.dense.weight",
    "dense.bias": "encoder.lm_head.dense.bias",
    "layer_norm.weight": "encoder.lm_head.layer_norm.weight",
    "layer_norm.bias": "encoder.lm_head.layer_norm.bias",
    "weight": "encoder.lm_head.weight",
    "bias": "encoder.lm_head.bias",
}
PROJECTION_TEXTS = 2048

logger = logging.getLogger("seed_fairseq.hf")


def default_representation(cfg: dict) -> str:
    """``dupmae`` for a checkpoint pre-trained with the DupMAE criterion, else ``cls``."""
    return "dupmae" if (cfg.get("criterion") or {}).get("_name") == "dupmae_pretrain" else "cls"


def special_ids(dictionary) -> list:
    """The ids that are not ordinary tokens (``vocabulary.dictionary.is_ordinary``): the specials and <mask>."""
    mask = dictionary.index("<mask>")
    return [i for i in range(len(dictionary)) if not is_ordinary(i, dictionary.nspecial, mask)]


def check_options(
    checkpoint, state: dict, model_cfg: dict, dictionary, dim: Optional[int], top_k: Optional[int]
) -> Tuple[int, int]:
    """(d', k) with their defaults; ValueError naming the option or the checkpoint file."""
    missing = [k for k in LM_HEAD_KEYS.values() if k not in state["model"]]
    if missing:
        raise ValueError(
            f"{checkpoint}: has no vocabulary projection weights ({', '.join(missing)}): the DupMAE "
            "representation is built from the MLM head the checkpoint was pre-trained with"
        )
    hidden = int(model_cfg["encoder_embed_dim"])
    n_special = len(special_ids(dictionary))
    dim = check_dim(min(DEFAULT_DIM, hidden) if dim is None else dim, hidden)
    top_k = check_top_k(
        min(DEFAULT_TOP_K, len(dictionary) - n_special) if top_k is None else top_k, len(dictionary), n_special
    )
    return dim, top_k


def _valid_tokens(data, dictionary, max_len: int, n: int):
    """Token lists ``<s> line`` of the first ``n`` lines of the data's valid split (fairseq ids)."""
    from fairseq.data import data_utils

    valid = data_utils.load_indexed_dataset(str(Path(data) / "valid"), None)
    if valid is None:
        return []
    out = []
    for i in range(min(n, len(valid))):
        ids = [dictionary.bos()] + [int(t) for t in valid[i]]
        if len(ids) > max_len:
            ids = ids[: max_len - 1] + [dictionary.eos()]
        out.append(ids)
    return out


def _batches(token_lists, pad: int, size: int = 64):
    order = sorted(range(len(token_lists)), key=lambda i: len(token_lists[i]))
    for start in range(0, len(order), size):
        chunk = [token_lists[i] for i in order[start : start + size]]
        tokens = torch.full((len(chunk), max(map(len, chunk))), pad, dtype=torch.long)
        for r, ids in enumerate(chunk):
            tokens[r, : len(ids)] = torch.tensor(ids)
        yield tokens


def build_head(
    fs_model,
    state: dict,
    dictionary,
    data,
    max_len: int,
    dim: int,
    top_k: int,
    activation: str,
    *,
    layer_norm_eps: float,
    hf_to_fairseq: Optional[Sequence[int]] = None,
) -> DupMAEHead:
    """The head: the checkpoint's MLM head + W_cls from the [CLS] vectors of the data.
    ``activation`` (HF name) and ``layer_norm_eps`` are the encoder's, as the checkpoint records
    them (``ExportJob.architecture``): its MLM head computes with them (BERT's eps is 1e-12).
    ``hf_to_fairseq`` (``ExportJob.hf_to_fairseq``): the head reads and writes the exported
    tokenizer's ids, so its vocabulary rows and special ids go to that order."""
    token_lists = _valid_tokens(data, dictionary, max_len, PROJECTION_TEXTS)
    hidden = fs_model.encoder.lm_head.dense.weight.size(1)
    if dim == hidden:
        projection, how = np.eye(hidden), "export: identity (d' = d)"
    else:
        vectors = []
        with torch.no_grad():
            for tokens in _batches(token_lists, dictionary.pad()):
                vectors.append(fs_model(tokens, features_only=True)[0][:, 0].double().numpy())
        if not vectors:
            raise ValueError(f"{Path(data) / 'valid'}: no text to compute the [CLS] projection from")
        matrix = np.concatenate(vectors)
        projection = cls_projection_from_vectors(matrix, dim)
        how = (
            f"export: orthogonal projection onto the top {dim} right singular vectors of the uncentred "
            f"[CLS] vectors of {len(matrix)} texts of {Path(data).resolve() / 'valid'}"
        )
    specials = special_ids(dictionary)
    weights = {k: state["model"][v].detach().float().clone() for k, v in LM_HEAD_KEYS.items()}
    if hf_to_fairseq is not None:
        order = torch.as_tensor(list(hf_to_fairseq), dtype=torch.long)  # row h of the head = fairseq row order[h]
        weights["weight"], weights["bias"] = weights["weight"][order], weights["bias"][order]
        to_hf = torch.empty_like(order)
        to_hf[order] = torch.arange(len(order))
        specials = [int(to_hf[i]) for i in specials]
    head = DupMAEHead(
        hidden,
        len(dictionary),
        dim,
        top_k,
        specials,
        activation=activation,
        layer_norm_eps=layer_norm_eps,
        cls_projection=how,
    )
    weights["cls_projection.weight"] = torch.from_numpy(projection).float()
    head.load_state_dict(weights)
    return head.eval()


def fairseq_reference(
    fs_model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    projection: torch.Tensor,
    special: Sequence[int],
    hf_to_fairseq: Optional[Sequence[int]] = None,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(dense, mu) the plain way: the fairseq model's features, its MLM head's full logits, a masked max.
    ``input_ids``, ``special`` and mu's columns are the tokenizer's ids (``hf_to_fairseq``: see :func:`build_head`)."""
    order = None if hf_to_fairseq is None else torch.as_tensor(list(hf_to_fairseq), dtype=torch.long)
    with torch.no_grad():
        features, _ = fs_model(input_ids if order is None else order[input_ids], features_only=True)
        logits = fs_model.encoder.lm_head(features)  # (batch, T, vocab)
        if order is not None:
            logits = logits[..., order]  # columns in the tokenizer's id order
        pool = attention_mask.bool() & ~torch.isin(input_ids, torch.tensor(list(special)))
        mu = logits.masked_fill(~pool.unsqueeze(-1), float("-inf")).amax(1)
        mu = torch.where(pool.any(1, keepdim=True), mu, torch.zeros_like(mu))
        return features[:, 0] @ projection.t(), mu


def head_outputs(
    head: DupMAEHead, token_embeddings: torch.Tensor, attention_mask: torch.Tensor, input_ids: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor]:
    with torch.no_grad():
        dense = head.cls_projection(token_embeddings[:, 0])
        mu = head.vocabulary_vector(token_embeddings, head.pool_positions(input_ids, attention_mask))
        return dense, mu


def max_difference(
    reference: Tuple[torch.Tensor, torch.Tensor],
    ours: Tuple[torch.Tensor, torch.Tensor],
    attention_mask: torch.Tensor,
) -> float:
    (d_ref, mu_ref), (d_ours, mu_ours) = reference, ours
    return max((d_ref - d_ours).abs().max().item(), (mu_ref - mu_ours).abs().max().item())


def verify_head(
    fs_model, head: DupMAEHead, token_embeddings, batch, atol: float, hf_to_fairseq: Optional[Sequence[int]] = None
) -> float:
    """The head on the exported encoder's outputs vs the fairseq model's own MLM head; :class:`ExportError`."""
    ids, mask = batch["input_ids"], batch["attention_mask"]
    projection = head.cls_projection.weight.detach()
    reference = fairseq_reference(fs_model, ids, mask, projection, head.head_config["special_ids"], hf_to_fairseq)
    ours = head_outputs(head, token_embeddings, mask, ids)
    diff = max_difference(reference, ours, mask)
    # logits reach tens; the encoder's features agree to ``atol``
    limit = atol * max(1.0, reference[1].abs().max().item())
    if not diff <= limit:
        raise ExportError(f"DupMAE head outputs differ from fairseq's: max abs diff {diff:.3g} > {limit:g}")
    return diff


def card(head: DupMAEHead) -> str:
    c = head.head_config
    return f"""
## DupMAE representation

This folder also holds DupMAE's own retrieval representation (Xiao & Liu, "RetroMAE v2: Duplex
Masked Auto-Encoder", Eq. 10-12): `dupmae.json` and `dupmae_head.safetensors`, read by
`seed_fairseq.encoders.dupmae.head.load_head` and used by `examples/retrieval/{{evaluate,finetune}}.py`
(`--representation dupmae`, the default for this folder):

* dense: the [CLS] vector projected to d' = {c["dim"]} dimensions; the projection: {c["cls_projection"]};
* sparse: the top k = {c["top_k"]} entries of the MLM head's vocabulary logits max-pooled over the ordinary
  tokens, kept at their vocabulary indices;
* score: dense dot product + sparse dot product over the shared indices.

`SentenceTransformer` on this folder alone gives the model's own pooled vector (`--representation own`).
"""


@dataclass
class BuiltHead:
    """The head of one export, checked against the in-memory encoder; written and re-checked by the export."""

    head: DupMAEHead
    job: ExportJob

    def _batch(self):
        j = self.job
        return j.tokenizer(j.texts, truncation=True, max_length=j.max_len, padding=True, return_tensors="pt")

    def check_in_memory(self) -> float:
        batch = self._batch()
        with torch.no_grad():
            token_embeddings = self.job.hf_model(**batch).last_hidden_state
        return verify_head(self.job.fs_model, self.head, token_embeddings, batch, self.job.atol, self.job.hf_to_fairseq)

    def save(self, folder: Path) -> None:
        self.head.save(folder)

    def card(self) -> str:
        return card(self.head)

    def verify(self, folder: Path) -> None:
        """The head files, reloaded the way the retrieval tools load them."""
        from ..retrieval.search import load_model  # faiss and scipy: the [retrieval] extra
        from .retriever import dupmae_head

        batch = self._batch()
        st = load_model(str(folder), device="cpu", representation="dupmae")
        head = dupmae_head(st).eval()
        inputs = {"input_ids": batch["input_ids"], "attention_mask": batch["attention_mask"]}
        with torch.no_grad():
            token_embeddings = st[0](inputs)["token_embeddings"]
        verify_head(self.job.fs_model, head, token_embeddings, batch, self.job.atol, self.job.hf_to_fairseq)


class DupMAEExporter(representation.Exporter):
    name = "dupmae"
    label = "DupMAE"
    options = {"dupmae_dim": "--dupmae-dim", "dupmae_top_k": "--dupmae-top-k"}

    def refuse(self, with_lm_head: bool) -> Optional[str]:
        if with_lm_head:
            return (
                "--representation dupmae cannot be combined with --mlm-head: the DupMAE head goes beside "
                "the sentence-transformers encoder folder (it holds the MLM head itself)"
            )
        return None

    def is_default(self, cfg: dict) -> bool:
        return default_representation(cfg) == "dupmae"

    def check(self, checkpoint, state, model_cfg, dictionary, options) -> dict:
        dim, top_k = check_options(
            checkpoint, state, model_cfg, dictionary, options.get("dupmae_dim"), options.get("dupmae_top_k")
        )
        return {"dim": dim, "top_k": top_k}

    def build(self, job: ExportJob, options: dict) -> BuiltHead:
        dim, top_k = options["dim"], options["top_k"]
        head = build_head(
            job.fs_model,
            job.state,
            job.dictionary,
            job.data,
            job.max_len,
            dim,
            top_k,
            job.activation,
            layer_norm_eps=job.architecture.layer_norm_eps,
            hf_to_fairseq=job.hf_to_fairseq,
        )
        built = BuiltHead(head, job)
        head_diff = built.check_in_memory()
        logger.info(f"DupMAE head (d'={dim}, k={top_k}) vs fairseq: max abs diff {head_diff:.2e}")
        return built


EXPORTER = representation.register(DupMAEExporter())
