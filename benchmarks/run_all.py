"""Every benchmark in one run, and one table of the ratios they measure, each with its command.

    python benchmarks/run_all.py [--quick] [--threads 2] [--workers 2] [--wiki DUMP]
                                 [--wikiextractor-python PY] [--markdown OUT] [--update-readme]

Runs, one after the other (never two at a time, so they do not slow each other down):

1. ``step_time.py`` at tiny and at base shape (``--quick``: tiny only): step time, peak
   memory and FLOPs of every pre-training objective vs fairseq's ``masked_lm``;
2. ``vocab_loss.py``: peak memory and time of the reconstruction loss, chunked vs plain;
3. ``decoder_window.py``: the weak decoder at 512 vs 128 tokens, window k=2 vs causal;
4. ``preprocess_throughput.py``: MB/s per stage at 1 and ``--workers`` workers, vs raw
   sentencepiece, and extraction vs WikiExtractor (skipped with a note when absent);
5. ``encode_throughput.py``: corpus encoding docs/s vs ``SentenceTransformer.encode`` for
   fp32 / bf16 / int8, with the MRR@10 change of each;
6. ``data_pipeline.py``: blocks/s one data-loader worker produces vs what an H100 consumes at
   40% MFU, per objective (``--quick``: the producers only, no base-shape FLOP count);
7. ``optimizer_step.py``: the optimizer's share of an update (gradient norm, step, zero_grad),
   ``torch_adam`` vs fairseq's ``adam`` in fp32, --fp16 and --bf16, time and kernel launches
   (``--quick``: tiny shape).

Prints the machine (CPU, cores, memory, load average before and after), then the table
(markdown). ``--update-readme`` writes the machine and the table into
``benchmarks/README.md`` between its ``<!-- results -->`` markers.
"""

import argparse
import json
import os
import platform
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
README = HERE / "README.md"
BEGIN, END = "<!-- results:begin -->", "<!-- results:end -->"


def machine():
    cpu = platform.processor() or "?"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        mem = next(line for line in Path("/proc/meminfo").read_text().splitlines() if line.startswith("MemTotal"))
        mem_gb = int(mem.split()[1]) / 2**20
    except (OSError, StopIteration):
        mem_gb = float("nan")
    import torch

    return (
        f"{cpu}, {os.cpu_count()} cores, {mem_gb:.0f} GiB RAM; Linux {platform.release()}; "
        f"Python {platform.python_version()}, torch {torch.__version__}"
    )


def run(name, script, args, out_dir):
    """Run one benchmark with --json; (result, command as shown)."""
    out = Path(out_dir) / f"{name}.json"
    shown = ["python", f"benchmarks/{script}", *map(str, args)]
    cmd = [sys.executable, str(HERE / script), *map(str, args), "--json", str(out)]
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    print(f"\n$ {shlex.join(shown)}", flush=True)
    t = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    lines = [line for line in proc.stdout.splitlines() if not line.rstrip().endswith(("it/s]", "s/it]"))]
    print("\n".join(lines[-40:]))
    print(f"({time.perf_counter() - t:.0f} s)", flush=True)
    if proc.returncode or not out.exists():
        print(f"{name} FAILED (exit {proc.returncode})", file=sys.stderr)
        return None, shlex.join(shown)
    return json.loads(out.read_text()), shlex.join(shown)


def fmt(x, digits=2):
    return "n/a" if x is None else f"{x:.{digits}f}"


def step_rows(result, cmd, size):
    rows = []
    s = result["summary"]
    for setup, r in s.items():
        if setup == "masked_lm":
            continue
        rows.append(
            (
                f"step time, {setup} / masked_lm, {size}",
                f"{fmt(r['time_ratio'])} wall, {fmt(r['cpu_ratio'])} CPU",
                f"FLOP ratio {fmt(r['flop_ratio'])}"
                + ("; target: step ratio <= FLOP ratio" if setup == "seed" else ""),
                cmd,
            )
        )
        rows.append(
            (
                f"peak memory, {setup} / masked_lm, {size}",
                fmt(r["mem_ratio"]),
                f"{r['peak_mem_mib']:.0f} vs {s['masked_lm']['peak_mem_mib']:.0f} MiB (RSS)"
                + ("; target <= 1.15 at base" if setup == "seed" and size == "base" else ""),
                cmd,
            )
        )
        if r.get("tensor_mem_ratio") is not None:
            rows.append(
                (
                    f"tensor peak memory, {setup} / masked_lm, {size}",
                    fmt(r["tensor_mem_ratio"]),
                    f"{r['tensor_peak_mib']:.0f} vs {s['masked_lm']['tensor_peak_mib']:.0f} MiB of live tensors "
                    "(what a GPU must hold)"
                    + (
                        {"cpdae": "; target <= 1.25 at base", "simlm": "; target <= 1.15 at base"}.get(setup, "")
                        if size == "base"
                        else ""
                    ),
                    cmd,
                )
            )
    return rows


