"""The range of every numeric option of the plugin's tasks, criterions and models, checked once for all.

fairseq parses a ``float`` option with ``float()``, which takes ``inf`` and ``nan``, and an ``int``
option as any integer: ``--bow-weight inf`` passed a ``>= 0`` check and ended in a ``StopIteration``
mid-training, ``--retrieval-max-length 1`` trained and only the export failed.  :func:`check_ranges`
checks the options where fairseq-train's command line becomes a task (``BottleneckPretrainTask.setup_task``,
before any file is read), a model (``BottleneckEncoderModel.build_model``: the options its ``add_args``
declares) and a criterion (``MultiTermCriterion.build_criterion``), field by field:

* a ``float`` option must be a finite number, whatever its range;
* its range is the one declared on the field (``metadata={"range": Range(...)}``), else
  :data:`INHERITED` (fields of fairseq's own configs, by name), else the one its name gives
  (:data:`BY_NAME`): every loss weight (``*_weight``) and the weight's decay target ``>= 0``, every
  temperature ``> 0``, every probability and dropout in [0, 1].  A new objective's weights are
  checked without a line of its own.

Options that other options bound (SimLM's ``--mask-prob <= --decoder-mask-prob``, the encoder's
schedule) keep their own checks beside these; interpolated fields (``II("optimization.max_update")``)
are fairseq's options, not the config's own, and are skipped.  A value out of range is one line naming
the option and the value (:class:`ConfigurationError`: ``error: ...``, exit 2, in ``fairseq-train``).
"""

import dataclasses
import math
from dataclasses import dataclass
from typing import Any, Dict, Iterator, Optional, Tuple

from ..base.errors import ConfigurationError


@dataclass(frozen=True)
class Range:
    """The values an option takes: ``low``/``high`` (None: unbounded), each excluded when ``*_open``;
    ``also`` single values allowed outside the interval (``0``: "the model's positions"); ``note``
    follows the range in the message."""

    low: Optional[float] = None
    high: Optional[float] = None
    low_open: bool = False
    high_open: bool = False
    also: Tuple[float, ...] = ()
    note: str = ""

    def holds(self, value: float) -> bool:
        if value in self.also:
            return True
        if not math.isfinite(value):
            return False
        if self.low is not None and (value <= self.low if self.low_open else value < self.low):
            return False
        return self.high is None or (value < self.high if self.high_open else value <= self.high)

    def describe(self, finite: bool = False) -> str:
        """``>= 0``, ``in (0, 1]``, ``0 or >= 3`` ...; ``finite``: say that infinities are out too."""
        if self.low is not None and self.high is not None:
            text = f"in {'(' if self.low_open else '['}{self.low:g}, {self.high:g}{')' if self.high_open else ']'}"
        elif self.low is not None:
            text = f"{'>' if self.low_open else '>='} {self.low:g}"
        elif self.high is not None:
            text = f"{'<' if self.high_open else '<='} {self.high:g}"
        else:
            text = "a finite number"
        if self.also:
            text = " or ".join([*(f"{v:g}" for v in self.also), text])
        if finite and (self.low is None or self.high is None) and text != "a finite number":
            text += " and finite"
        return text + self.note


NON_NEGATIVE = Range(0)
POSITIVE = Range(0, low_open=True)
PROBABILITY = Range(0, 1)
# by the end of a field's name (the first that matches): what a loss weight, a temperature, a probability needs
BY_NAME: Tuple[Tuple[str, Range], ...] = (
    ("_weight", NON_NEGATIVE),
    ("_weight_decay_to", NON_NEGATIVE),
    ("_temperature", POSITIVE),
    ("_prob", PROBABILITY),
    ("dropout", PROBABILITY),  # the models' --dropout, --attention-dropout ... (BottleneckEncoderModel.build_model)
)
# fields of fairseq's own configs the plugin's configs inherit (MaskedLMConfig), by name
INHERITED: Dict[str, Range] = {
    "mask_multiple_length": Range(1),
    "mask_stdev": NON_NEGATIVE,
}


def option(name: str) -> str:
    return "--" + name.replace("_", "-")


def range_of(name: str, declared: Optional[Range] = None) -> Optional[Range]:
    """The range of the field ``name``: declared on it, inherited from fairseq's config, or by its name."""
    if declared is not None:
        return declared
    if name in INHERITED:
        return INHERITED[name]
    return next((r for suffix, r in BY_NAME if name.endswith(suffix)), None)


def _dataclass_of(cfg: Any) -> Optional[type]:
    if dataclasses.is_dataclass(cfg):
        return cfg if isinstance(cfg, type) else type(cfg)
    from omegaconf import OmegaConf

    if OmegaConf.is_config(cfg):
        kind = OmegaConf.get_type(cfg)
        return kind if dataclasses.is_dataclass(kind) else None
    return None


def _fields(cfg: Any) -> Iterator[Tuple[str, Optional[Range]]]:
    """(name, declared range) of the config's own options (interpolated fields left out)."""
    kind = _dataclass_of(cfg)
    if kind is not None:
        for f in dataclasses.fields(kind):
            default = f.default if f.default is not dataclasses.MISSING else None
            if isinstance(default, str) and default.startswith("${"):
                continue  # II("section.name"): another section's option
            yield f.name, f.metadata.get("range")
        return
    names = cfg.keys() if hasattr(cfg, "keys") else vars(cfg)  # a plain mapping or Namespace
    for name in names:
        if not str(name).startswith("_"):
            yield str(name), None


def _value(cfg: Any, name: str) -> Any:
    try:
        return cfg[name] if isinstance(cfg, dict) else getattr(cfg, name, None)
    except Exception:  # an interpolation that does not resolve outside fairseq-train: not this config's
        return None


def check_ranges(cfg: Any) -> None:
    """Refuse the first option of ``cfg`` (a task's or a criterion's config: a dataclass, an OmegaConf
    config or a Namespace) whose value is out of its range (see the module docstring):
    :class:`ConfigurationError` naming the option and the value."""
    for name, declared in _fields(cfg):
        value = _value(cfg, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        allowed = range_of(name, declared)
        if allowed is None:
            if isinstance(value, float) and not math.isfinite(value):
                raise ConfigurationError(f"{option(name)} must be a finite number, got {value}")
            continue
        if not allowed.holds(value):
            raise ConfigurationError(
                f"{option(name)} must be {allowed.describe(finite=isinstance(value, float))}, got {value}"
            )
