"""Import a local HuggingFace BERT / RoBERTa / XLM-R encoder for continued pre-training.

    OUT/checkpoint.pt        fairseq checkpoint of the plugin's encoder (``seed_encoder``
                             without decoder; the MLM head when the HF model has one);
                             ``fairseq-train --finetune-from-model OUT/checkpoint.pt``
                             continues it with any objective (docs/hf.md)
    OUT/dict.txt             the model's own vocabulary in its own id order (vocabulary/tokenizer.py)
    OUT/hf_tokenizer.json    the id mapping and word-boundary convention
    OUT/tokenizer/           the model's tokenizer (what preprocess.build --tokenizer and the
                             export use)
    OUT/model_args.txt       the fairseq-train options that rebuild this encoder exactly and
                             train its own representation (--bottleneck-pooling,
                             --retrieval-similarity: what its sentence-transformers modules do)
    OUT/seed_fairseq_import.json   this tool's record, written last; it lists the files above

Before the folder appears, the fairseq encoder built from the written files is
compared with the HF model on the same text (features, and MLM logits when
there is a head); the folder is assembled under a temporary name and renamed.
``--force`` on an earlier import replaces exactly the files its record lists:
anything else in OUT (a user's notes) stays (``fileio.staged_output``).
Weights stored in fp16 or bf16 are read, compared (the HF reference loaded in
float32) and written in float32; the record says the stored precision.

The model's representation (``sentence.py``): a sentence-transformers folder's pooling,
normalisation and similarity are recorded (``representation`` in the record, the task
options in the checkpoint and in ``model_args.txt``), and the pooled vector fairseq computes
is compared with ``SentenceTransformer``'s on the same strings; what the plugin cannot carry
(a Dense module, weightedmean pooling, ...) is refused before anything is written.  A plain
HuggingFace folder (no ``modules.json``) gets the papers' [CLS] vector and dot product.
"""

import logging
import shlex
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, NamedTuple, Optional, Tuple

import torch

from ...base.fileio import (
    OutputError,
    owned_output,
    staged_dir,
    write_json_atomic,
    write_text_atomic,
)
from ...base.representation import Representation
from ...base.vocabulary.tokenizer import RECORD as VOCAB_RECORD
from ...base.vocabulary.tokenizer import (
    TOKENIZER_DIR,
    TokenizerError,
    TokenizerVocab,
    check_tokenizer_fits,
    load_fast_tokenizer,
    vocab_from_tokenizer,
    write_dict,
)
from .folder import (
    CONFIG,
    SIZES,
    HFFolderError,
    check_finite,
    check_fits_weights,
    check_sizes,
    iter_weights,
    read_config,
    read_weights,
    transformers_config,
    weight_files,
    weight_shapes,
)
from .import_check import compare, compare_representation
from .import_keymap import FAMILIES, HEAD, HEAD_KEYS, Family, hf_to_fairseq, position_offset
from .keymap import UnmappedKeyError
from .sentence import read_folder

if TYPE_CHECKING:
    from fairseq.models import BaseFairseqModel
    from fairseq.tasks import FairseqTask
    from omegaconf import DictConfig
    from transformers import PreTrainedTokenizerFast

logger = logging.getLogger("seed_fairseq.hf")

IMPORT_RECORD = "seed_fairseq_import.json"
CHECKPOINT = "checkpoint.pt"
MODEL_ARGS = "model_args.txt"
TOOL = "examples/import_from_hf.py"

# HF hidden_act -> fairseq activation_fn computing the same function
ACTIVATIONS = {"gelu": "gelu", "relu": "relu", "gelu_new": "gelu_accurate", "tanh": "tanh"}
# config.json numbers the import reads: key -> (transformers' default, check, what the check wants)
FLOAT_SETTINGS = {
    "layer_norm_eps": (1e-12, lambda v: 0 < v < 1, "a number in (0, 1)"),
    "hidden_dropout_prob": (0.1, lambda v: 0 <= v < 1, "a number in [0, 1)"),
    "attention_probs_dropout_prob": (0.1, lambda v: 0 <= v < 1, "a number in [0, 1)"),
}

