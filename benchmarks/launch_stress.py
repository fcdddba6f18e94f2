#!/usr/bin/env python
"""Run the 2-process CPU ``torchrun`` launch of ``fairseq-train`` N times and count failures.

    python benchmarks/launch_stress.py --runs 20 [--load 1]

Each run is one tiny ``seed_pretrain`` update on 2 gloo workers (what
``tests/test_contract.py`` does).  ``--load K`` keeps K busy-looping processes
running meanwhile (a loaded 2-core CI machine is where teardown races show).
Prints one line per failed run (exit code, the last line of its output) and a
summary; exit code 1 if any run failed.  Not part of CI.
"""

import argparse
import multiprocessing
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def _spin():
    while True:
        pass


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def build_data(out: Path) -> Path:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "preprocess.build",
            "--text",
            str(REPO / "examples/data/demo_corpus.txt"),
            "--out",
            str(out),
            "--vocab-size",
            "397",
            "--workers",
            "1",
            "--valid-docs",
            "2",
            "--test-docs",
            "0",
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    return out


def one_run(data: Path, save: Path) -> subprocess.CompletedProcess:
    from seed_fairseq.pretrain.tasks.registry import registered_objectives
    from seed_fairseq.workflows.kit.argv import command, train_args

    seed = next(d for d in registered_objectives() if d.name == "seed")
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                "--master_port", str(_free_port())]  # fmt: skip
    model = ["--encoder-layers", "2", "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "37",
             "--encoder-attention-heads", "2"]  # fmt: skip
    rest = ["--tokens-per-sample", "48", "--sample-break-mode", "none", "--batch-size", "4", "--optimizer", "sgd",
            "--lr", "0.1", "--max-update", "1", "--cpu", "--num-workers", "0", "--disable-validation",
            "--distributed-world-size", "2", "--ddp-backend", "legacy_ddp", "--log-format", "json"]  # fmt: skip
    args = train_args(seed, *rest, arch="seed_encoder_tiny", model=model, own=["--decoder-layers", "1"])
    cmd = command(data, args, save_dir=save, launcher=launcher)
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--load", type=int, default=1, help="busy processes running meanwhile")
    args = p.parse_args()
    spinners = [multiprocessing.Process(target=_spin, daemon=True) for _ in range(args.load)]
    for s in spinners:
        s.start()
    failures = 0
    t0 = time.time()
    try:
        with tempfile.TemporaryDirectory(prefix="launch_stress_") as tmp:
            data = build_data(Path(tmp) / "data")
            for i in range(args.runs):
                proc = one_run(data, Path(tmp) / f"ckpt{i}")
                out = (proc.stdout + proc.stderr).strip().splitlines()
                bad = proc.returncode != 0 or any("terminate called" in line for line in out)
                if bad:
                    failures += 1
                    print(f"run {i}: exit {proc.returncode}", flush=True)
                    causes = [
                        line
                        for line in out
                        if "terminate called" in line or "Error" in line or "exitcode" in line or "Signal" in line
                    ]
                    print("\n".join("    " + line for line in (causes or out[-5:])[-8:]), flush=True)
    finally:
        for s in spinners:
            s.terminate()
    print(f"{failures} of {args.runs} launches failed ({time.time() - t0:.0f} s, load {args.load})")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