def table(results):
    rows = []
    for size in ("tiny", "base"):
        if results.get(f"step_{size}"):
            rows += step_rows(*results[f"step_{size}"], size)
    if results.get("vocab_loss"):
        r, cmd = results["vocab_loss"]
        v = r["results"]
        for impl in ("chunked", "recompute"):
            rows.append(
                (
                    f"reconstruction loss peak memory, {impl} / plain",
                    fmt(v[impl]["mem_ratio"], 3),
                    f"{v[impl]['peak_mib']:.0f} vs {v['plain']['peak_mib']:.0f} MiB; "
                    f"CPU time {fmt(v[impl]['cpu_ratio'])}x",
                    cmd,
                )
            )
    if results.get("decoder"):
        r, cmd = results["decoder"]
        d = r["results"]
        rows.append(
            (
                "decoder time per token, 512 / 128 tokens",
                f"{fmt(d['2']['ratio_512_128'])} (k=2)",
                f"{fmt(d['full']['ratio_512_128'])} with fairseq's causal attention"
                + (f"; {fmt(d['2-masked']['ratio_512_128'])} with k=2 masked" if "2-masked" in d else ""),
                cmd,
            )
        )
        if "banded_vs_masked_512" in d:
            rows.append(
                (
                    "decoder CPU time at 512 tokens, k=2 banded / masked",
                    fmt(d["banded_vs_masked_512"]),
                    "the same window computed on the 1 + k allowed keys vs fairseq's masked n x n attention",
                    cmd,
                )
            )
    if results.get("preprocess"):
        r, cmd = results["preprocess"]
        w = r["workers"]
        for row in r["rows"]:
            if row["workers"] == 1:
                continue
            rows.append(
                (
                    f"{row['stage']} MB/s, {w} workers / 1",
                    fmt(row["speedup"]),
                    f"{row['mbps']:.2f} MB/s" + ("; target >= 1.7" if row["stage"] in ("encode", "binarize") else ""),
                    cmd,
                )
            )
        for stage in ("encode", "binarize"):
            one = next(x for x in r["rows"] if x["stage"] == stage and x["workers"] == 1)
            rows.append(
                (
                    f"{stage} MB/s (1 worker) / raw sentencepiece",
                    fmt(one["mbps"] / r["spm_raw_mbps"]),
                    f"{one['mbps']:.2f} vs {r['spm_raw_mbps']:.2f} MB/s",
                    cmd,
                )
            )
        rows.append(
            (
                "pipeline per core (encode + binarize) / raw sentencepiece",
                fmt(r["pipeline_vs_spm"]),
                f"{r['pipeline_per_core_mbps']:.2f} MB/s; target >= 0.80",
                cmd,
            )
        )
        if "wikiextractor_leftovers" in r:
            for k in sorted({1, w}):
                rows.append(
                    (
                        f"extraction MB/s, ours (default scanner) / WikiExtractor, {k} worker(s)",
                        fmt(r[f"extract_vs_wikiextractor_{k}"]),
                        "target >= 1.0",
                        cmd,
                    )
                )
            for k in sorted({1, w}):
                if f"extract_parser_vs_wikiextractor_{k}" in r:
                    rows.append(
                        (
                            f"extraction MB/s, ours (--wiki-cleaner parser) / WikiExtractor, {k} worker(s)",
                            fmt(r[f"extract_parser_vs_wikiextractor_{k}"]),
                            "the mwparserfromhell cleaner",
                            cmd,
                        )
                    )
            if "parser_ceiling_vs_wikiextractor" in r:
                rows.append(
                    (
                        "parser cleaner's ceiling: XML + mwparserfromhell's tokenizer alone / WikiExtractor, 1 worker",
                        fmt(r["parser_ceiling_vs_wikiextractor"]),
                        f"{r['parser_ceiling_mbps']:.2f} MB/s; what any extractor on this parser needs at least",
                        cmd,
                    )
                )
            parser_left = r.get("extract_parser_leftovers", {}).get("total", "n/a")
            rows.append(
                (
                    "markup leftovers, ours (scanner / parser) / WikiExtractor",
                    f"{r['extract_leftovers']['total']} / {parser_left} / {r['wikiextractor_leftovers']['total']}",
                    f"scanner {r['extract_leftovers']['by_token']}; "
                    f"parser {r.get('extract_parser_leftovers', {}).get('by_token', {})}; "
                    f"WikiExtractor {r['wikiextractor_leftovers']['by_token']}",
                    cmd,
                )
            )
        else:
            rows.append(("extraction vs WikiExtractor", "skipped", r.get("wikiextractor_skipped", ""), cmd))
        if "peak_rss_ratio" in r:
            rows.append(("preprocess peak RSS, dump repeated / once", fmt(r["peak_rss_ratio"]), "1.0 = flat", cmd))
    if results.get("encode"):
        r, cmd = results["encode"]
        e = r["rows"]
        for name in ("fp32", "bf16", "int8"):
            rows.append(
                (
                    f"corpus encoding docs/s, ours {name} / SentenceTransformer.encode",
                    fmt(e[name]["vs_sentence_transformers"]),
                    f"MRR@10 {e[name]['mrr10']:.4f} ({e[name]['mrr10_change']:+.4f} vs fp32)"
                    + ("; target >= 1.0" if name == "fp32" else ""),
                    cmd,
                )
            )
    if results.get("pipeline"):
        r, cmd = results["pipeline"]
        for row in r["rows"]:
            workers = row.get("workers_needed")
            rows.append(
                (
                    f"data-loader workers per H100 at 40% MFU, {row['objective']}",
                    "n/a" if workers is None else fmt(workers),
                    f"one worker {row['blocks_per_cpu_s']:.0f} blocks/CPU s"
                    + ("" if workers is None else f", H100 {row['consumed_per_s']:.0f} blocks/s")
                    + "; target <= 4",
                    cmd,
                )
            )
    if results.get("optimizer"):
        r, cmd = results["optimizer"]
        for precision in ("fp32", "fp16", "bf16"):
            new, old, s = (
                r["results"][precision]["torch_adam"],
                r["results"][precision]["adam"],
                r["summary"][precision],
            )
            rows.append(
                (
                    f"optimizer share of an update, torch_adam / adam, {precision}",
                    f"{fmt(s['time_ratio'])} wall, {fmt(s['cpu_ratio'])} CPU",
                    f"{1000 * new['seconds_total']:.0f} vs {1000 * old['seconds_total']:.0f} ms (norm + step + "
                    f"zero_grad; step alone {fmt(s['step_time_ratio'])}); kernel launches {new['launches_total']} vs "
                    f"{old['launches_total']}",
                    cmd,
                )
            )
        for optimizer, s in r["summary"]["bf16_over_fp16"].items():
            rows.append(
                (
                    f"optimizer share of an update, bf16 / fp16, {optimizer}",
                    f"{fmt(s['time_ratio'])} wall, {fmt(s['cpu_ratio'])} CPU",
                    f"kernel launches {fmt(s['launch_ratio'])}x"
                    + ("; target <= 1 (bf16 at least as fast as fp16)" if optimizer == "torch_adam" else ""),
                    cmd,
                )
            )
    lines = ["| measurement | ratio | details | command |", "| --- | --- | --- | --- |"]
    lines += [f"| {a} | {b} | {c} | `{d}` |" for a, b, c, d in rows]
    return "\n".join(lines)


