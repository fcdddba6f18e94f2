"""An export checked against its checkpoint: the HuggingFace model's MLM logits and the sentence-transformers
representation against the fairseq model's on the same texts."""

from pathlib import Path
from typing import List, Union

import torch

from ...base.representation import Representation
from .representation import ExportError
from .texts import HFTexts, SpmTexts, length_batches


def _fairseq_ids(batch, texts_source: Union[SpmTexts, HFTexts]) -> torch.Tensor:
    """The tokenizer's ids of ``batch`` in the fairseq dictionary's order."""
    if texts_source.fairseq_to_hf is None:
        return batch["input_ids"]
    return torch.as_tensor(texts_source.hf_to_fairseq)[batch["input_ids"]]


def verify_representation(
    fairseq_model, folder: Path, texts_source: Union[SpmTexts, HFTexts], texts: List[str], max_len: int,
    representation: Representation, atol: float,
) -> float:  # fmt: skip
    """``SentenceTransformer`` on the written ``folder`` against the vector fairseq computes for the
    same texts (its features pooled as ``representation`` says, normalised for cosine, with
    ``models.bottleneck.pool``, what pre-training and its validation read); raises ExportError."""
    import torch.nn.functional as F
    from sentence_transformers import SentenceTransformer

    from ...pretrain.models.bottleneck import pool

    st = SentenceTransformer(str(folder), device="cpu", local_files_only=True)
    max_len = representation.seq_length(max_len)  # what the written sentence_bert_config.json keeps
    diff = 0.0
    for group in length_batches(st.tokenizer, texts, max_len):
        batch = st.tokenizer(group, truncation=True, max_length=max_len, padding=True, return_tensors="pt")
        fs_ids = _fairseq_ids(batch, texts_source)
        with torch.no_grad():
            features, _ = fairseq_model(fs_ids, features_only=True)
            ours = pool(features, ~batch["attention_mask"].bool(), representation.pooling)
            if representation.normalize:
                ours = F.normalize(ours, p=2, dim=-1)
            theirs = st.encode(group, convert_to_tensor=True, batch_size=len(group), show_progress_bar=False)
        diff = max(diff, (ours - theirs.to(ours.dtype)).abs().max().item())
    if not diff <= atol:
        raise ExportError(
            f"SentenceTransformer's vectors ({representation.describe()}) differ from fairseq's: max abs diff "
            f"{diff:.3g} > {atol:g}"
        )
    return diff


def _max_abs_diff(a, b, mask):
    return (a - b).abs()[mask.bool()].max().item()


def verify(
    fairseq_model,
    hf_model,
    tokenizer,
    texts_source: Union[SpmTexts, HFTexts],
    texts: List[str],
    max_len: int,
    atol: float,
    with_lm_head: bool,
) -> float:
    """Token ids and outputs of fairseq vs HF on the same strings; raises ExportError."""
    for text in texts:
        ref = texts_source.reference_ids(text, max_len)
        got = tokenizer(text, truncation=True, max_length=max_len)["input_ids"]
        if ref != got:
            raise ExportError(f"tokenizer ids differ from fairseq's for {text[:60]!r}: {got[:12]} vs {ref[:12]}")
    diff = 0.0
    for group in length_batches(tokenizer, texts, max_len):
        batch = tokenizer(group, truncation=True, max_length=max_len, padding=True, return_tensors="pt")
        fs_ids = _fairseq_ids(batch, texts_source)
        with torch.no_grad():
            fs_features, _ = fairseq_model(fs_ids, features_only=True)
            hf_out = hf_model(**batch, output_hidden_states=True)
            diff = max(diff, _max_abs_diff(fs_features, hf_out.hidden_states[-1], batch["attention_mask"]))
            if with_lm_head:
                fs_logits, _ = fairseq_model(fs_ids)
                hf_logits = hf_out.logits
                if texts_source.fairseq_to_hf is not None:
                    hf_logits = hf_logits[..., texts_source.fairseq_to_hf]
                diff = max(diff, _max_abs_diff(fs_logits, hf_logits, batch["attention_mask"]))
    if not diff <= atol:
        raise ExportError(f"HF outputs differ from fairseq's: max abs diff {diff:.3g} > {atol:g}")
    return diff
