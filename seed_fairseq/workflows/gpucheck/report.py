"""The report: every check with its status, the measurements, and the projection of the paper's run.

``gpu_check.json`` holds everything; ``gpu_check.md`` is the same for people.  Both are
written atomically (``seed_fairseq/base/fileio``).  ``docs/gpu.md`` explains every line.
"""

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from ...base.fileio import write_json_atomic, write_text_atomic
from .kernels import CLASSES, TOP, short_name
from .profile import (
    ASSUMED_MFU,
    PROJECTION_GPUS,
    RECIPE_BLOCKS,
    RECIPE_TOKENS,
    RECIPE_UPDATES,
    REFERENCE,
    Profile,
)

JSON_NAME = "gpu_check.json"
MARKDOWN_NAME = "gpu_check.md"
PASS, FAIL, SKIP = "pass", "fail", "skip"
NOT_RUN = "not run"  # no time was left for it (--budget-seconds), or the run was interrupted: neither passed nor failed
KERNEL_PROFILE = "Kernel profile"  # the section's title, in both files


@dataclass
class Check:
    """One line of the report."""

    name: str  # e.g. "train seed fp16", "fp16 vs fp32 seed", "data parallel", "faiss"
    status: str  # pass / fail / skip / not run
    detail: str  # one line: what was measured, or why it failed / was skipped
    values: Dict[str, Any] = field(default_factory=dict)


def recipe_tokens_per_update() -> int:
    """The paper's update: 256 blocks of 512 tokens through the encoder (CPDAE: 128 texts x 2 views,
    the comparison's identical budget)."""
    return RECIPE_BLOCKS * RECIPE_TOKENS


def projection(flops_per_token: float, words_per_second: Optional[float], peak_tflops: Optional[float]) -> Dict:
    """Hours and GPU-hours of the 1M-update recipe on N GPUs: from the measured encoder tokens per second
    of one GPU (scaling assumed linear in N), and from the counted FLOPs at :data:`ASSUMED_MFU` of the peak."""
    tokens = float(RECIPE_UPDATES) * recipe_tokens_per_update()
    rows = {}
    for n in PROJECTION_GPUS:
        row = {}
        if words_per_second:
            hours = tokens / (words_per_second * n) / 3600
            row["measured_hours"], row["measured_gpu_hours"] = hours, hours * n
        if peak_tflops:
            hours = tokens * flops_per_token / (n * peak_tflops * 1e12 * ASSUMED_MFU) / 3600
            row["estimated_hours"], row["estimated_gpu_hours"] = hours, hours * n
        rows[str(n)] = row
    return {
        "recipe": f"{RECIPE_UPDATES} updates x {RECIPE_BLOCKS} x {RECIPE_TOKENS} tokens",
        "flops_per_update": flops_per_token * recipe_tokens_per_update(),
        "assumed_mfu": ASSUMED_MFU,
        "gpus": rows,
    }


def ratios_and_projection(objectives: Dict[str, Any], baseline: str, first: str, peak) -> None:
    """Each run's speed, FLOPs and memory relative to ``baseline``'s in the same precision, and each
    objective's projection of the paper's run from its ``first`` precision (``peak(precision)``: TFLOP/s)."""
    base = objectives.get(baseline, {}).get("training", {})
    for entry in objectives.values():
        for precision, r in entry.get("training", {}).items():
            b = base.get(precision, {})
            if b.get("words_per_second") and r.get("words_per_second"):
                r["speed_vs_masked_lm"] = r["words_per_second"] / b["words_per_second"]
            if b.get("flops_per_token") and r.get("flops_per_token"):
                r["flops_vs_masked_lm"] = r["flops_per_token"] / b["flops_per_token"]
            if b.get("peak_memory") and r.get("peak_memory"):
                r["memory_vs_masked_lm"] = r["peak_memory"] / b["peak_memory"]
        r = entry.get("training", {}).get(first)
        if r and r.get("flops_per_token"):
            entry["projection"] = projection(r["flops_per_token"], r.get("words_per_second"), peak(first))


def build(
    profile: Profile,
    checks: List[Check],
    objectives: Dict[str, Any],
    seconds: float,
    budget: Optional[float] = None,
    running: bool = False,
) -> Dict[str, Any]:
    """The report.  ``passed`` only when every check ran and none failed; ``not_run`` lists the checks
    the budget (or an interrupt) left out; ``running``: written while checks are still to come."""
    failed = [c.name for c in checks if c.status == FAIL]
    not_run = [c.name for c in checks if c.status == NOT_RUN]
    return {
        "tool": "seed_fairseq.gpucheck",
        "dry_run": profile.dry_run,
        "device": profile.device,
        "device_name": profile.device_name,
        "gpus": profile.gpus,
        "profile": {k: v for k, v in asdict(profile).items()},
        "passed": not failed and not not_run and not running,
        "failed": failed,
        "not_run": not_run,
        "running": running,
        "budget_seconds": budget,
        "seconds": seconds,
        "checks": [asdict(c) for c in checks],
        "objectives": objectives,
    }