# Strings every import is checked on: accents, CJK, emoji, a long word, case, empty, and one longer
# than any model's positions (where each side cuts a text is compared too).
CHECK_STRINGS = [
    "The Rhine rises in the Swiss Alps and flows north to the North Sea.",
    "Café au lait in Zürich costs 4.50 CHF — naïve prices!",
    "unicode: ﬁ ℌ İstanbul 北京 Ωμέγα 🙂 \u2028 tabs\tand  spaces",
    "Donaudampfschifffahrtsgesellschaftskapitänswitwe pneumonoultramicroscopicsilicovolcanoconiosis",
    "UPPER CASE and MiXeD CaSe, digits 0123456789 and 3.14159",
    "",
]
CHECK_STRINGS.append(" ".join(CHECK_STRINGS[:5]) * 6)


class HFImportError(ValueError):
    """Bad input for the import; ``str()`` names the file and the problem."""


def check_architecture(cfg: dict, path: Path) -> Family:
    """The family of a supported HF config, or one clear error saying why not."""
    config_path = path / CONFIG
    model_type = cfg.get("model_type")
    if not isinstance(model_type, str) or model_type not in FAMILIES:
        architectures = cfg.get("architectures")
        named = ", ".join(a for a in architectures if isinstance(a, str)) if isinstance(architectures, list) else ""
        raise HFImportError(
            f"{config_path}: unsupported architecture model_type={model_type!r} "
            f"({named}); supported: {sorted(FAMILIES)} "
            "(post-LN BERT, RoBERTa and XLM-R encoders)"
        )
    try:
        check_sizes(cfg, config_path, required=SIZES)
    except HFFolderError as e:
        raise HFImportError(str(e)) from None
    problems = []
    if cfg.get("position_embedding_type", "absolute") != "absolute":
        problems.append(f"position_embedding_type={cfg['position_embedding_type']!r} (needs 'absolute')")
    if cfg.get("is_decoder") or cfg.get("add_cross_attention"):
        problems.append("a decoder (is_decoder / add_cross_attention)")
    act = cfg.get("hidden_act", "gelu")
    if not isinstance(act, str) or act not in ACTIVATIONS:
        problems.append(f"hidden_act={act!r} (supported: {sorted(ACTIVATIONS)})")
    if cfg.get("tie_word_embeddings", True) is False:
        problems.append("tie_word_embeddings=false (fairseq ties the output projection)")
    if cfg["hidden_size"] % cfg["num_attention_heads"]:
        problems.append("hidden_size is not a multiple of num_attention_heads")
    if problems:
        raise HFImportError(f"{config_path}: no exact fairseq equivalent: " + "; ".join(problems))
    for key, (default, ok, wanted) in FLOAT_SETTINGS.items():
        value = cfg.get(key, default)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not ok(value):
            raise HFImportError(f"{config_path}: {key} must be {wanted}, got {value!r}")
    return FAMILIES[model_type]


def stored_dtype(weights: Dict[str, torch.Tensor]) -> str:
    """The floating-point type(s) the weights are stored in: ``float32``, ``float16``, ..."""
    kinds = {str(v.dtype).replace("torch.", "") for v in weights.values() if v.is_floating_point()}
    return "+".join(sorted(kinds)) or "none"


class Source(NamedTuple):
    config: dict
    family: Family
    weights: Dict[str, torch.Tensor]  # in float32
    stored_dtype: str  # what the files hold: float32, float16, bfloat16
    tokenizer: "PreTrainedTokenizerFast"
    vocab: TokenizerVocab
    representation: Representation  # what its sentence-transformers modules compute (sentence.py)


def check_source(hf_dir: Path) -> None:
    """What :func:`read_source` refuses, read from ``config.json``, the weights (headers, then one
    tensor at a time for NaN or infinities), the sentence-transformers files and the tokenizer only:
    a tool that imports the folder in a later stage (adapt, the comparison's --init) refuses a
    folder without weights or tokenizer, a broken one, or one whose vocabulary does not fit, before
    it writes anything.  :class:`HFImportError` (``FILE: problem``)."""
    hf_dir = Path(hf_dir)
    try:
        hf_cfg = read_config(hf_dir)
        check_architecture(hf_cfg, hf_dir)
        transformers_config(hf_dir)
        check_fits_weights(hf_cfg, weight_shapes(hf_dir), hf_dir / CONFIG)
        check_finite(iter_weights(hf_dir), weight_files(hf_dir)[0])
        read_folder(hf_dir)
    except HFFolderError as e:
        raise HFImportError(str(e)) from None
    rows = hf_cfg["vocab_size"]
    try:
        tok = load_fast_tokenizer(hf_dir)
        check_tokenizer_fits(tok, rows, hf_dir)
        vocab_from_tokenizer(tok, hf_dir, expected_size=rows)
    except TokenizerError as e:
        raise HFImportError(str(e)) from None


