"""results.json, results.md and the plots, from what the stages left in ``--out``.

Everything here is recomputed from the files on every run (it takes seconds), so
the report always describes exactly the runs that exist.
"""

import json
import os
import platform
import time
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from ...base.fileio import write_json_atomic, write_text_atomic
from ...base.retrieval_data import load_data
from ...encoders.retrieval.metrics import aggregate, evaluate, per_query, read_trec_run
from ..kit.logs import final_diagnostics, read_valid
from ..kit.objectives import OBJECTIVES
from ..kit.roundtrip import first_sentence, statement
from ..kit.stats import aggregate_seeds, document_p, fmt_mean_std, fmt_p, mean_std, paired_p
from ..measure.flops import BATCHES
from . import plots
from .objectives import MLM_BASELINE, eval_models
from .plan import fraction_label, run_name

METRICS = ("MRR@10", "R@100", "nDCG@10")


def machine() -> Dict[str, Any]:
    import torch

    try:
        load = os.getloadavg()
    except OSError:
        load = None
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpus": os.cpu_count(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
        "load_average_at_report": load,
    }


def per_query_runs(qrels, run_files: List[Path]) -> List[Dict[str, Dict[str, float]]]:
    """[{metric: {qid: value}} per seed] of TREC run files."""
    return [per_query(qrels, read_trec_run(f), METRICS) for f in run_files]


def seed_metrics(pq: List[Dict[str, Dict[str, float]]]) -> List[Dict[str, float]]:
    return [aggregate(v) for v in pq]


def p_values(pq_a, pq_b, resamples: int, seed: int, test=paired_p) -> Dict[str, Optional[float]]:
    """{metric: p} of A vs B: ``test`` is ``paired_p`` (the queries are the units) or ``document_p``
    (the held-out documents of a derived set; None for a given set)."""
    return {m: test([s[m] for s in pq_a], [s[m] for s in pq_b], resamples, seed) for m in METRICS}


def _with_total(counts: Optional[dict], updates: int) -> Optional[dict]:
    """The FLOPs stage's per-update counts plus ``total`` = per update x ``updates`` (of this run)."""
    return None if counts is None else {**counts, "total": counts["per_update"] * updates}


def _flops(x: Optional[float]) -> str:
    return "-" if x is None else f"{x:.3g}"