def _fmt(x: Optional[float], digits: int = 3) -> str:
    if x is None:
        return "-"
    if abs(x) >= 1000:
        return f"{x:,.0f}"
    return f"{x:.{digits}g}"


def verdict(report: Dict[str, Any]) -> str:
    """PASSED (every check ran, none failed), FAILED (one failed), INCOMPLETE (none failed, some did not
    run: out of time or interrupted), RUNNING (the report of a run still going, or killed)."""
    if report["failed"]:
        return "FAILED"
    if report.get("running"):
        return "RUNNING"
    return "INCOMPLETE" if report.get("not_run") else "PASSED"


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float as None: strict JSON has no NaN or Infinity (a check whose
    loss was not finite says so in its detail)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def data_line(data: Dict[str, Any]) -> str:
    """One line: the vocabulary, the training tokens, and where the text came from."""
    sources = ", ".join(
        f"{s.get('kind')} {s.get('file')}" + (f" (sha256 {s['sha256'][:12]})" if s.get("sha256") else "")
        for s in data.get("sources") or []
    )
    where = (
        f"the --data folder {data.get('folder')}" if data.get("given") else f"built by this run in {data.get('folder')}"
    )
    copies = f" x {data['copies']}" if (data.get("copies") or 1) > 1 else ""
    vocab, tokens = data.get("vocab_size"), data.get("train_tokens")
    return (
        (f"Data: a {vocab:,}-piece vocabulary" if isinstance(vocab, int) else "Data: vocabulary unknown")
        + (f", {tokens:,} training tokens" if isinstance(tokens, int) else "")
        + f"; {where}, from {sources or '-'}{copies}."
    )


