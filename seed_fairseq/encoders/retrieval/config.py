"""``FinetuneConfig``: the settings of dual-encoder fine-tuning, and its command-line flags.

The flags are generated from the dataclass fields (their ``metadata``): the flag,
argparse type, choices and help are written once, here.  ``examples/retrieval/finetune.py``
adds them with :meth:`FinetuneConfig.add_args`; the comparison (``compare/cli.py``) adds a
subset under its own names with :func:`add_config_args` and reads them back with
:func:`config_from_args`.
"""

import argparse
import math
from dataclasses import dataclass, field, fields
from typing import Any, Dict, Mapping, Optional

from .cli import fraction, nonneg_float, nonneg_int, positive_float, positive_int, seed_int, unit_interval

NEGATIVES = ("bm25", "ance", "none")
LOSSES = ("mnrl", "triplet")
ANCE_FIRST = ("dense", "bm25")


def _flag(default: Any, flag: Optional[str] = None, **argparse_kw) -> Any:
    """A field with a command-line flag (``flag``: default ``--`` + the field name with dashes)."""
    return field(default=default, metadata={"cli": {"flag": flag, **argparse_kw}})


def _search(dest: str) -> Dict[str, Any]:
    """A field read from the encoding and search options (``cli.add_search_args``) instead."""
    return {"search": dest}


@dataclass
class FinetuneConfig:
    negatives: str = _flag("bm25", choices=NEGATIVES)  # none | bm25 | ance
    loss: str = _flag("mnrl", choices=LOSSES)  # mnrl | triplet
    train_fraction: float = _flag(1.0, type=fraction)
    seed: int = _flag(1, type=seed_int)
    batch_size: int = _flag(32, "--train-batch-size", type=positive_int, help="queries per step")
    lr: float = _flag(2e-5, type=positive_float)
    epochs: int = _flag(1, type=positive_int, help="epochs (per round with --negatives ance)")  # per ANCE round
    warmup_ratio: float = _flag(0.1, type=unit_interval)
    weight_decay: float = _flag(0.01, type=nonneg_float)
    max_grad_norm: float = 1.0
    num_negatives: int = _flag(  # hard negatives per (query, positive)
        1,
        type=nonneg_int,
        help="hard negatives per query (fewer, with a note, when the corpus has fewer unjudged documents)",
    )
    # negatives are sampled from this many top-ranked non-positives
    neg_top_k: int = _flag(100, type=positive_int, help="sample hard negatives from this top-k")
    ance_rounds: int = _flag(2, type=positive_int)
    ance_first: str = _flag(  # where round 1 mines: the starting model (dense) or bm25
        "dense",
        choices=ANCE_FIRST,
        help="negatives of the first ANCE round: the starting model's own top-k, or BM25",
    )
    margin: float = _flag(1.0, type=nonneg_float, help="triplet margin")  # triplet loss
    # MNRL logit scale; None: follows the model's similarity (training.SCALES)
    scale: Optional[float] = _flag(
        None,
        type=positive_float,
        help="MNRL logit scale (default: the model's similarity decides: 20 for cosine, as sentence-transformers' "
        "MultipleNegativesRankingLoss; 1 for dot product, DPR's softmax over raw dot products)",
    )
    eval_every: int = _flag(
        0, type=nonneg_int, help="dev metrics every N steps within an epoch (0: step 0 and epoch ends only)"
    )
    eval_k: int = _flag(100, type=positive_int)
    encode_batch_size: int = field(
        default=128, metadata={**_search("batch_size"), "cli": {"flag": None, "type": positive_int}}
    )
    # autocast dtype on CUDA; CPU always trains in fp32
    precision: str = field(default="fp16", metadata=_search("precision"))
    index: str = field(default="flat", metadata={**_search("index"), "cli": {"flag": None}})
    show_progress: bool = field(default=True, metadata={"cli": {"flag": "--no-progress", "negate": True}})

    @staticmethod
    def add_args(p: argparse.ArgumentParser) -> None:
        """The fine-tuning flags of ``examples/retrieval/finetune.py`` (defaults from this class)."""
        add_config_args(p, {f.name: flag_of(f.name) for f in fields(FinetuneConfig) if _cli(f) and not _searched(f)})

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "FinetuneConfig":
        """The config of parsed :meth:`add_args` flags plus the search flags (``cli.add_search_args``)."""
        own = {f.name: flag_of(f.name) for f in fields(cls) if _cli(f) and not _searched(f)}
        searched = {f.name: getattr(args, f.metadata["search"]) for f in fields(cls) if _searched(f)}
        return config_from_args(args, own, **searched)

    def validate(self) -> None:
        """ValueError for settings that would hang, crash late or train on nothing."""
        if self.negatives not in ("none", "bm25", "ance"):
            raise ValueError(f"negatives must be none, bm25 or ance, got {self.negatives!r}")
        if self.loss not in ("mnrl", "triplet"):
            raise ValueError(f"loss must be mnrl or triplet, got {self.loss!r}")
        if self.loss == "triplet" and self.negatives == "none":
            raise ValueError("--loss triplet needs negatives: use --negatives bm25 or ance")
        if self.loss == "triplet" and self.num_negatives < 1:
            raise ValueError("--loss triplet needs --num-negatives >= 1")
        if self.ance_first not in ("dense", "bm25"):
            raise ValueError(f"ance_first must be dense or bm25, got {self.ance_first!r}")
        at_least = {
            "batch_size": 1,
            "epochs": 1,
            "neg_top_k": 1,
            "ance_rounds": 1,
            "eval_k": 1,
            "encode_batch_size": 1,
            "num_negatives": 0,
            "eval_every": 0,
        }
        for name, low in at_least.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        from .metrics import CURVE_METRICS, check_depth

        check_depth(self.eval_k, CURVE_METRICS, "--eval-k")  # the dev curve's metrics
        ranges = {
            "train_fraction": (0, 1, False),
            "lr": (0, math.inf, False),
            "scale": (0, math.inf, False),
            "max_grad_norm": (0, math.inf, False),
            "warmup_ratio": (0, 1, True),
            "weight_decay": (0, math.inf, True),
            "margin": (0, math.inf, True),
        }
        for name, (low, high, low_ok) in ranges.items():
            value = getattr(self, name)
            if name == "scale" and value is None:  # the model's similarity decides (training.loss_scale)
                continue
            ok = (
                isinstance(value, (int, float))
                and math.isfinite(value)
                and value <= high
                and (value >= low if low_ok else value > low)
            )
            if not ok:
                raise ValueError(
                    f"{name} must be a finite number {'>=' if low_ok else '>'} {low}"
                    f"{'' if high == math.inf else f' and <= {high}'}, got {value!r}"
                )


