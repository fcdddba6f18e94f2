"""The one exception type the CLI turns into ``error: <file>: <problem>`` and exit code 2,
and the machine's errors it reports the same way."""

import errno
import os

from seed_fairseq.base.errors import ENVIRONMENT_ERRNOS
from seed_fairseq.base.fileio import STORAGE_ERRNOS as WRITE_ERRNOS
from seed_fairseq.base.fileio import naming as writing

# ENVIRONMENT_ERRNOS: errors of the machine rather than of the code, reported like
# bad input, one line naming the file, so the user can fix it and rerun to resume.
# WRITE_ERRNOS: the ones only a write can raise (a full disk, a quota, the file-size
# limit). writing(path): names ``path`` in such an error raised without a file name
# (Python's write, flush and fsync raise them so, and a worker's or a library's
# error may carry none); an error that already names its file keeps that name: put
# the narrowest block innermost.
__all__ = ["ENVIRONMENT_ERRNOS", "WRITE_ERRNOS", "PreprocessError", "environment_problem", "writing"]


class PreprocessError(Exception):
    """Bad input or an unusable output folder, named by the file it concerns.

    Raised for problems a user can fix (truncated dump, wrong file, non-UTF-8
    bytes, too large a vocabulary ...). Bugs stay ordinary exceptions so they
    keep their traceback.
    """

    def __init__(self, path, problem):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")

    def __reduce__(self):
        # Raised in a pool worker, it is pickled back to the parent; the default
        # (the class called with ``args``, one string) would fail there, and
        # multiprocessing's result thread would die and leave the map waiting forever.
        return type(self), (self.path, self.problem)


def environment_problem(e: OSError) -> str:
    """The problem of one of ENVIRONMENT_ERRNOS, with what to do about it."""
    if e.errno == errno.EFBIG:
        what = "file too large (over the file-size limit, see ulimit -f, or the file system's largest file)"
    else:
        what = e.strerror or os.strerror(e.errno)
    return f"{what}; fix this and rerun the same command to resume"
