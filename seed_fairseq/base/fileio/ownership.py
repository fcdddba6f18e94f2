"""Output folders a tool builds, records and replaces: exactly what its record lists (``seed_fairseq.base.fileio``)."""

import contextlib
import errno
import json
import os
import shutil
import signal
import threading
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any, Callable, Dict, FrozenSet, Iterable, Iterator, List, Optional, Tuple

from .atomic import (
    OutputError,
    PathLike,
    _read_json,
    check_parents,
    chmod_tree,
    file_mode,
    fsync_dir,
    temp_dir_beside,
    write_json_atomic,
)
from .locks import flock_fd, lock_folder
from .storage import storage_error

# ---- deleting exactly what a record lists ---------------------------------------------------


def listed_path(out: PathLike, rel: str) -> Path:
    """``out / rel`` for an entry of a tool's record, once it is known to stay in ``out``.

    :class:`OutputError` names the entry when it is not a plain relative path
    (absolute, ``..``, a backslash) or when one of its folders is a symbolic
    link: a record listing ``lnk/s.txt`` with ``out/lnk`` a link to elsewhere
    must never delete ``elsewhere/s.txt``.  Refusing every link on the way is
    the strict form of "resolves inside ``out``": a link that points inside
    today may point elsewhere by the time the file is deleted.  The entry
    itself may be a link: deleting it removes the link only.
    """
    out = Path(out)
    pure = PurePosixPath(rel) if isinstance(rel, str) else None
    bad = pure is None or not pure.parts or "\\" in rel or "\0" in rel or pure.is_absolute() or ".." in pure.parts
    if bad:
        raise OutputError(out, f"its record lists {rel!r}, which is not a path inside the folder; nothing was deleted")
    folder = out
    for part in pure.parts[:-1]:
        folder = folder / part
        if folder.is_symlink():
            raise OutputError(
                folder,
                f"is a symbolic link, and the record lists {rel} through it: files are never deleted through "
                "a link (it may lead out of the folder); nothing was deleted: move the link away",
            )
    return folder / pure.parts[-1]


