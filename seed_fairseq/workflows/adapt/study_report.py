"""The study's report.json, report.md and report.png: every objective and arm against the original model.

Every number is computed from the runs the stages left (TREC files) and the judged
queries of the derived set's test split.  A row's value is the mean over its seeds
(with the seeds' spread); its p-value is the two-sided paired permutation test over the
queries of the seed-averaged per-query scores (``compare.stats.paired_p``) against the
reference: the original model zero-shot for the zero-shot column, the original model
fine-tuned identically (with the same seeds) for the fine-tuned column.  On a derived set, whose
queries come many to a held-out document, the same test over the documents too
(``p_documents``, ``kit.stats.document_p``).
"""

import platform
import time
from pathlib import Path
from typing import Any, Dict, List

from ...base.fileio import write_json_atomic, write_text_atomic
from ...base.retrieval_data import load_data
from ...encoders.retrieval.metrics import aggregate, per_query, read_trec_run
from ..kit.objectives import OBJECTIVES
from ..kit.roundtrip import first_sentence, statement
from ..kit.stats import document_p, fmt_p, mean_std, paired_p
from .plan import REPORT_FILES
from .report import METRICS, cut_by, save_png

ALPHA = 0.05
SETTINGS = ("updates", "batch_size", "tokens_per_sample", "lr", "warmup")


def _values(study, qrels, path: Path) -> Dict[str, Dict[str, float]]:
    return per_query(qrels, read_trec_run(path), METRICS)


def collect(study, results: Dict[str, Any]) -> Dict[str, Any]:
    p = study.plan
    test = load_data(study.retrieval_dir, p.test_split)
    qrels = test.qrels
    original = _values(study, qrels, study.eval_dir("zeroshot-original") / "run.trec")
    original_ft = [_values(study, qrels, o.eval_dir("finetune-original") / "run.trec")
                   for o in study.originals.values()]  # fmt: skip

    def row(per_seed, reference, label, **extra) -> Dict[str, Any]:
        scores = [aggregate(v) for v in per_seed]
        ref = [reference] if isinstance(reference, dict) else reference
        entry = {"label": label, **extra,
                 "metrics": {m: mean_std([s[m] for s in scores]) for m in METRICS}}  # fmt: skip
        if reference is not None:
            ref_mean = {m: mean_std([aggregate(v)[m] for v in ref])["mean"] for m in METRICS}
            entry["delta"] = {m: entry["metrics"][m]["mean"] - ref_mean[m] for m in METRICS}
            runs = {m: ([v[m] for v in per_seed], [v[m] for v in ref]) for m in METRICS}
            entry["p"] = {m: paired_p(*runs[m], p.resamples) for m in METRICS}
            entry["p_documents"] = {m: document_p(*runs[m], p.resamples) for m in METRICS}
        return entry

    bm25 = _values(study, qrels, study.out / "bm25" / "test.trec")
    zeroshot = {"original": row([original], None, "no continued pre-training"),
                "bm25": row([bm25], original, "BM25 (bm25s)")}  # fmt: skip
    finetuned = {"original": row(original_ft, original, "no continued pre-training")}
    for arm in study.arms:
        for objective in study.objectives:
            names = [n for n, c in study.cells.items() if c.plan.objective.name == objective and f"-{arm}-s" in n]
            zs = [_values(study, qrels, study.cells[n].eval_dir("zeroshot") / "run.trec") for n in names]
            ft = [_values(study, qrels, study.cells[n].eval_dir("finetune") / "run.trec") for n in names]
            key = f"{objective}/{arm}"
            label = OBJECTIVES[objective].label
            zeroshot[key] = row(zs, original, label, objective=objective, arm=arm)
            finetuned[key] = row(ft, original_ft, label, objective=objective, arm=arm)
    seconds = {k: v.get("seconds") for k, v in results.items() if isinstance(v, dict) and "seconds" in v}
    pre = p.pretrain
    return {
        "tool": "seed_fairseq.adapt.study",
        "command": p.command,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "threads": p.threads},
        "model": str(p.model),
        "corpus": str(p.corpus),
        "seeds": study.seeds,
        "arms": {a.name: a.description for a in study.arm_specs},
        "pretrain": {k: getattr(pre, k) for k in SETTINGS},
        "encoder_lr_scale": {a.name: a.encoder_lr_scale for a in study.arm_specs},
        # adapt's freeze is 0 for an objective the import has every head of: a range over the objectives
        "freeze_updates": {a: sorted({c.freeze_updates() for n, c in study.cells.items() if f"-{a}-s" in n})
                           for a in study.arms},  # fmt: skip
        "evaluation": {
            "split": p.test_split,
            "queries": len([q for q in test.query_ids() if test.positives(q)]),
            "passages": len(test.corpus),
            "train_queries": results.get(f"finetune-original-s{study.seeds[0]}", {}).get("train_queries"),
            "heldout_documents": results.get("split", {}).get("heldout"),
            "documents": results.get("split", {}).get("documents"),
            "max_seq_length": p.max_seq_length,
            "cut_by": cut_by(p),
            "resamples": p.resamples,
            "finetune": {k: getattr(p.finetune, k) for k in ("negatives", "loss", "epochs", "batch_size", "lr")},
        },
        "roundtrip": {k: v for k, v in results.get("roundtrip", {}).items() if k != "seconds"},
        "zeroshot": zeroshot,
        "finetuned": finetuned,
        "seconds": {"total": sum(v for v in seconds.values() if v), "stages": seconds},
    }


