"""The comparison's own view of the objectives (the table itself and their fairseq-train arguments:
``kit.objectives``): the rows it evaluates (DupMAE twice: its dense + sparse representation and its
dense vector alone), its baseline, and the settings one update's FLOPs are counted with.
"""

from dataclasses import dataclass
from typing import List

from ..kit.argv import without_options
from ..kit.objectives import OBJECTIVES, PretrainSettings

MLM_BASELINE = "mlm"  # the row every other is tested against


@dataclass(frozen=True)
class EvalModel:
    """One evaluated row: an objective's model with one representation."""

    objective: str
    representation: str

    @property
    def key(self) -> str:
        # an objective evaluated one way is its name; DupMAE's two rows are dupmae+dupmae and dupmae+own
        if len(OBJECTIVES[self.objective].representations) == 1:
            return self.objective
        return f"{self.objective}+{self.representation}"

    @property
    def label(self) -> str:
        spec = OBJECTIVES[self.objective]
        if len(spec.representations) == 1:
            return spec.label
        return f"{spec.label} ({'dense+sparse' if self.representation == 'dupmae' else 'dense only'})"


def eval_models(objectives: List[str]) -> List[EvalModel]:
    return [EvalModel(o, r) for o in objectives for r in OBJECTIVES[o].representations]


# fairseq-train options that set the schedule's lengths and intervals, not what one update computes
SCHEDULE_OPTIONS = (
    "--warmup-updates",
    "--total-num-update",
    "--max-update",
    "--validate-interval-updates",
    "--save-interval-updates",
)


# What one update computes of the settings (every field but the schedule's lengths and
# intervals): the FLOPs stage reads these, and counts with ``per_update_settings``.
PER_UPDATE_FIELDS = tuple(
    f"pretrain.{name}"
    for name in ("encoder_args", "tokens_per_sample", "batch_size", "update_freq", "lr", "fairseq_args", "gpu")
)


def per_update_settings(s: PretrainSettings) -> PretrainSettings:
    """``s`` with its schedule's lengths and intervals set to fixed values (1 update, no warm-up,
    no validation): the settings one update's FLOPs are counted with.  Reads only the fields of
    ``PER_UPDATE_FIELDS``."""
    return PretrainSettings(
        encoder_args=list(s.encoder_args),
        tokens_per_sample=s.tokens_per_sample,
        batch_size=s.batch_size,
        update_freq=s.update_freq,
        updates=1,
        warmup=0,
        lr=s.lr,
        validate_every=0,
        probe_size=0,
        fairseq_args=list(s.fairseq_args),
        gpu=s.gpu,
        save_every=1,
    )


def per_update_args(args: List[str]) -> List[str]:
    """``args`` without the schedule options (each followed by its value): what a FLOPs count depends on."""
    return without_options(args, SCHEDULE_OPTIONS)
