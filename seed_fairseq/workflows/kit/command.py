"""What the command lines of the workflows share: the fine-tuning flags, quiet libraries, the one-line
report of a stage's error, and the command itself (flags -> plan -> run -> its report, or ``error:``)."""

import argparse
import os
import signal
import sys
from typing import Any, Callable, List, Optional, Sequence

from preprocess.errors import PreprocessError

from ...base.fileio import OutputError, storage_line
from ...base.retrieval_data import DataFormatError
from ...encoders.retrieval.cli import report
from ...encoders.retrieval.config import flag_of
from ...encoders.retrieval.index import SearchError
from .checks import glue_option_values
from .folder import StageError
from .interrupt import Interrupted, handle_interrupts

# FinetuneConfig field -> the workflows' flag: their own names (the epochs, batch size and
# learning rate of fine-tuning under ft-), the flags and help generated from the fields
FT_PREFIXED = ("epochs", "batch_size", "lr")
FINETUNE_FLAGS = {
    name: flag_of(name, prefix="ft-" if name in FT_PREFIXED else "")
    for name in ("negatives", "loss", "num_negatives", *FT_PREFIXED, "encode_batch_size", "index")
}
FINETUNE_TYPES = {"lr": float}  # --ft-lr: checked by FinetuneConfig.validate (finetune.py: by argparse)


def quiet_libraries() -> None:
    """The libraries' progress bars and warnings would bury the stage log; no hub look-ups."""
    for key, value in (("TRANSFORMERS_VERBOSITY", "error"), ("HF_HUB_DISABLE_PROGRESS_BARS", "1"),
                       ("TOKENIZERS_PARALLELISM", "false"), ("HF_HUB_OFFLINE", "1")):  # fmt: skip
        os.environ.setdefault(key, value)


def report_stage_error(e: Exception) -> Optional[int]:
    """Exit status 2 after one ``error:`` line for an error of a stage the user can act on
    (bad data, a refused folder, the one-line errors of the tools the stages call, a full
    disk); None for anything else (a bug: the caller re-raises it with its traceback)."""
    from ...encoders.hf.import_ import HFImportError

    if isinstance(e, StageError):
        if e.detail:
            print(e.detail, file=sys.stderr)
        return report(e)
    if isinstance(e, (DataFormatError, OutputError, SearchError, PreprocessError, HFImportError)):
        return report(e)
    line = storage_line(e)  # a full disk or file-size limit (runs, reports, plots)
    return None if line is None else report(line)


def run_command(
    argv: Optional[List[str]],
    prog: str,
    make_parser: Callable[[], argparse.ArgumentParser],
    option_lists: Sequence[str],
    build: Callable[[argparse.Namespace, List[str], str], Any],
    run: Callable[[Any], str],
) -> int:
    """A workflow's command: ``build`` the plan from the flags (refusals: ``error:`` and exit 2, before
    anything is written), ``run`` it and print what it returns (its report); on SIGINT/SIGTERM/SIGHUP
    every child stopped (interrupt.py) and 128 + the signal number.  ``option_lists``: the flags whose
    value is a list of fairseq-train options (``--fairseq-args "--fp16"``, as the docs write it)."""
    with handle_interrupts():
        try:
            return _command(list(sys.argv[1:] if argv is None else argv), prog, make_parser, option_lists, build, run)
        except Interrupted as e:
            print(f"interrupted ({signal.Signals(e.signum).name}); rerun the same command to resume", file=sys.stderr)
            return e.exit_code


def _command(argv: List[str], prog: str, make_parser, option_lists, build, run) -> int:
    args = make_parser().parse_args(glue_option_values(argv, option_lists))
    quiet_libraries()
    try:
        plan = build(args, argv, prog)
    except (ValueError, OutputError) as e:  # DataFormatError is a ValueError
        return report(e)
    if not args.gpu:  # fine-tuning and encoding in this process: as --flush-denormal in pre-training
        import torch

        torch.set_flush_denormal(True)
    try:
        # everything that can be refused was checked before --out is created or touched
        text = run(plan)
    except Exception as e:
        code = report_stage_error(e)
        if code is None:
            raise
        return code
    print(text)
    return 0
