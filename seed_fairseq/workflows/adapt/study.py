"""The adaptation study: every objective continued from one model, with and without the safeguards, over seeds.

    python examples/adaptation_study.py --model HF_DIR --corpus TEXT --out OUT \\
        [--objectives all] [--arms none,safeguarded] [--seeds 1,2] [adapt.py's options]

One folder, one domain.  What does not depend on the objective is done once and shared
by every cell (the import, the held-out split, the retrieval set derived from it, the
data, SimLM's generator, the round-trip check of the import, BM25, the original model --
``--model`` itself -- zero-shot and fine-tuned with each seed); then, for each seed, arm and objective (a
*cell*), the continued pre-training (``adapt.training``: the same fairseq-train command as
``examples/adapt.py``), the export of its *last* checkpoint, zero-shot retrieval, and the
identical fine-tuning on the derived set's train split followed by retrieval again.

Unlike ``adapt.py``, no checkpoint is chosen and nothing falls back to the original: the
study measures what the objective does to the model at the budget, whatever it is.  The
report (``study_report.py``) compares every cell's seed-averaged per-query scores with the
original's by the paired permutation test.

    OUT/adaptation_study.json        the tool's record: the folder is its own
    OUT/import  corpus  retrieval  data-bin  generator  roundtrip  bm25     shared, as in adapt.py
    OUT/eval/zeroshot-original/  OUT/eval/finetune-original-sN/             the reference row
    OUT/cells/<objective>-<arm>-sN/{pretrain,model,eval/zeroshot,eval/finetune}
    OUT/report.md  report.json  report.png
"""

import argparse
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Dict, Iterator, List, Optional, Sequence, Tuple

from preprocess.stages import WHOLE_PLAN, Stage

from ..kit.command import run_command
from ..kit.folder import ToolFolder
from ..kit.objectives import OBJECTIVES, ORDER, check_fairseq_args, parse_objectives
from ..kit.pipeline import timed
from . import plan as defaults
from .pipeline import Adaptation
from .plan import REPORT_FILES, AdaptPlan, log

TOOL = "seed_fairseq.adapt.study"
RECORD = "adaptation_study.json"
STUDY = ToolFolder(TOOL, RECORD, "the adaptation study (examples/adaptation_study.py)", "adaptation study")


@dataclass(frozen=True)
class Arm:
    """How the encoder is treated while the objective's new heads are young (tasks/encoder_lr.py)."""

    name: str
    freeze: bool  # the encoder frozen for adapt's default share of the updates (FREEZE_SHARE)
    encoder_lr_scale: float
    description: str


ARMS = {
    a.name: a
    for a in (
        Arm("none", False, 1.0, "every parameter trained from the first update at the same learning rate"),
        Arm(
            "warmup",
            True,
            1.0,
            "the new heads trained alone first, then the encoder joins with its own "
            "linear warm-up, at the heads' learning rate",
        ),  # fmt: skip
        Arm(
            "safeguarded",
            True,
            defaults.ENCODER_LR_SCALE,
            "adapt.py's defaults: the new heads trained alone "
            "first, then the encoder joins with its own linear warm-up, at "
            f"{defaults.ENCODER_LR_SCALE} x the heads' learning rate",
        ),  # fmt: skip
    )
}
DEFAULT_ARMS = ("none", "safeguarded")
DEFAULT_SEEDS = (1, 2)


def cell_name(objective: str, arm: str, seed: int) -> str:
    return f"{objective}-{arm}-s{seed}"


