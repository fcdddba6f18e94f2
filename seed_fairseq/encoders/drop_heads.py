"""Drop the pre-training-only modules (decoders, heads) after pre-training.

    seed-drop-heads CHECKPOINT OUT.pt [--data DATA_BIN] [--trust-checkpoint]
    (also: seed-drop-decoder, python -m seed_fairseq.encoders.drop_heads)

writes an encoder-only checkpoint that stock fairseq loads as a ``roberta``
model (``RobertaModel.from_pretrained``, ``--restore-file`` for
``sentence_prediction`` fine-tuning, ...) without this plugin and under
torch's safe ``weights_only`` loading: it holds tensors and plain
containers only (no optimizer state, no pickled config objects).  What is
dropped is what the model class declares (``pretraining_only_prefixes``,
``pretraining_only_config_prefixes``; see ``models/bottleneck.py``).

The model's representation (its pooling and similarity: the task options
``--bottleneck-pooling`` and ``--retrieval-similarity``, which stock ``masked_lm``'s task
config has no place for) is kept in ``extra_state["seed_fairseq"]["representation_options"]``,
where the HuggingFace export reads it (``checkpoint_records.representation_options``).

The encoder keeps every architecture fact its checkpoint records
(``checkpoint_records.encoder_architecture``).  An encoder that stock ``roberta``
cannot build exactly -- one continued from an import of BERT, whose
LayerNorms have eps 1e-12 where fairseq's are fixed at 1e-5 -- is written as
the plugin's encoder-only architecture (``seed_encoder_mlm_only``, the same
keys as ``roberta``), which loads with the plugin imported and which stock
fairseq refuses rather than computing other numbers.

Before anything is written, the encoder-only model is loaded back through
fairseq and its features and MLM logits are compared with the full model's on
the same input; the file appears (atomically, via rename) only if they match.
"""

import argparse
import dataclasses
import logging
import sys
from pathlib import Path
from typing import Optional, Sequence

import torch

from ..base.fileio import OutputError, PathLike, atomic_path, storage_line
from ..pretrain.checkpoint import (
    TRUST_OPTION,
    CheckpointError,
    peek_checkpoint,
    plain_config,
    read_checkpoint,
    recorded_data_dir,
)
from ..pretrain.checkpoint_files import torch_save
from ..pretrain.checkpoint_records import check_dictionary, encoder_architecture, representation_options

logger = logging.getLogger("seed_fairseq.drop_heads")

# what extra_state["seed_fairseq"]["source"] says in this tool's outputs (older name first)
SOURCES = ("drop_decoder", "drop_heads")
# the architecture of an encoder stock roberta cannot build exactly: RoBERTa's encoder and MLM
# head (the same keys) with the plugin's options (models/bottleneck.py), no decoder
ENCODER_ONLY_ARCH = "seed_encoder_mlm_only"