def _verdict(entry: Dict[str, Any], metric: str = "nDCG@10") -> str:
    d, p = entry["delta"][metric], entry["p"][metric]
    if p >= ALPHA:
        return "no significant change"
    return "**helps**" if d > 0 else "**hurts**"


def _mean(x: Dict[str, Any]) -> str:
    return f"{x['mean']:.3f}" + (f" ± {x['std']:.3f}" if x["n"] > 1 else "")


def _p_docs(entry: Dict[str, Any], metric: str) -> str:
    """The test over documents ("-" where there is none: a set not derived, a report written before it)."""
    return fmt_p(entry.get("p_documents", {}).get(metric))


def table(data: Dict[str, Any]) -> List[str]:
    """The study's table: one row per objective and arm, zero-shot and fine-tuned nDCG@10 side by side."""
    m = "nDCG@10"
    lines = [
        f"| objective | arm | zero-shot {m} | Δ | p | p (documents) | fine-tuned {m} | Δ | p | p (documents) "
        "| verdict after fine-tuning |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    zs, ft = data["zeroshot"], data["finetuned"]
    o, o_ft = zs["original"], ft["original"]
    lines.append(f"| **no continued pre-training** | - | {_mean(o['metrics'][m])} | | | | "
                 f"{_mean(o_ft['metrics'][m])} | {o_ft['delta'][m]:+.3f} | {fmt_p(o_ft['p'][m])} | "
                 f"{_p_docs(o_ft, m)} | (the reference) |")  # fmt: skip
    b = zs["bm25"]
    lines.append(f"| BM25 | - | {_mean(b['metrics'][m])} | {b['delta'][m]:+.3f} | {fmt_p(b['p'][m])} | "
                 f"{_p_docs(b, m)} | | | | | |")  # fmt: skip
    for key, z in zs.items():
        if "arm" not in z:
            continue
        f = ft[key]
        lines.append(
            f"| {z['label']} | {z['arm']} | {_mean(z['metrics'][m])} | {z['delta'][m]:+.3f} | {fmt_p(z['p'][m])} | "
            f"{_p_docs(z, m)} | {_mean(f['metrics'][m])} | {f['delta'][m]:+.3f} | {fmt_p(f['p'][m])} | "
            f"{_p_docs(f, m)} | {_verdict(f)} |"
        )
    return lines


def summary(data: Dict[str, Any]) -> List[str]:
    """Plain sentences: which objectives help, which hurt, and by how much (nDCG@10, p < 0.05)."""
    out = []
    for column, what in (("zeroshot", "zero-shot"), ("finetuned", "after identical fine-tuning")):
        rows = [r for r in data[column].values() if "arm" in r]
        helps = [r for r in rows if r["p"]["nDCG@10"] < ALPHA and r["delta"]["nDCG@10"] > 0]
        hurts = [r for r in rows if r["p"]["nDCG@10"] < ALPHA and r["delta"]["nDCG@10"] < 0]

        def names(rs):
            return ", ".join(f"{r['label']} ({r['arm']}, {r['delta']['nDCG@10']:+.3f})" for r in rs) or "none"

        out.append(f"* **{what.capitalize()}**, against the model with no continued pre-training: "
                   f"helps: {names(helps)}; hurts: {names(hurts)}; the other {len(rows) - len(helps) - len(hurts)} "
                   "rows are not significantly different (p >= 0.05).")  # fmt: skip
    return out


def _frozen(data: Dict[str, Any], arm: str) -> str:
    n = data.get("freeze_updates", {}).get(arm) or [0]
    if n[-1] == 0:
        return ""
    if n == [1]:
        return " (the encoder frozen for the first update)"
    span = str(n[0]) if len(n) == 1 else f"{n[0]}-{n[-1]} (by objective)"
    return f" (the encoder frozen for the first {span} updates)"


def markdown(data: Dict[str, Any]) -> str:
    ev, pre = data["evaluation"], data["pretrain"]
    roundtrip = data.get("roundtrip") or {}
    warning = first_sentence(roundtrip, Path(data["model"]).name)
    lines = [
        f"# Adaptation study: `{Path(data['model']).name}` on `{Path(data['corpus']).name}`\n",
        *([warning + "\n"] if warning else []),
        "```\n" + data["command"] + "\n```\n",
        *summary(data),
        "",
        *table(data),
        "",
        f"nDCG@10: mean ± standard deviation over the seeds {data['seeds']}; Δ and p against the model with no "
        "continued pre-training (zero-shot: the original; fine-tuned: the original fine-tuned identically with the "
        "same seeds); p: two-sided paired permutation test over the queries of the seed-averaged scores "
        f"({ev['resamples']} resamples); p (documents): the same test with whole held-out documents as its unit "
        "(their queries' summed scores keep or flip their sign together), since a derived set's queries come many "
        "to a document and are not independent. The verdicts use p over the queries.\n",
        f"* Evaluation: the `{ev['split']}` split, {ev['queries']} judged queries over {ev['passages']} passages, "
        f"derived from {ev['heldout_documents']} of the corpus's {ev['documents']} documents held out of "
        "pre-training (every paragraph a passage; one sentence of each paragraph of >= 3 sentences, removed from "
        f"it, a query; queries split by document); every model in the representation of the model as given "
        f"({roundtrip.get('given', '-')}: the original `--model` itself, each cell pre-trained, validated and "
        f"exported in it), texts cut at {ev['max_seq_length']} tokens ({ev.get('cut_by', '--max-seq-length')}). "
        f"{statement(roundtrip)}",
        f"* Continued pre-training (every cell): {pre['updates']} updates of {pre['batch_size']} blocks of "
        f"{pre['tokens_per_sample']} tokens, lr {pre['lr']} ({pre['warmup']} warm-up updates, linear decay); the "
        "last checkpoint is evaluated.",
        *(f"* Arm `{a}`: {d}" + _frozen(data, a) + "." for a, d in data["arms"].items()),
        f"* Fine-tuning (every model alike, seed = the cell's): {ev['train_queries']} queries of the train split, "
        f"{ev['finetune']['negatives']} hard negatives + in-batch negatives, {ev['finetune']['loss']} loss, "
        f"{ev['finetune']['epochs']} epoch(s), batch {ev['finetune']['batch_size']}, lr {ev['finetune']['lr']}.",
        f"* Wall time: {data['seconds']['total'] / 60:.0f} min ({data['machine']['threads']} CPU threads).\n",
        "Plot: [report.png](report.png); every metric (MRR@10, R@100 too): `report.json`.",
    ]
    return "\n".join(lines) + "\n"


def plot(data: Dict[str, Any], out: Path) -> Path:
    """Δ nDCG@10 against the model with no continued pre-training, per objective and arm, with the
    seeds' spread; zero-shot on the left, fine-tuned on the right; a star marks p < 0.05."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    m = "nDCG@10"
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for ax, (column, title) in zip(axes, (("zeroshot", "zero-shot"), ("finetuned", "after identical fine-tuning"))):
        rows = [r for r in data[column].values() if "arm" in r]
        objectives = list(dict.fromkeys(r["objective"] for r in rows))
        arms = list(dict.fromkeys(r["arm"] for r in rows))
        x = np.arange(len(objectives))
        width = 0.8 / max(1, len(arms))
        for i, arm in enumerate(arms):
            rs = [next(r for r in rows if r["objective"] == o and r["arm"] == arm) for o in objectives]
            pos = x + (i - (len(arms) - 1) / 2) * width
            ax.bar(pos, [r["delta"][m] for r in rs], width, yerr=[r["metrics"][m]["std"] for r in rs],
                   label=arm, color=f"C{i}", capsize=2)  # fmt: skip
            for xp, r in zip(pos, rs):
                if r["p"][m] < ALPHA:  # the star beyond the bar's error bar, where its cap cannot hide it
                    up = r["delta"][m] > 0
                    tip = r["delta"][m] + (1 if up else -1) * (r["metrics"][m]["std"] or 0.0)
                    ax.annotate("*", (xp, tip), xytext=(0, 1 if up else -1), textcoords="offset points",
                                ha="center", va="bottom" if up else "top", fontsize=12)  # fmt: skip
        ax.margins(y=0.12)
        ref = data[column]["original"]["metrics"][m]["mean"]
        ax.axhline(0, color="black", linewidth=0.8)
        ax.set_xticks(x)
        ax.set_xticklabels(objectives, fontsize=8)
        ax.set_title(f"{title}: Δ {m} vs no continued pre-training ({ref:.3f})", fontsize=9)
        ax.grid(axis="y", alpha=0.3)
        ax.legend(fontsize=7, title="arm", title_fontsize=7)
    if "bm25" in data["zeroshot"]:
        axes[0].axhline(data["zeroshot"]["bm25"]["delta"][m], color="grey", linestyle="--", linewidth=0.8)
        axes[0].text(0, data["zeroshot"]["bm25"]["delta"][m], " BM25", fontsize=7, va="bottom", color="grey")
    fig.suptitle(f"{Path(data['model']).name} on {Path(data['corpus']).name}: seeds {data['seeds']}, "
                 f"{data['evaluation']['queries']} test queries (* p < 0.05)", fontsize=10)  # fmt: skip
    return save_png(fig, out)


def write_study_report(study, results: Dict[str, Any]) -> List[str]:
    data = collect(study, results)
    plot(data, study.out / "report.png")
    write_json_atomic(study.out / "report.json", data)
    write_text_atomic(study.out / "report.md", markdown(data))
    return list(REPORT_FILES)
