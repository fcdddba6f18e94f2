"""The one place a ``fairseq-train`` command line is written: an objective's description
(``seed_fairseq/base/objectives.py``) and the settings of a run in, the arguments out.

    train_args(d, ...)        what follows DATA: d's --user-dir (another's), --task, --criterion,
                              --arch, the model's sizes, d's own settings, then the run's options
    GENERATOR                 SimLM's generator (a small MLM-only encoder: ``objectives.generator_args``)
    DEFAULT_OPTIMIZER         the optimizer the tools' runs use (``torch_adam``); ADAM_OPTIMIZERS, the
                              ones that take the options written with it (--adam-betas, --adam-eps)
    parse_argv(data, args)    DATA --user-dir seed_fairseq ARGS: what fairseq's own parser reads
                              (``base/user_dir.py``: the FLOPs count and the in-process runs parse it)
    command(data, args, ...)  the full command: [launcher] fairseq-train DATA --user-dir ... ARGS
                              [--save-dir]

The comparison, the adaptation and its study, gpucheck, the benchmarks and the tests build
their command lines here.  Imports without fairseq.
"""

import sys
from pathlib import Path
from typing import List, Optional, Sequence

from ...base.objectives import ObjectiveDescription
from ...base.user_dir import parse_argv

# SimLM's generator: the MLM-only encoder (a small one), its masked LM frozen during SimLM's training
GENERATOR = ObjectiveDescription(
    "generator",
    "seed_pretrain",
    task="seed_pretrain",
    arch="seed_encoder_mlm_only",
    args=("--mlm-weight", "1.0"),
    label="SimLM's generator",
)
# fairseq's own masked LM (RoBERTa): the reference of the cost measurements
FAIRSEQ_MLM = ObjectiveDescription(
    "masked_lm", "masked_lm", task="masked_lm", arch="roberta_base", label="fairseq's masked_lm"
)

# fairseq's adam update on torch's fused kernel (pretrain/optim/torch_adam.py): what every run the tools
# write uses.  fairseq's own "adam" computes the same update (its Python loop, one tensor at a time) and
# takes the same options; a tool that measures fairseq's own stack (gpucheck's masked_lm reference)
# passes "adam" instead of this.
DEFAULT_OPTIMIZER = "torch_adam"
ADAM_OPTIMIZERS = ("torch_adam", "adam")

# one plain SGD step with learning rate 1: the weight change is the gradient (the data-parallel
# checks: tests/test_contract.py and gpucheck)
SGD_ONE_STEP = (
    "--optimizer", "sgd", "--lr", "1.0", "--lr-scheduler", "fixed", "--clip-norm", "0",
    "--dropout", "0", "--attention-dropout", "0", "--weight-decay", "0",
)  # fmt: skip


def train_args(
    d: ObjectiveDescription,
    *rest: str,
    model: Sequence[str] = (),
    arch: str = "",
    own: Optional[Sequence[str]] = None,
    generator: Optional[str] = None,
) -> List[str]:
    """fairseq-train's arguments after DATA for objective ``d``: its ``--user-dir`` when it is
    registered outside the plugin, its task, criterion and ``arch`` (default: its full-size one),
    the ``model`` options (the encoder's sizes), its ``own`` settings (default: its paper's,
    ``d.args``), ``--generator-path`` when it needs one, then ``rest``."""
    if d.needs_generator and not generator:
        raise ValueError(f"{d.comparison_name} needs a generator checkpoint")
    return [
        *d.user_dir_args(),
        "--task", d.task, "--criterion", d.criterion, "--arch", arch or d.arch,
        *model,
        *(d.args if own is None else own),
        *(["--generator-path", str(generator)] if d.needs_generator else []),
        *rest,
    ]  # fmt: skip


def without_options(args: Sequence[str], options: Sequence[str]) -> List[str]:
    """``args`` without each of ``options`` and the value after it."""
    out, skip = [], False
    for a in args:
        if skip:
            skip = False
        elif a in options:
            skip = True
        else:
            out.append(a)
    return out


def fairseq_bin(name: str = "fairseq-train") -> str:
    """The fairseq tool beside this interpreter (the virtual environment's)."""
    return str(Path(sys.executable).with_name(name))


def command(data, args: Sequence[str], save_dir=None, launcher: Sequence[str] = (), program: str = "") -> List[str]:
    """The full command: ``[launcher] fairseq-train DATA --user-dir seed_fairseq ARGS [--save-dir SAVE_DIR]``
    (``program``: another fairseq-train than the one beside this interpreter)."""
    save = ["--save-dir", str(save_dir)] if save_dir is not None else []
    return [*map(str, launcher), program or fairseq_bin("fairseq-train"), *parse_argv(data, args), *save]