def drop_heads(state: dict) -> dict:
    """Pure function: a checkpoint dict of one of the plugin's pre-training models
    -> an encoder-only checkpoint dict (the input is not modified): stock ``roberta``, or
    :data:`ENCODER_ONLY_ARCH` for an encoder stock ``roberta`` cannot build exactly.
    ValueError (:class:`CheckpointError` for a config entry) when the state is not such a checkpoint."""
    from fairseq.tasks.masked_lm import MaskedLMConfig

    from ..pretrain.models import pretraining_model_class

    cfg = plain_config(state.get("cfg"))
    if not cfg or "model" not in cfg:
        raise ValueError("not a fairseq checkpoint with a config (no 'cfg' entry)")
    model_cfg = dict(cfg["model"])
    name = model_cfg.get("_name") or model_cfg.get("arch")
    model_class = pretraining_model_class(name)
    if model_class is None:
        raise ValueError(f"expected a checkpoint of one of this plugin's pre-training models, got model/arch {name!r}")
    prefixes = model_class.pretraining_only_prefixes
    beyond_roberta = encoder_architecture(model_cfg).beyond_roberta()
    model_cfg = {k: v for k, v in model_cfg.items() if not k.startswith(model_class.pretraining_only_config_prefixes)}
    # stock roberta when it builds this encoder exactly; otherwise every fact kept, no decoder
    arch = ENCODER_ONLY_ARCH if beyond_roberta else "roberta"
    if beyond_roberta:
        model_cfg.update(beyond_roberta, decoder_layers=0)
    model_cfg["_name"] = arch
    model_cfg["arch"] = arch
    # argparse-era models keep a copy of every option in cfg.model
    for key, value in (("user_dir", None), ("task", "masked_lm"), ("criterion", "masked_lm")):
        if key in model_cfg:
            model_cfg[key] = value
    allowed_task_keys = {f.name for f in dataclasses.fields(MaskedLMConfig)}
    task_cfg = {k: v for k, v in cfg["task"].items() if k in allowed_task_keys}
    task_cfg["_name"] = "masked_lm"
    new_cfg = dict(cfg)
    new_cfg.update(model=model_cfg, task=task_cfg, criterion={"_name": "masked_lm"})
    new_cfg["common"] = dict(cfg.get("common") or {}, user_dir=None)
    # optimizer / lr-scheduler state belongs to the pre-training run
    for key in ("optimizer", "lr_scheduler", "bmuf", "ema"):
        new_cfg.pop(key, None)

    weights = {k: v.clone() for k, v in state["model"].items() if not k.startswith(prefixes)}
    if prefixes and len(weights) == len(state["model"]):
        logger.warning(f"the checkpoint has no pre-training-only weights ({', '.join(prefixes)})")
    num_updates = 0
    if state.get("optimizer_history"):
        num_updates = int(state["optimizer_history"][-1].get("num_updates", 0))
    return {
        "args": None,
        "cfg": new_cfg,
        "model": weights,
        "optimizer_history": [
            {
                "criterion_name": "MaskedLmLoss",
                "optimizer_name": "none",
                "lr_scheduler_state": {"best": None},
                "num_updates": num_updates,
            }
        ],
        # the dictionary identity the export and later restores check
        "task_state": dict(state.get("task_state") or {}),
        "extra_state": {
            "epoch": 1,
            "train_iterator": {"epoch": 1, "iterations_in_epoch": 0, "shuffle": True, "version": 2},
            "seed_fairseq": {
                "source": "drop_heads",
                "pretrain_updates": num_updates,
                "model": name,
                "arch": arch,
                # the model's pooling and similarity, which stock masked_lm's task config cannot hold:
                # what the export writes back (hf/export.py)
                "representation_options": representation_options(state),
            },
        },
        "last_optimizer_state": None,
    }


def _encoder_outputs(model, tokens):
    """The encoder's features and the MLM head's logits (both kept by the encoder-only checkpoint)."""
    with torch.no_grad():
        features, _ = model(tokens, features_only=True)
        logits, _ = model(tokens)
    return features, logits


def _is_own_output(path: PathLike) -> bool:
    """Is ``path`` an encoder-only checkpoint this tool wrote (so it may be replaced)?"""
    try:
        state = peek_checkpoint(path, trust=False)  # whatever --trust-checkpoint says about CHECKPOINT
    except CheckpointError:
        return False
    return ((state.get("extra_state") or {}).get("seed_fairseq") or {}).get("source") in SOURCES


