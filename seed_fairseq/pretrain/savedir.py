"""One ``fairseq-train`` per save-dir, and the cleanup of what a killed run left there.

Two runs writing one ``--save-dir`` overwrite each other's ``checkpoint_last.pt``
without a word, and the advised rerun of an interrupted run is exactly such a
second run when the first one still lives.  The process that writes the
checkpoints (rank 0, or each rank with its own checkpoint suffix) therefore
holds an exclusive lock on ``SAVE_DIR/.fairseq-train<suffix>.lock`` from its
first look at the save-dir until it exits (``fairseq_patches.save_dir_lock``
takes it before the first checkpoint is read).

The lock is a POSIX record lock (``fcntl.lockf``): the kernel releases it when
the holder dies, even by ``kill -9``, so a stale lock never blocks a restart;
the pid written into the file is only for the message.  Not ``flock``: a flock
is shared with every process forked while it is held (fairseq's DataLoader
workers), which would keep a killed run's lock alive until its workers notice;
record locks are not inherited by ``fork``.  They are released when the
process closes ANY descriptor of the file, so this module opens it exactly
once per process and keeps it open.
"""

import errno
import fcntl
import logging
import os
import re
import socket
import stat
from pathlib import Path
from typing import Dict, List

from ..base.errors import ConfigurationError, PathLike
from ..base.fileio import file_mode

logger = logging.getLogger(__name__)

_held: Dict[str, int] = {}  # lock file (real path) -> its descriptor, open for the process lifetime
_NO_LOCKS = (errno.ENOLCK, errno.EOPNOTSUPP, errno.EINVAL)  # what lockf says where locks do not exist


def lock_path(save_dir: PathLike, suffix: str = "") -> Path:
    return Path(save_dir) / f".fairseq-train{suffix}.lock"


def _holder(fd: int) -> str:
    """What the lock file says about its holder: ``pid N`` (``on HOST`` when another machine)."""
    try:
        words = os.pread(fd, 256, 0).decode("ascii", "replace").split()
    except OSError:
        words = []
    if not words:
        return "pid unknown"
    host = words[1] if len(words) > 1 else ""
    return f"pid {words[0]}" + (f" on {host}" if host and host != socket.gethostname() else "")


def lock_save_dir(save_dir: PathLike, suffix: str = "") -> Path:
    """Hold the save-dir's lock until this process exits (a no-op when it already does).

    Raises :class:`ConfigurationError` naming the save-dir and the holder's pid
    when another process holds it.
    """
    path = lock_path(save_dir, suffix)
    path.parent.mkdir(parents=True, exist_ok=True)
    key = os.path.realpath(path)
    if key in _held:
        return path
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, file_mode())
    try:
        fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in _NO_LOCKS:  # a file system without locks must not stop training
            os.close(fd)
            logger.warning(f"{path}: cannot lock ({e.strerror}): a second run into {save_dir} would not be noticed")
            return path
        if e.errno not in (errno.EACCES, errno.EAGAIN):
            os.close(fd)
            raise
        holder = _holder(fd)
        os.close(fd)
        raise ConfigurationError(
            f"another fairseq-train is writing this folder ({holder}); wait for it to end, "
            "stop it, or choose another --save-dir",
            Path(save_dir),
        ) from None
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode("ascii", "replace"), 0)
    _held[key] = fd
    return path


# fileio.temp_path_beside names a checkpoint's staging file ".NAME.tmp-" + tempfile's 8 random
# characters; NAME is one of fairseq's checkpoint names (checkpoint_files.checkpoint_candidates)
_NAME = r"checkpoint(_last|_best|\d+|_\d+_\d+|\.best_.*)"
_RANDOM = r"[a-z0-9_]{8}"


def remove_staging_debris(save_dir: PathLike, suffix: str = "") -> List[Path]:
    """Delete the staging files of checkpoint writes that a killed run left in ``save_dir``.

    Only regular files named exactly like the atomic writes of checkpoints name
    them (``.checkpoint_last.pt.tmp-XXXXXXXX``, for this run's checkpoint
    SUFFIX); call it only while holding the save-dir's lock for that suffix,
    when no write of the run can be under way.
    """
    pattern = re.compile(r"\." + _NAME + re.escape(suffix) + r"\.pt\.tmp-" + _RANDOM)
    removed = []
    try:
        entries = list(os.scandir(save_dir))
    except FileNotFoundError:
        return removed
    for entry in entries:
        if pattern.fullmatch(entry.name) and stat.S_ISREG(entry.stat(follow_symlinks=False).st_mode):
            os.unlink(entry.path)
            removed.append(Path(entry.path))
    if removed:
        logger.info(f"removed {len(removed)} staging file(s) of interrupted checkpoint writes in {save_dir}")
    return removed
