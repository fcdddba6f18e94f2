"""The error the plugin raises when ``fairseq-train`` must not start as configured.

Raised for what the user can fix -- a data file that is missing, truncated or
split at ``:``, a batch setting that leaves validation without a batch, a model
with fewer positions than a block, a save-dir another run is writing -- so that
``fairseq-train`` reports it as one ``error: FILE: problem`` line with exit
status 2 (``fairseq_patches.user_errors`` wraps fairseq-train's ``main``)
instead of a traceback, and before any training.
"""

import errno
import os
from typing import Optional, Union

PathLike = Union[str, os.PathLike]

# Errors of the machine that the user must fix (free space, raise a limit, fix
# permissions): fairseq-train reports them in one line and never retries them
# (seed_fairseq/pretrain/fairseq_patches: user_errors, atomic_checkpoints).
ENVIRONMENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM})


class ConfigurationError(ValueError):
    """A configuration or input refused before training.

    ``str()`` is ``FILE: problem``, or the problem alone when no file is at
    fault (an option: the problem then names it).  A ``ValueError``, as the
    option checks of the tasks and criterions have always raised.
    """

    def __init__(self, problem: str, path: Optional[PathLike] = None):
        self.path = None if path is None else str(path)
        self.problem = problem
        super().__init__(problem if self.path is None else f"{self.path}: {problem}")
