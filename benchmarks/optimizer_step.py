"""The optimizer's share of an update: ``torch_adam`` vs fairseq's ``adam``, in fp32, --fp16 and --bf16.

    python benchmarks/optimizer_step.py [--arch-size base] [--steps 5] [--rounds 2] [--threads 1] [--json OUT]

At base shape (the 201 parameters of a 12 x 768 RoBERTa encoder with its MLM head, FFN 3072, 514
positions, a 32k vocabulary: 111M weights) with fixed random gradients (no forward: the optimizer
alone), each optimizer built as fairseq-train builds it -- fp32; ``--fp16``: fairseq's
``FP16Optimizer`` with ONE flat fp32 master tensor and a loss scale; ``--bf16``: the same wrapper
with 201 unflattened fp32 masters -- times what the Trainer calls after the backward pass: the
gradient norm and clipping (``multiply_grads`` + ``clip_grad_norm``, with the wrappers' fp16/bf16 ->
fp32 gradient copy), ``step`` (with the copy of the masters back), ``zero_grad``; mean of
``--steps`` updates after one untimed, wall and CPU time, then the kernel launches of one update
counted with ``torch.profiler`` (``seed_fairseq/workflows/measure/optimizer_step.py``: the outermost
aten ops that launch a kernel on a GPU; a multi-tensor op counts once).

``adam`` is fairseq as installed without apex (its Python Adam, its per-tensor gradient norm, its
wrapper zeroing the bf16 masters' gradients one at a time); ``torch_adam`` is the plugin's optimizer
with the plugin's multi-tensor gradient norm and zeroing.  Each (precision,
optimizer) runs in a fresh interpreter, one at a time; ``--rounds`` repeats the set in alternating
order and the times are medians over the rounds.
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TAG = "OPTIMIZER_STEP_RESULT "
SIZES = {"base": {}, "tiny": {"layers": 2, "hidden": 128, "ffn": 512}}
PRECISIONS = ("fp32", "fp16", "bf16")
OPTIMIZERS = ("adam", "torch_adam")


def worker(args):
    import torch

    from seed_fairseq.workflows.measure.optimizer_step import encoder_shapes, measure

    torch.set_num_threads(args.threads)
    precision, optimizer = args.worker.split(":")
    result = measure(optimizer, precision, steps=args.steps, shapes=encoder_shapes(**SIZES[args.arch_size]))
    print(TAG + json.dumps(result), flush=True)


def run_one(args, precision, optimizer, env):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", f"{precision}:{optimizer}"]
    cmd += ["--arch-size", args.arch_size, "--steps", str(args.steps), "--threads", str(args.threads)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    lines = [line for line in proc.stdout.splitlines() if line.startswith(TAG)]
    if proc.returncode or not lines:
        raise SystemExit(f"{precision} {optimizer} failed:\n{proc.stderr[-4000:]}")
    return json.loads(lines[-1][len(TAG) :])


def median_of(runs):
    """One result: the first run's counts, each phase's median time over the runs."""
    out = dict(runs[0])
    for key in ("seconds", "cpu_seconds"):
        out[key] = {phase: statistics.median(r[key][phase] for r in runs) for phase in runs[0][key]}
        out[f"{key}_total"] = sum(out[key].values())
    out["launches_total"] = sum(out["launches"].values())
    return out


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch-size", choices=sorted(SIZES), default="base")
    p.add_argument("--steps", type=int, default=5, help="timed updates per run (after one untimed)")
    p.add_argument("--rounds", type=int, default=2, help="runs of every setup, in alternating order")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    for name in ("steps", "rounds", "threads"):
        if getattr(args, name) < 1:
            p.error(f"--{name} must be >= 1")
    if args.worker:
        return worker(args)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), PYTHONWARNINGS="ignore")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    setups = [(p_, o) for p_ in PRECISIONS for o in OPTIMIZERS]
    runs = {s: [] for s in setups}
    for r in range(args.rounds):
        for s in setups if r % 2 == 0 else reversed(setups):
            runs[s].append(run_one(args, *s, env))
    results = {p_: {o: median_of(runs[(p_, o)]) for o in OPTIMIZERS} for p_ in PRECISIONS}

    first = results["fp32"]["adam"]
    print(
        f"\noptimizer share of an update, {args.arch_size} shape ({first['tensors']} tensors, "
        f"{first['parameters'] / 1e6:.1f}M weights), {args.threads} thread(s), medians of {args.rounds} rounds "
        f"x {args.steps} updates; ms per update (wall), kernel launches per update"
    )
    head = f"{'precision':<10}{'optimizer':<12}{'masters':>8}{'norm':>8}{'step':>8}{'zero':>8}{'total':>8}"
    print(head + f"{'CPU ms':>8}{'launches (norm+step+zero)':>28}")
    summary = {}
    for p_ in PRECISIONS:
        for o in OPTIMIZERS:
            r = results[p_][o]
            ms = {k: 1000 * v for k, v in r["seconds"].items()}
            n = r["launches"]
            print(
                f"{p_:<10}{o:<12}{r['master_tensors']:>8}{ms['norm']:>8.1f}{ms['step']:>8.1f}{ms['zero_grad']:>8.1f}"
                f"{1000 * r['seconds_total']:>8.1f}{1000 * r['cpu_seconds_total']:>8.1f}"
                f"{r['launches_total']:>10} ({n['norm']}+{n['step']}+{n['zero_grad']})"
            )
        new, old = results[p_]["torch_adam"], results[p_]["adam"]
        summary[p_] = {
            "time_ratio": new["seconds_total"] / old["seconds_total"],
            "cpu_ratio": new["cpu_seconds_total"] / old["cpu_seconds_total"],
            "step_time_ratio": new["seconds"]["step"] / old["seconds"]["step"],
            "launch_ratio": new["launches_total"] / old["launches_total"],
        }
    summary["bf16_over_fp16"] = {
        o: {
            "time_ratio": results["bf16"][o]["seconds_total"] / results["fp16"][o]["seconds_total"],
            "cpu_ratio": results["bf16"][o]["cpu_seconds_total"] / results["fp16"][o]["cpu_seconds_total"],
            "launch_ratio": results["bf16"][o]["launches_total"] / results["fp16"][o]["launches_total"],
        }
        for o in OPTIMIZERS
    }
    print("\ntorch_adam / adam:")
    for p_ in PRECISIONS:
        s = summary[p_]
        print(
            f"  {p_}: {s['time_ratio']:.2f} wall, {s['cpu_ratio']:.2f} CPU (step alone {s['step_time_ratio']:.2f}); "
            f"launches {s['launch_ratio']:.3f}"
        )
    print("bf16 / fp16:")
    for o, s in summary["bf16_over_fp16"].items():
        print(f"  {o}: {s['time_ratio']:.2f} wall, {s['cpu_ratio']:.2f} CPU; launches {s['launch_ratio']:.2f}")
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results, "summary": summary}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
