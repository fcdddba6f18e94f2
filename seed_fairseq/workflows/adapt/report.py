"""report.json, report.md and report.png: the original model against the adapted one.

The original model is ``--model`` as the user gave it, scored and fine-tuned as the adapted
one; the report's first sentence says when the import -> export round trip does not give it
back exactly (``kit/roundtrip.py``: then the adapted model started from something else).

Every number is computed from the runs the stages left (TREC files) and the judged
queries of the report's split.  Each row is compared with a reference row by the
two-sided paired permutation test over the queries
(``kit.stats.paired_p`` of one run each): the adapted model and BM25 with
the original model zero-shot; after fine-tuning, the original fine-tuned with the
original zero-shot (what fine-tuning alone gives), and the adapted fine-tuned with the
original fine-tuned (what adaptation adds after identical fine-tuning).  On the derived set
(no ``--retrieval-dev``), whose queries come many to a held-out document, the same test over
the documents too (``p_documents``, ``kit.stats.document_p``).
"""

import platform
import time
from pathlib import Path
from typing import Any, Dict, List, Optional

from ...base.fileio import atomic_path, write_json_atomic, write_text_atomic
from ...base.retrieval_data import load_data
from ...encoders.retrieval.metrics import aggregate, per_query, read_trec_run
from ..kit.roundtrip import first_sentence, statement
from ..kit.stats import document_p, fmt_p, paired_p
from .plan import REPORT_FILES

METRICS = ("nDCG@10", "MRR@10", "R@100")


def _rows(ad) -> List[Dict[str, Any]]:
    """(key, label, run file, reference key) of every evaluated model, in table order."""
    rows = [
        ("original", "original model, zero-shot", ad.eval_dir("zeroshot-original") / "run.trec", None),
        ("adapted", "adapted model, zero-shot", ad.eval_dir("zeroshot-adapted") / "run.trec", "original"),
        ("bm25", "BM25 (bm25s)", ad.out / "bm25" / "test.trec", "original"),
    ]
    if ad.plan.train_queries is not None:
        rows += [
            ("original_ft", "original model, fine-tuned", ad.eval_dir("finetune-original") / "run.trec", "original"),
            ("adapted_ft", "adapted model, fine-tuned", ad.eval_dir("finetune-adapted") / "run.trec", "original_ft"),
        ]
    return [dict(key=k, label=label, run=run, versus=versus) for k, label, run, versus in rows]


def collect(ad, results: Dict[str, Any]) -> Dict[str, Any]:
    p = ad.plan
    test = load_data(ad.retrieval_dir, p.test_split)
    rows = _rows(ad)
    values = {r["key"]: per_query(test.qrels, read_trec_run(r["run"]), METRICS) for r in rows}
    models = {}
    for r in rows:
        entry: Dict[str, Any] = {"label": r["label"], "metrics": aggregate(values[r["key"]])}
        if r["versus"] is not None:
            a, b = values[r["key"]], values[r["versus"]]
            entry["versus"] = r["versus"]
            entry["p"] = {m: paired_p([a[m]], [b[m]], p.resamples) for m in METRICS}  # one run each: over the queries
            if p.derived:
                entry["p_documents"] = {m: document_p([a[m]], [b[m]], p.resamples) for m in METRICS}
        models[r["key"]] = entry
    return {
        "tool": "seed_fairseq.adapt",
        "command": p.command,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": {"platform": platform.platform(), "python": platform.python_version()},
        "model": str(p.model),
        "corpus": str(p.corpus),
        "objective": p.objective.name,
        "settings": p.settings,
        "pretrain": {
            "updates": p.pretrain.updates,
            "batch_size": p.pretrain.batch_size,
            "tokens_per_sample": p.pretrain.tokens_per_sample,
            "lr": p.pretrain.lr,
            "warmup": p.pretrain.warmup,
            "new_heads": results["pretrain"].get("new_heads", []),
            "freeze_encoder_updates": results["pretrain"].get("freeze_updates"),
            "encoder_warmup_updates": p.encoder_warmup_updates,
            "encoder_lr_scale": p.encoder_lr_scale,
            "layer_lr_decay": p.layer_lr_decay,
            "seconds": results["pretrain"]["seconds"],
        },
        "selection": {k: v for k, v in results["export"].items() if k != "seconds"},
        "roundtrip": {k: v for k, v in results.get("roundtrip", {}).items() if k != "seconds"},
        "evaluation": _evaluation(ad, results, test),
        "models": models,
        "stage_seconds": {k: v.get("seconds") for k, v in results.items() if isinstance(v, dict) and "seconds" in v},
    }


def cut_by(plan) -> str:
    """Who chose where texts are cut in evaluation and fine-tuning: the user, or the model as given."""
    return "--max-seq-length" if plan.settings.get("max_seq_length") else "the model's own max_seq_length"


