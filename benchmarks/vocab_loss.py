"""Peak memory and time of the vocabulary loss alone: plain vs chunked vs recompute.

    python benchmarks/vocab_loss.py [--positions 4088] [--hidden 768] [--vocab 32768] [--dtype fp32]
                                    [--repeat 3] [--threads 2] [--json OUT]

The weak decoder's reconstruction loss at SEED's base shape: 8 x 511 positions, hidden 768,
a 32k vocabulary (``--vocab``), forward + backward of
``linear_cross_entropy(hidden, weight, target, implementation=...)`` with gradients for
both the hidden states and the (tied) weight, ``grad_output`` 1:

* ``plain``: ``F.linear`` then ``F.cross_entropy`` (the full logits; what the criterion
  computed before ``--vocab-loss``);
* ``chunked`` (the default): gradients computed chunk by chunk in forward;
* ``recompute``: logits recomputed chunk by chunk in backward.

Each implementation runs in a fresh interpreter (this script with ``--worker``). "Peak
memory" is the peak resident set size during ``--repeat`` forward + backward passes minus
the resident set size just before them (inputs and their gradient buffers already
allocated): what the loss itself adds at its peak. Times are medians (wall clock and
process CPU time).
"""

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
IMPLEMENTATIONS = ("plain", "chunked", "recompute")
DTYPES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
TAG = "VOCAB_LOSS_RESULT "


def rss_kb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def worker(args):
    import torch

    from seed_fairseq.pretrain.modules.linear_cross_entropy import linear_cross_entropy

    torch.set_num_threads(args.threads)
    dtype = getattr(torch, DTYPES[args.dtype])
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(args.positions, args.hidden, generator=g).to(dtype).requires_grad_()
    weight = (torch.randn(args.vocab, args.hidden, generator=g) * 0.05).to(dtype).requires_grad_()
    target = torch.randint(0, args.vocab, (args.positions,), generator=g)
    # gradient buffers exist before the measurement, as they do in training
    hidden.grad, weight.grad = torch.zeros_like(hidden), torch.zeros_like(weight)
    before = rss_kb()
    times, cpu = [], []
    for _ in range(args.repeat):
        t, c = time.perf_counter(), time.process_time()
        nll, _ = linear_cross_entropy(hidden, weight, target, implementation=args.worker)
        nll.backward()
        times.append(time.perf_counter() - t)
        cpu.append(time.process_time() - c)
        del nll
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    result = {
        "implementation": args.worker,
        "peak_mib": (peak - before) / 1024,
        "time_s": statistics.median(times),
        "cpu_s": statistics.median(cpu),
        "logits_mib": args.positions * args.vocab * 4 / 2**20,
    }
    print(TAG + json.dumps(result), flush=True)


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--positions", type=int, default=8 * 511)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--dtype", choices=sorted(DTYPES), default="fp32")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--json")
    p.add_argument("--worker", choices=IMPLEMENTATIONS, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.worker:
        return worker(args)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), PYTHONWARNINGS="ignore")
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    results = {}
    for impl in IMPLEMENTATIONS:
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", impl]
        for name in ("positions", "hidden", "vocab", "dtype", "repeat", "threads"):
            cmd += ["--" + name, str(getattr(args, name))]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
        lines = [line for line in proc.stdout.splitlines() if line.startswith(TAG)]
        if proc.returncode or not lines:
            raise SystemExit(f"{impl} failed:\n{proc.stderr[-4000:]}")
        results[impl] = json.loads(lines[-1][len(TAG) :])
    plain = results["plain"]
    print(
        f"\nvocabulary loss, {args.positions} positions x hidden {args.hidden} x vocabulary {args.vocab}, "
        f"{args.dtype}, forward + backward, {args.threads} threads (the full logits: {plain['logits_mib']:.0f} MiB)"
    )
    print(f"{'implementation':<15}{'peak MiB':>10}{'s':>8}{'CPU s':>8}{'mem x':>8}{'CPU x':>8}")
    for impl, r in results.items():
        r["mem_ratio"] = r["peak_mib"] / plain["peak_mib"]
        r["cpu_ratio"] = r["cpu_s"] / plain["cpu_s"]
        print(
            f"{impl:<15}{r['peak_mib']:>10.0f}{r['time_s']:>8.2f}{r['cpu_s']:>8.2f}"
            f"{r['mem_ratio']:>8.3f}{r['cpu_ratio']:>8.2f}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps({"args": vars(args), "results": results}, indent=1))


if __name__ == "__main__":
    sys.exit(main())