def collect(comp, results: Mapping[str, Any]) -> Dict[str, Any]:
    """The numbers of the report (``results.json``)."""
    p = comp.plan
    test = load_data(comp.retrieval_dir, p.test_split)
    qrels = test.qrels
    full = fraction_label(max(p.fractions))
    models: Dict[str, Any] = {}
    pq_zero: Dict[str, list] = {}
    pq_ft: Dict[str, list] = {}
    for em in eval_models(p.objectives):
        folders = [comp.eval_dir(em.objective, s) for s in p.seeds]
        rep = em.representation
        pq_zero[em.key] = per_query_runs(qrels, [f / f"{rep}.zeroshot.trec" for f in folders])
        few = {fraction_label(f): per_query_runs(qrels, [d / f"{rep}.ft{fraction_label(f)}.trec" for d in folders])
               for f in p.fractions}  # fmt: skip
        pq_ft[em.key] = few[full]
        sims = [json.loads((f / "cls_similarity.json").read_text()) for f in folders]
        lengths = sorted({k for s in sims for k in s["cosine"]}, key=int)
        models[em.key] = {
            "label": em.label,
            "objective": em.objective,
            "representation": rep,
            "per_seed": {
                str(s): {
                    "zero_shot": seed_metrics(pq_zero[em.key])[i],
                    "few_shot": {k: seed_metrics(v)[i] for k, v in few.items()},
                    "cls_cosine": sims[i]["cosine"],
                }
                for i, s in enumerate(p.seeds)
            },
            "zero_shot": aggregate_seeds(seed_metrics(pq_zero[em.key])),
            "finetuned": aggregate_seeds(seed_metrics(few[full])),
            "few_shot": {k: aggregate_seeds(seed_metrics(v)) for k, v in few.items()},
            "cls_cosine": {L: mean_std([s["cosine"][L] for s in sims if L in s["cosine"]]) for L in lengths},
            "cls_cosine_notes": sorted({n for s in sims for n in s["notes"]}),
        }
    bm25_run = read_trec_run(comp.out / "bm25" / "test.trec")
    bm25 = {"metrics": evaluate(qrels, bm25_run, METRICS)}
    if MLM_BASELINE in p.objectives:
        base = MLM_BASELINE
        for key, m in models.items():
            if key != base:
                for suffix, p_test in (("", paired_p), ("_documents", document_p)):
                    m["p_vs_mlm" + suffix] = {
                        "zero_shot": p_values(pq_zero[key], pq_zero[base], p.resamples, p.seeds[0], p_test),
                        "finetuned": p_values(pq_ft[key], pq_ft[base], p.resamples, p.seeds[0], p_test),
                    }
        bm25_pq = per_query_runs(qrels, [comp.out / "bm25" / "test.trec"])
        bm25["p_vs_mlm_finetuned"] = p_values(bm25_pq, pq_ft[base], p.resamples, p.seeds[0])
        bm25["p_vs_mlm_finetuned_documents"] = p_values(bm25_pq, pq_ft[base], p.resamples, p.seeds[0], document_p)

    flops = results.get("flops", {}).get("counts", {})
    objectives: Dict[str, Any] = {}
    curves: Dict[str, Any] = {}
    for o in p.objectives:
        logs = [comp.pretrain_dir(o, s) / "train.log" for s in p.seeds]
        rows = [read_valid(f) for f in logs]
        curves[OBJECTIVES[o].label] = plots.mean_curves(rows)
        finals = [final_diagnostics(r) for r in rows]
        keys = sorted(set.intersection(*(set(f) for f in finals))) if all(finals) else []
        objectives[o] = {
            "label": OBJECTIVES[o].label,
            "notes": OBJECTIVES[o].notes,
            "train_args": comp.pretrain_args(o, p.seeds[0]),
            "batch_size": p.pretrain.batch_for(OBJECTIVES[o]),
            "pretrain_seconds": mean_std([results[f"pretrain-{run_name(o, s)}"]["seconds"] for s in p.seeds]),
            "flops": _with_total(flops.get(o), p.pretrain.updates),
            "diagnostics": {k: mean_std([f[k] for f in finals]) for k in keys},
        }
    stage_seconds = {k: v.get("seconds") for k, v in results.items() if isinstance(v, dict) and "seconds" in v}
    return {
        "tool": "seed_fairseq.compare",
        "command": p.command,
        "preset": p.preset,
        "date": time.strftime("%Y-%m-%d %H:%M:%S"),
        "machine": machine(),
        "settings": p.settings,
        "objectives_run": p.objectives,
        "seeds": p.seeds,
        "retrieval": retrieval_design(comp, results, test),
        "bm25": bm25,
        "models": models,
        "objectives": objectives,
        "generator": {
            "flops": _with_total(flops.get("generator"), p.generator_updates),
            "seconds": results.get("generator", {}).get("seconds"),
        },
        "stage_seconds": stage_seconds,
        "curves": curves,
        # --init: the import -> export round trip against the model as given (roundtrip.py)
        "roundtrip": {k: v for k, v in results.get("roundtrip", {}).items() if k != "seconds"},
    }


def retrieval_design(comp, results, test) -> Dict[str, Any]:
    p = comp.plan
    info = {"test_queries": len(test.query_ids()), "passages": len(test.corpus), "split": p.test_split}
    if p.retrieval_data is not None:
        info["design"] = f"given: {p.retrieval_data}"
    else:
        st = results.get("retrieval", {})
        info["design"] = (
            f"derived from {p.corpus.name} ({st.get('documents')} documents"
            + (f", a seeded choice of {p.retrieval_docs}" if p.retrieval_docs else "")
            + f"): {st.get('passages')} passages (paragraphs); queries = one sentence removed from each paragraph "
            "of >= 3 sentences; split by document: "
            + ", ".join(f"{k} {v}" for k, v in (st.get("queries") or {}).items())
        )
    return info


