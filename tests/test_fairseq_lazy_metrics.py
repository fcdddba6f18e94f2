"""The install-time edit of fairseq (``fairseq_patches/lazy_metrics.py``, run by ``scripts/setup_env.sh``):
scikit-learn and scipy.stats imported on first use, not at every ``fairseq-train`` start."""

import subprocess
import sys

import pytest

from seed_fairseq.pretrain.fairseq_patches import lazy_metrics

STOCK = (
    "import torch\r\n"
    "from sklearn.metrics import f1_score\r\n"
    "from sklearn.metrics import matthews_corrcoef as _matthews_corrcoef\r\n"
    "from scipy.stats import pearsonr, spearmanr\r\n"
    "\r\n"
    "X = 1\r\n"
)


def test_the_lines_are_replaced_in_place_and_once():
    edits = lazy_metrics.EDITS["criterions/sentence_prediction.py"]
    new = lazy_metrics.rewrite(STOCK, edits)
    lines = new.split("\r\n")
    assert len(lines) == len(STOCK.split("\r\n")) and lines[0] == "import torch" and lines[5] == "X = 1"
    assert all(lazy_metrics.MARK in line for line in lines[1:4]) and "\n" not in new.replace("\r\n", "")
    assert lazy_metrics.rewrite(new, edits) == new  # idempotent
    with pytest.raises(ValueError, match="not found: from scipy.stats import pearsonr, spearmanr"):
        lazy_metrics.rewrite(STOCK.replace("pearsonr, spearmanr", "pearsonr"), edits)


def test_the_names_compute_what_the_libraries_do():
    import numpy as np
    from scipy.stats import pearsonr, spearmanr
    from sklearn.metrics import f1_score, matthews_corrcoef, roc_curve

    space = {}
    exec(lazy_metrics.rewrite(STOCK, lazy_metrics.EDITS["criterions/sentence_prediction.py"]), space)
    y, p = np.array([0, 1, 1, 0, 1]), np.array([0, 1, 0, 0, 1])
    assert space["f1_score"](y_true=y, y_pred=p) == f1_score(y_true=y, y_pred=p)
    assert space["_matthews_corrcoef"](y, p) == matthews_corrcoef(y, p)
    a, b = np.array([1.0, 2.0, 3.0, 5.0]), np.array([1.0, 2.5, 2.0, 7.0])
    assert space["pearsonr"](a, b)[0] == pearsonr(a, b)[0] and space["spearmanr"](a, b)[0] == spearmanr(a, b)[0]
    (line,) = lazy_metrics.EDITS["tasks/audio_classification.py"].values()
    exec(line, space)
    assert space["sklearn_metrics"].roc_curve is roc_curve


def test_fairseq_train_starts_without_sklearn():
    """The installed fairseq (setup_env.sh edited it): its start imports neither."""
    probe = "import sys, fairseq_cli.train; print(sorted(m for m in ('sklearn', 'scipy.stats') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]", out
