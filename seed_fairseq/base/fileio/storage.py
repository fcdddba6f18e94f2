"""Full disk, quota and file-size limit: one line naming the file (``seed_fairseq.base.fileio``)."""

import contextlib
import errno
import os
from typing import Iterator, Optional

from .atomic import PathLike

# ---- full disk, quota, file-size limit ------------------------------------------------------

# Errors of the machine rather than of the input: reported as one line naming the output.
STORAGE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EFBIG)


def storage_error(exc: Optional[BaseException]) -> Optional[OSError]:
    """The full-disk / quota / file-size-limit error behind ``exc``, or None.

    Libraries wrap it: torch raises a RuntimeError whose context is the
    OSError (when it writes through a Python file); safetensors and tokenizers
    (Rust) keep only the OS error's text, ``... (os error 28)``.
    """
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, OSError) and exc.errno in STORAGE_ERRNOS:
            return exc
        for code in STORAGE_ERRNOS:
            if f"(os error {code})" in str(exc):
                return OSError(code, os.strerror(code))
        exc = exc.__cause__ or exc.__context__
    return None


def storage_line(exc: BaseException) -> Optional[str]:
    """``FILE: problem`` for a full disk, quota or file-size limit behind ``exc``
    (:func:`storage_error`), for a tool's one ``error:`` line; None for anything else."""
    err = storage_error(exc)
    if err is None:
        return None
    hint = " (the file-size limit: ulimit -f)" if err.errno == errno.EFBIG else ""
    where = f"{err.filename}: " if err.filename else ""
    return f"{where}{err.strerror}{hint} while writing the output; free space or raise the limit, then run again"


@contextlib.contextmanager
def naming(path: PathLike) -> Iterator[None]:
    """Name ``path`` in a full disk, quota or file-size limit error raised inside the block
    without a file name (Python's ``write`` and ``flush`` raise them so).

    For a block that writes the one file ``path``; not inside :func:`atomic_path`,
    which may be nested in another one's block and could not tell whose write failed.
    (``preprocess.errors.writing`` is this function.)
    """
    try:
        yield
    except OSError as e:
        if e.errno in STORAGE_ERRNOS and not e.filename:
            raise OSError(e.errno, e.strerror, str(path)) from e
        raise
