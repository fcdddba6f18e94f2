"""What every retrieval tool shares: the project's file-safety helpers, argparse
types that refuse values which would hang or mislead, and the one-line error.

The guarantees (README, "Guarantees"): bad input gives one line
``error: FILE: problem`` (``FILE:LINE:`` for data files) on stderr and exit
status 2; every output file is written under a temporary name beside it and
renamed into place; a tool replaces or deletes only what its own record says
it wrote.
"""

import argparse
import importlib.util
import math
import os
import shutil
import sys
from pathlib import Path
from types import ModuleType
from typing import Callable

REPO = Path(__file__).resolve().parents[2]


def _load_fileio() -> ModuleType:
    """``seed_fairseq.fileio`` without running ``seed_fairseq/__init__.py``.

    The package's ``__init__`` imports fairseq and registers the pre-training
    task and models: seconds of start-up that a BM25 run or a metrics check does
    not need.  ``fileio`` itself is standard library only, so it is loaded from
    its file under its own module name; a later ``import seed_fairseq.fileio``
    finds it in ``sys.modules`` and gets the same module (same ``OutputError``).
    """
    name = "seed_fairseq.fileio"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, REPO / "seed_fairseq" / "fileio.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


fileio = _load_fileio()
OutputError = fileio.OutputError
atomic_path = fileio.atomic_path
write_text_atomic = fileio.write_text_atomic
write_json_atomic = fileio.write_json_atomic
check_output_dir = fileio.check_output_dir
replace_dir = fileio.replace_dir
temp_dir_beside = fileio.temp_dir_beside
dir_mode = fileio.dir_mode


def apply_umask(folder: Path) -> None:
    """chmod what a library wrote in ``folder`` to the umask's permissions.

    transformers writes ``model.safetensors`` through a private temporary file
    (mode 0600) whatever the umask; the project promises umask permissions for
    everything it writes.
    """
    folder = Path(folder)
    os.chmod(folder, dir_mode())
    for path in folder.rglob("*"):
        if path.is_symlink():
            continue
        os.chmod(path, dir_mode() if path.is_dir() else fileio.file_mode())


def own_staging_dir(target: Path) -> Path:
    """A fresh, empty ``.NAME.partial`` folder beside ``target``, to be moved over
    it with :func:`replace_dir` when complete.

    For tools that own the folder around ``target`` (reproduce_small.py's
    ``--out``): the fixed name lets a rerun delete what an interrupted run left,
    because only the tool itself ever creates that name there.  (Outside a
    folder the tool owns, use ``temp_dir_beside``: its random name is never
    reused and nothing beside the user's output is deleted.)
    """
    target = Path(target)
    staging = target.parent / f".{target.name}.partial"
    if staging.is_symlink() or staging.is_file():
        staging.unlink()
    elif staging.exists():
        shutil.rmtree(staging)
    staging.parent.mkdir(parents=True, exist_ok=True)
    staging.mkdir(mode=dir_mode())
    return staging


def check_parents(path: Path) -> None:
    """:class:`OutputError` when the nearest existing ancestor of ``path`` is not a
    folder (``--out file.txt/model``): refused up front instead of failing after the work."""
    for parent in Path(path).absolute().parents:
        if parent.exists():
            if not parent.is_dir():
                raise OutputError(parent, "exists and is not a folder")
            return


def report(error: object) -> int:
    """Print ``error: ...`` (one line) on stderr; returns the exit status 2.

    ``error`` is an exception whose ``str()`` is ``FILE: problem`` (DataFormatError,
    OutputError) or such a message; only its first line is printed.
    """
    lines = str(error).strip().splitlines()
    text = lines[0] if lines else type(error).__name__
    print(f"error: {text}", file=sys.stderr)
    return 2


# ---------------------------------------------------------------------------
# argparse types: a bad value is an argparse error (usage + one error line, exit 2)
# ---------------------------------------------------------------------------


def _number(kind: type, check: Callable[[float], bool], wanted: str) -> Callable[[str], float]:
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not {'an integer' if kind is int else 'a number'}") from None
        # float("nan") parses; NaN fails every comparison and would slip through
        if isinstance(value, float) and not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"{text!r} is not a finite number")
        if not check(value):
            raise argparse.ArgumentTypeError(f"{text} is not {wanted}")
        return value

    parse.__name__ = wanted  # argparse names the type in some messages
    return parse


positive_int = _number(int, lambda v: v >= 1, "an integer >= 1")
nonneg_int = _number(int, lambda v: v >= 0, "an integer >= 0")
# numpy's seeding accepts 0 .. 2**32 - 1 only; a negative seed would be a traceback
seed_int = _number(int, lambda v: 0 <= v < 2**32, "a seed in [0, 2**32)")
positive_float = _number(float, lambda v: v > 0, "a number > 0")
nonneg_float = _number(float, lambda v: v >= 0, "a number >= 0")
fraction = _number(float, lambda v: 0 < v <= 1, "in (0, 1]")
unit_interval = _number(float, lambda v: 0 <= v <= 1, "in [0, 1]")
