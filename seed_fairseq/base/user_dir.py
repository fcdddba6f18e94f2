"""The plugin's folder as ``fairseq-train --user-dir`` names it, and the argument list fairseq's
parser reads with it: the one place both are written (the workflows' command lines,
``workflows/kit/argv.py``, and the in-process parses of ``workflows/measure``).  Imports nothing."""

from pathlib import Path
from typing import List, Sequence

# seed_fairseq/: fairseq-train imports it, and through it registers every objective of the plugin
USER_DIR = str(Path(__file__).resolve().parents[1])


def parse_argv(data, args: Sequence[str]) -> List[str]:
    """``DATA --user-dir seed_fairseq ARGS``: what ``fairseq-train`` parses, and an in-process parse
    (an objective of another ``--user-dir`` names its own in ``ARGS``, after this one: the last counts)."""
    return [str(data), "--user-dir", USER_DIR, *map(str, args)]