def finetune_settings(results: Dict[str, Any]) -> Dict[str, Any]:
    """The fine-tuning both models had, as their stages recorded it: the report says "both models
    alike" only when the two records agree (data, every setting, the seed).  Their stages declare
    the same plan fields, so they always do; a record that disagrees is a bug, never reported."""
    used = [results.get(f"finetune-{who}", {}).get("settings") for who in ("original", "adapted")]
    if used[0] is None or used[0] != used[1]:
        raise RuntimeError(f"the two fine-tunings were not identical: {used[0]} vs {used[1]}")
    return used[0]


def _evaluation(ad, results, test) -> Dict[str, Any]:
    p = ad.plan
    info = {
        "split": p.test_split,
        "queries": len([q for q in test.query_ids() if test.positives(q)]),
        "passages": len(test.corpus),
        "max_seq_length": p.max_seq_length,
        "cut_by": cut_by(p),
        "resamples": p.resamples,
    }
    if p.derived:
        split = results.get("split", {})
        info["design"] = (
            f"derived from {split.get('heldout')} of the corpus's {split.get('documents')} documents, held out "
            "of pre-training: every paragraph is a passage; one sentence of each paragraph of >= 3 sentences, "
            "removed from it, is a query; queries split by document (dev: checkpoint selection, test: this report)"
        )
    else:
        info["design"] = f"given: {p.retrieval_dev}"
        info["selected_on_same_split"] = p.dev_in_training and p.test_split == "dev"
    if p.train_queries is not None:
        ft = finetune_settings(results)
        info["finetune"] = {
            "data": ft["data"],
            "negatives": ft["negatives"],
            "loss": ft["loss"],
            "epochs": ft["epochs"],
            "batch_size": ft["batch_size"],
            "lr": ft["lr"],
            "seed": ft["seed"],
            "train_queries": results.get("finetune-adapted", {}).get("train_queries"),
        }
    return info


def _cell(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.3f}"


def _verdict(data: Dict[str, Any]) -> List[str]:
    """One sentence per comparison that matters, with its sign and p-value."""
    out = []
    m = data["models"]
    for key, what in (("adapted", "zero-shot"), ("adapted_ft", "after identical fine-tuning")):
        if key not in m:
            continue
        ref = m[m[key]["versus"]]
        a, b = m[key]["metrics"]["nDCG@10"], ref["metrics"]["nDCG@10"]
        p = m[key]["p"]["nDCG@10"]
        change = "better" if a > b and p < 0.05 else "worse" if a < b and p < 0.05 else "not significantly different"
        p_docs = m[key].get("p_documents", {}).get("nDCG@10")
        docs = "" if p_docs is None else f"; over the held-out documents the queries come from, p = {fmt_p(p_docs)}"
        out.append(
            f"* {what.capitalize()}: nDCG@10 {b:.3f} -> {a:.3f} ({a - b:+.3f}, p = {fmt_p(p)}{docs}): the adapted "
            f"model is **{change}** (two-sided paired permutation test over the queries, 0.05)."
        )
    return out


