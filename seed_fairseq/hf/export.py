"""Export a seed_pretrain (or encoder-only) checkpoint to HuggingFace transformers.

The encoder maps exactly onto ``XLMRobertaModel`` (RoBERTa architecture:
learned positions with fairseq's padding offset, embedding LayerNorm, post-LN,
no segments); the tokenizer reproduces pre-training's normalisation and ids.
Everything is checked numerically against fairseq BEFORE the output folder
appears: the folder is assembled under a temporary name, reloaded with
``AutoModel``/``AutoTokenizer``/``SentenceTransformer``, compared again, and
only then renamed into place.  ``--force`` on an earlier export replaces
exactly the files its record lists; anything else in the folder stays
(``fileio.staged_output``).
"""

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Tuple, Union

import torch

from ..checkpoint import CheckpointError, check_dictionary, plain_config, read_checkpoint
from ..fileio import OutputError, PathLike, owned_output, staged_output, write_output_record
from ..vocabulary.dictionary import dictionary_sha256
from ..vocabulary.tokenizer import RECORD as VOCAB_RECORD
from ..vocabulary.tokenizer import (
    TOKENIZER_DIR,
    TokenizerError,
    fairseq_to_hf_from_record,
    load_fast_tokenizer,
    vocab_from_tokenizer,
)
from ..vocabulary.tokenizer import load_record as load_vocab_record
from .import_keymap import fairseq_positions_to_hf
from .keymap import fairseq_to_hf
from .tokenizer import build_tokenizer, fairseq_encode

if TYPE_CHECKING:
    from fairseq.data import Dictionary
    from transformers import PreTrainedTokenizerFast, XLMRobertaConfig

logger = logging.getLogger("seed_fairseq.hf")

# Edge cases every export is checked on, besides real text from the data.
CHECK_STRINGS = [
    "Café au lait in Zürich costs 4.50 CHF — naïve prices!",
    "UPPER CASE and MiXeD CaSe",
    "digits 0123456789 and 3.14159, 1e-6",
    "unicode: ﬁ ℌ İstanbul 北京 Ωμέγα 🙂 \u2028 tabs\tand  spaces",
    "",
]


class ExportError(ValueError):
    pass


# written last into every export: the folder is this tool's own, and these its files
# (see fileio.staged_output)
EXPORT_RECORD = "seed_fairseq_export.json"
TOOL = "examples/export_to_hf.py"


def _architecture_problems(m):
    """Why an encoder config has no exact XLMRobertaModel equivalent ([] if it has one)."""
    want = {
        "encoder_normalize_before": False,  # HF RoBERTa is post-LN
        "layernorm_embedding": True,
        "no_scale_embedding": True,
        "encoder_learned_pos": True,
        "no_token_positional_embeddings": False,
        "untie_weights_roberta": False,
        "adaptive_input": False,
    }
    problems = [f"{k}={m.get(k)!r} (HF RoBERTa needs {v!r})" for k, v in want.items() if m.get(k, v) != v]
    if m.get("activation_fn", "gelu") not in ACTIVATIONS:
        problems.append(f"activation_fn={m.get('activation_fn')!r} (supported: {sorted(ACTIVATIONS)})")
    if m.get("encoder_layers_to_keep"):
        problems.append("encoder_layers_to_keep is set (prune the checkpoint first)")
    for k in ("quant_noise_pq", "quant_noise_scalar"):
        if m.get(k, 0):
            problems.append(f"{k}={m.get(k)} (quantisation noise)")
    return problems


# fairseq activation -> HF hidden_act computing the same function
ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "gelu_accurate": "gelu_new", "tanh": "tanh"}