class Cell(Adaptation):
    """One objective, arm and seed: adapt's stages with its own folders under ``cells/`` (or, for the
    original model fine-tuned with a seed, under ``eval/``); the shared stages' folders are the study's."""

    def __init__(self, plan: AdaptPlan, folder: Path):
        super().__init__(plan)
        self.folder = folder

    @property
    def pretrain_dir(self) -> Path:
        return self.folder / "pretrain"

    @property
    def model_dir(self) -> Path:
        return self.folder / "model"

    def eval_dir(self, stage: str) -> Path:
        return self.folder / "eval" / stage.split("-")[0]

    @property
    def train_set(self) -> Path:
        return self.retrieval_dir  # the derived set's train split: its documents are not the test split's

    def selection_args(self) -> List[str]:
        return []  # no validation: the last checkpoint is the cell's model

    def stage_export(self, results) -> dict:
        last = self.pretrain_dir / "checkpoint_last.pt"

        def body():
            self.export(last, self.data_bin, self.model_dir, "own")
            return {"checkpoint": str(last)}

        return timed(body)


def study_plans(
    base: AdaptPlan, objectives: Sequence[str], arms: Sequence[str], seeds: Sequence[int]
) -> Iterator[Tuple[str, AdaptPlan]]:
    """(name, plan) of every cell, seed by seed (a partial study has whole seeds), arm by arm."""
    for seed in seeds:
        for arm_name in arms:
            arm = ARMS[arm_name]
            for objective in objectives:
                plan = replace(
                    base,
                    objective=OBJECTIVES[objective],
                    seed=seed,
                    freeze_updates=None if arm.freeze else 0,
                    encoder_warmup_updates=-1,
                    encoder_lr_scale=arm.encoder_lr_scale,
                )
                yield cell_name(objective, arm_name, seed), plan


class Study(Adaptation):
    """The shared stages (``Adaptation``'s, without checkpoint selection), then every cell's."""

    WHAT = "the adaptation study"

    def __init__(self, plan: AdaptPlan, objectives: Sequence[str], arms: Sequence[str], seeds: Sequence[int]):
        super().__init__(plan)
        self.objectives, self.arms, self.seeds = list(objectives), list(arms), list(seeds)
        self.arm_specs = [ARMS[a] for a in self.arms]
        self.cells: Dict[str, Cell] = {
            name: Cell(cp, self.out / "cells" / name) for name, cp in study_plans(plan, objectives, arms, seeds)
        }
        # the original model fine-tuned with each seed: the reference row after fine-tuning
        self.originals: Dict[int, Cell] = {s: _OriginalSeed(replace(plan, seed=s), self.out, s) for s in self.seeds}

    def stages(self) -> List[Stage]:
        needs_generator = any(OBJECTIVES[o].needs_generator for o in self.objectives)
        st = [*self.preparation(needs_generator), self.roundtrip_stage(), self.bm25_stage(),
              self.run_stage("zeroshot", "original", "zeroshot-original", "eval/zeroshot-original")]  # fmt: skip
        for s, orig in self.originals.items():
            st.append(orig.run_stage("finetune", "original", f"finetune-original-s{s}", f"eval/finetune-original-s{s}"))
        cell_names = []
        for name, cell in self.cells.items():
            folder, export = f"cells/{name}", f"export-{name}"
            st += [
                cell.pretrain_stage(f"pretrain-{name}", f"{folder}/pretrain"),
                cell.export_stage(export, f"pretrain-{name}", f"{folder}/model"),
                cell.run_stage("zeroshot", "adapted", f"zeroshot-{name}", f"{folder}/eval/zeroshot", export=export),
                cell.run_stage("finetune", "adapted", f"finetune-{name}", f"{folder}/eval/finetune", export=export),
            ]
            cell_names += [f"zeroshot-{name}", f"finetune-{name}"]
        reads = (
            "roundtrip",
            "bm25",
            "zeroshot-original",
            *(f"finetune-original-s{s}" for s in self.seeds),
            *cell_names,
        )
        # the report states the whole plan (its command, its settings)
        st.append(self.stage("report", self.stage_report, (WHOLE_PLAN,), reads=reads, products=REPORT_FILES))
        return st

    def stage_report(self, results) -> dict:
        from .study_report import write_study_report

        return timed(lambda: {"files": write_study_report(self, results)})