def write_encoder_checkpoint(
    checkpoint: PathLike, out: PathLike, data: Optional[PathLike] = None, atol: float = 1e-6, trust: bool = False
) -> Path:
    """Load CHECKPOINT (plugin imported), drop the heads, verify, write OUT atomically.

    OUT may be replaced only when it is an earlier output of this tool.
    CHECKPOINT is loaded without running code from it unless ``trust``
    (``--trust-checkpoint``; ``checkpoint.load_torch_file``); OUT never is.
    """
    from fairseq import checkpoint_utils
    from fairseq.data import Dictionary
    from fairseq.models.roberta import RobertaModel

    import seed_fairseq

    seed_fairseq.register()  # the model, and fairseq's checkpoint loading without code

    from ..pretrain.models import pretraining_model_class

    out = Path(out)
    if out.is_dir():
        raise OutputError(out, "is a folder; give the path of the .pt file to write")
    if out.exists() and not _is_own_output(out):
        raise OutputError(out, "exists and was not written by seed-drop-heads; refusing to replace it")
    state = read_checkpoint(checkpoint, arg_overrides={"data": str(data)} if data else None, trust=trust)
    try:
        encoder_state = drop_heads(state)
    except CheckpointError as e:
        raise CheckpointError(checkpoint, e.problem) from None
    except ValueError as e:
        raise CheckpointError(checkpoint, str(e)) from None
    arch = encoder_state["cfg"]["model"]["_name"]
    data_dir = recorded_data_dir(state)  # --data when given (overridden above)
    dict_path = data_dir / "dict.txt" if data_dir is not None else None
    if dict_path is None or not dict_path.is_file():
        raise CheckpointError(
            dict_path or checkpoint, "dictionary not found; pass --data with the folder the model was trained on"
        )
    dictionary = Dictionary.load(str(dict_path))
    dictionary.add_symbol("<mask>")
    check_dictionary(state, checkpoint, dict_path, len(dictionary))

    # the state read above (drop_heads cloned what it kept), not a second read of the file
    models, _ = checkpoint_utils.load_model_ensemble([str(checkpoint)], state=state)
    full = models[0].eval()
    with atomic_path(out, suffix=".pt") as tmp:
        torch_save(encoder_state, tmp, name=out)
        encoder_models, _ = checkpoint_utils.load_model_ensemble([str(tmp)], arg_overrides={"data": str(data_dir)})
        encoder = encoder_models[0].eval()
        expected = RobertaModel if arch == "roberta" else pretraining_model_class(arch)
        if type(encoder) is not expected:
            raise CheckpointError(checkpoint, f"the encoder-only checkpoint loads as {type(encoder).__name__}")
        d = full.encoder.dictionary
        g = torch.Generator().manual_seed(0)
        tokens = torch.randint(d.nspecial, len(d), (3, 17), generator=g)
        tokens[:, 0] = d.bos()
        tokens[1, 11:] = d.pad()
        pairs = zip(_encoder_outputs(full, tokens), _encoder_outputs(encoder, tokens))
        diff = max((a - b).abs().max().item() for a, b in pairs)
        if not diff <= atol:
            raise CheckpointError(
                checkpoint,
                f"the encoder-only model computes other features or MLM logits than the checkpoint's (max abs "
                f"diff {diff:g}); {out} not written",
            )
    if arch == "roberta":
        what = "encoder-only RoBERTa checkpoint"
    else:
        facts = ", ".join(
            f"{k}={v!r}" for k, v in encoder_architecture(encoder_state["cfg"]["model"]).beyond_roberta().items()
        )
        what = (
            f"encoder-only {arch} checkpoint ({facts}: stock fairseq's roberta cannot build this encoder; "
            "load it with the plugin, --user-dir or import seed_fairseq)"
        )
    logger.info(f"wrote {out}: {what} (features match, max abs diff {diff:.2e})")
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    logging.basicConfig(format="%(asctime)s | %(levelname)s | %(name)s | %(message)s", level=logging.INFO)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("checkpoint", help="a pre-training checkpoint of the plugin (e.g. checkpoint_last.pt)")
    parser.add_argument("out", help="where to write the encoder-only checkpoint")
    parser.add_argument("--data", help="data folder with dict.txt, if it moved since training")
    parser.add_argument(
        TRUST_OPTION,
        action="store_true",
        help="load CHECKPOINT with Python's full unpickler, which runs any code pickled in it: only for a file "
        "you trust.  Without it a checkpoint holding anything but the types fairseq checkpoints hold is refused",
    )
    args = parser.parse_args(argv)
    try:
        write_encoder_checkpoint(args.checkpoint, args.out, data=args.data, trust=args.trust_checkpoint)
    except (CheckpointError, OutputError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except OSError as e:  # a full disk or file-size limit while writing OUT
        line = storage_line(e)
        if line is None:
            raise
        print(f"error: {line}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # Ctrl-C, also in the middle of writing OUT (checkpoint_files.torch_save)
        print(f"interrupted; rerun the same command ({args.out} appears only complete)", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())