class SpmTexts:
    """Data folders of ``preprocess.build`` with sentencepiece: the export builds a fast
    tokenizer reproducing normalisation + spm + the XLM-R id rule (fairseq ids = HF ids)."""

    def __init__(self, data, dictionary, sp, record):
        self.data, self.dictionary, self.sp, self.record = Path(data), dictionary, sp, record
        self.fairseq_to_hf = None  # the identity
        self.pad = dictionary.pad()
        self.bos, self.eos = dictionary.bos(), dictionary.eos()

    def reference_ids(self, text: str, max_len: int) -> List[int]:
        return fairseq_encode(text, self.sp, self.dictionary, self.record, max_length=max_len)

    def decode(self, fairseq_ids) -> Optional[str]:
        from preprocess.vocab import fairseq_to_spm_id

        ids = [fairseq_to_spm_id(int(t)) for t in fairseq_ids if int(t) > 3]
        return self.sp.decode(ids) if ids else None

    def tokenizer(self, max_len: int) -> "PreTrainedTokenizerFast":
        return build_tokenizer(self.data / "spm.model", self.record, max_len)

    def describe(self) -> str:
        return ", ".join(self.record.get("steps", []))


class HFTexts:
    """Data (or import) folders whose ids come from a HuggingFace tokenizer (``--tokenizer``,
    ``examples/import_from_hf.py``): the export writes that same tokenizer and puts the
    embedding rows back into its id order (``vocabulary/tokenizer.py``)."""

    def __init__(self, data, tok, vocab):
        self.data, self.tok, self.vocab = Path(data), tok, vocab
        self.fairseq_to_hf = vocab.fairseq_to_hf
        self.hf_to_fairseq = vocab.hf_to_fairseq
        self.pad, self.bos, self.eos = (vocab.fairseq_to_hf[i] for i in (1, 0, 2))
        self.record = {}

    def reference_ids(self, text: str, max_len: int) -> List[int]:
        return self.tok(text, truncation=True, max_length=max_len)["input_ids"]

    def decode(self, fairseq_ids) -> Optional[str]:
        ids = [self.fairseq_to_hf[int(t)] for t in fairseq_ids if int(t) > 3]
        return self.tok.decode(ids, skip_special_tokens=True) if ids else None

    def tokenizer(self, max_len: int) -> "PreTrainedTokenizerFast":
        tok = load_fast_tokenizer(self.data / TOKENIZER_DIR)
        tok.model_max_length = max_len
        return tok

    def describe(self) -> str:
        return f"the model's own tokenizer ({type(self.tok).__name__})"


def _hf_texts(data, dictionary, rec):
    """The HF tokenizer of a data/import folder, checked against its record and dict.txt."""
    try:
        tok = load_fast_tokenizer(data / TOKENIZER_DIR)
        vocab = vocab_from_tokenizer(tok, data / TOKENIZER_DIR)
    except TokenizerError as e:
        raise ExportError(str(e)) from e
    if vocab.sha256 != rec.get("tokenizer_sha256") or vocab.fairseq_to_hf != fairseq_to_hf_from_record(rec):
        raise ExportError(f"{data / TOKENIZER_DIR}: is not the tokenizer {data / VOCAB_RECORD} records")
    if dictionary.symbols[4:] != vocab.symbols[4:]:
        raise ExportError(f"{data / 'dict.txt'}: does not list the tokenizer's vocabulary in its id order")
    return HFTexts(data, tok, vocab)


