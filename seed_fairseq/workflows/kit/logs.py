"""Reading what ``fairseq-train --log-format json`` printed: the validation rows
(losses and the pre-training diagnostics of ``seed_fairseq/pretrain/diagnostics.py``)."""

import json
from pathlib import Path
from typing import Dict, List

VALID_TAG = "| valid | "
TRAIN_INNER_TAG = "| train_inner | "


def _rows(path: Path, tag: str) -> List[Dict[str, float]]:
    rows = []
    for line in Path(path).read_text(encoding="utf-8", errors="replace").splitlines():
        if tag not in line:
            continue
        try:
            rec = json.loads(line.split(tag, 1)[1])
        except ValueError:
            continue  # a line cut by a kill
        prefix = tag.strip(" |") + "_"
        row = {}
        for key, value in rec.items():
            try:
                row[key[len(prefix) :] if key.startswith(prefix) else key] = float(value)
            except (TypeError, ValueError):
                pass
        rows.append(row)
    return rows


def read_valid(path) -> List[Dict[str, float]]:
    """Every ``| valid |`` row of a log ({"num_updates", "loss", "dec_loss", "cls_cosine", ...})."""
    return _rows(path, VALID_TAG)


def read_train_inner(path) -> List[Dict[str, float]]:
    """Every ``| train_inner |`` row, one per ``--log-interval`` updates (``num_updates``, ``loss`` ...)."""
    return _rows(path, TRAIN_INNER_TAG)


def final_diagnostics(rows: List[Dict[str, float]]) -> Dict[str, float]:
    """The diagnostics of the last validation: losses, ``*_cls_bits*``, ``cls_cosine``, ``probe_mrr10``."""
    if not rows:
        return {}
    last = max(rows, key=lambda r: r.get("num_updates", 0))
    keep = {}
    for k, v in last.items():
        if k.endswith(("_loss", "_cls_bits", "_cls_bits_seq")) or k in (
            "loss",
            "cls_cosine",
            "probe_mrr10",
            "num_updates",
        ):
            keep[k] = v
    return keep
