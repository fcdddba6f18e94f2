"""The model card (``README.md``) of an export: which objective made the encoder, and how."""

from typing import TYPE_CHECKING, Optional, Union

if TYPE_CHECKING:
    from ...base.representation import Representation
    from .texts import HFTexts, SpmTexts


def describe_objective(cfg: dict, model_cfg: dict) -> tuple:
    """(title, description, tag) of the checkpoint's pre-training objective: the
    description its task class declares (``seed_fairseq.base.objectives``)."""
    from ...pretrain.tasks.registry import objective_for

    task = (cfg.get("task") or {}).get("_name") or ""
    d = objective_for(task, model_cfg)
    if d is None:
        return "Bottleneck encoder", f"the plugin's `{task or '?'}` objective", "bottleneck-pretraining"
    return d.title, d.card_text, d.tag


def model_card(
    cfg: dict,
    model_cfg: dict,
    state: dict,
    texts_source: Union["SpmTexts", "HFTexts"],
    diff: float,
    with_lm_head: bool,
    representation: Optional["Representation"] = None,
) -> str:
    t, o = cfg.get("task", {}), cfg.get("optimization", {})
    crit, ds = cfg.get("criterion", {}), cfg.get("dataset", {})
    hist = state.get("optimizer_history") or [{}]
    workers = cfg.get("distributed_training", {}).get("distributed_world_size")
    title, what, tag = describe_objective(cfg, model_cfg)
    weights = {k[: -len("_weight")]: v for k, v in crit.items() if k.endswith("_weight")}
    rows = {
        "objective (fairseq task / criterion)": f"{t.get('_name', '?')} / {crit.get('_name', '?')}",
        "architecture (fairseq)": model_cfg.get("_name") or model_cfg.get("arch"),
        "encoder": f"{model_cfg['encoder_layers']} layers, hidden {model_cfg['encoder_embed_dim']}, "
        f"FFN {model_cfg['encoder_ffn_embed_dim']}, {model_cfg['encoder_attention_heads']} heads",
        "decoder (dropped)": f"{model_cfg.get('decoder_layers', 0)} layers"
        + (
            f", attention window {model_cfg['decoder_attention_window']}"
            if "decoder_attention_window" in model_cfg
            else ""
        ),
        "loss weights": ", ".join(f"{k} {v}" for k, v in weights.items()) or "-",
        "updates": hist[-1].get("num_updates", "?"),
        "peak lr": o.get("lr"),
        "batch": f"{ds.get('batch_size')} sequences x {workers} workers x update-freq {o.get('update_freq')}",
        "tokens per sample": t.get("tokens_per_sample"),
        "sample break mode": t.get("sample_break_mode"),
        "mask prob": t.get("mask_prob"),
        "tokenizer": texts_source.describe(),
    }
    table = "\n".join(f"| {k} | {v} |" for k, v in rows.items())
    head = "XLMRobertaForMaskedLM (with the MLM head)" if with_lm_head else "XLMRobertaModel (encoder only)"
    if representation is None or representation.pooling == "cls" and not representation.normalize:
        use = (
            "Use the [CLS] vector (`last_hidden_state[:, 0]`) with dot product; `SentenceTransformer` on this "
            "folder does exactly that (CLS pooling, no normalisation)."
        )
    else:
        use = (
            f"The model's representation, which it was pre-trained and validated on: {representation.describe()} "
            f"(`--bottleneck-pooling {representation.pooling} --retrieval-similarity {representation.similarity}`); "
            "`SentenceTransformer` on this folder computes exactly that."
        )
    return f"""---
library_name: transformers
tags: [{tag}, dense-retrieval, fairseq, sentence-transformers]
license: mit
---

# {title} (exported from fairseq)

A RoBERTa-style encoder pre-trained with {what}, trained with `seed_fairseq`. Exported as
**{head}**; the pre-training-only heads (decoders) are not included. {use} The pooler is not
part of the pre-training and is exported as zeros.

Checked at export: tokenizer ids equal fairseq's, and HF outputs equal fairseq's
(max abs diff {diff:.2e}, fp32).

| training configuration | |
| --- | --- |
{table}
"""
