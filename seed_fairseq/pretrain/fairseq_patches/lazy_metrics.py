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
importing it).
"""

import importlib.util
import sys
from pathlib import Path
from typing import Dict, List

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
    spec = importlib.util.find_spec("fairseq")  # a top-level package: found, not imported
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError("fairseq is not installed")
    return Path(list(spec.submodule_search_locations)[0])


def main() -> int:
    try:
        root = fairseq_folder()
    except FileNotFoundError as e:
        print(f"fairseq: {e}; nothing edited", file=sys.stderr)
        return 0
    left = []
    for name, edits in EDITS.items():
        path = root / name
        try:
            text = path.read_bytes().decode("utf-8")
            new = rewrite(text, edits)
        except (OSError, UnicodeDecodeError, ValueError) as e:
            print(f"fairseq: {path}: left as it is ({e})")
            left.append(name)
            continue
        if new != text:
            tmp = path.with_name(path.name + ".seed_fairseq.tmp")
            tmp.write_bytes(new.encode("utf-8"))
            tmp.replace(path)
    if not left:
        print("fairseq: scikit-learn and scipy.stats imported on first use (fairseq_patches/lazy_metrics.py)")
    return 0  # an unexpected fairseq is slower to start, not broken: the install goes on


if __name__ == "__main__":
    sys.exit(main())
