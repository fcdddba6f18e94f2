"""Where a tool may put its output folder, checked before anything is read or written.

Every tool that makes an output folder (``preprocess.build``, the comparison, adapt, the
adaptation study, gpu_check) refuses the same things the same way, with one
:class:`~seed_fairseq.base.fileio.OutputError` (``PATH: problem``) before any input is read:

* :func:`check_out_path`: a folder it could not create or write (a file on the way,
  a read-only folder), or a path containing ``:`` (fairseq reads ``DATA`` as a list of
  folders split at ``:``, and every tool of the project runs fairseq-train on data it
  writes there);
* :func:`check_apart`: an ``--out`` that is an input, inside one or holding one: a
  tool would then read what it wrote, or see its input change (a new fingerprint) on
  every run, and a redo could delete its own input.
"""

import os
from pathlib import Path
from typing import Iterable, Optional, Tuple

from .atomic import OutputError, PathLike

# why a path with ':' is refused: fairseq-train's DATA is split at ':' into shards
FAIRSEQ_COLON = "fairseq-train reads as a list of data folders (DATA is split at ':' into shards)"


def check_out_path(out: PathLike, flag: str = "--out", colon: Optional[str] = FAIRSEQ_COLON) -> None:
    """Refuse an output folder the tool could not make or use, before anything is written.

    :class:`OutputError` naming ``out`` when its path (made absolute) contains ``:``
    (``colon`` says why; None allows it), when the nearest existing folder on its way is
    a file (``--out notes.txt/run``), when ``out`` exists and is not a folder, or when
    the folder ``out`` is (or would be created in) cannot be written (read-only, another
    user's).  Nothing is created; ``flag`` names the option in the messages.
    """
    out = Path(out)
    absolute = out.absolute()
    if colon is not None and ":" in str(absolute):
        full = "" if ":" in str(out) else f" ({absolute})"
        raise OutputError(out, f"its path{full} contains ':', which {colon}; choose a folder whose path has no ':'")
    if absolute.exists() or absolute.is_symlink():
        if absolute.is_symlink() and not absolute.exists():
            raise OutputError(out, "is a broken symbolic link")
        if not absolute.is_dir():
            raise OutputError(out, "exists and is not a folder")
        if not os.access(absolute, os.W_OK | os.X_OK):
            raise OutputError(out, f"{flag}: the folder cannot be written (read-only, or not this user's)")
        return
    for parent in absolute.parents:  # `--out file/sub`: the nearest existing one
        if parent.exists() or parent.is_symlink():
            if not parent.is_dir():
                raise OutputError(out, f"cannot create the folder ({parent} is not a folder)")
            if not os.access(parent, os.W_OK | os.X_OK):
                raise OutputError(out, f"cannot create the folder ({parent} cannot be written: read-only, or not "
                                       "this user's)")  # fmt: skip
            return


def place_in(path: PathLike, out: PathLike) -> Optional[str]:
    """Where ``path`` is with respect to the folder ``out``, if it is ``out`` or
    inside it: symlinks resolved, and the same folder reached by another name
    (a bind mount, a case-insensitive file system) recognised by its inode."""
    path, out = Path(path), Path(out)
    resolved, folder = path.resolve(), out.resolve()
    if resolved == folder:
        return f"is --out {out} itself"
    if folder in resolved.parents:
        return f"is inside --out {out}"
    try:
        target = folder.stat()
    except OSError:
        return None  # a missing --out holds nothing
    for p in (resolved, *resolved.parents):
        try:
            st = p.stat()
        except OSError:
            continue
        if (st.st_dev, st.st_ino) == (target.st_dev, target.st_ino):
            return f"is --out {out} itself" if p == resolved else f"is inside --out {out}"
    return None


def check_apart(out: PathLike, inputs: Iterable[Tuple[str, Optional[PathLike]]], tool: str = "the tool") -> None:
    """Refuse an ``--out`` that is one of the ``inputs`` ((flag, path) pairs; None: not
    given), lies inside one, or holds one.

    Inside an input folder, the tool's own files change the input's fingerprint on
    every run (every rerun would redo everything) and could be read as input; an input
    inside ``--out`` would be read from where the tool writes, and a redo could delete
    it.  :class:`OutputError` naming the input.
    """
    out = Path(out)
    for flag, path in inputs:
        if path is None:
            continue
        path = Path(path)
        where = place_in(path, out)
        if where:
            raise OutputError(
                path,
                f"{flag}: {where}, where {tool} writes its outputs; an input is never read from there: move it "
                "out or choose another --out",
            )
        if place_in(out, path):
            raise OutputError(
                out,
                f"--out is inside {flag} {path}: its files would change that input on every run (and be read as "
                "part of it); choose an --out outside it",
            )