class _OriginalSeed(Cell):
    """The original model fine-tuned with seed ``s``: its run in ``eval/finetune-original-sN``."""

    def __init__(self, plan: AdaptPlan, out: Path, seed: int):
        super().__init__(plan, out)
        self.seed = seed

    def eval_dir(self, stage: str) -> Path:
        return self.out / "eval" / f"{stage}-s{self.seed}"


# ---------------------------------------------------------------------------
# the command line: adapt.py's, with several objectives, arms and seeds
# ---------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    from .cli import add_options

    p = argparse.ArgumentParser(
        prog="adaptation_study.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    help = f"objectives, comma-separated, or all (default: {','.join(ORDER)})"
    add_options(p, lambda p: p.add_argument("--objectives", default="all", help=help))
    g = p.add_argument_group("the study")
    g.add_argument("--arms", default=",".join(DEFAULT_ARMS),
                   help=f"comma-separated, of {', '.join(ARMS)} (default: {','.join(DEFAULT_ARMS)})")  # fmt: skip
    g.add_argument("--seeds", default=",".join(map(str, DEFAULT_SEEDS)), help="pre-training and fine-tuning seeds")
    return p


def _names(value: str, allowed: Sequence[str], flag: str) -> List[str]:
    names = [v.strip() for v in value.split(",") if v.strip()]
    bad = [n for n in names if n not in allowed]
    if bad or not names or len(set(names)) != len(names):
        raise ValueError(f"{flag}: {value!r}: give distinct names of {', '.join(allowed)}")
    return names


def build(args: argparse.Namespace, argv: List[str], prog: str) -> Tuple[AdaptPlan, List[str], List[str], List[int]]:
    from .cli import build_plan

    objectives = list(ORDER) if args.objectives == "all" else parse_objectives(args.objectives)
    arms = _names(args.arms, list(ARMS), "--arms")
    try:
        seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        seeds = []
    if not seeds or len(set(seeds)) != len(seeds) or min(seeds) < 0 or max(seeds) >= 2**32:
        raise ValueError(f"--seeds: {args.seeds!r}: give distinct integers in [0, 2**32) (numpy's seeds), "
                         "comma-separated")  # fmt: skip
    if args.train_queries is not None or args.retrieval_dev is not None:
        raise ValueError("the study derives its retrieval set (train, test) from documents held out of --corpus: "
                         "--retrieval-dev and --train-queries are adapt.py's")  # fmt: skip
    for flag in ("freeze_encoder_updates", "validate_every", "probe_size"):
        if getattr(args, flag) is not None:
            raise ValueError(f"--{flag.replace('_', '-')}: the study sets it per arm (--arms)")
    args.objective, args.best_checkpoint_metric, args.probe_size = objectives[0], "probe_mrr10", 1
    plan = build_plan(args, argv, prog)
    # no validation: the last checkpoint is each cell's model
    settings = replace(plan.pretrain, validate_every=0, probe_size=0, save_every=plan.pretrain.updates)
    plan = replace(plan, pretrain=settings, dev_in_training=False, train_queries=None, best_metric="")
    for objective in objectives[1:]:  # build_plan checked the first one's
        planned = Adaptation(replace(plan, objective=OBJECTIVES[objective])).pretrain_args(True)
        check_fairseq_args(settings.fairseq_args, planned)
    return plan, objectives, arms, seeds


def main(argv: Optional[List[str]] = None, prog: str = "examples/adaptation_study.py") -> int:
    """The command, as adapt.py's (``kit.command.run_command``)."""
    from .cli import OPTION_LISTS

    return run_command(argv, prog, parser, OPTION_LISTS, build, _run)


def _run(built: Tuple[AdaptPlan, List[str], List[str], List[int]]) -> str:
    plan, objectives, arms, seeds = built
    STUDY.take(plan.out)
    study = Study(plan, objectives, arms, seeds)
    log(f"{len(study.cells)} cells: {len(objectives)} objectives x {len(arms)} arms x {len(seeds)} seeds")
    study.run()
    return (plan.out / "report.md").read_text(encoding="utf-8")