def load_inputs(
    checkpoint: PathLike, data: PathLike, trust: bool = False
) -> Tuple[dict, dict, dict, "Dictionary", Union[SpmTexts, HFTexts], Tuple[str, ...]]:
    """Checkpoint, its model config, the data's dictionary and texts (how raw text becomes
    ids), and the state-dict prefixes that are not exported (the pre-training-only modules).
    The checkpoint is loaded without running code from it unless ``trust``
    (``--trust-checkpoint``; ``checkpoint.load_torch_file``)."""
    from fairseq.data import Dictionary

    import seed_fairseq  # noqa: F401  (registers the model; fairseq's checkpoint loading without code)

    checkpoint, data = Path(checkpoint), Path(data)
    try:
        hf_record = load_vocab_record(data)
    except TokenizerError as e:
        raise ExportError(str(e)) from e
    needed = ("dict.txt", TOKENIZER_DIR) if hf_record else ("dict.txt", "spm.model", "preprocess.json")
    for name in needed:
        if not (data / name).exists():
            raise ExportError(
                f"{data / name}: not found; --data must be the folder written by python -m preprocess.build "
                "(or by examples/import_from_hf.py)"
            )
    try:
        state = read_checkpoint(checkpoint, arg_overrides={"data": str(data)}, trust=trust)
    except CheckpointError as e:
        raise ExportError(str(e)) from e
    cfg = plain_config(state.get("cfg") or {})
    model_cfg = cfg.get("model") or {}
    name = model_cfg.get("_name") or model_cfg.get("arch")
    from fairseq.models import ARCH_MODEL_NAME_REGISTRY

    from ..models import pretraining_model_class

    model_class = pretraining_model_class(name)
    if model_class is None and ARCH_MODEL_NAME_REGISTRY.get(name, name) != "roberta":
        raise ExportError(
            f"{checkpoint}: model {name!r} is neither one of this plugin's pre-training models nor a roberta encoder"
        )
    # what the export leaves out: the modules the model class declares pre-training-only
    dropped = tuple(model_class.pretraining_only_prefixes) if model_class else ()
    problems = _architecture_problems(model_cfg)
    if problems:
        raise ExportError(f"{checkpoint}: arch {name!r} has no exact HuggingFace equivalent: " + "; ".join(problems))

    dictionary = Dictionary.load(str(data / "dict.txt"))
    dictionary.add_symbol("<mask>")
    rows = state["model"]["encoder.sentence_encoder.embed_tokens.weight"].size(0)
    if rows != len(dictionary):
        raise ExportError(
            f"{data / 'dict.txt'}: gives {len(dictionary)} symbols (with specials and <mask>) but the "
            f"checkpoint's embedding has {rows} rows: not the data this model was trained on"
        )
    record_all = json.loads((data / "preprocess.json").read_text()) if (data / "preprocess.json").is_file() else {}
    recorded = (record_all.get("fairseq_dictionary") or {}).get("sha256")
    if recorded and recorded != dictionary_sha256(data / "dict.txt"):
        raise ExportError(
            f"{data / 'dict.txt'}: does not match the dictionary {data / 'preprocess.json'} "
            "records (the folder was changed after it was built)"
        )
    try:
        check_dictionary(state, checkpoint, data / "dict.txt", len(dictionary))
    except CheckpointError as e:
        raise ExportError(str(e)) from e
    if hf_record:
        return state, cfg, model_cfg, dictionary, _hf_texts(data, dictionary, hf_record), dropped
    import sentencepiece as spm

    sp = spm.SentencePieceProcessor(model_file=str(data / "spm.model"))
    expected = [sp.id_to_piece(i) for i in range(3, sp.get_piece_size())]
    if dictionary.symbols[4 : 4 + len(expected)] != expected or len(dictionary) != len(expected) + 5:
        raise ExportError(
            f"{data / 'spm.model'}: its pieces do not match {data / 'dict.txt'} under the XLM-R id rule "
            f"(spm has {sp.get_piece_size()} pieces, the dictionary {len(dictionary)} symbols)"
        )
    return state, cfg, model_cfg, dictionary, SpmTexts(data, dictionary, sp, record_all["normalization"]), dropped