def update_readme(text):
    content = README.read_text(encoding="utf-8")
    if BEGIN not in content or END not in content:
        raise SystemExit(f"{README}: no {BEGIN} ... {END} section")
    head, rest = content.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    README.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}", encoding="utf-8")


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="tiny step-time shape only (skips the base one)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--wiki", help="dump for the preprocessing rows (default: the shared sample)")
    p.add_argument("--wikiextractor-python", help="interpreter with wikiextractor installed")
    p.add_argument("--base-steps", type=int, default=2, help="timed steps at base shape (default 2)")
    p.add_argument("--markdown", help="also write the table here")
    p.add_argument("--update-readme", action="store_true", help=f"write machine + table into {README.name}")
    args = p.parse_args(argv)

    load_before = os.getloadavg()
    started = time.strftime("%Y-%m-%d %H:%M")
    results = {}
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="run_all_") as tmp:
        threads = ["--threads", args.threads]
        tiny = ["--arch-size", "tiny", "--steps", 10, "--rounds", 3, *threads]  # short steps: many of them
        results["step_tiny"] = run("step_tiny", "step_time.py", tiny, tmp)
        if not args.quick:
            base = ["--arch-size", "base", "--steps", args.base_steps, *threads]
            results["step_base"] = run("step_base", "step_time.py", base, tmp)
        results["vocab_loss"] = run("vocab_loss", "vocab_loss.py", threads, tmp)
        results["decoder"] = run("decoder", "decoder_window.py", threads, tmp)
        pre = ["--workers", args.workers]
        if args.wiki:
            pre += ["--wiki", args.wiki]
        if args.wikiextractor_python:
            pre += ["--wikiextractor-python", args.wikiextractor_python]
        results["preprocess"] = run("preprocess", "preprocess_throughput.py", pre, tmp)
        results["encode"] = run("encode", "encode_throughput.py", threads, tmp)
        results["pipeline"] = run("pipeline", "data_pipeline.py", ["--no-flops"] if args.quick else [], tmp)
        opt = ["--arch-size", "tiny" if args.quick else "base", "--threads", args.threads]
        results["optimizer"] = run("optimizer", "optimizer_step.py", opt, tmp)
    results = {k: v for k, v in results.items() if v and v[0] is not None}
    load_after = os.getloadavg()
    text = (
        f"Machine: {machine()}. Run {started}, {time.perf_counter() - t0:.0f} s; load average "
        f"{load_before[0]:.1f} before, {load_after[0]:.1f} after (other jobs shared the cores: wall-clock "
        f"ratios are noisier than CPU-time ones).\n\n{table(results)}"
    )
    print("\n" + text)
    if args.markdown:
        Path(args.markdown).write_text(text + "\n", encoding="utf-8")
    if args.update_readme:
        update_readme(text)


if __name__ == "__main__":
    sys.exit(main())