def by_documents(data: Mapping[str, Any]) -> bool:
    """Whether the report has a test over documents: a derived set's (``kit.stats.document_p``)."""
    return any(v is not None for m in data["models"].values() for part in m.get("p_vs_mlm_documents", {}).values()
               for v in part.values())  # fmt: skip


def _cells(value: str, metric: str, p: Mapping[str, Any], p_documents: Optional[Mapping[str, Any]]) -> str:
    """A table's cells for one metric: the value, its p and, where the report has them, its p over documents."""
    return f"{value} | {fmt_p(p.get(metric))}" + ("" if p_documents is None else f" | {fmt_p(p_documents.get(metric))}")


def write_plots(comp, data: Dict[str, Any]) -> List[str]:
    p = comp.plan
    rows = list(data["models"].values())
    out = comp.out
    plots.plot_metrics(rows, out / "metrics.png", data["bm25"]["metrics"])
    plots.plot_few_shot(rows, p.fractions, out / "few_shot.png")
    plots.plot_cls_cosine(rows, out / "cls_cosine.png")
    plots.plot_diagnostics(data["curves"], out / "diagnostics.png")
    return list(plots.PLOTS)


def masking_phrase(objectives) -> str:
    """Each objective's masking, objectives alike grouped: "`seed`/`mlm` 15%, `retromae` 30% whole words"
    (``masking`` of their descriptions)."""
    groups: Dict[str, List[str]] = {}
    for o in objectives:
        d = OBJECTIVES[o].description
        groups.setdefault(d.masking if d else "its task's default", []).append(f"`{o}`")
    return ", ".join(f"{'/'.join(names)} {masking}" for masking, names in groups.items())


def differences(p) -> List[str]:
    """The report's bullets on what differs between the objectives of plan ``p`` by design, from their
    descriptions: the masking, the texts per update, the generator."""
    s = p.pretrain
    texts = s.batch_size * s.update_freq
    out = [
        "* Not identical, by design: the pre-training heads and losses, and each objective's own masking "
        f"({masking_phrase(p.objectives)})."
    ]
    for o in p.objectives:
        spec = OBJECTIVES[o]
        if spec.texts_per_update_factor != 1:
            share = _share(spec.texts_per_update_factor)
            reason = spec.description.texts_per_update_reason if spec.description else ""
            out.append(
                f"* {spec.label} {reason or 'is trained on fewer texts per update'}, so it gets {share} the texts "
                f"per update ({s.batch_for(spec) * s.update_freq} instead of {texts}): the encoder sees the same "
                f"number of tokens per update, but {spec.label} sees {share} as many different texts."
            )
    with_generator = [OBJECTIVES[o].label for o in p.objectives if OBJECTIVES[o].needs_generator]
    if with_generator:
        who = " and ".join(with_generator)
        out.append(
            f"* The frozen generator of {who} is trained first, once (seed 1, shared by every seed): "
            f"`seed_encoder_mlm_only` with `{' '.join(p.generator_args)}`, {p.generator_updates} updates on the "
            f"same data; its cost is reported separately below, not in {who}'s."
        )
    return out


def _share(factor: float) -> str:
    return {0.5: "half", 0.25: "a quarter of"}.get(factor, f"{factor:g} x")


