"""The comparison's figures (matplotlib, Agg backend, PNG).

metrics.png      MRR@10 / R@100 / nDCG@10 per model, zero-shot and fine-tuned, mean +- std over seeds
few_shot.png     MRR@10 vs the fraction of training queries used in fine-tuning (Figure 6c/d)
cls_cosine.png   mean [CLS] cosine of random text pairs vs their length (Figures 1b/5)
diagnostics.png  the validation diagnostics over pre-training updates (mean over seeds)
"""

from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence

from ...base.fileio import atomic_path

PLOTS = ("metrics.png", "few_shot.png", "cls_cosine.png", "diagnostics.png")
METRICS = ("MRR@10", "R@100", "nDCG@10")


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(fig, path: Path) -> Path:
    with atomic_path(path, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    _plt().close(fig)
    return path


def _mean(agg: Optional[Mapping]) -> float:
    return float("nan") if not agg or agg.get("mean") is None else agg["mean"]


def _std(agg: Optional[Mapping]) -> float:
    return 0.0 if not agg or not agg.get("std") else agg["std"]


def plot_metrics(rows: Sequence[Mapping], out: Path, bm25: Optional[Mapping] = None) -> Path:
    """``rows``: [{"label", "zero_shot": {metric: agg}, "finetuned": {metric: agg}}]."""
    import numpy as np

    plt = _plt()
    fig, axes = plt.subplots(1, len(METRICS), figsize=(4.6 * len(METRICS), 3.8))
    x = np.arange(len(rows))
    for ax, m in zip(axes, METRICS):
        for j, (part, name) in enumerate((("zero_shot", "zero-shot"), ("finetuned", "fine-tuned"))):
            means = [_mean(r[part].get(m)) for r in rows]
            stds = [_std(r[part].get(m)) for r in rows]
            ax.bar(x + (j - 0.5) * 0.38, means, 0.38, yerr=stds, capsize=3, label=name, color=f"C{j}")
        if bm25 and m in bm25:
            ax.axhline(bm25[m], color="k", linestyle="--", linewidth=1, label="BM25")
        ax.set_xticks(x)
        ax.set_xticklabels([r["label"] for r in rows], rotation=35, ha="right", fontsize=7)
        ax.set_title(m, fontsize=9)
        ax.tick_params(labelsize=7)
        ax.grid(axis="y", alpha=0.3)
    axes[0].legend(fontsize=7)
    fig.suptitle("retrieval on the test split (mean ± std over pre-training seeds)", fontsize=10)
    fig.tight_layout()
    return _save(fig, out)


def plot_few_shot(rows: Sequence[Mapping], fractions: Sequence[float], out: Path) -> Path:
    """``rows``: [{"label", "few_shot": {fraction label: {metric: agg}}}]; MRR@10 vs % of training queries."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.6, 4.0))
    xs = [f * 100 for f in fractions]
    for i, r in enumerate(rows):
        aggs = [r["few_shot"].get(f"{f * 100:g}", {}).get("MRR@10") for f in fractions]
        ax.errorbar(xs, [_mean(a) for a in aggs], yerr=[_std(a) for a in aggs], marker="o", markersize=3,
                    capsize=3, linewidth=1.2, color=f"C{i % 10}", label=r["label"])  # fmt: skip
    ax.set_xscale("log")
    ax.set_xticks(xs)
    ax.set_xticklabels([f"{x:g}%" for x in xs])
    ax.set_xlabel("training queries used in fine-tuning", fontsize=8)
    ax.set_ylabel("MRR@10 (test)", fontsize=8)
    ax.set_title("few-shot fine-tuning (paper Figure 6c/d)", fontsize=9)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
    fig.tight_layout()
    return _save(fig, out)


def plot_cls_cosine(rows: Sequence[Mapping], out: Path) -> Path:
    """``rows``: [{"label", "cls_cosine": {length: agg}}]; lengths the model could not take are missing."""
    plt = _plt()
    fig, ax = plt.subplots(figsize=(5.6, 4.0))
    for i, r in enumerate(rows):
        lengths = sorted(int(k) for k in r["cls_cosine"])
        if not lengths:
            continue
        aggs = [r["cls_cosine"][str(L)] for L in lengths]
        ax.errorbar(lengths, [_mean(a) for a in aggs], yerr=[_std(a) for a in aggs], marker="o", markersize=3,
                    capsize=3, linewidth=1.2, color=f"C{i % 10}", label=r["label"])  # fmt: skip
    ax.set_xscale("log", base=2)
    ax.set_xlabel("text length (tokens)", fontsize=8)
    ax.set_ylabel("mean cosine of [CLS] vectors of random pairs", fontsize=8)
    ax.set_title("[CLS] anisotropy before fine-tuning (Figures 1b/5; lower = more diverse)", fontsize=8)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=6)
    fig.tight_layout()
    return _save(fig, out)


DIAG_PANELS = (
    ("validation loss (bits per unit, weighted sum)", lambda k: k == "loss"),
    ("bits through [CLS] per sequence", lambda k: k.endswith("_cls_bits_seq")),
    ("mean [CLS] cosine (anisotropy)", lambda k: k == "cls_cosine"),
    ("retrieval probe MRR@10", lambda k: k == "probe_mrr10"),
)


def mean_curves(runs: Sequence[List[Dict[str, float]]]) -> Dict[str, Dict[float, float]]:
    """Validation rows of several seeds -> {key: {update: mean over the seeds that logged it}}."""
    acc: Dict[str, Dict[float, List[float]]] = {}
    for rows in runs:
        for row in rows:
            u = row.get("num_updates")
            if u is None:
                continue
            for k, v in row.items():
                acc.setdefault(k, {}).setdefault(u, []).append(v)
    return {k: {u: sum(v) / len(v) for u, v in by_u.items()} for k, by_u in acc.items()}


def plot_diagnostics(curves: Mapping[str, Mapping[str, Mapping[float, float]]], out: Path) -> Path:
    """``curves``: {objective label: mean_curves(...)}."""
    plt = _plt()
    fig, axes = plt.subplots(1, len(DIAG_PANELS), figsize=(4.3 * len(DIAG_PANELS), 3.6))
    for ax, (title, wanted) in zip(axes, DIAG_PANELS):
        for i, (label, keys) in enumerate(curves.items()):
            chosen = sorted(k for k in keys if wanted(k))
            for j, key in enumerate(chosen):
                pts = sorted(keys[key].items())
                name = label if len(chosen) == 1 else f"{label}: {key[: -len('_cls_bits_seq')]}"
                ax.plot([u for u, _ in pts], [v for _, v in pts], marker="o", markersize=2.5, linewidth=1.2,
                        color=f"C{i % 10}", linestyle="-" if j == 0 else "--", label=name)  # fmt: skip
        ax.set_title(title, fontsize=9)
        ax.set_xlabel("pre-training updates", fontsize=8)
        ax.tick_params(labelsize=7)
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend(fontsize=6)
    fig.suptitle("pre-training diagnostics at every validation (mean over seeds)", fontsize=10)
    fig.tight_layout()
    return _save(fig, out)
