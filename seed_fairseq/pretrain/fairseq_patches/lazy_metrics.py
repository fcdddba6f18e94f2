"""An install-time edit of fairseq 0.12 (``scripts/setup_env.sh`` runs it after fairseq is installed):
scikit-learn and scipy.stats imported where fairseq uses them, not at every start.

``fairseq-train`` imports every task and criterion before it reads its options, and two of them import
scikit-learn at module level (``tasks/audio_classification.py``'s ROC curve, ``criterions/
sentence_prediction.py``'s F1, MCC and correlations; scikit-learn pulls in scipy.stats): about 1 s of
a start's 3.6 s on 2 cores (2.6 s after), in a process that never computes those metrics. A runtime
patch cannot help (fairseq is imported before any ``--user-dir``), so the installed files are edited:
each of those import lines becomes, on the same line (line numbers and CRLF endings kept), a name that
imports on first use. Idempotent; a file whose lines are not the expected ones is left as it is and
named. ``python -m seed_fairseq.pretrain.fairseq_patches.lazy_metrics`` (finds fairseq without
importing it, the way ``import fairseq`` would).

Only the venv the install targets is edited: the files are written only when they lie, resolved, in the
running interpreter's own site-packages (``sysconfig``'s ``purelib``/``platlib`` of ``sys.prefix``).  A
fairseq found elsewhere (a ``PYTHONPATH`` entry, an editable checkout, the system's packages), a file that
is a symbolic link (never written through), or one that cannot be written (read-only file, folder or file
system) is left as it is, with one line saying why, and the exit status stays 0: a slower start is not a
broken install.  A file is replaced atomically (a hidden temporary file beside it, then a rename; none is
left behind on a failure) and keeps its permission bits and owner.
"""

import contextlib
import errno
import importlib.util
import os
import stat
import sys
import sysconfig
from pathlib import Path
from typing import Dict, List, Optional, Sequence

from ...base.fileio import fsync_dir, temp_path_beside

MARK = "# seed_fairseq: imported on first use (setup_env.sh)"

# fairseq file -> {the import line, without its ending: the line that replaces it}
EDITS: Dict[str, Dict[str, str]] = {
    "tasks/audio_classification.py": {
        "from sklearn import metrics as sklearn_metrics": "sklearn_metrics = type('_LazySklearnMetrics', (), "
        "{'__getattr__': lambda self, name: getattr(__import__('sklearn.metrics', fromlist=['_']), name)})()",
    },
    "criterions/sentence_prediction.py": {
        "from sklearn.metrics import f1_score": "def f1_score(*a, **k): "
        "from sklearn.metrics import f1_score as f; return f(*a, **k)",
        "from sklearn.metrics import matthews_corrcoef as _matthews_corrcoef": "def _matthews_corrcoef(*a, **k): "
        "from sklearn.metrics import matthews_corrcoef as f; return f(*a, **k)",
        "from scipy.stats import pearsonr, spearmanr": "pearsonr, spearmanr = "
        "(lambda *a, **k: __import__('scipy.stats', fromlist=['_']).pearsonr(*a, **k)), "
        "(lambda *a, **k: __import__('scipy.stats', fromlist=['_']).spearmanr(*a, **k))",
    },
}


def rewrite(text: str, edits: Dict[str, str]) -> str:
    """``text`` with each line of ``edits`` replaced by one line (its ending kept: line numbers and CRLF
    stay); ``text`` unchanged when it carries :data:`MARK`; ValueError when a line is missing."""
    if MARK in text:
        return text
    out: List[str] = []
    missing = dict(edits)
    for line in text.splitlines(keepends=True):
        body = line.rstrip("\r\n")
        new = missing.pop(body, None)
        out.append(line if new is None else f"{new}  {MARK}{line[len(body) :]}")
    if missing:
        raise ValueError(f"not found: {', '.join(missing)}")
    return "".join(out)


def fairseq_folder() -> Path:
    """The folder ``import fairseq`` would load, as the interpreter finds it (not resolved)."""
    spec = importlib.util.find_spec("fairseq")  # a top-level package: found, not imported
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("fairseq is not installed")
    return Path(os.path.abspath(list(spec.submodule_search_locations)[0]))


def site_packages() -> List[Path]:
    """The running interpreter's own site-packages (the venv the install targets), resolved."""
    paths = sysconfig.get_paths()
    return sorted({Path(os.path.realpath(paths[key])) for key in ("purelib", "platlib")})


def _outside(path: Path, sites: Sequence[Path]) -> Optional[str]:
    """Why ``path`` (resolved) is not one of ours to edit, or None."""
    real = Path(os.path.realpath(path))
    if any(site in real.parents for site in sites):  # Path.is_relative_to needs Python 3.9
        return None
    where = ", ".join(str(site) for site in sites)
    return f"not in this venv's site-packages ({where})"


def replace_keeping_mode(path: Path, data: bytes) -> None:
    """``path`` replaced by ``data`` atomically, with its permission bits and owner; OSError when a step
    cannot be done (``path`` then unchanged, no temporary file left)."""
    st = path.stat()
    tmp = temp_path_beside(path)
    try:
        with open(tmp, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        mine = tmp.stat()
        if (mine.st_uid, mine.st_gid) != (st.st_uid, st.st_gid):
            os.chown(tmp, st.st_uid, st.st_gid)
        os.chmod(tmp, stat.S_IMODE(st.st_mode))  # after chown, which may clear set-id bits
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    fsync_dir(path.parent)


def edit(root: Path, sites: Sequence[Path]) -> int:
    """Edit the fairseq in ``root`` when it lies in one of ``sites``; one line for each file left as it
    is.  Returns how many files were left."""
    why = _outside(root, sites)
    if why is not None:
        print(f"fairseq: {root}: {why}; left as it is")
        return len(EDITS)
    left = 0
    for name, edits in EDITS.items():
        path = root / name
        why = _edit_file(path, edits, sites)
        if why is not None:
            print(f"fairseq: {path}: {why}; left as it is")
            left += 1
    return left


def _edit_file(path: Path, edits: Dict[str, str], sites: Sequence[Path]) -> Optional[str]:
    """Why ``path`` was left as it is, or None (edited, or edited before)."""
    if path.is_symlink():
        return "a symbolic link (never written through)"
    why = _outside(path, sites)
    if why is not None:
        return why
    path = Path(os.path.realpath(path))  # its folders may be reached through a link
    try:
        text = path.read_bytes().decode("utf-8")
        new = rewrite(text, edits)
    except (OSError, UnicodeDecodeError, ValueError) as e:
        return f"cannot read it: {e.strerror}" if isinstance(e, OSError) and e.strerror else str(e)
    if new == text:
        return None
    try:
        if not os.access(path, os.W_OK):
            raise PermissionError(errno.EACCES, "the file is read-only")
        replace_keeping_mode(path, new.encode("utf-8"))
    except OSError as e:
        return f"cannot write it: {e.strerror or e}"
    return None


def main() -> int:
    try:
        root = fairseq_folder()
    except FileNotFoundError as e:
        print(f"fairseq: {e}; nothing edited", file=sys.stderr)
        return 0
    if not edit(root, site_packages()):
        print("fairseq: scikit-learn and scipy.stats imported on first use (fairseq_patches/lazy_metrics.py)")
    return 0  # an unexpected fairseq is slower to start, not broken: the install goes on


if __name__ == "__main__":
    sys.exit(main())