def hf_config(
    model_cfg: dict, vocab_size: int, with_lm_head: bool, pad: int = 1, bos: int = 0, eos: int = 2
) -> "XLMRobertaConfig":
    from transformers import XLMRobertaConfig

    return XLMRobertaConfig(
        vocab_size=vocab_size,
        hidden_size=model_cfg["encoder_embed_dim"],
        num_hidden_layers=model_cfg["encoder_layers"],
        num_attention_heads=model_cfg["encoder_attention_heads"],
        intermediate_size=model_cfg["encoder_ffn_embed_dim"],
        hidden_act=ACTIVATIONS[model_cfg.get("activation_fn", "gelu")],
        hidden_dropout_prob=model_cfg.get("dropout", 0.1),
        attention_probs_dropout_prob=model_cfg.get("attention_dropout", 0.1),
        # positions start after the padding index, in fairseq (1) and in XLM-R (pad)
        max_position_embeddings=model_cfg["max_positions"] + pad + 1,
        type_vocab_size=1,
        layer_norm_eps=model_cfg.get("encoder_layer_norm_eps") or 1e-5,
        pad_token_id=pad,
        bos_token_id=bos,
        eos_token_id=eos,
        architectures=["XLMRobertaForMaskedLM" if with_lm_head else "XLMRobertaModel"],
    )


def _check_texts(texts_source, data, n=24):
    """Real text: the first lines of the data's valid split, decoded, plus edge cases."""
    from fairseq.data import data_utils

    texts = list(CHECK_STRINGS)
    valid = data_utils.load_indexed_dataset(str(Path(data) / "valid"), None)
    if valid is not None:
        for i in range(min(n, len(valid))):
            text = texts_source.decode(valid[i])
            if text:
                texts.append(text)
    # longer than the model: exercises truncation
    texts.append(" ".join(texts) * 8)
    return texts


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
    batch = tokenizer(texts, truncation=True, max_length=max_len, padding=True, return_tensors="pt")
    fs_ids = batch["input_ids"]
    if texts_source.fairseq_to_hf is not None:
        fs_ids = torch.as_tensor(texts_source.hf_to_fairseq)[fs_ids]
    with torch.no_grad():
        fs_features, _ = fairseq_model(fs_ids, features_only=True)
        hf_out = hf_model(**batch, output_hidden_states=True)
        hf_features = hf_out.hidden_states[-1]
        diff = _max_abs_diff(fs_features, hf_features, batch["attention_mask"])
        if with_lm_head:
            fs_logits, _ = fairseq_model(fs_ids)
            hf_logits = hf_out.logits
            if texts_source.fairseq_to_hf is not None:
                hf_logits = hf_logits[..., texts_source.fairseq_to_hf]
            diff = max(diff, _max_abs_diff(fs_logits, hf_logits, batch["attention_mask"]))
    if not diff <= atol:
        raise ExportError(f"HF outputs differ from fairseq's: max abs diff {diff:.3g} > {atol:g}")
    return diff


def to_hf_order(
    hf_state: Dict[str, torch.Tensor], texts_source: Union[SpmTexts, HFTexts], with_lm_head: bool
) -> Dict[str, torch.Tensor]:
    """Rows in fairseq id order -> the tokenizer's, positions to its padding index."""
    if texts_source.fairseq_to_hf is None:
        return hf_state
    prefix = "roberta." if with_lm_head else ""
    inverse = torch.as_tensor(texts_source.hf_to_fairseq)
    for key in (prefix + "embeddings.word_embeddings.weight", "lm_head.decoder.weight", "lm_head.bias"):
        if key in hf_state:
            hf_state[key] = hf_state[key][inverse].contiguous()
    if "lm_head.bias" in hf_state:
        hf_state["lm_head.decoder.bias"] = hf_state["lm_head.bias"]
    pos = prefix + "embeddings.position_embeddings.weight"
    hf_state[pos] = fairseq_positions_to_hf(hf_state[pos], texts_source.pad)
    return hf_state


