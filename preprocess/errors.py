"""The one exception type the CLI turns into ``error: <file>: <problem>`` and exit code 2,
and the machine's errors it reports the same way."""

import contextlib
import errno
import os
from typing import Iterator, Union

# Errors of the machine rather than of the code: reported like bad input, one
# line naming the file, so the user can fix it and rerun to resume.
ENVIRONMENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM})
# The ones only a write can raise: a full disk, a quota, the file-size limit.
WRITE_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG})


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


@contextlib.contextmanager
def writing(path: Union[str, os.PathLike]) -> Iterator[None]:
    """Name ``path`` in a full-disk or file-too-large error raised inside the block.

    Python's ``write``, ``flush`` and ``os.fsync`` raise them without a file
    name (and a worker's or a library's error may carry none), which would
    leave the user a traceback instead of ``error: FILE: problem``. An error
    that already names its file keeps that name: put the narrowest block
    innermost.
    """
    try:
        yield
    except OSError as e:
        if e.errno in WRITE_ERRNOS and not e.filename:
            e.filename = str(path)
        raise


def environment_problem(e: OSError) -> str:
    """The problem of one of ENVIRONMENT_ERRNOS, with what to do about it."""
    if e.errno == errno.EFBIG:
        what = "file too large (over the file-size limit, see ulimit -f, or the file system's largest file)"
    else:
        what = e.strerror or os.strerror(e.errno)
    return f"{what}; fix this and rerun the same command to resume"
