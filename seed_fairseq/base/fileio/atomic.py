"""Atomic writes that respect the umask, file hashing, and the checks before a tool writes
(``seed_fairseq.base.fileio``)."""

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator, Optional, Union

PathLike = Union[str, os.PathLike]


class OutputError(ValueError):
    """An output location the tool must not write to; ``str()`` is ``PATH: problem``."""

    def __init__(self, path: PathLike, problem: str):
        self.path = str(path)
        self.problem = problem
        super().__init__(f"{self.path}: {problem}")


def current_umask() -> int:
    """The process umask, read without changing it where the OS allows."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except OSError:
        pass
    old = os.umask(0o022)  # not thread-safe; only where /proc is missing
    os.umask(old)
    return old


def file_mode() -> int:
    return 0o666 & ~current_umask()


def dir_mode() -> int:
    return 0o777 & ~current_umask()


def fsync_dir(path: PathLike) -> None:
    """Make a rename in ``path`` durable (no-op where directories cannot be opened)."""
    try:
        fd = os.open(str(path), os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def temp_path_beside(target: PathLike, suffix: str = "") -> Path:
    """A new empty file next to ``target`` (same file system, so rename is atomic),
    hidden, with umask permissions."""
    target = Path(target)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.tmp-", suffix=suffix, dir=target.parent)
    os.close(fd)
    os.chmod(tmp, file_mode())
    return Path(tmp)


def temp_dir_beside(target: PathLike) -> Path:
    target = Path(target)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.tmp-", dir=target.parent))
    os.chmod(tmp, dir_mode())
    return tmp


def _fsync_file(path: Path) -> None:
    with open(path, "rb+") as f:
        os.fsync(f.fileno())


@contextlib.contextmanager
def atomic_path(target: PathLike, suffix: str = "") -> Iterator[Path]:
    """``with atomic_path(out) as tmp: write(tmp)`` -> ``out`` appears complete or not at all.

    On an exception (or a kill) only a hidden temporary file is left behind,
    which the ``with`` block removes when it can.
    """
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = temp_path_beside(target, suffix)
    try:
        yield tmp
        _fsync_file(tmp)
        os.replace(tmp, target)
        fsync_dir(target.parent)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_bytes_atomic(path: PathLike, data: bytes) -> Path:
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)
    return Path(path)


def write_text_atomic(path: PathLike, text: str) -> Path:
    return write_bytes_atomic(path, text.encode("utf-8"))


def write_json_atomic(path: PathLike, obj: Any) -> Path:
    return write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=True, ensure_ascii=False) + "\n")


def copy_atomic(src: PathLike, dst: PathLike) -> Path:
    with atomic_path(dst) as tmp:
        with open(src, "rb") as fin, open(tmp, "wb") as fout:
            shutil.copyfileobj(fin, fout, 16 << 20)
    return Path(dst)


HASH_CHUNK = 16 << 20


def sha256_file(path: PathLike, chunk: int = HASH_CHUNK) -> str:
    """The sha256 (hex) of the content of the file ``path``, read ``chunk`` bytes at a time.

    An unreadable file raises the ``OSError`` of ``open`` or ``read``; callers
    that report input errors wrap it (``preprocess.inputs``).
    """
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(chunk), b""):
            h.update(block)
    return h.hexdigest()


def check_output_dir(out: PathLike, record: str, tool: str, is_own: Optional[Callable[[Path], bool]] = None) -> bool:
    """May ``tool`` write the folder ``out``?  Returns True when it already holds
    an earlier output of the tool (identified by the file ``record`` in it, and
    ``is_own(record_path)`` when given), False when it is missing or empty.
    Raises :class:`OutputError` for a file, or a non-empty folder the tool did
    not write: its contents are the user's and are never touched."""
    out = Path(out)
    if not out.exists():
        if out.is_symlink():
            raise OutputError(out, "is a broken symbolic link")
        return False
    if not out.is_dir():
        raise OutputError(out, "exists and is not a folder")
    rec = out / record
    if rec.is_file() and (is_own is None or is_own(rec)):
        return True
    if any(out.iterdir()):
        raise OutputError(
            out,
            f"folder is not empty and was not written by {tool} (no {record} in it); "
            "refusing to write into it: choose a new or empty folder",
        )
    return False


def chmod_tree(root: PathLike) -> None:
    """Give ``root`` and everything under it the umask's permissions.

    Libraries that write model folders (transformers' ``save_pretrained``,
    sentence-transformers) create some files through private temporary files
    with mode 0600 whatever the umask; the project promises umask permissions
    for everything it writes.
    """
    root = Path(root)
    for path in [root, *root.rglob("*")]:
        if not path.is_symlink():
            os.chmod(path, dir_mode() if path.is_dir() else file_mode())


def check_parents(path: PathLike) -> None:
    """:class:`OutputError` when the nearest existing ancestor of ``path`` is not a
    folder (``--out file.txt/model``): refused up front instead of failing after the work."""
    for parent in Path(path).absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise OutputError(parent, "exists and is not a folder")
            return


def _read_json(path: Path) -> Any:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
