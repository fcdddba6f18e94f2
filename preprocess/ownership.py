"""What ``preprocess.build`` may do to ``--out``: the folder's owner, its lock, and the
files a build may replace or delete (those its records list, preprocess.record).

``--out`` must be missing, empty, a finished build of this tool (its record) or an
unfinished one (its ``.work`` state); nothing else in it is ever written or deleted,
and nothing in it is ever read as input.
"""

import logging
import os
from pathlib import Path
from typing import Any, Dict, Iterable, Optional, Sequence, Tuple

from seed_fairseq.base.fileio import OutputError, check_out_path, check_output_dir, lock_folder, place_in

from . import record as rec
from .errors import PreprocessError, writing
from .record import RECORD, TOOL

logger = logging.getLogger("preprocess")


def inspect_out(out: Path) -> Tuple[Optional[Dict[str, Any]], bool]:
    """(the finished build's record or None, whether ``.work`` is this tool's) of ``out``;
    :class:`OutputError` when ``out`` is neither missing, empty nor this tool's.
    Nothing is written."""
    if out.exists() and not out.is_dir():
        raise OutputError(out, "exists and is not a folder")
    record = rec.load_record(out) if out.is_dir() else None
    own_work = out.is_dir() and rec.work_is_own(out)
    if record is None and not own_work:
        if out.is_dir() and (out / RECORD).exists():
            raise OutputError(
                out / RECORD,
                f"is not a build record of {TOOL}; refusing to write into this folder: choose a new or empty folder",
            )
        check_output_dir(out, RECORD, TOOL)  # missing or empty, else OutputError
    return record, own_work


def check_paths(out: Path, sources: Iterable[Tuple[str, str]]) -> None:
    """Refuse, before any input is read, an --out fairseq cannot use or the tool
    cannot create, and an input inside --out.

    Everything in OUT is the tool's outputs and work files (or the user's
    files beside them): read as input, a build would depend on what it
    wrote, and its --force would delete its own input. An --out inside a
    --books folder is fine: the books listing leaves out every build
    (preprocess.inputs.book_files).
    """
    for _, path in sources:
        where = place_in(Path(path), out)
        if where:
            raise PreprocessError(
                path,
                f"{where}, where {TOOL} writes its outputs and work files; an input is "
                "never read from there: move it out or choose another --out",
            )
    check_out_path(out)  # ':' (fairseq's DATA list), a file on the way, a read-only folder


def check_collisions(out: Path, rels: Sequence[str], owned) -> None:
    """:class:`OutputError` for a path among ``rels`` (relative to ``out``) that holds
    something this tool did not write (not in ``owned``), or a file or link in the way."""
    for rel in rels:
        path = out / rel
        for parent in list(reversed(path.relative_to(out).parents))[1:]:
            p = out / parent
            if (p.exists() or p.is_symlink()) and (p.is_symlink() or not p.is_dir()):
                raise OutputError(
                    p,
                    f"is in the way of {rel}, which {TOOL} writes, and was not "
                    "written by it; move it away or choose another --out",
                )
        if (path.exists() or path.is_symlink()) and rel not in owned:
            raise OutputError(
                path,
                f"exists and was not written by {TOOL}; refusing to overwrite it: move it away or choose another --out",
            )


class OutLock:
    """One build at a time in OUT: a second one is refused, it never waits
    (:func:`seed_fairseq.base.fileio.lock_folder`). Where OUT cannot be opened or
    the file system has no locks, the build carries on unlocked, as before."""

    def __init__(self, out: Path):
        self.out = out
        self._fd: Optional[int] = None

    def take(self) -> None:
        if self._fd is not None:
            return
        busy = f"another {TOOL} is writing this folder; wait for it to finish or stop it"
        try:
            self._fd = lock_folder(self.out, busy)
        except OSError:  # OUT cannot be opened (an OutputError is no OSError)
            return

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def discard_finished(out: Path, record: Dict[str, Any]) -> None:
    """--force on a finished build: delete exactly the files its record lists.

    The list goes into a fresh work state before the record is deleted, so
    a kill half-way leaves a folder that still says what is the tool's.
    """
    if rec.work_is_own(out):
        rec.remove_work(out)
    outputs = rec.record_outputs(record)
    logger.info("--force: deleting the %d files of the earlier build in %s", len(outputs), out)
    state = rec.WorkState(out, outputs)
    with writing(state.path):
        state.save()
    (out / RECORD).unlink(missing_ok=True)
    rec.delete_outputs(out, outputs)


def discard_unfinished(out: Path, state: rec.WorkState) -> None:
    """--force on an unfinished build: its files in OUT, then its work folder."""
    logger.info("--force: discarding the unfinished build in %s", out)
    rec.delete_outputs(out, state.outputs)
    rec.remove_work(out)
