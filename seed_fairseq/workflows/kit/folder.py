"""A workflow's ``--out``: the tool's own folder (its record claims it; a rerun resumes it; someone
else's folder is refused) with one run at a time in it, its stages' folders and records, the error
a stage reports, and the tool's log line."""

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from ...base.fileio import OutputError, check_output_dir, lock_folder, write_json_atomic

STATE = ".stages"  # OUT/.stages/: the stage records (preprocess.stages.Runner)


class StageError(Exception):
    """A stage failed in a way the user can act on; ``str()`` is ``PATH: problem``."""

    def __init__(self, path, problem: str, detail: str = ""):
        self.path, self.problem, self.detail = str(path), problem, detail
        super().__init__(f"{self.path}: {problem}")


@dataclass(frozen=True)
class ToolFolder:
    """``tool``: the record's ``"tool"``; ``record``: its file in ``--out``; ``owner``: the tool in words
    (refusals name it); ``what``: the run in words (the lock's refusal)."""

    tool: str
    record: str
    owner: str
    what: str

    def is_own(self, path: Path) -> bool:
        try:
            rec = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, ValueError):
            return False
        return isinstance(rec, dict) and rec.get("tool") == self.tool

    def claim(self, out: Path) -> None:
        """Make ``out`` this tool's folder (new or empty: create the record; with the record: an
        earlier run, resumed) or refuse with :class:`OutputError` (``fileio.check_output_dir``)."""
        if check_output_dir(out, self.record, self.owner, is_own=self.is_own):
            return
        out.mkdir(parents=True, exist_ok=True)
        write_json_atomic(out / self.record, {"tool": self.tool, "created": time.strftime("%Y-%m-%d %H:%M:%S")})

    def lock(self, out: Path) -> Optional[int]:
        """One run per ``out``, held for the process's life (``fileio.lock_folder``, the lock every tool takes)."""
        return lock_folder(out, f"another {self.what} is running in this folder", lock_file=".lock")

    def take(self, out: Path) -> None:
        """``out`` claimed and locked: this tool's folder, with this run the only one in it."""
        self.claim(out)
        self.lock(out)


def tool_log(name: str) -> Callable[[str], None]:
    """``[name HH:MM:SS] message`` on stderr, flushed: the tool's progress lines."""

    def log(msg: str) -> None:
        print(f"[{name} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    return log


def check_stage_folders(out: Path, runner, owner: str) -> None:
    """Refuse, before any stage of ``runner`` runs, a stage folder ``owner`` (the tool, in words)
    cannot own: one that holds files while no stage of the tool ever started there (someone
    else's), or one reached through a symbolic link or a file (a redo deletes only inside
    ``out``, never through a link).  A started stage's folder may hold the user's files too:
    redoing the stage deletes only the files it writes (``Stage.writes``)."""
    for stage in runner.stages:
        if stage.folder is None:
            continue
        path = out
        for part in Path(stage.folder).parts:
            path = path / part
            if path.is_symlink() or (path.exists() and not path.is_dir()):
                raise OutputError(
                    path,
                    f"is a {'symbolic link' if path.is_symlink() else 'file'} where {owner} keeps its "
                    f"{stage.folder} folder; it writes and deletes only inside --out: move it away",
                )
        folder = out / stage.folder
        if folder.is_dir() and any(folder.iterdir()) and not runner.started_marker(stage.name).exists():
            raise OutputError(
                folder,
                "holds files this tool did not write there (no stage record for it); move them away or "
                "choose another --out",
            )
