"""Is a split's ``.bin``/``.idx`` pair whole?  Checked before fairseq maps it.

fairseq memory-maps a split without looking at its size: a truncated ``.idx``
fails inside numpy with a message that names no file, and a truncated ``.bin``
loads fine and fails (or reads garbage) only when training reaches its last
blocks.  Both files describe each other, so a cut is visible up front:

* the ``.idx`` header gives the number of sequences N, hence its own size
  (26 + 12 N bytes: sizes int32 and pointers int64), and its last pointer and
  size give the ``.bin``'s (``MMapIndexedDataset``'s format);
* a build of ``preprocess.build`` also records each split's sequences and
  tokens in ``preprocess.json`` (in the data folder, or its parent for a
  sharded build), which gives both sizes independently of the files.

A file smaller than either says is refused with one line naming it.  A file
whose size differs otherwise from the build record only gets a warning (it was
rewritten after the build, e.g. by ``fairseq-preprocess``; its own index still
vouches for it).
"""

import json
import logging
import os
import struct
from pathlib import Path
from typing import Optional, Tuple

import numpy as np
from fairseq.data.indexed_dataset import MMapIndexedDataset, _code_to_dtype

from ...base.errors import ConfigurationError

logger = logging.getLogger(__name__)

_MAGIC = MMapIndexedDataset.Index._HDR_MAGIC
_HEADER = struct.Struct("<9sQBQ")  # magic, version, dtype code, number of sequences
# preprocess/record.py: the build record and its format tag
BUILD_RECORD = "preprocess.json"
BUILD_RECORD_FORMAT = "seed_fairseq.preprocess/1"


def _index_header(idx: Path) -> Optional[Tuple[int, int]]:
    """(itemsize of the tokens, number of sequences) of an mmap ``.idx``; None for
    another of fairseq's formats (not checked here)."""
    with open(idx, "rb") as f:
        head = f.read(_HEADER.size)
    if not _MAGIC.startswith(head[: len(_MAGIC)]):
        return None  # fairseq's "cached"/"lazy" format, or not an index at all: fairseq's own check
    if len(head) < _HEADER.size:
        raise ConfigurationError(f"truncated: {len(head)} bytes, shorter than the index header", idx)
    magic, version, code, n = _HEADER.unpack(head)
    if magic != _MAGIC or version != 1 or code not in _code_to_dtype:
        raise ConfigurationError(f"not a fairseq mmap index (version {version}, dtype code {code})", idx)
    return np.dtype(_code_to_dtype[code]).itemsize, n


def _bin_size_from_index(idx: Path, n: int, itemsize: int) -> int:
    """Bytes the ``.bin`` must hold: the last sequence's pointer plus its size."""
    if n == 0:
        return 0
    with open(idx, "rb") as f:
        f.seek(_HEADER.size + 4 * (n - 1))
        (last_size,) = struct.unpack("<i", f.read(4))
        f.seek(_HEADER.size + 4 * n + 8 * (n - 1))
        (last_pointer,) = struct.unpack("<q", f.read(8))
    return last_pointer + last_size * itemsize


def recorded_split(split_path: str) -> Optional[dict]:
    """The build record's entry for the split at ``split_path`` (``DIR/train``), or None."""
    target = os.path.realpath(split_path)
    folder = Path(split_path).parent
    for root in (folder, folder.parent):
        try:
            record = json.loads((root / BUILD_RECORD).read_text(encoding="utf-8"))
        except (OSError, ValueError):
            continue
        if not isinstance(record, dict) or record.get("format") != BUILD_RECORD_FORMAT:
            continue
        for entry in (record.get("splits") or {}).values():
            if isinstance(entry, dict) and os.path.realpath(root / str(entry.get("path"))) == target:
                return entry
    return None


def _compare(path: Path, actual: int, expected: int, source: str) -> None:
    if actual < expected:
        raise ConfigurationError(f"truncated: {actual} bytes, {source} {expected}", path)
    if actual != expected:
        logger.warning(f"{path}: {actual} bytes, {source} {expected} (rewritten after the build?)")


def check_split_files(split_path: str) -> None:
    """Refuse a split whose ``.idx`` or ``.bin`` is cut short (see the module docstring)."""
    idx, bin_ = Path(split_path + ".idx"), Path(split_path + ".bin")
    for path, other in ((idx, bin_), (bin_, idx)):
        if other.is_file() and not path.is_file():
            raise ConfigurationError(f"not found, but {other.name} is: the split is incomplete", path)
    if not idx.is_file():
        return  # no such split: the task says so
    header = _index_header(idx)
    if header is None:
        return
    itemsize, n = header
    entry = recorded_split(split_path)
    if entry is not None and isinstance(entry.get("sequences"), int) and isinstance(entry.get("tokens"), int):
        _compare(idx, idx.stat().st_size, _HEADER.size + 12 * entry["sequences"], "the build record says")
        _compare(bin_, bin_.stat().st_size, itemsize * entry["tokens"], "the build record says")
    idx_size = idx.stat().st_size
    if idx_size < _HEADER.size + 12 * n:
        raise ConfigurationError(
            f"truncated: {idx_size} bytes, its header says {n} sequences ({_HEADER.size + 12 * n} bytes)", idx
        )
    needed = _bin_size_from_index(idx, n, itemsize)
    if bin_.stat().st_size < needed:
        raise ConfigurationError(f"truncated: {bin_.stat().st_size} bytes, {idx.name} says {needed}", bin_)
