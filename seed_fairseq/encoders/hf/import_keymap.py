"""HuggingFace BERT / RoBERTa / XLM-R keys -> fairseq RoBERTa encoder keys (the import).

The mirror of ``keymap.py``: declarative tables per family, one pure
state_dict -> state_dict function that raises on any HF key it cannot place
and on any fairseq key left without a value.  Most entries are renames; a few
carry a transform, named in the table:

* ``vocab``     -- rows in HF id order -> fairseq id order (``vocabulary/tokenizer.py``);
* ``positions`` -- the position table re-indexed to fairseq's offset (fairseq
  position of token ``i`` is ``i + 2``; BERT's is ``i``, RoBERTa's ``i + pad + 1``)
  with the token-type-0 embedding folded in (fairseq has no segments, BERT
  adds type 0 to every token: adding it to every position row instead gives
  the same sum, and keeps the tied output embedding unchanged);
* ``fold``      -- consumed by ``positions`` (the token-type table; only row 0 is used);
* ``tied`` / ``tied_bias`` -- the output projection: must equal the word
  embeddings / the MLM bias (fairseq ties them), checked, not stored.
"""

import re
from dataclasses import dataclass
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from .keymap import UnmappedKeyError

FS = "encoder.sentence_encoder."
HEAD = "encoder.lm_head."

# (HF regex, fairseq template, transform); {0} is the regex's group (layer index or weight/bias)
EMBEDDINGS = [
    (r"embeddings\.word_embeddings\.weight", FS + "embed_tokens.weight", "vocab"),
    (r"embeddings\.position_embeddings\.weight", FS + "embed_positions.weight", "positions"),
    (r"embeddings\.token_type_embeddings\.weight", None, "fold"),
    (r"embeddings\.LayerNorm\.(weight|bias)", FS + "layernorm_embedding.{0}", None),
]
# post-LN Transformer layer: HF sub-module -> fairseq sub-module (the same pairs as the export)
POST_LN_LAYER = [
    ("attention.self.query", "self_attn.q_proj"),
    ("attention.self.key", "self_attn.k_proj"),
    ("attention.self.value", "self_attn.v_proj"),
    ("attention.output.dense", "self_attn.out_proj"),
    ("attention.output.LayerNorm", "self_attn_layer_norm"),
    ("intermediate.dense", "fc1"),
    ("output.dense", "fc2"),
    ("output.LayerNorm", "final_layer_norm"),
]
LAYERS = [
    (r"encoder\.layer\.(\d+)\." + re.escape(hf) + r"\.(weight|bias)", FS + "layers.{0}." + fs + ".{1}", None)
    for hf, fs in POST_LN_LAYER
]
BERT_MLM_HEAD = [
    (r"cls\.predictions\.transform\.dense\.(weight|bias)", HEAD + "dense.{0}", None),
    (r"cls\.predictions\.transform\.LayerNorm\.(weight|bias)", HEAD + "layer_norm.{0}", None),
    (r"cls\.predictions\.bias", HEAD + "bias", "vocab"),
    (r"cls\.predictions\.decoder\.weight", None, "tied"),
    (r"cls\.predictions\.decoder\.bias", None, "tied_bias"),
]
ROBERTA_MLM_HEAD = [
    (r"lm_head\.dense\.(weight|bias)", HEAD + "dense.{0}", None),
    (r"lm_head\.layer_norm\.(weight|bias)", HEAD + "layer_norm.{0}", None),
    (r"lm_head\.bias", HEAD + "bias", "vocab"),
    (r"lm_head\.decoder\.weight", None, "tied"),
    (r"lm_head\.decoder\.bias", None, "tied_bias"),
]
# HF keys deliberately not imported (logged): no fairseq counterpart in a RoBERTa encoder
DROPPED = [
    r"pooler\..*",  # BERT's [CLS] pooler: not used by [CLS]-vector retrieval
    r"cls\.seq_relationship\..*",  # BERT's next-sentence head
    r"embeddings\.position_ids",  # buffers some versions saved
    r"embeddings\.token_type_ids",
]
# names older checkpoints use (transformers renames them the same way on load)
LEGACY_RENAMES = [(r"LayerNorm\.gamma$", "LayerNorm.weight"), (r"LayerNorm\.beta$", "LayerNorm.bias")]


@dataclass(frozen=True)
class Family:
    name: str
    model_prefix: str  # what *ForMaskedLM classes put before the encoder's keys
    mlm_head: List[Tuple[str, Optional[str], Optional[str]]]
    positions: str  # "absolute" (BERT: position i is row i) or "padding" (RoBERTa: row i + pad + 1)


FAMILIES = {
    "bert": Family("bert", "bert.", BERT_MLM_HEAD, "absolute"),
    "roberta": Family("roberta", "roberta.", ROBERTA_MLM_HEAD, "padding"),
    "xlm-roberta": Family("xlm-roberta", "roberta.", ROBERTA_MLM_HEAD, "padding"),
}

HEAD_KEYS = [HEAD + k for k in ("dense.weight", "dense.bias", "layer_norm.weight", "layer_norm.bias", "bias")]


