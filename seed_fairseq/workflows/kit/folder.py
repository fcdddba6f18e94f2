"""A workflow's ``--out``: the tool's own folder (its record claims it; a rerun resumes it; someone
else's folder is refused) with one run at a time in it, and the tool's log line."""

import json
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Optional

from ...base.fileio import check_output_dir, lock_folder, write_json_atomic


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


def tool_log(name: str) -> Callable[[str], None]:
    """``[name HH:MM:SS] message`` on stderr, flushed: the tool's progress lines."""

    def log(msg: str) -> None:
        print(f"[{name} {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    return log
