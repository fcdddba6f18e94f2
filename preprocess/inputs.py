"""Input identity for ``preprocess.build``: content, not path or mtime.

A build is identified by the sha256 of its inputs' content; :class:`InputHasher`
rehashes only the files whose size or mtime changed since an earlier run hashed
them, and tells whether a file changed while the build read it. :func:`book_files`
lists a ``--books`` folder (what is hashed and read), leaving builds out.
"""

import hashlib
import logging
import os
from pathlib import Path
from typing import Any, Callable, Dict, List, Optional, Set, Union

from seed_fairseq.base.fileio import sha256_file

from .errors import PreprocessError
from .record import TOOL, holds_build
from .text import check_nonempty_file

logger = logging.getLogger("preprocess")


def file_sha256(path: Path) -> str:
    """:func:`seed_fairseq.base.fileio.sha256_file`, an unreadable file a :class:`PreprocessError`."""
    try:
        return sha256_file(path)
    except OSError as e:
        raise PreprocessError(path, f"cannot read it ({e.strerror or e})") from None


class InputHasher:
    """sha256 of input files, rehashing only files whose size or mtime changed
    since they were hashed (``cache``: {resolved path: {bytes, mtime_ns, sha256}})."""

    def __init__(self, cache: Optional[Dict[str, Any]] = None):
        self.cache = {k: v for k, v in (cache or {}).items() if isinstance(v, dict)}
        self.used: Dict[str, Dict[str, Any]] = {}

    def file(self, path: Path) -> str:
        # The readers' own checks first: a FIFO or device is refused here,
        # before open() could block on it.
        check_nonempty_file(path)
        key = str(Path(path).resolve())
        st = os.stat(key)
        entry = self.cache.get(key)
        if not (
            entry
            and entry.get("bytes") == st.st_size
            and entry.get("mtime_ns") == st.st_mtime_ns
            and isinstance(entry.get("sha256"), str)
        ):
            entry = {"bytes": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": file_sha256(Path(path))}
        self.used[key] = entry
        return entry["sha256"]

    def source(self, kind: str, path: str) -> str:
        """Content identity of one --wiki / --books / --text input."""
        if kind != "books":
            return self.file(Path(path))
        root = Path(path)
        h = hashlib.sha256()
        skipped = set()
        for f in book_files(root, skipped):  # sorted: the order books are read in
            h.update(f"{f.relative_to(root).as_posix()}\0{self.file(f)}\n".encode("utf-8"))
        for folder in sorted(skipped):
            logger.info("--books %s: skipping %s, a build of %s (its outputs are not books)", root, folder, TOOL)
        return h.hexdigest()

    def changed_since_hashed(self) -> Optional[str]:
        """A hashed file whose size or mtime is no longer what it was, if any."""
        for key, entry in self.used.items():
            try:
                st = os.stat(key)
            except OSError:
                return key
            if (st.st_size, st.st_mtime_ns) != (entry["bytes"], entry["mtime_ns"]):
                return key
        return None


def book_files(directory: Union[str, Path], skipped: Optional[Set[Path]] = None) -> List[Path]:
    """The .txt files of a BookCorpus-style directory (one book per file), sorted for determinism.

    A folder below ``directory`` that holds a build of preprocess.build (an
    ``--out`` put inside the books folder: this build's or another's) is not
    books: its dict.txt and work files are the tool's outputs, and reading them
    would make a build's input depend on its own output, so that its identical
    rerun would never be "nothing to do". Such folders, and .txt links pointing
    into one, are left out; ``skipped`` (when given) collects what was left out.
    """
    directory = Path(directory)
    if not directory.exists():
        raise PreprocessError(directory, "no such directory")
    if not directory.is_dir():
        raise PreprocessError(directory, "not a directory (--books expects a folder of .txt files)")
    if holds_build(directory):
        raise PreprocessError(
            directory,
            "holds a build of preprocess.build (preprocess.json or .work): its files are that "
            "build's outputs, not books; give the folder of the .txt files",
        )
    root = directory.resolve()
    holds: Dict[Path, bool] = {}

    def build_folder(path: Path, stop: Callable[[Path], bool]) -> Optional[Path]:
        """The first folder above ``path``, before one ``stop`` accepts, that holds a build."""
        for parent in path.parents:
            if stop(parent):
                return None
            if parent not in holds:
                holds[parent] = holds_build(parent)
            if holds[parent]:
                return parent
        return None

    files = []
    for p in sorted(directory.rglob("*.txt")):
        if not p.is_file():
            continue
        # rglob does not enter linked folders: a file's folders below ``directory`` are real ones
        found = build_folder(p, lambda d: d == directory)
        if found is None and p.is_symlink():
            # where the link points, up to the books folder or a folder above it
            found = build_folder(p.resolve(), lambda d: d == root or d in root.parents)
            if found is not None:
                found = p
        if found is not None:
            if skipped is not None:
                skipped.add(found)
            continue
        files.append(p)
    if not files:
        raise PreprocessError(directory, "empty directory: no .txt files found")
    return files
