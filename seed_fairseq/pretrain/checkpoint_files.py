"""A save folder's checkpoints: what a restart falls back to, and atomic writes
(``torch.save`` to a temporary name, fsync, rename)."""

import re
from pathlib import Path
from typing import Any, List, Optional, Tuple

import torch

from ..base.fileio import atomic_path
from .checkpoint import CheckpointError, PathLike, UntrustedCheckpointError, num_updates, peek_checkpoint

# ---------------------------------------------------------------------------
# restarts
# ---------------------------------------------------------------------------


def checkpoint_candidates(save_dir: PathLike, suffix: str = "") -> List[Path]:
    """Every checkpoint fairseq-train may have written in ``save_dir`` with ``suffix``."""
    save_dir = Path(save_dir)
    if not save_dir.is_dir():
        return []
    pattern = re.compile(r"checkpoint(_last|_best|\d+|_\d+_\d+|\.best_.*)" + re.escape(suffix) + r"\.pt")
    return sorted(p for p in save_dir.iterdir() if pattern.fullmatch(p.name) and p.is_file())


def newest_readable_checkpoint(
    save_dir: PathLike, suffix: str = "", prefer: Optional[PathLike] = None
) -> Tuple[Optional[Path], List[str]]:
    """The readable checkpoint of ``save_dir`` with the most updates (``prefer``
    wins ties) and a list of the unreadable ones with their problems.

    A checkpoint holding a type outside the allowlist is not skipped like a
    damaged one: :class:`UntrustedCheckpointError` (a restart must not quietly
    fall back past a file someone put there)."""
    best, best_key, bad = None, None, []
    for p in checkpoint_candidates(save_dir, suffix):
        try:
            state = peek_checkpoint(p)
        except UntrustedCheckpointError:
            raise
        except CheckpointError as e:
            bad.append(str(e))
            continue
        key = (num_updates(state), prefer is not None and p == Path(prefer), p.stat().st_mtime_ns)
        if best_key is None or key > best_key:
            best, best_key = p, key
    return best, bad


# ---------------------------------------------------------------------------
# writing
# ---------------------------------------------------------------------------


# what may stop torch.save inside a write: the storage, Ctrl-C, a SIGTERM handler's SystemExit
_WRITE_STOPPERS = (OSError, KeyboardInterrupt, SystemExit)


class _RecordingWriter:
    """A file for ``torch.save`` that keeps what interrupted a write: torch's writer turns
    ANY exception of ``write`` -- the ``OSError`` of a full disk, the ``KeyboardInterrupt`` of
    a Ctrl-C, the ``SystemExit`` of a SIGTERM handler -- into ``RuntimeError("... unexpected
    pos ...")`` without the cause."""

    def __init__(self, f):
        self.f = f
        self.error: Optional[BaseException] = None

    def write(self, data) -> int:
        try:
            return self.f.write(data)
        except BaseException as e:  # recorded, and raised again by torch_save in place of torch's
            self.error = e
            raise

    def flush(self) -> None:
        self.f.flush()


def torch_save(obj: Any, path: PathLike, name: Optional[PathLike] = None) -> None:
    """``torch.save(obj, path)`` whose interrupted write raises what interrupted it: the
    ``OSError`` of a full disk or file-size limit (with ``name``, default ``path``, as its
    file name), the ``KeyboardInterrupt`` of a Ctrl-C, the ``SystemExit`` of a SIGTERM handler."""
    try:
        with open(path, "wb") as f:
            writer = _RecordingWriter(f)
            try:
                torch.save(obj, writer)
            except RuntimeError as e:
                # what write() recorded, or what it raised before it could (a signal's handler
                # runs at any bytecode: torch keeps that exception as the context of its own)
                cause = writer.error or (e.__context__ if isinstance(e.__context__, _WRITE_STOPPERS) else None)
                if cause is None:
                    raise
                raise cause from e
    except OSError as e:
        if e.errno is None:
            raise
        raise OSError(e.errno, e.strerror, str(name or path)) from e


def save_atomic(obj: Any, path: PathLike) -> Path:
    """``torch.save`` that leaves either the old file or the complete new one.

    A failed write (full disk, file-size limit ...) raises the ``OSError`` with
    ``path`` as its file name; an interrupted one (Ctrl-C, SIGTERM) the
    ``KeyboardInterrupt`` / ``SystemExit``, never torch's ``RuntimeError``."""
    with atomic_path(path) as tmp:
        torch_save(obj, tmp, name=path)
    return Path(path)