def read_source(hf_dir: Path) -> Source:
    """The HF folder's parts, each checked against the others before anything is built:
    a size the weights contradict is config.json's fault, a tokenizer that does not
    cover the word embedding is the tokenizer's."""
    try:
        hf_cfg = read_config(hf_dir)
        family = check_architecture(hf_cfg, hf_dir)
        # transformers' own type checks: the reference model and the tokenizer read config.json too
        transformers_config(hf_dir)
        weights = read_weights(hf_dir)
        check_fits_weights(hf_cfg, {k: tuple(v.shape) for k, v in weights.items()}, hf_dir / CONFIG)
        check_finite(weights.items(), weight_files(hf_dir)[0])
        representation = read_folder(hf_dir)
    except HFFolderError as e:
        raise HFImportError(str(e)) from None
    dtype = stored_dtype(weights)
    # fp16 / bf16 weights are compared and written in float32: folding the token-type row
    # into the positions in fp16 would round, and fairseq trains an fp32 master copy anyway
    weights = {k: v.float() if v.is_floating_point() else v for k, v in weights.items()}
    rows = hf_cfg["vocab_size"]  # the word embedding's rows (check_fits_weights)
    try:
        tok = load_fast_tokenizer(hf_dir)
        check_tokenizer_fits(tok, rows, hf_dir)
        vocab = vocab_from_tokenizer(tok, hf_dir, expected_size=rows)
    except TokenizerError as e:
        raise HFImportError(str(e)) from None
    # the tokens a text can hold; a cut at or beyond them is none of the model's own
    positions = hf_cfg["max_position_embeddings"] - position_offset(family, vocab.fairseq_to_hf[1])
    return Source(hf_cfg, family, weights, dtype, tok, vocab, representation.within(positions))


def model_args(cfg: dict, max_positions: int, representation: Representation = Representation()) -> List[str]:
    """fairseq-train options that build this encoder (any objective's arch; pass them after --arch)
    and make every objective train and validate the model's own representation."""
    return [
        "--encoder-layers",
        str(cfg["num_hidden_layers"]),
        "--encoder-embed-dim",
        str(cfg["hidden_size"]),
        "--encoder-ffn-embed-dim",
        str(cfg["intermediate_size"]),
        "--encoder-attention-heads",
        str(cfg["num_attention_heads"]),
        "--max-positions",
        str(max_positions),
        "--activation-fn",
        ACTIVATIONS[cfg.get("hidden_act", "gelu")],
        "--encoder-layer-norm-eps",
        repr(float(cfg.get("layer_norm_eps", FLOAT_SETTINGS["layer_norm_eps"][0]))),
        "--dropout",
        repr(float(cfg.get("hidden_dropout_prob", FLOAT_SETTINGS["hidden_dropout_prob"][0]))),
        "--attention-dropout",
        repr(float(cfg.get("attention_probs_dropout_prob", FLOAT_SETTINGS["attention_probs_dropout_prob"][0]))),
        *representation.task_args(),
    ]


