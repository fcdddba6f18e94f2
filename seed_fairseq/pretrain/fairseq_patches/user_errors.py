"""One line for what the user can fix (fix 8).

``fairseq-train``'s ``main`` (``fairseq_cli.train.main``, or ``__main__.main``
under ``python -m fairseq_cli.train``) is wrapped; it is looked up when
``cli_main`` calls it, after ``--user-dir`` was imported.  The plugin's
refusals (``ConfigurationError``, ``CheckpointError``), fairseq's own option checks
written as ``assert`` (:data:`FAIRSEQ_OPTION_ASSERTIONS`), and a full disk, quota,
file-size limit, read-only or forbidden folder (an ``OSError`` naming its file,
``errors.ENVIRONMENT_ERRNOS``) end the run with ``error: FILE: problem`` on
stderr and exit status 2, not a traceback.  torch's writer reports a failed
write as a ``RuntimeError`` without the cause; checkpoint writes recover the
``OSError`` (``checkpoint_files.save_atomic``) and are not retried for these causes
(``atomic_checkpoints``).
"""

import errno
import functools
import sys
from typing import Callable, Optional

from ...base.errors import ENVIRONMENT_ERRNOS
from ._common import fairseq_train_modules, logger, mark

# fairseq-train's own checks of the user's options that fairseq writes as ``assert``
# (``fairseq_cli/train.py``): message -> the line shown instead of the traceback.
FAIRSEQ_OPTION_ASSERTIONS = {
    "Must specify batch size either with --max-tokens or --batch-size": (
        "--batch-size: fairseq-train needs a batch size: pass --batch-size N or --max-tokens N"
    ),
}


def user_error_line(error: BaseException) -> Optional[str]:
    """``FILE: problem`` for an error the user can fix, None for anything else."""
    from ...base.errors import ConfigurationError
    from ..checkpoint import CheckpointError

    if isinstance(error, (ConfigurationError, CheckpointError)):
        return str(error).strip().splitlines()[0]
    if isinstance(error, AssertionError) and str(error) in FAIRSEQ_OPTION_ASSERTIONS:
        return FAIRSEQ_OPTION_ASSERTIONS[str(error)]
    if isinstance(error, OSError) and error.errno in ENVIRONMENT_ERRNOS and error.filename:
        hint = " (the file-size limit: ulimit -f)" if error.errno == errno.EFBIG else ""
        return f"{error.filename}: {error.strerror}{hint}; fix this and rerun the same command to resume"
    return None


def one_line_errors(main: Callable) -> Callable:
    """``main`` that reports the user's errors as ``error: FILE: problem`` and exits with status 2."""
    if getattr(main, "_seed_fairseq_one_line_errors", False):
        return main

    @functools.wraps(main)
    def wrapped(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except Exception as e:
            line = user_error_line(e)
            if line is None:
                raise
            logger.debug("refused", exc_info=True)
            print(f"error: {line}", file=sys.stderr, flush=True)
            sys.exit(2)

    wrapped._seed_fairseq_one_line_errors = True
    return mark(wrapped, __name__)


def install() -> None:
    """Wrap ``main`` of fairseq-train when this process runs it: the module
    ``fairseq_cli.train`` (the ``fairseq-train`` command), or ``python -m fairseq_cli.train``."""
    for module in fairseq_train_modules():
        if callable(getattr(module, "main", None)):
            module.main = one_line_errors(module.main)