def position_offset(family: Family, pad_id: int) -> int:
    """HF row of the first token's position."""
    return 0 if family.positions == "absolute" else pad_id + 1


def expected_fairseq_keys(num_layers: int) -> List[str]:
    keys = [FS + "embed_tokens.weight", FS + "embed_positions.weight"]
    keys += [FS + f"layernorm_embedding.{p}" for p in ("weight", "bias")]
    for i in range(num_layers):
        for _, fs in POST_LN_LAYER:
            keys += [FS + f"layers.{i}.{fs}.{p}" for p in ("weight", "bias")]
    return keys


def _normalise_keys(state: Dict[str, torch.Tensor], family: Family) -> Dict[str, torch.Tensor]:
    out = {}
    prefixed = any(k.startswith(family.model_prefix + "embeddings.") for k in state)
    for key, value in state.items():
        for pattern, repl in LEGACY_RENAMES:
            key = re.sub(pattern, repl, key)
        if prefixed and key.startswith(family.model_prefix):
            key = key[len(family.model_prefix) :]
        out[key] = value
    return out


def hf_to_fairseq(
    state: Dict[str, torch.Tensor],
    family: Family,
    num_layers: int,
    fairseq_to_hf: Sequence[int],
    pad_id: int,
) -> Tuple[Dict[str, torch.Tensor], List[str]]:
    """Map an HF encoder (+ MLM head) state dict to fairseq ``RobertaEncoder`` keys.

    Returns (fairseq state, HF keys dropped on purpose).  The MLM head is
    included when the HF state has one (all of it; part of one is an error).
    """
    state = _normalise_keys(state, family)
    table = [(re.compile(p), t, x) for p, t, x in EMBEDDINGS + LAYERS + family.mlm_head]
    dropped_re = [re.compile(p) for p in DROPPED]
    perm = torch.as_tensor(list(fairseq_to_hf), dtype=torch.long)

    out, checks, unmapped, dropped = {}, {}, [], []
    type_table = None
    for key, value in state.items():
        for regex, template, transform in table:
            m = regex.fullmatch(key)
            if not m:
                continue
            value = value.detach().clone()
            if transform == "fold":
                type_table = value
            elif transform in ("tied", "tied_bias"):
                checks[transform] = (key, value)
            else:
                if transform == "vocab":
                    if value.size(0) != len(perm):
                        raise UnmappedKeyError(f"{key}: {value.size(0)} rows but the vocabulary has {len(perm)} tokens")
                    value = value[perm]
                out[template.format(*m.groups())] = value
            break
        else:
            if any(r.fullmatch(key) for r in dropped_re):
                dropped.append(key)
            else:
                unmapped.append(key)
    if unmapped:
        raise UnmappedKeyError(f"HuggingFace keys with no fairseq equivalent: {sorted(unmapped)}")
    missing = sorted(set(expected_fairseq_keys(num_layers)) - set(out))
    if missing:
        raise UnmappedKeyError(f"fairseq keys with no value in the HuggingFace model: {missing}")
    head = [k for k in HEAD_KEYS if k in out]
    if head and len(head) != len(HEAD_KEYS):
        raise UnmappedKeyError(f"incomplete MLM head: has {head}, needs {HEAD_KEYS}")

    words = out[FS + "embed_tokens.weight"]
    if "tied" in checks:
        key, value = checks["tied"]
        if not torch.equal(value[perm], words):
            raise UnmappedKeyError(f"{key}: output projection not tied to the word embeddings (fairseq ties them)")
    if "tied_bias" in checks:
        key, value = checks["tied_bias"]
        if HEAD + "bias" not in out or not torch.equal(value[perm], out[HEAD + "bias"]):
            raise UnmappedKeyError(f"{key}: differs from the MLM head's bias (fairseq has one bias)")

    # positions: fairseq row 2 + i = HF row offset + i, token type 0 folded in
    hf_pos = out[FS + "embed_positions.weight"]
    offset = position_offset(family, pad_id)
    fs_pos = torch.zeros(hf_pos.size(0) - offset + 2, hf_pos.size(1), dtype=hf_pos.dtype)
    fs_pos[2:] = hf_pos[offset:]
    if offset >= 2:  # rows fairseq never reads for real tokens (pad, unused): kept for a faithful copy
        fs_pos[:2] = hf_pos[offset - 2 : offset]
    if type_table is not None:
        fs_pos += type_table[0]
    out[FS + "embed_positions.weight"] = fs_pos
    return out, sorted(dropped)


def fairseq_positions_to_hf(fs_pos: torch.Tensor, pad_id: int) -> torch.Tensor:
    """fairseq's position table -> XLM-R's with padding index ``pad_id`` (the export's inverse)."""
    max_positions = fs_pos.size(0) - 2
    hf = torch.zeros(max_positions + pad_id + 1, fs_pos.size(1), dtype=fs_pos.dtype)
    hf[pad_id + 1 :] = fs_pos[2:]
    for k in (1, 2):  # the pad row (and the unused one before it)
        if pad_id + 1 - k >= 0:
            hf[pad_id + 1 - k] = fs_pos[2 - k]
    return hf
