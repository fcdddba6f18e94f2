"""File safety shared by every tool of the project: atomic writes that respect
the umask, and output folders that a tool may only replace when its own record
says it wrote them.

The guarantees (README, "Guarantees"):

* every file appears complete or not at all: it is written under a temporary
  name in the same folder, flushed and fsync'ed, then renamed over the target;
* files and folders get the permissions the user's umask gives (``tempfile``
  creates 0600 files and 0700 folders; we chmod them before the rename);
* a tool replaces or deletes an existing output only when the output carries
  the tool's own record (a file it wrote and names, e.g. ``preprocess.json``);
  anything else is refused with :class:`OutputError`.
"""

import contextlib
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


def replace_dir(staging: PathLike, out: PathLike) -> Path:
    """Move the finished folder ``staging`` to ``out``; an existing ``out``
    (already checked to be the tool's own) is moved aside first and deleted only
    after the new one is in place, so a kill leaves one of the two whole."""
    staging, out = Path(staging), Path(out)
    old = None
    if out.exists():
        old = Path(tempfile.mkdtemp(prefix=f".{out.name}.old-", dir=out.parent))
        os.rmdir(old)
        os.replace(out, old)
    os.replace(staging, out)
    fsync_dir(out.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
    return out


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


def own_staging_dir(target: PathLike) -> Path:
    """A fresh, empty ``.NAME.partial`` folder beside ``target``, to be moved over
    it with :func:`replace_dir` when complete.

    Only for tools that own the folder around ``target`` (a stage folder inside
    their own ``--out``): the fixed name lets a rerun delete what an interrupted
    run left, because only the tool itself ever creates that name there.
    Outside a folder the tool owns, use :func:`temp_dir_beside`: its random
    name is never reused and nothing beside the user's output is deleted.
    """
    target = Path(target)
    staging = target.parent / f".{target.name}.partial"
    if staging.is_symlink() or staging.is_file():
        staging.unlink()
    elif staging.exists():
        shutil.rmtree(staging)
    staging.parent.mkdir(parents=True, exist_ok=True)
    staging.mkdir(mode=dir_mode())
    os.chmod(staging, dir_mode())
    return staging