def delete_listed(out: PathLike, rels: Iterable[str]) -> None:
    """Delete the files ``rels`` (relative to ``out``, as a tool's record lists them;
    never folders), then the folders these deletions left empty.

    Every entry is checked (:func:`listed_path`) before the first deletion, so a
    refused record deletes nothing.  A file of the user's beside the listed
    ones keeps its folder.
    """
    out = Path(out)
    paths = [listed_path(out, rel) for rel in rels]
    parents = set()
    for path in paths:
        if path.is_symlink() or path.is_file():
            path.unlink()
        parent = path.parent
        while parent != out:
            parents.add(parent)
            parent = parent.parent
    for parent in sorted(parents, key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            parent.rmdir()  # only when empty


# ---- output folders a tool builds and replaces ----------------------------------------------

# The first file of every staging folder: names the tool, locked while the tool runs.
STAGING_MARK = ".seed_fairseq-staging"


def claim_name(record: str) -> str:
    """The file that says which files of OUT an unfinished install owns (see :func:`staged_output`)."""
    return f".{record}.installing"


def _is_claim_debris(name: str, record: str) -> bool:
    """A temporary of an interrupted write of the claim (its name is the tool's alone)."""
    return name.startswith(f".{claim_name(record)}.tmp-")


@dataclass(frozen=True)
class Owned:
    """What a tool's own records in an existing output folder say."""

    complete: bool  # the record is in place: a finished earlier output
    files: FrozenSet[str]  # what the record, and the claim of an unfinished install, list
    lists_files: bool = True  # False: a record of an older version, which lists no files


def owned_output(
    out: PathLike, record: str, tool: str, is_own: Optional[Callable[[Path], bool]] = None
) -> Optional[Owned]:
    """What ``tool`` owns in the folder ``out``: None when it is missing or empty.

    The folder is the tool's when it holds the tool's ``record`` (``is_own``
    decides when given; else any JSON object) or the claim of an install that
    was interrupted.  :class:`OutputError` for a file, or a non-empty folder the
    tool did not write: its contents are the user's and are never touched.
    """
    out = Path(out)
    if not out.exists():
        if out.is_symlink():
            raise OutputError(out, "is a broken symbolic link")
        check_parents(out)
        return None
    if not out.is_dir():
        raise OutputError(out, "exists and is not a folder")
    rec = out / record
    content = _read_json(rec) if rec.is_file() and not rec.is_symlink() else None
    complete = content is not None and (is_own(rec) if is_own is not None else isinstance(content, dict))
    claim = _read_json(out / claim_name(record))
    claimed = isinstance(claim, dict) and claim.get("tool") == tool and isinstance(claim.get("files"), list)
    if not complete and not claimed:
        if any(not _is_claim_debris(e.name, record) for e in out.iterdir()):
            raise OutputError(
                out,
                f"folder is not empty and was not written by {tool} (no {record} in it); "
                "refusing to write into it: choose a new or empty folder",
            )
        return None
    listed = content.get("files") if complete and isinstance(content, dict) else None
    entries = (claim["files"] if claimed else []) + (listed if isinstance(listed, list) else [])
    for rel in entries:
        listed_path(out, rel)  # an entry outside the folder is refused now, not after the work
    return Owned(complete, frozenset(entries), claimed or not complete or isinstance(listed, list))


def staged_files(staging: PathLike) -> List[str]:
    """The files of a staging folder, relative, sorted (its mark left out)."""
    staging = Path(staging)
    return sorted(
        p.relative_to(staging).as_posix()
        for p in staging.rglob("*")
        if (p.is_file() or p.is_symlink()) and p != staging / STAGING_MARK
    )


def write_output_record(staging: PathLike, record: str, content: dict) -> Path:
    """Write the tool's record into its staging folder, as the last file.

    ``files`` (added to ``content``) lists every file of the output, the
    record last: exactly what a later run of the tool may replace or delete.
    """
    files = [rel for rel in staged_files(staging) if rel != record] + [record]
    return write_json_atomic(Path(staging) / record, {**content, "files": files})


def _exit_on_sigterm(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


@contextlib.contextmanager
def _sigterm_unwinds() -> Iterator[None]:
    """A SIGTERM (``kill``) ends the process the way Ctrl-C does, through the
    ``finally`` blocks that remove the staging folder (exit status 143), rather
    than at once.  Only where SIGTERM would kill outright (nobody handles it)
    and in the main thread, the only one where Python runs signal handlers."""
    install = threading.current_thread() is threading.main_thread() and (
        signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    )
    if install:
        signal.signal(signal.SIGTERM, _exit_on_sigterm)
    try:
        yield
    finally:
        if install and signal.getsignal(signal.SIGTERM) is _exit_on_sigterm:  # not one installed since
            signal.signal(signal.SIGTERM, signal.SIG_DFL)


# the signals that unwind a tool (SIGINT: KeyboardInterrupt; SIGTERM: _sigterm_unwinds)
_UNWINDING_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def _signals_held() -> Iterator[None]:
    """Ctrl-C and SIGTERM wait while a staging folder is created or removed, and take effect on
    leaving (the handler they would have run, run then).  Their exception would otherwise land
    between the ``mkdir`` and the ``try`` that removes the folder, or inside that removal, and leave
    an empty ``.OUT.tmp-*`` folder: a real SIGTERM to ``finetune.py`` did, 2 times out of 5, in
    ``temp_dir_beside``.  Blocking the signals (``pthread_sigmask``) is not enough: Python runs the
    handler of a signal that arrived just before later, at any bytecode; so the handlers themselves
    are swapped (main thread only: the only one where Python runs handlers)."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: List[int] = []
    before = {}
    try:
        for signum in _UNWINDING_SIGNALS:
            before[signum] = signal.signal(signum, lambda n, frame: caught.append(n))
        yield
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
        for signum in dict.fromkeys(caught):
            handler = before.get(signum)
            if callable(handler):
                handler(signum, None)  # raises: KeyboardInterrupt, SystemExit (_exit_on_sigterm)
            elif handler == signal.SIG_DFL:
                os.kill(os.getpid(), signum)  # what it would have done


@contextlib.contextmanager
def _staging_dir(out: Path, tool: str) -> Iterator[Path]:
    """A new ``.OUT.tmp-*`` folder beside ``out``, removed on leaving.

    Its first file is a mark naming ``tool``, locked for as long as the tool
    runs (a lock dies with its process, even on ``kill -9``): what
    :func:`remove_stale_staging` needs to prove a folder left behind is the
    tool's debris.  The lock is taken before the mark names anyone.  Ctrl-C and
    SIGTERM wait while the folder and its mark are made and while it is removed
    (:func:`_signals_held`), so an interrupted tool leaves nothing.
    """
    staging, fd = None, None
    try:
        with _signals_held():
            staging = temp_dir_beside(out)
            fd = os.open(staging / STAGING_MARK, os.O_CREAT | os.O_EXCL | os.O_RDWR, file_mode())
        flock_fd(fd, wait=True)
        os.write(fd, json.dumps({"tool": tool, "pid": os.getpid()}).encode())
        yield staging
    finally:
        with _signals_held():
            if staging is not None:
                shutil.rmtree(staging, ignore_errors=True)  # after an install: the emptied folders only
            if fd is not None:
                os.close(fd)


def remove_stale_staging(out: PathLike, tool: str) -> None:
    """Delete the staging folders beside ``out`` that killed runs of ``tool`` left.

    Only proven debris: a ``.OUT.tmp-*`` folder whose mark names ``tool`` and
    whose lock nobody holds.  A running tool's folder (locked), another tool's,
    or one without a mark is left alone.
    """
    out = Path(out)
    prefix = f".{out.name}.tmp-"
    try:
        entries = [e for e in out.parent.iterdir() if e.name.startswith(prefix)]
    except OSError:
        return
    for entry in entries:
        if entry.is_symlink() or not entry.is_dir():
            continue
        try:
            fd = os.open(entry / STAGING_MARK, os.O_RDWR | os.O_NOFOLLOW)
        except OSError:
            continue
        try:
            mark = _read_json(entry / STAGING_MARK)
            if flock_fd(fd, wait=False) and isinstance(mark, dict) and mark.get("tool") == tool:
                shutil.rmtree(entry, ignore_errors=True)
        finally:
            os.close(fd)


@contextlib.contextmanager
def _folder_lock(out: Path, tool: str) -> Iterator[None]:
    """One install at a time into ``out``; a second one is refused, never waits."""
    fd = lock_folder(out, f"another {tool} is writing this folder; wait for it to finish")
    try:
        yield
    finally:
        if fd is not None:
            os.close(fd)


def _check_room(out: Path, rels: Iterable[str], owned: FrozenSet[str], tool: str) -> None:
    """:class:`OutputError` when a path the new output takes holds something the tool did not write."""
    for rel in rels:
        folder = out
        for part in PurePosixPath(rel).parts[:-1]:
            folder = folder / part
            if folder.is_symlink() or (folder.exists() and not folder.is_dir()):
                raise OutputError(
                    folder,
                    f"is in the way of {rel}, which {tool} writes, and was not written by it; "
                    "move it away or choose another --out",
                )
        path = out / rel
        if (path.is_dir() and not path.is_symlink()) or ((path.exists() or path.is_symlink()) and rel not in owned):
            raise OutputError(
                path,
                f"exists and was not written by {tool}; refusing to overwrite it: move it away or choose another --out",
            )


def _install_files(staging: Path, out: Path, record: str, tool: str, owned: Owned) -> None:
    """Replace, in the folder ``out`` the tool owns, exactly the files its records list.

    The claim (old and new files) goes in first and the record comes out,
    so a kill at any point leaves a folder that says what is the tool's and
    that a rerun completes; then the old files the new output lacks go, each
    new file is renamed into place, the record last; nothing else is touched.
    """
    new = staged_files(staging)
    # a record without a list (older versions): the names the tool writes are its own
    old = owned.files if owned.lists_files else owned.files | set(new)
    _check_room(out, new, old, tool)
    stale = sorted(old - set(new) - {claim_name(record)})
    for rel in stale:
        listed_path(out, rel)  # a link on the way: refused before anything changes
    for entry in out.iterdir():
        if _is_claim_debris(entry.name, record) and entry.is_file():
            entry.unlink()
    claim = out / claim_name(record)
    write_json_atomic(claim, {"tool": tool, "record": record, "files": sorted(old | set(new))})
    (out / record).unlink(missing_ok=True)  # from here on the folder says: unfinished
    delete_listed(out, stale)
    folders = {out}
    for rel in sorted(new, key=lambda r: r == record):  # the record last
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging / rel, target)
        folders.add(target.parent)
    for folder in folders:
        fsync_dir(folder)
    claim.unlink()
    fsync_dir(out)


def _install(
    staging: Path, out: Path, record: str, tool: str, replace: bool, is_own: Optional[Callable[[Path], bool]]
) -> None:
    """Put the finished output ``staging`` at ``out``: a missing or empty ``out`` is
    replaced by the whole folder in one rename; one the tool owns gets its files
    replaced one by one (:func:`_install_files`)."""
    if record not in staged_files(staging):
        raise RuntimeError(f"{tool} left no {record} in {staging}")  # a bug of the tool, not an input
    chmod_tree(staging)
    owned = owned_output(out, record, tool, is_own)
    if owned is None and not out.is_symlink():  # a link the user made stays a link
        os.unlink(staging / STAGING_MARK)  # not part of the output (its lock stays held)
        try:
            os.replace(staging, out)  # out is missing or an empty folder
            fsync_dir(out.parent)
            return
        except OSError as e:
            if e.errno not in (errno.ENOTEMPTY, errno.EEXIST):
                raise
        owned = owned_output(out, record, tool, is_own)  # written meanwhile: refused unless the tool's
    owned = owned or Owned(complete=False, files=frozenset())
    if owned.complete and not replace:
        raise OutputError(out, f"holds an earlier output of {tool}; pass --force to replace it")
    with _folder_lock(out, tool):
        _install_files(staging, out, record, tool, owned)


@contextlib.contextmanager
def staged_output(
    out: PathLike, record: str, tool: str, *, replace: bool, is_own: Optional[Callable[[Path], bool]] = None
) -> Iterator[Path]:
    """Build ``tool``'s output folder ``out`` in a staging folder, then install it.

    ``with staged_output(out, RECORD, TOOL, replace=force) as staging:`` writes
    the files into ``staging``, the record last (:func:`write_output_record`).
    When the block ends, a missing or empty ``out`` becomes the new folder in
    one rename; an earlier output of the tool (``replace`` must allow it) keeps
    everything its record does not list, a user's notes or save-dir, while
    exactly the listed files are replaced or deleted, the record last.  A path
    the new output takes that holds something the tool did not write is
    refused (:class:`OutputError`) before anything changes, as is a full disk
    or the file-size limit, reported as one line naming the output.

    Staging folders killed runs of the tool left beside ``out`` are removed
    first (:func:`remove_stale_staging`); this one is removed on any exit, a
    SIGTERM included.
    """
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(out, tool)
    with _sigterm_unwinds(), _staging_dir(out, tool) as staging:
        try:
            yield staging
            _install(staging, out, record, tool, replace, is_own)
        except Exception as e:
            err = storage_error(e)
            if err is None:
                raise
            name = Path(err.filename) if err.filename else out
            if staging in name.parents:
                name = out / name.relative_to(staging)
            raise OutputError(
                name, f"{err.strerror} while writing the output; free space or raise the limit, then run again"
            ) from None


@contextlib.contextmanager
def staged_dir(
    out: PathLike, record: str, tool: str, *, replace: bool, is_own: Optional[Callable[[Path], bool]] = None
) -> Iterator[Tuple[Path, Dict[str, Any]]]:
    """The whole epilogue of a tool that writes an output folder: stage, record, install.

    ``with staged_dir(out, RECORD, TOOL, replace=force) as (staging, content):``
    the block writes the output's files into ``staging`` and fills the dict
    ``content``; when it ends without an exception, ``content`` is written as
    the tool's record, the last file (:func:`write_output_record`, which adds
    the list of files), and the folder is installed at ``out``
    (:func:`staged_output`, whose guarantees apply).  A block that leaves
    ``content`` empty is a bug of the tool: RuntimeError, nothing installed.
    """
    with staged_output(out, record, tool, replace=replace, is_own=is_own) as staging:
        content: Dict[str, Any] = {}
        yield staging, content
        if not content:
            raise RuntimeError(f"{tool} wrote no record content for {out}")  # a bug of the tool
        write_output_record(staging, record, content)
