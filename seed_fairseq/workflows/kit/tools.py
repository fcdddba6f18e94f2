"""The command-line tools a workflow's stages start: where they are, their environment, a run
logged to a file (stopped with the driver: interrupt.py)."""

import os
import shlex
from pathlib import Path
from typing import Callable, Dict, List, Optional

from .folder import StageError
from .interrupt import run_child


def child_env(threads: Optional[int] = None) -> Dict[str, str]:
    """The environment of the tools the stages start: ``threads`` CPU threads (None: as this process
    has them), quiet, offline, and this checkout's plugin and preprocess package importable
    (fairseq-train's ``--user-dir``)."""
    env = dict(
        os.environ,
        PYTHONWARNINGS="ignore",
        HF_HUB_OFFLINE="1",
        TRANSFORMERS_OFFLINE="1",
        TOKENIZERS_PARALLELISM="false",
    )
    if threads is not None:
        env["OMP_NUM_THREADS"] = str(threads)
    root = str(Path(__file__).resolve().parents[3])
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, [os.environ.get("PYTHONPATH")])])
    return env


def run_logged(cmd: List[str], log_file: Path, env: Dict[str, str], *, say: Callable[[str], None],
               append: bool = False) -> None:  # fmt: skip
    """Run a command-line tool with its output in ``log_file`` (its command line: ``say``, the workflow's
    log line); :class:`StageError` with its tail on failure."""
    cmd = [str(c) for c in cmd]
    say(" ".join(shlex.quote(c) for c in cmd))
    with open(log_file, "a" if append else "w", encoding="utf-8") as f:
        returncode = run_child(cmd, f, env)  # an interrupt of the driver stops it first (interrupt.py)
    if returncode != 0:
        tail = log_file.read_text(encoding="utf-8", errors="replace")[-3000:]
        raise StageError(log_file, f"{Path(cmd[0]).name} failed (exit {returncode}); see this log", tail)