def markdown(data: Dict[str, Any]) -> str:
    lines: List[str] = []
    add = lines.append
    pre, sel, ev = data["pretrain"], data["selection"], data["evaluation"]
    add(f"# Domain adaptation: `{Path(data['model']).name}` continued with `{data['objective']}`\n")
    warning = first_sentence(data.get("roundtrip") or {}, Path(data["model"]).name)
    if warning:
        add(warning + "\n")
    add("```\n" + data["command"] + "\n```\n")
    add("## Result\n")
    if sel["kept_start"]:
        last = max(sel["validations"].items(), key=lambda kv: int(kv[0]), default=None)
        after = f", {last[1]:.4f} after update {last[0]}" if last else ""
        start = f" ({sel['start']:.4f} at the start{after})" if sel.get("start") is not None else ""
        add(
            f"**No checkpoint of the continued pre-training scored above the starting model on the dev set by "
            f"`{sel['metric']}`{start}: the adapted model in `model/` is the original.**\n"
        )
    lines.extend(_verdict(data))
    add("")
    add("| model | " + " | ".join(METRICS) + " | compared with | " + " | ".join(f"p {m}" for m in METRICS) + " |")
    add("| --- |" + " --- |" * (2 * len(METRICS) + 1))
    for entry in data["models"].values():
        versus = data["models"][entry["versus"]]["label"] if "versus" in entry else "(the reference)"
        pv = entry.get("p", {})
        add(f"| {entry['label']} | " + " | ".join(_cell(entry["metrics"][m]) for m in METRICS) + f" | {versus} | "
            + " | ".join(fmt_p(pv.get(m)) for m in METRICS) + " |")  # fmt: skip
    add("")
    add(
        f"Evaluated on the `{ev['split']}` split: {ev['queries']} judged queries over {ev['passages']} passages, "
        f"{ev['design']}. The original model is `--model` as given, scored as the retrieval tools score it (in "
        f"the representation its folder declares: {(data.get('roundtrip') or {}).get('given', '-')}); the adapted "
        "one is `model/`, pre-trained, validated and exported in that same representation; texts cut at "
        f"{ev['max_seq_length']} tokens ({ev.get('cut_by', '--max-seq-length')}). p: two-sided paired permutation "
        "test over the queries "
        f"({ev['resamples']} resamples, exact for <= 16 queries) against the row named in 'compared with'. "
        f"{statement(data.get('roundtrip') or {})}\n"
    )
    if ev.get("selected_on_same_split"):
        add(
            "**Note:** the checkpoint was chosen on this same split (`--retrieval-dev` has no `test` split): the "
            "adapted model's numbers are optimistic. Give a folder with a test split, or `--test-split`.\n"
        )
    add("## What was done\n")
    heads = ", ".join(pre["new_heads"]) or "none"
    add(
        f"* Continued pre-training: {pre['updates']} updates of {pre['batch_size']} blocks of "
        f"{pre['tokens_per_sample']} tokens, lr {pre['lr']} ({pre['warmup']} warm-up updates, linear decay); "
        f"{pre['seconds']:.0f} s."
    )
    add(
        f"* Heads the original model does not have: {heads}. The encoder was frozen for the first "
        f"{pre['freeze_encoder_updates']} updates (`--freeze-encoder-updates`), then its learning rate rose over "
        f"{pre['encoder_warmup_updates'] if pre['encoder_warmup_updates'] >= 0 else pre['freeze_encoder_updates']}"
        f" updates (`--encoder-warmup-updates`); encoder LR x {pre['encoder_lr_scale']}, layer decay "
        f"{pre['layer_lr_decay']}."
    )
    vals = ", ".join(f"{u}: {v:.4f}" for u, v in sel["validations"].items())
    start = f"{sel['start']:.4f}" if sel.get("start") is not None else "not logged"
    if sel["kept_start"]:
        chosen = "**none beat the starting model: the adapted model is the original**"
    else:
        chosen = f"update {sel['update']} ({sel['value']:.4f})"
    add(
        f"* Checkpoint selection by `{sel['metric']}` at each validation (update: score): {vals or 'none'}; the "
        f"starting model: {start}; kept: {chosen}."
    )
    if "finetune" in ev:
        ft = ev["finetune"]
        add(
            f"* Fine-tuning (both models alike): {ft['train_queries']} training queries of `{ft['data']}`, "
            f"{ft['negatives']} hard negatives + in-batch negatives, {ft['loss']} loss, {ft['epochs']} epoch(s), "
            f"batch {ft['batch_size']}, lr {ft['lr']}, seed {ft['seed']}."
        )
    add("\n## Wall time per stage (seconds)\n")
    add(", ".join(f"{k} {v:.0f}" for k, v in data["stage_seconds"].items() if v is not None) + "\n")
    add("Plot: [report.png](report.png); numbers: `report.json`.")
    return "\n".join(lines) + "\n"


def plot(data: Dict[str, Any], out: Path) -> Path:
    """Bars of the three metrics per model, and the selection metric over the updates."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    models = list(data["models"].values())
    fig, (bars, curve) = plt.subplots(1, 2, figsize=(11, 4), gridspec_kw={"width_ratios": [3, 2]})
    x = np.arange(len(METRICS))
    width = 0.8 / len(models)
    for i, entry in enumerate(models):
        heights = [entry["metrics"][m] for m in METRICS]
        bars.bar(x + (i - (len(models) - 1) / 2) * width, heights, width, label=entry["label"], color=f"C{i}")
    bars.set_xticks(x)
    bars.set_xticklabels(METRICS)
    bars.set_ylim(0, 1)
    bars.set_title(f"{data['evaluation']['split']} split, {data['evaluation']['queries']} queries", fontsize=9)
    bars.legend(fontsize=7)
    bars.grid(axis="y", alpha=0.3)
    sel = data["selection"]
    points = sorted((int(u), v) for u, v in sel["validations"].items())
    if sel.get("start") is not None:
        points = [(0, sel["start"])] + [pt for pt in points if pt[0] > 0]
    if points:
        curve.plot([u for u, _ in points], [v for _, v in points], marker="o")
    if sel.get("value") is not None:
        curve.plot([sel["update"]], [sel["value"]], marker="*", markersize=14, color="C3", linestyle="",
                   label="kept" + (" (the start)" if sel["kept_start"] else ""))  # fmt: skip
        curve.legend(fontsize=7)
    curve.set_xlabel("update")
    curve.set_title(f"{sel['metric']} at each validation", fontsize=9)
    curve.grid(alpha=0.3)
    return save_png(fig, out)


def save_png(fig, out: Path) -> Path:
    """``fig`` laid out, written atomically to ``out`` and closed."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    with atomic_path(out, suffix=".png") as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)
    return out


def write_report(ad, results: Dict[str, Any]) -> List[str]:
    data = collect(ad, results)
    plot(data, ad.out / "report.png")
    write_json_atomic(ad.out / "report.json", data)
    write_text_atomic(ad.out / "report.md", markdown(data))
    return list(REPORT_FILES)