def build_fairseq(
    data_dir: Path, args: List[str], tokens_per_sample: int
) -> Tuple["DictConfig", "FairseqTask", "BaseFairseqModel"]:
    """Task and model as fairseq-train builds them (the plugin's MLM-only encoder)."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from ...base.user_dir import parse_argv

    mlm_only = ["--task", "seed_pretrain", "--criterion", "seed_pretrain", "--arch", "seed_encoder_mlm_only"]
    argv = parse_argv(data_dir, [*mlm_only, *args, "--tokens-per-sample", str(tokens_per_sample), "--cpu"])
    ns = options.parse_args_and_arch(options.get_training_parser(), argv)
    cfg = convert_namespace_to_omegaconf(ns)
    task = tasks.setup_task(cfg.task)
    return cfg, task, task.build_model(cfg.model)


def fresh_head(model, seed: int) -> Dict[str, torch.Tensor]:
    """BERT initialisation of the MLM head (the HF model has none), reproducible."""
    from fairseq.modules.transformer_sentence_encoder import init_bert_params

    head = model.encoder.lm_head
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        head.dense.apply(init_bert_params)
    head.layer_norm.reset_parameters()
    with torch.no_grad():
        head.bias.zero_()
    state = model.state_dict()
    return {k: state[k].clone() for k in HEAD_KEYS}


def checkpoint_dict(cfg, model, task, source: dict) -> dict:
    from ...pretrain.checkpoint import plain_config

    return {
        "args": None,
        "cfg": plain_config(cfg),
        "model": {k: v.clone() for k, v in model.state_dict().items()},
        "optimizer_history": [
            {
                "criterion_name": "SeedPretrainCriterion",
                "optimizer_name": "none",
                "lr_scheduler_state": {"best": None},
                "num_updates": 0,
            }
        ],
        "task_state": task.state_dict(),  # the dictionary identity restores and exports check
        "extra_state": {
            "epoch": 1,
            "train_iterator": {"epoch": 1, "iterations_in_epoch": 0, "shuffle": True, "version": 2},
            "seed_fairseq": source,
        },
        "last_optimizer_state": None,
    }


def _load_hf(auto_class, folder):
    """The HF reference in float32, quietly: its load report lists the heads the class
    leaves out.  transformers 5 otherwise keeps the stored dtype (fp16 / bf16), which
    differs from any fp32 computation by far more than ``atol``."""
    from transformers.utils import logging as hf_logging

    level = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()
    try:
        return auto_class.from_pretrained(str(folder), local_files_only=True, dtype=torch.float32).eval()
    finally:
        hf_logging.set_verbosity(level)


def import_model(hf_dir, out, force: bool = False, atol: float = 1e-5, seed: int = 1) -> Path:
    from fairseq import checkpoint_utils
    from transformers import AutoModel, AutoModelForMaskedLM

    from ...base.vocabulary.dictionary import dictionary_sha256
    from ...pretrain.checkpoint_files import save_atomic

    hf_dir, out = Path(hf_dir), Path(out)
    try:
        earlier = owned_output(out, IMPORT_RECORD, TOOL)
    except OutputError as e:
        raise HFImportError(str(e)) from None
    if earlier is not None and earlier.complete and not force:
        raise HFImportError(f"{out}: holds an earlier import; pass --force to replace it")
    hf_cfg, family, weights, source_dtype, tok, vocab, representation = read_source(hf_dir)
    logger.info(f"{hf_dir}: weights stored in {source_dtype}; imported, compared and written in float32")
    pad = vocab.fairseq_to_hf[1]
    layers = hf_cfg["num_hidden_layers"]
    try:
        fs_state, dropped = hf_to_fairseq(weights, family, layers, vocab.fairseq_to_hf, pad)
    except UnmappedKeyError as e:
        raise HFImportError(f"{hf_dir}: {e.args[0]}") from None
    max_positions = fs_state["encoder.sentence_encoder.embed_positions.weight"].size(0) - 2
    if dropped:
        logger.info(f"not imported (no fairseq counterpart): {', '.join(dropped)}")
    has_head = HEAD + "bias" in fs_state
    args = model_args(hf_cfg, max_positions, representation)

    # OUT keeps what its record does not list (a user's notes); see fileio.staged_output
    try:
        with staged_dir(out, IMPORT_RECORD, TOOL, replace=force) as (staging, record):
            write_dict(vocab, staging / "dict.txt")
            write_json_atomic(staging / VOCAB_RECORD, vocab.record())
            tok.save_pretrained(str(staging / TOKENIZER_DIR))
            cfg, task, model = build_fairseq(staging, args, tokens_per_sample=min(512, max_positions))
            if not has_head:
                fs_state.update(fresh_head(model, seed))
                logger.warning(
                    f"{hf_dir}: the model has no MLM head: encoder.lm_head is freshly initialised "
                    "(BERT init); continued pre-training trains it from scratch (--freeze-encoder-updates N "
                    "trains it alone first: docs/hf.md)"
                )
            # fairseq's state dict names the tied output projection separately
            fs_state[HEAD + "weight"] = fs_state["encoder.sentence_encoder.embed_tokens.weight"]
            missing, unexpected = model.load_state_dict(fs_state, strict=False)
            buffers = {name for name, _ in model.named_buffers()}
            missing = [k for k in missing if k not in buffers]
            if missing or unexpected:
                raise HFImportError(f"{hf_dir}: mapped state does not fit the fairseq encoder: {missing} {unexpected}")
            model.eval()

            hf_model = _load_hf(AutoModel, hf_dir)
            hf_mlm = _load_hf(AutoModelForMaskedLM, hf_dir) if has_head else None
            diff = compare(model, hf_model, hf_mlm, tok, vocab, CHECK_STRINGS, max_positions)
            if not diff <= atol:
                raise HFImportError(f"{hf_dir}: fairseq outputs differ from HF's: max abs diff {diff:.3g} > {atol:g}")
            # the vector the model is used by: fairseq's pooled (and normalised) one against SentenceTransformer's
            cut = representation.seq_length(max_positions)
            checked = compare_representation(model, hf_dir, tok, vocab, CHECK_STRINGS, max_positions, cut)
            pooled = None if checked is None else checked[0]
            if checked is not None and checked[1] != cut:
                raise HFImportError(
                    f"{hf_dir}: SentenceTransformer cuts texts at {checked[1]} tokens, the import read {cut} "
                    "(hf/sentence.text_cut): its continuation would encode other texts than the model"
                )
            if pooled is not None and not pooled <= atol:
                raise HFImportError(
                    f"{hf_dir}: fairseq's {representation.describe()} differs from SentenceTransformer's: max abs "
                    f"diff {pooled:.3g} > {atol:g}"
                )

            source = {
                "source": "import_from_hf",
                "model": str(hf_dir.resolve()),
                "family": family.name,
                "mlm_head": "imported" if has_head else "fresh",
                "source_dtype": source_dtype,
            }
            save_atomic(checkpoint_dict(cfg, model, task, source), staging / CHECKPOINT)
            # the checkpoint as fairseq reads it, once more against HF
            (loaded,), _ = checkpoint_utils.load_model_ensemble(
                [str(staging / CHECKPOINT)], arg_overrides={"data": str(staging)}
            )
            diff = max(diff, compare(loaded.eval(), hf_model, hf_mlm, tok, vocab, CHECK_STRINGS, max_positions))
            if not diff <= atol:
                raise HFImportError(f"{hf_dir}: the written checkpoint differs from HF: max abs diff {diff:.3g}")
            write_text_atomic(staging / MODEL_ARGS, shlex.join(args) + "\n")
            logger.info(f"fairseq vs HF on {len(CHECK_STRINGS)} strings: max abs diff {diff:.2e}")
            logger.info(
                f"the model's representation: {representation.describe()} ({shlex.join(representation.task_args())})"
                + ("" if pooled is None else f"; fairseq vs SentenceTransformer: max abs diff {pooled:.2e}")
            )
            record.update(
                {
                    "tool": "seed_fairseq.hf.import_",
                    "model": str(hf_dir.resolve()),
                    "family": family.name,
                    "hf_architectures": hf_cfg.get("architectures"),
                    "mlm_head": source["mlm_head"],
                    # what continued pre-training should train alone first (--freeze-encoder-updates), on top
                    # of the objective's own decoders and projections, which no import has
                    "fresh_heads": [] if has_head else [HEAD.rstrip(".")],
                    "source_dtype": source_dtype,  # the checkpoint holds float32 whatever the source stored
                    "dropped_keys": dropped,
                    "dictionary_sha256": dictionary_sha256(staging / "dict.txt"),
                    "tokenizer_sha256": vocab.sha256,
                    "max_positions": max_positions,
                    "model_args": args,
                    # what its sentence-transformers modules compute: every objective continued from
                    # the import trains and validates this vector (model_args' task options)
                    "representation": representation.record(),
                    "representation_max_abs_diff": pooled,
                    "max_abs_diff": diff,
                },
            )
    except OutputError as e:
        raise HFImportError(str(e)) from None
    logger.info(f"wrote {out}")
    return out


def read_model_args(folder) -> Optional[List[str]]:
    p = Path(folder) / MODEL_ARGS
    return shlex.split(p.read_text()) if p.is_file() else None