def markdown(comp, data: Dict[str, Any]) -> str:
    p = comp.plan
    s = p.pretrain
    lines: List[str] = []
    add = lines.append
    add("# Bottleneck objectives compared on identical data, encoder and budget\n")
    warning = first_sentence(data.get("roundtrip") or {}, Path(str(p.init)).name) if p.init else ""
    if warning:
        add(warning + "\n")
    add("```\n" + data["command"] + "\n```\n")
    m = data["machine"]
    add(
        f"Machine: {m['platform']}, {m['cpus']} CPUs ({m['processor']}), Python {m['python']}, torch {m['torch']}"
        + (f", GPU {m['cuda']}" if m["cuda"] else ", no GPU")
        + f"; {p.threads} threads per process; load average when the report was written: "
        + (", ".join(f"{x:.1f}" for x in m["load_average_at_report"]) if m["load_average_at_report"] else "-")
        + f". Preset `{p.preset}`; seeds {', '.join(map(str, p.seeds))}; {data['date']}.\n"
    )
    texts = s.batch_size * s.update_freq
    add("## What is identical and what is not\n")
    add(
        f"* Identical for every objective: the data (`{p.corpus.name}`, one sentencepiece/tokenizer vocabulary), "
        f"the encoder (`{' '.join(s.encoder_args) or 'the imported model'}`), blocks of "
        f"{s.tokens_per_sample} tokens (`--sample-break-mode complete`), {s.updates} updates of {texts} blocks "
        f"({s.updates * texts * s.tokens_per_sample:,} block positions through the encoder at most), Adam, "
        f"lr {s.lr} with {s.warmup} warm-up updates and linear decay, clip 1.0, dropout 0.1, the seeds, and the "
        "same fine-tuning and evaluation."
    )
    lines += differences(p)
    add(
        "* FLOPs per update are counted with `torch.utils.flop_counter.FlopCounterMode` on the forward and "
        f"backward of {BATCHES} real training batches (matrix products and attention, 2 FLOPs per multiply-add; not "
        "element-wise work) x `--update-freq`; total = per update x updates. The encoder's share is the "
        "forward and backward of `encoder.sentence_encoder` on the inputs it received in those batches."
    )
    add(
        f"* Fine-tuning (every model alike): {p.finetune.negatives} hard negatives + in-batch negatives, "
        f"{p.finetune.loss} loss, {p.finetune.epochs} epochs, batch {p.finetune.batch_size}, lr {p.finetune.lr}, "
        f"{f'max {p.max_seq_length} tokens' if p.max_seq_length else 'texts cut at each model’s own max_seq_length'}, "
        "seed = the pre-training seed (every objective of a seed fine-tunes on "
        "the same subset of queries); 'fine-tuned' is the run on "
        f"{fraction_label(max(p.fractions))}% of the training queries."
    )
    docs = by_documents(data)
    add(
        "* Mean ± sample standard deviation over the pre-training seeds (no ± with one seed). p: two-sided "
        f"paired permutation test ({p.resamples} resamples, exact for <= 16 queries) against MLM-only over the "
        "test queries, each query's value averaged over the seeds first"
        + (
            "; p (documents): the same test over the held-out documents the queries were derived from (each "
            "document's queries summed), since the queries of one document are not independent.\n"
            if docs
            else ".\n"
        )
    )
    r = data["retrieval"]
    add(f"Retrieval: {r['split']} split, {r['test_queries']} queries over {r['passages']} passages; {r['design']}.\n")

    if p.init and data.get("roundtrip"):
        add(
            f"Every model was pre-trained, validated, exported and is scored in the representation of the --init "
            f"model ({data['roundtrip']['given']}). {statement(data['roundtrip'])}\n"
        )
    for part, title in (("zero_shot", "Zero-shot (the pre-trained model's own vector, no fine-tuning)"),
                        ("finetuned", "Fine-tuned")):  # fmt: skip
        add(f"## {title}\n")
        add("| model | " + " | ".join(f"{x} | p" + (" | p (documents)" if docs else "") for x in METRICS) + " |")
        add("| --- |" + (" --- | --- | --- |" if docs else " --- | --- |") * len(METRICS))
        if part == "finetuned":
            b = data["bm25"]
            bp, bd = b.get("p_vs_mlm_finetuned", {}), b.get("p_vs_mlm_finetuned_documents", {})
            add("| BM25 (bm25s) | " + " | ".join(_cells(f"{b['metrics'][x]:.3f}", x, bp, bd if docs else None)
                                                 for x in METRICS) + " |")  # fmt: skip
        for mm in data["models"].values():
            pv = mm.get("p_vs_mlm", {}).get(part, {})
            pd = mm.get("p_vs_mlm_documents", {}).get(part, {}) if docs else None
            row = " | ".join(_cells(fmt_mean_std(mm[part].get(x)), x, pv, pd) for x in METRICS)
            add(f"| {mm['label']} | {row} |")
        add("")

    fr = [fraction_label(f) for f in p.fractions]
    add("## Few-shot fine-tuning: MRR@10 by share of the training queries (Figure 6c/d)\n")
    add("| model | " + " | ".join(f"{x}%" for x in fr) + " |")
    add("| --- |" + " --- |" * len(fr))
    for mm in data["models"].values():
        add(f"| {mm['label']} | " + " | ".join(fmt_mean_std(mm["few_shot"][x].get("MRR@10")) for x in fr) + " |")
    add("")

    lengths = sorted({L for mm in data["models"].values() for L in mm["cls_cosine"]}, key=int)
    add("## Mean [CLS] cosine of random text pairs before fine-tuning (Figures 1b/5; lower = more diverse)\n")
    add("| model | " + " | ".join(f"{L} tokens" for L in lengths) + " |")
    add("| --- |" + " --- |" * len(lengths))
    for mm in data["models"].values():
        cells = []
        for L in lengths:
            c = fmt_mean_std(mm["cls_cosine"].get(L)) if L in mm["cls_cosine"] else "skipped"
            cells.append(c + ("*" if L in mm["cls_cosine"] and int(L) > s.tokens_per_sample else ""))
        add(f"| {mm['label']} | " + " | ".join(cells) + " |")
    notes = sorted({n for mm in data["models"].values() for n in mm["cls_cosine_notes"]})
    if notes:
        add("\nlengths " + "; ".join(notes))
    if any(int(L) > s.tokens_per_sample for L in lengths):
        add(f"\n\\* longer than the pre-training blocks ({s.tokens_per_sample} tokens): positions never trained")
    add("")

    diag_keys = sorted({k for o in data["objectives"].values() for k in o["diagnostics"] if k != "num_updates"})
    shown = [k for k in diag_keys if k in ("cls_cosine", "probe_mrr10") or k.endswith("_cls_bits_seq")]
    add("## Pre-training cost and the diagnostics at its last validation\n")
    add("| objective | texts / update | wall s | FLOPs total | encoder FLOPs | " + " | ".join(shown) + " |")
    add("| --- | --- | --- | --- | --- |" + " --- |" * len(shown))
    for od in data["objectives"].values():
        fl = od["flops"] or {}
        enc = fl.get("encoder_per_update") * s.updates if fl.get("encoder_per_update") is not None else None
        cells = [fmt_mean_std(od["diagnostics"][k]) if k in od["diagnostics"] else "-" for k in shown]
        add(f"| {od['label']} | {od['batch_size'] * s.update_freq} | {fmt_mean_std(od['pretrain_seconds'], 0)} | "
            f"{_flops(fl.get('total'))} | {_flops(enc)} | " + " | ".join(cells) + " |")  # fmt: skip
    g = data["generator"]
    if g["flops"]:
        add(f"| the frozen generator (separate) | {texts} | {g['seconds']:.0f} | {_flops(g['flops']['total'])} | "
            f"{_flops(g['flops']['encoder_per_update'] * p.generator_updates)} |" + " - |" * len(shown))  # fmt: skip
    add(
        "\nDiagnostics (`seed_fairseq/pretrain/diagnostics.py`): `<term>_cls_bits_seq` = bits per sequence the "
        "bottleneck term takes from [CLS]; `cls_cosine` = mean cosine of the [CLS] vectors of a validation batch; "
        "`probe_mrr10` = the unsupervised half-block retrieval probe. Wall time: the fairseq-train processes "
        "(validation and diagnostics included), summed over resumed attempts.\n"
    )
    add("## Wall time per stage (seconds)\n")
    add(", ".join(f"{k} {v:.0f}" for k, v in data["stage_seconds"].items() if v is not None) + "\n")
    add("Plots: " + ", ".join(f"[{x}]({x})" for x in plots.PLOTS) + "; numbers: `results.json`.")
    return "\n".join(lines) + "\n"


def write_report(comp, results: Mapping[str, Any]) -> Dict[str, Any]:
    data = collect(comp, results)
    data["plots"] = write_plots(comp, data)
    write_json_atomic(comp.out / "results.json", data)
    text = markdown(comp, data)
    write_text_atomic(comp.out / "results.md", text)
    return {"data": data, "markdown": text}
