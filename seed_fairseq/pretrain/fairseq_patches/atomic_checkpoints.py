"""Atomic checkpoints (fix 3).

fairseq writes the first checkpoint of a save under a temporary name but then
copies it onto ``checkpoint_last.pt`` (and ``checkpoint_best.pt`` ...) in
place: a kill during that copy leaves a truncated ``checkpoint_last.pt`` and
the same command no longer restarts.  Every checkpoint name is now written to a
temporary file in the same folder, fsync'ed and renamed:

- ``fairseq.checkpoint_utils.PathManager``: fairseq's ``PathManager`` with an
  atomic ``copy`` (``fileio.copy_atomic``) for local paths;
- ``fairseq.checkpoint_utils.torch_persistent_save``: local files are written
  by ``checkpoint_files.save_atomic``, which recovers the ``OSError`` that torch's
  writer reports as a ``RuntimeError`` without the cause.  Transient write
  errors are retried as fairseq does (3 attempts); the errors of the machine the
  user must fix (``errors.ENVIRONMENT_ERRNOS``: full disk, quota, file-size
  limit, read-only or forbidden folder) are not.

Remote paths (``://``) and ``async_write`` keep fairseq's own code.
"""

import os
import time

from ...base.errors import ENVIRONMENT_ERRNOS
from ._common import mark


class _AtomicPathManager:
    """fairseq's ``PathManager`` inside ``checkpoint_utils`` with an atomic ``copy``."""

    def __init__(self, path_manager):
        self._pm = path_manager

    def __getattr__(self, name):
        return getattr(self._pm, name)

    def copy(self, src_path, dst_path, overwrite=False):
        if "://" in str(dst_path) or "://" in str(src_path):  # remote storage: fairseq's own copy
            return self._pm.copy(src_path, dst_path, overwrite)
        if os.path.exists(dst_path) and not overwrite:
            return False
        from ...base.fileio import copy_atomic

        try:
            copy_atomic(src_path, dst_path)
        except OSError as e:
            if e.filename or e.errno is None:
                raise
            # a failed write() names no file: say which checkpoint could not be written
            raise OSError(e.errno, e.strerror, str(dst_path)) from e
        return True


def _atomic_torch_persistent_save(obj, filename, async_write: bool = False):
    if async_write or not isinstance(filename, (str, os.PathLike)) or "://" in str(filename):
        return _original_torch_persistent_save(obj, filename, async_write)
    from ..checkpoint_files import save_atomic

    for attempt in range(3):  # fairseq retries transient write errors too
        try:
            save_atomic(obj, filename)
            return
        except OSError as e:
            if attempt == 2 or e.errno in ENVIRONMENT_ERRNOS:
                raise
            time.sleep(2.5)


_original_torch_persistent_save = None


def install_atomic_copy() -> None:
    from fairseq import checkpoint_utils

    if not isinstance(checkpoint_utils.PathManager, _AtomicPathManager):
        checkpoint_utils.PathManager = mark(_AtomicPathManager(checkpoint_utils.PathManager), __name__)


def install_atomic_save() -> None:
    global _original_torch_persistent_save
    from fairseq import checkpoint_utils

    if checkpoint_utils.torch_persistent_save is not _atomic_torch_persistent_save:
        _original_torch_persistent_save = checkpoint_utils.torch_persistent_save
        checkpoint_utils.torch_persistent_save = _atomic_torch_persistent_save


mark(_atomic_torch_persistent_save, __name__)