# ---------------------------------------------------------------------------------------------
# the flags, generated from the fields
# ---------------------------------------------------------------------------------------------

_FIELDS = {f.name: f for f in fields(FinetuneConfig)}


def _cli(f) -> bool:
    return "cli" in f.metadata


def _searched(f) -> bool:
    return "search" in f.metadata


def flag_of(name: str, prefix: str = "") -> str:
    """The flag of field ``name`` (``--train-batch-size`` for ``batch_size``); with ``prefix``
    (``ft-``), ``--`` + prefix + the field name (``--ft-batch-size``)."""
    meta = _FIELDS[name].metadata.get("cli", {})
    if not prefix and meta.get("flag"):
        return meta["flag"]
    return "--" + prefix + name.replace("_", "-")


def _dest(flag: str) -> str:
    return flag[2:].replace("-", "_")


def add_config_args(
    p,
    flags: Mapping[str, str],
    defaults: Optional[Mapping[str, Any]] = None,
    types: Optional[Mapping[str, Any]] = None,
) -> None:
    """Add the flags ``flags`` (field -> flag) to ``p`` (a parser or a group), in field order,
    with the field's default, type, choices and help unless ``defaults`` / ``types`` override them."""
    defaults, types = defaults or {}, types or {}
    for name, f in _FIELDS.items():
        if name not in flags:
            continue
        meta = dict(f.metadata.get("cli", {}))
        meta.pop("flag", None)
        if meta.pop("negate", False):
            p.add_argument(flags[name], action="store_true")
            continue
        if name in types:
            meta["type"] = types[name]
        meta = {k: v for k, v in meta.items() if v is not None}
        p.add_argument(flags[name], default=defaults.get(name, f.default), **meta)


def config_from_args(args: argparse.Namespace, flags: Mapping[str, str], **fixed) -> FinetuneConfig:
    """The :class:`FinetuneConfig` of the parsed ``flags`` (field -> flag, as given to
    :func:`add_config_args`) and ``fixed`` field values; other fields keep their defaults."""
    values = {}
    for name, flag in flags.items():
        value = getattr(args, _dest(flag))
        values[name] = not value if _FIELDS[name].metadata.get("cli", {}).get("negate") else value
    return FinetuneConfig(**values, **fixed)
