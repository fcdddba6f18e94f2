"""fairseq RoBERTa encoder keys -> HuggingFace (XLM-)RoBERTa keys.

A declarative table plus one pure state_dict -> state_dict function that
raises on any key it cannot place and on any HF key left without a value.
The pre-training-only modules a model class declares (SEED's
``weak_decoder.*``, ...; ``models/bottleneck.py``) are not part of the export
and are dropped explicitly; anything else unknown is an error, never silently
lost.
"""

import re
from typing import Dict, Iterable, Sequence

import torch

FS = "encoder.sentence_encoder."

# (fairseq regex, HF template); {0} is the layer index when the regex has a group.
ENCODER_KEY_MAP = [
    (FS + r"embed_tokens\.weight", "embeddings.word_embeddings.weight"),
    (FS + r"embed_positions\.weight", "embeddings.position_embeddings.weight"),
    (FS + r"layernorm_embedding\.weight", "embeddings.LayerNorm.weight"),
    (FS + r"layernorm_embedding\.bias", "embeddings.LayerNorm.bias"),
]
_LAYER = FS + r"layers\.(\d+)\."
for _fs, _hf in [
    ("self_attn.q_proj", "attention.self.query"),
    ("self_attn.k_proj", "attention.self.key"),
    ("self_attn.v_proj", "attention.self.value"),
    ("self_attn.out_proj", "attention.output.dense"),
    ("self_attn_layer_norm", "attention.output.LayerNorm"),
    ("fc1", "intermediate.dense"),
    ("fc2", "output.dense"),
    ("final_layer_norm", "output.LayerNorm"),
]:
    for _p in ("weight", "bias"):
        ENCODER_KEY_MAP.append((_LAYER + re.escape(f"{_fs}.{_p}"), "encoder.layer.{0}." + f"{_hf}.{_p}"))

# RoBERTa's MLM head; the projection is tied to the word embeddings.
LM_HEAD_KEY_MAP = [
    (r"encoder\.lm_head\.dense\.weight", "lm_head.dense.weight"),
    (r"encoder\.lm_head\.dense\.bias", "lm_head.dense.bias"),
    (r"encoder\.lm_head\.layer_norm\.weight", "lm_head.layer_norm.weight"),
    (r"encoder\.lm_head\.layer_norm\.bias", "lm_head.layer_norm.bias"),
    (r"encoder\.lm_head\.weight", "lm_head.decoder.weight"),
    (r"encoder\.lm_head\.bias", "lm_head.bias"),
]

# fairseq keys that are deliberately not exported (besides the model's
# pre-training-only prefixes, passed in by the caller).
DROPPED = [
    r"encoder\.sentence_encoder\.version",
    r".*\._float_tensor",
]
LM_HEAD_DROPPED = [r"encoder\.lm_head\..*"]


class UnmappedKeyError(KeyError):
    pass


def expected_hf_keys(num_layers: int, with_lm_head: bool, prefix: str) -> Iterable[str]:
    for pattern, template in ENCODER_KEY_MAP:
        if "(" in pattern:
            for i in range(num_layers):
                yield prefix + template.format(i)
        else:
            yield prefix + template
    if with_lm_head:
        for _, template in LM_HEAD_KEY_MAP:
            yield template


def fairseq_to_hf(
    state: Dict[str, torch.Tensor],
    num_layers: int,
    with_lm_head: bool = False,
    dropped_prefixes: Sequence[str] = (),
) -> Dict[str, torch.Tensor]:
    """Map a fairseq ``seed_encoder``/``roberta`` state dict to HF RoBERTa names.

    ``with_lm_head`` gives ``XLMRobertaForMaskedLM`` names (``roberta.`` prefix
    plus ``lm_head.*``); otherwise ``XLMRobertaModel`` names.  Keys under
    ``dropped_prefixes`` (the model's pre-training-only modules) are left out.  Token-type
    embeddings (fairseq has no segments: zeros, the identity for one type) and
    the pooler (not part of SEED-Encoder: zeros, so that a pooler output can
    never be mistaken for a trained one) are added for the base model.
    """
    prefix = "roberta." if with_lm_head else ""
    table = [(re.compile(p), prefix + t) for p, t in ENCODER_KEY_MAP]
    if with_lm_head:
        table += [(re.compile(p), t) for p, t in LM_HEAD_KEY_MAP]
    dropped = [re.compile(p) for p in DROPPED + ([] if with_lm_head else LM_HEAD_DROPPED)]
    dropped += [re.compile(re.escape(p) + ".*") for p in dropped_prefixes]

    out = {}
    unmapped = []
    for key, value in state.items():
        for regex, template in table:
            m = regex.fullmatch(key)
            if m:
                out[template.format(*m.groups())] = value.detach().clone()
                break
        else:
            if not any(r.fullmatch(key) for r in dropped):
                unmapped.append(key)
    if unmapped:
        raise UnmappedKeyError(f"fairseq keys with no HuggingFace equivalent: {sorted(unmapped)}")
    missing = sorted(set(expected_hf_keys(num_layers, with_lm_head, prefix)) - set(out))
    if missing:
        raise UnmappedKeyError(f"HuggingFace keys with no value in the checkpoint: {missing}")

    hidden = out[prefix + "embeddings.word_embeddings.weight"].size(1)
    dtype = out[prefix + "embeddings.word_embeddings.weight"].dtype
    out[prefix + "embeddings.token_type_embeddings.weight"] = torch.zeros(1, hidden, dtype=dtype)
    if with_lm_head:
        out["lm_head.decoder.bias"] = out["lm_head.bias"]
    else:
        out["pooler.dense.weight"] = torch.zeros(hidden, hidden, dtype=dtype)
        out["pooler.dense.bias"] = torch.zeros(hidden, dtype=dtype)
    return out