def markdown(report: Dict[str, Any]) -> str:
    p = report["profile"]
    budget = report.get("budget_seconds")
    lines = [
        f"# gpu_check: {verdict(report)}" + (" (dry run on the CPU)" if p["dry_run"] else ""),
        "",
        f"Device: {report['device_name']} x {max(1, report['gpus'])} ({report['device']}); precisions "
        f"{', '.join(p['precisions'])} vs {p['reference']}; blocks of {p['tokens_per_sample']}; "
        f"at most {p['updates']} updates per run; {report['seconds']:.0f} s in all"
        + (f" of a {budget:g} s budget" if budget else "")
        + ". What each line means: docs/gpu.md.",
        "",
    ]
    if report.get("data"):
        lines += [data_line(report["data"]), ""]
    if report["failed"]:
        lines += [f"Failed: {', '.join(report['failed'])}", ""]
    if report.get("not_run"):
        lines += [f"Not run (out of time or interrupted): {', '.join(report['not_run'])}", ""]
    if report.get("running"):
        lines += ["Written while checks were still running: the run was stopped, or is not finished.", ""]
    lines += ["## Checks", "", "| check | status | detail |", "|---|---|---|"]
    lines += [f"| {c['name']} | {c['status']} | {c['detail']} |" for c in report["checks"]]
    lines += [
        "",
        "## Training, per objective and precision",
        "",
        "Words/s and MFU are measured after warm-up; halves: how far the speeds of the first and the second "
        "half of the measured updates differ (stable within 5%).",
        "",
        "| objective | precision | optimizer | batch | updates | loss first -> last | overflows | peak memory (GB) | "
        "x masked_lm memory | words/s | halves | x masked_lm words/s | GFLOP/token | MFU |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, per in report["objectives"].items():
        for precision, r in per.get("training", {}).items():
            losses = r.get("losses") or [None]
            mfu = r.get("mfu")
            lines.append(
                f"| {name} | {precision} | {_optimizer(name, r.get('optimizer'))} | {r.get('batch', '-')} | "
                f"{len(r.get('losses') or [])} | {_fmt(losses[0])} -> {_fmt(losses[-1])} | "
                f"{r.get('overflows', '-')} | {_fmt((r.get('peak_memory') or 0) / 1e9)} | "
                f"{_fmt(r.get('memory_vs_masked_lm'))} | "
                f"{_fmt(r.get('words_per_second'))} | {_halves(r)} | {_fmt(r.get('speed_vs_masked_lm'))} | "
                f"{_fmt(r.get('flops_per_token', 0) / 1e9)} | {'-' if mfu is None else f'{mfu:.1%}'} |"
            )
    lines += [
        "",
        f"## The paper's run ({RECIPE_UPDATES:,} updates x {RECIPE_BLOCKS} x {RECIPE_TOKENS} tokens), projected",
        "",
        "Measured: this device's words/s (the first precision), scaled linearly to N devices. "
        f"Estimated: counted FLOPs at {ASSUMED_MFU:.0%} MFU of the device's peak."
        + (
            " A dry run's numbers are the CPU's at tiny shape: they test the arithmetic, not a GPU."
            if p["dry_run"]
            else ""
        ),
        "",
        "| objective | " + " | ".join(f"{n} GPUs: hours (GPU-hours)" for n in PROJECTION_GPUS) + " |",
        "|---|" + "---|" * len(PROJECTION_GPUS),
    ]
    for name, per in report["objectives"].items():
        proj = per.get("projection")
        if not proj:
            continue
        cells = []
        for n in PROJECTION_GPUS:
            row = proj["gpus"][str(n)]
            measured = (
                f"{_fmt(row['measured_hours'])} ({_fmt(row['measured_gpu_hours'])})" if "measured_hours" in row else "-"
            )
            estimated = (
                f"est. {_fmt(row['estimated_hours'])} ({_fmt(row['estimated_gpu_hours'])})"
                if "estimated_hours" in row
                else ""
            )
            cells.append(f"{measured}; {estimated}".strip("; "))
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    lines += kernel_markdown(report.get("kernel_profile") or {})
    return "\n".join(lines) + "\n"


def _optimizer(name: str, optimizer: Optional[str]) -> str:
    if not optimizer:
        return "-"
    return f"fairseq's {optimizer} (reference)" if name == REFERENCE else optimizer


def _halves(r: Dict[str, Any]) -> str:
    spread = r.get("speed_spread")
    if spread is None or r.get("measured_updates", 0) < 4:
        return f"too few ({r.get('measured_updates', 0)} measured)" if "measured_updates" in r else "-"
    return f"{spread:.1%}" + ("" if r.get("speed_stable") else " (unstable)")


def kernel_section(runs: List[Dict[str, Any]]) -> Dict[str, Any]:
    """The JSON's "Kernel profile": the classes' names, and each training run's profile (or why none)."""
    return {"title": KERNEL_PROFILE, "classes": dict(CLASSES), "top": TOP, "runs": runs}


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|")


def kernel_markdown(section: Dict[str, Any]) -> List[str]:
    """The Markdown's "Kernel profile": a row of shares per run, then each run's top kernels."""
    runs = section.get("runs") or []
    done = [r for r in runs if r.get("status") == "ok"]
    activity = ", ".join(sorted({r["activity"] for r in done})) or "nothing (no run was profiled)"
    lines = [
        "",
        f"## {KERNEL_PROFILE}",
        "",
        f"A few updates of each training run after its measured ones, under torch.profiler; profiled: {activity}. "
        "Shares of the profiled updates' time by class (host gaps: the device idle, waiting for the host); "
        "s/update: an update under the profiler. What each class holds: docs/gpu.md.",
        "",
        "| objective | precision | optimizer | updates | s/update | launches/update | "
        + " | ".join(CLASSES.values())
        + " |",
        "|---|---|---|---|---|---|" + "---|" * len(CLASSES),
    ]
    for r in runs:
        head = f"| {r['objective']} | {r['precision']} | {_optimizer(r['objective'], r.get('optimizer'))} | "
        if r.get("status") != "ok":
            lines.append(head + f"{_cell(r.get('detail') or r.get('status'))} |" + " - |" * (2 + len(CLASSES)))
            continue
        shares = " | ".join(f"{r['classes'][k]['share']:.1%}" for k in CLASSES)
        lines.append(
            head + f"{r['updates']} | {_fmt(r['seconds_per_update'])} | {_fmt(r['launches_per_update'])} | {shares} |"
        )
    for r in done:
        n = r["updates"]
        lines += [
            "",
            f"### {r['objective']} {r['precision']} ({_optimizer(r['objective'], r.get('optimizer'))}): "
            f"the {len(r['top'])} kernels with the most time",
            "",
            "| # | kernel | class | ms/update | calls/update |",
            "|---|---|---|---|---|",
        ]
        lines += [
            f"| {i} | {_cell(short_name(k['name']))} | {CLASSES[k['class']]} | {_fmt(k['seconds'] * 1e3 / n)} | "
            f"{_fmt(k['calls'] / n)} |"
            for i, k in enumerate(r["top"], 1)
        ]
    return lines


def write(out: Path, report: Dict[str, Any]) -> None:
    write_json_atomic(out / JSON_NAME, json_safe(report))
    write_text_atomic(out / MARKDOWN_NAME, markdown(report))
