"""One process per folder: an advisory lock (``flock``) on a file in it, held while a tool writes there."""

import errno
import fcntl
import os
from pathlib import Path
from typing import Optional

from .atomic import (
    OutputError,
    PathLike,
    file_mode,
)


def flock_fd(fd: int, wait: bool) -> bool:
    """flock; False when another process holds it (or, ``wait`` aside, locks are unsupported)."""
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
    except OSError:
        return False
    return True


def lock_folder(folder: PathLike, busy: str, *, lock_file: Optional[str] = None) -> Optional[int]:
    """The one writer's lock on ``folder``, taken without waiting: a second writer is refused.

    Locks ``folder`` itself, or the file ``folder/lock_file`` (created, umask
    permissions) when given.  Returns the descriptor that holds the lock
    (closing it, or the process ending, even by ``kill -9``, releases it), or
    None on a file system without locks, where the caller carries on unlocked.
    :class:`OutputError` ``(folder, busy)`` when another process holds it; an
    error opening the folder or file is raised as it is.
    """
    target = Path(folder) / lock_file if lock_file else Path(folder)
    fd = os.open(target, os.O_RDWR | os.O_CREAT if lock_file else os.O_RDONLY, file_mode())
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        os.close(fd)
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
            raise OutputError(folder, busy) from None
        return None
    return fd