# task -> (title, what pre-training did, tag): the card says which objective made the encoder
OBJECTIVES = {
    "seed_pretrain": (
        "SEED-Encoder",
        "MLM plus a weak decoder that reconstructs the input from the [CLS] vector alone "
        "(SEED-Encoder, Lu et al., EMNLP 2021)",
        "seed-encoder",
    ),
    "retromae_pretrain": (
        "RetroMAE",
        "MLM plus RetroMAE's one-layer enhanced decoder that reconstructs the unmasked input from "
        "the [CLS] vector (Xiao & Liu)",
        "retromae",
    ),
    "dupmae_pretrain": (
        "DupMAE",
        "MLM, RetroMAE's enhanced decoder from [CLS], and a bag-of-words loss on the max-pooled MLM "
        "head (DupMAE, Xiao & Liu, 'RetroMAE v2')",
        "dupmae",
    ),
    "simlm_pretrain": (
        "SimLM",
        "replaced language modelling with a frozen generator, plus a shallow decoder that sees the "
        "encoder only through [CLS] (SimLM, Wang et al., 2022)",
        "simlm",
    ),
    "cpdae_pretrain": (
        "CPDAE",
        "MLM plus a bag-of-words decoder on [CLS] and a contrast of the word distributions of two "
        "masked views (CPDAE, Xu et al., CIKM 2022)",
        "cpdae",
    ),
}


def describe_objective(cfg: dict, model_cfg: dict) -> tuple:
    """(title, description, tag) of the checkpoint's pre-training objective."""
    task = (cfg.get("task") or {}).get("_name") or ""
    title, what, tag = OBJECTIVES.get(
        task, ("Bottleneck encoder", f"the plugin's `{task or '?'}` objective", "bottleneck-pretraining")
    )
    if task == "seed_pretrain" and not model_cfg.get("decoder_layers"):
        title, what = "MLM-only encoder", "masked language modelling only (the baseline of SEED-Encoder's comparison)"
    elif task == "seed_pretrain" and str(model_cfg.get("decoder_attention_window")) == "full":
        title = "SEED-Encoder (full-attention decoder ablation)"
    return title, what, tag


