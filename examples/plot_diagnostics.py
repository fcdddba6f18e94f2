#!/usr/bin/env python
"""Plot the pre-training diagnostics of one or more fairseq-train runs.

    python examples/plot_diagnostics.py LOG [LOG ...] --out diagnostics.png [--labels A B ...]

LOG is what ``fairseq-train --log-format json`` printed (its stdout/stderr saved to
a file, or ``--log-file``): every ``| valid |`` line is read.  Panels: the
validation losses, bits through [CLS] per bottleneck term (``<term>_cls_bits_seq``,
bits per sequence), the mean [CLS] cosine (anisotropy), when the run had
``--retrieval-probe-size``, the probe's MRR@10 and, when it had ``--retrieval-dev``, the
dev set's nDCG@10 and MRR@10.  The starting model's scores (the task's line
``retrieval at update 0 (the starting model...): ...``) are the point at update 0 of these
panels and a dotted line across them.  Needs matplotlib (``pip install matplotlib``, or
the ``plot`` extra).
"""

import argparse
import json
import re
import sys
from pathlib import Path
from typing import Dict, List

TAG = "| valid | "
# what BottleneckPretrainTask.log_start logs (seed_fairseq.pretrain.diagnostics.start_line)
START = re.compile(r"retrieval at update 0 \(the starting model[^)]*\): (.*)$")


def start_row(line: str) -> Dict[str, float]:
    """The starting model's scores of a ``retrieval at update 0`` line, as a row at update 0
    marked ``start`` (empty for any other line)."""
    match = START.search(line)
    if not match:
        return {}
    row = {"num_updates": 0.0, "start": 1.0}
    for part in match.group(1).split(" | "):
        name, _, value = part.strip().partition(" ")
        try:
            row[name] = float(value)
        except ValueError:
            pass
    return row


def read_valid(path: Path) -> List[Dict[str, float]]:
    """The ``| valid |`` records of a log, after the starting model's row (the first one)."""
    rows = []
    start = {}
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        start = start or start_row(line)
        if TAG not in line:
            continue
        rec = json.loads(line.split(TAG, 1)[1])
        row = {}
        for key, value in rec.items():
            try:
                row[key[len("valid_") :] if key.startswith("valid_") else key] = float(value)
            except (TypeError, ValueError):
                pass
        rows.append(row)
    if not rows:
        raise SystemExit(f"error: {path}: no '| valid |' lines (train with --log-format json and validation on)")
    return [start] + rows if start else rows


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("logs", nargs="+", type=Path)
    p.add_argument("--out", required=True, type=Path, help="PNG to write")
    p.add_argument("--labels", nargs="*", help="one label per log (default: file names)")
    p.add_argument("--title", default="pre-training diagnostics (validation)")
    args = p.parse_args(argv)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = args.labels or [log.stem for log in args.logs]
    if len(labels) != len(args.logs):
        p.error("--labels needs one label per log")
    runs = [(label, read_valid(log)) for label, log in zip(labels, args.logs)]
    panels = [
        ("loss (bits per unit)", lambda k: k.endswith("_loss") and k not in ("loss", "best_loss")),
        ("bits through [CLS] per sequence\n(own - rotated [CLS])", lambda k: k.endswith("_cls_bits_seq")),
        ("mean [CLS] cosine (anisotropy)", lambda k: k == "cls_cosine"),
        ("retrieval probe MRR@10", lambda k: k == "probe_mrr10"),
    ]
    if any("dev_ndcg10" in r for _, rows in runs for r in rows):
        panels.append(("--retrieval-dev (zero-shot)", lambda k: k in ("dev_ndcg10", "dev_mrr10")))
    fig, axes = plt.subplots(1, len(panels), figsize=(4.2 * len(panels), 3.4))
    for ax, (title, wanted) in zip(axes, panels):
        for i, (label, rows) in enumerate(runs):
            keys = sorted({k for r in rows for k in r if wanted(k)})
            for key in keys:
                xs = [r["num_updates"] for r in rows if key in r]
                ys = [r[key] for r in rows if key in r]
                name = label if len(keys) == 1 else f"{label}: {key}"
                ax.plot(xs, ys, marker="o", markersize=2.5, linewidth=1.2, color=f"C{i}", label=name,
                        linestyle="-" if key == keys[0] else "--")  # fmt: skip
                start = [r[key] for r in rows if r.get("start") and key in r]
                if start:  # the starting model: above the line the run helped, below it hurt
                    ax.axhline(start[0], color=f"C{i}", linestyle=":", linewidth=0.8)
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("updates", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=6)
    fig.suptitle(args.title, fontsize=10)
    fig.tight_layout()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(args.out, dpi=110)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