def model_card(
    cfg: dict,
    model_cfg: dict,
    state: dict,
    texts_source: Union[SpmTexts, HFTexts],
    diff: float,
    with_lm_head: bool,
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
    return f"""---
library_name: transformers
tags: [{tag}, dense-retrieval, fairseq, sentence-transformers]
license: mit
---

# {title} (exported from fairseq)

A RoBERTa-style encoder pre-trained with {what}, trained with `seed_fairseq`. Exported as
**{head}**; the pre-training-only heads (decoders) are not included. Use the [CLS] vector
(`last_hidden_state[:, 0]`) with dot product; `SentenceTransformer` on this folder does
exactly that (CLS pooling, no normalisation). The pooler is not part of the pre-training
and is exported as zeros.

Checked at export: tokenizer ids equal fairseq's, and HF outputs equal fairseq's
(max abs diff {diff:.2e}, fp32).

| training configuration | |
| --- | --- |
{table}
"""


def _verify_head(fs_model, head_or_folder, tokenizer, texts, max_len, atol, hf_model=None) -> float:
    """The DupMAE head on the exported encoder's outputs vs the fairseq model's own MLM head."""
    from . import dupmae_export

    batch = tokenizer(texts, truncation=True, max_length=max_len, padding=True, return_tensors="pt")
    ids, mask = batch["input_ids"], batch["attention_mask"]
    if hf_model is not None:
        head = head_or_folder
        with torch.no_grad():
            token_embeddings = hf_model(**batch).last_hidden_state
    else:
        from ..retrieval.dupmae import dupmae_head
        from ..retrieval.search import load_model

        st = load_model(str(head_or_folder), device="cpu", representation="dupmae")
        head = dupmae_head(st).eval()
        with torch.no_grad():
            token_embeddings = st[0]({"input_ids": ids, "attention_mask": mask})["token_embeddings"]
    projection = head.cls_projection.weight.detach()
    reference = dupmae_export.fairseq_reference(fs_model, ids, mask, projection, head.head_config["special_ids"])
    ours = dupmae_export.head_outputs(head, token_embeddings, mask, ids)
    diff = dupmae_export.max_difference(reference, ours, mask)
    # logits reach tens; the encoder's features agree to ``atol``
    limit = atol * max(1.0, reference[1].abs().max().item())
    if not diff <= limit:
        raise ExportError(f"DupMAE head outputs differ from fairseq's: max abs diff {diff:.3g} > {limit:g}")
    return diff


def dupmae_card(head) -> str:
    c = head.head_config
    return f"""
## DupMAE representation

This folder also holds DupMAE's own retrieval representation (Xiao & Liu, "RetroMAE v2: Duplex
Masked Auto-Encoder", Eq. 10-12): `dupmae.json` and `dupmae_head.safetensors`, read by
`seed_fairseq.hf.dupmae_head.load_head` and used by `examples/retrieval/{{evaluate,finetune}}.py`
(`--representation dupmae`, the default for this folder):

* dense: the [CLS] vector projected to d' = {c["dim"]} dimensions; the projection: {c["cls_projection"]};
* sparse: the top k = {c["top_k"]} entries of the MLM head's vocabulary logits max-pooled over the ordinary
  tokens, kept at their vocabulary indices;
* score: dense dot product + sparse dot product over the shared indices.

`SentenceTransformer` on this folder alone gives the plain [CLS] vector.
"""


def export(
    checkpoint: PathLike,
    data: PathLike,
    out: PathLike,
    force: bool = False,
    with_lm_head: bool = False,
    atol: float = 1e-5,
    representation: Optional[str] = None,
    dupmae_dim: Optional[int] = None,
    dupmae_top_k: Optional[int] = None,
    trust_checkpoint: bool = False,
) -> Path:
    """``representation``: ``dupmae`` adds DupMAE's head files (``dupmae_export.py``),
    ``cls`` does not; None: ``dupmae`` for a DupMAE checkpoint exported without the
    MLM head, else ``cls``.  ``dupmae_dim`` (d', default min(384, d)) and
    ``dupmae_top_k`` (k, default min(384, selectable vocabulary)) configure it.
    ``trust_checkpoint``: load the checkpoint with the full unpickler (``load_inputs``)."""
    from fairseq import checkpoint_utils
    from transformers import AutoModel, AutoModelForMaskedLM, AutoTokenizer, XLMRobertaForMaskedLM, XLMRobertaModel

    from . import dupmae_export

    out = Path(out)
    if representation not in (None, "cls", "dupmae"):
        raise ExportError(f"--representation must be cls or dupmae, got {representation!r}")
    if representation == "dupmae" and with_lm_head:
        raise ExportError(
            "--representation dupmae cannot be combined with --mlm-head: the DupMAE head goes beside "
            "the sentence-transformers encoder folder (it holds the MLM head itself)"
        )
    try:
        earlier = owned_output(out, EXPORT_RECORD, TOOL)
    except OutputError as e:
        raise ExportError(str(e)) from e
    if earlier is not None and earlier.complete and not force:
        raise ExportError(f"{out}: holds an earlier export; pass --force to replace it")
    state, cfg, model_cfg, dictionary, texts_source, dropped = load_inputs(checkpoint, data, trust_checkpoint)
    max_len = model_cfg["max_positions"]
    if representation is None:
        representation = "cls" if with_lm_head else dupmae_export.default_representation(cfg)
    if representation == "cls" and (dupmae_dim is not None or dupmae_top_k is not None):
        raise ExportError(
            f"{checkpoint}: --dupmae-dim / --dupmae-top-k given, but this checkpoint exports the [CLS] "
            "representation (pass --representation dupmae)"
        )
    if representation == "dupmae":
        try:
            dupmae_dim, dupmae_top_k = dupmae_export.check_options(
                checkpoint, state, model_cfg, dictionary, dupmae_dim, dupmae_top_k
            )
        except ValueError as e:
            raise ExportError(str(e)) from e

    src = texts_source
    config = hf_config(model_cfg, len(dictionary), with_lm_head, pad=src.pad, bos=src.bos, eos=src.eos)
    hf_model = (XLMRobertaForMaskedLM if with_lm_head else XLMRobertaModel)(config).eval()
    hf_state = fairseq_to_hf(state["model"], model_cfg["encoder_layers"], with_lm_head, dropped_prefixes=dropped)
    hf_model.load_state_dict(to_hf_order(hf_state, src, with_lm_head), strict=True)
    tokenizer = src.tokenizer(max_len)

    # reuse the state read by load_inputs (hf_state holds clones) instead of reading the file again
    (fs_model,), _ = checkpoint_utils.load_model_ensemble(
        [str(checkpoint)], arg_overrides={"data": str(data)}, state=state
    )
    fs_model.eval()
    texts = _check_texts(src, data)
    diff = verify(fs_model, hf_model, tokenizer, src, texts, max_len, atol, with_lm_head)
    logger.info(f"fairseq vs HF: ids equal on {len(texts)} strings, max abs diff {diff:.2e}")
    head = None
    if representation == "dupmae":
        activation = ACTIVATIONS[model_cfg.get("activation_fn", "gelu")]
        try:
            head = dupmae_export.build_head(
                fs_model, state, dictionary, data, max_len, dupmae_dim, dupmae_top_k, activation
            )
        except ValueError as e:
            raise ExportError(str(e)) from e
        head_diff = _verify_head(fs_model, head, tokenizer, texts, max_len, atol, hf_model)
        logger.info(f"DupMAE head (d'={dupmae_dim}, k={dupmae_top_k}) vs fairseq: max abs diff {head_diff:.2e}")

    try:
        with staged_output(out, EXPORT_RECORD, TOOL, replace=force) as staging:
            hf_model.save_pretrained(staging, safe_serialization=True)
            tokenizer.save_pretrained(staging)
            if not with_lm_head:
                from sentence_transformers import SentenceTransformer

                try:  # sentence-transformers >= 6; importing sentence_transformers.models warns there
                    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
                except ImportError:  # 3.x - 5.x
                    from sentence_transformers.models import Pooling, Transformer

                word = Transformer(str(staging), max_seq_length=max_len)
                # sentence-transformers >= 5 renamed get_word_embedding_dimension (the old name warns)
                dim = getattr(word, "get_embedding_dimension", None) or word.get_word_embedding_dimension
                pooling = Pooling(dim(), pooling_mode="cls")
                SentenceTransformer(modules=[word, pooling], device="cpu").save(str(staging))
            card = model_card(cfg, model_cfg, state, src, diff, with_lm_head)
            if head is not None:
                head.save(staging)
                card += dupmae_card(head)
            (staging / "README.md").write_text(card)
            # the written folder, reloaded the way users will load it
            auto = (AutoModelForMaskedLM if with_lm_head else AutoModel).from_pretrained(staging).eval()
            verify(
                fs_model,
                auto,
                AutoTokenizer.from_pretrained(staging),
                src,
                texts,
                max_len,
                atol,
                with_lm_head,
            )
            if head is not None:  # the head files, reloaded the way the retrieval tools load them
                _verify_head(fs_model, staging, tokenizer, texts, max_len, atol)
            # the record last: it lists the files --force may replace (nothing else in OUT)
            write_output_record(
                staging,
                EXPORT_RECORD,
                {
                    "tool": "seed_fairseq.hf.export",
                    "checkpoint": str(Path(checkpoint).resolve()),
                    "data": str(Path(data).resolve()),
                    "dictionary_sha256": dictionary_sha256(Path(data) / "dict.txt"),
                    "with_lm_head": with_lm_head,
                    "representation": representation,
                    "max_abs_diff": diff,
                },
            )
    except OutputError as e:
        raise ExportError(str(e)) from None
    logger.info(f"wrote {out}")
    return out
