"""The FLOP-based estimate of the paper's run, before any GPU report exists (docs/gpu.md).

    python -m seed_fairseq.workflows.gpucheck.estimate --data DATA_BIN [--batch 2]

Counts, on the CPU, the FLOPs of one update of every objective at base shape (12 x 768,
blocks of 512, the *_base architectures, SimLM with a 12 x 256 generator) with the same
:class:`~seed_fairseq.workflows.gpucheck.runs.Run` and counter as gpu_check, per encoder token, and
prints the hours and GPU-hours of 1M updates x 256 x 512 tokens on 8, 16 and 64
V100/A100/H100 at the assumed MFU (:data:`~seed_fairseq.workflows.gpucheck.profile.ASSUMED_MFU`),
in fp16.  The vocabulary is the data set's (``dict.txt``): the papers' is ~30k.
"""

import argparse
import dataclasses
import json
import sys
import tempfile
from pathlib import Path
from typing import Dict, List, Optional

from .profile import (
    ASSUMED_MFU,
    FAIRSEQ_BASELINE,
    PEAK_TFLOPS,
    PROJECTION_GPUS,
    dry_run_profile,
    generator_setup,
    setups,
)
from .report import projection, recipe_tokens_per_update

GPUS = ("V100", "A100", "H100")


def count_base_flops(data: Path, batch: int, say=print) -> Dict[str, float]:
    """objective -> counted FLOPs per encoder token of one base-shape update on the CPU."""
    from .runs import Run, save_generator

    p = dataclasses.replace(dry_run_profile(), tiny=False, tokens_per_sample=512)
    out = {}
    with tempfile.TemporaryDirectory() as tmp:
        generator = Path(tmp) / "generator.pt"
        save_generator(data, p.run_args(list(generator_setup(p).args), "fp32", 1, 1), "cpu", generator)
        for s in [s for s in setups(p, str(generator)) if s.optimizer is None]:  # not the reference: same FLOPs
            run = Run(data, p.run_args(list(s.args), "fp32", batch, 1, dropout=False), "cpu")
            try:
                values = run.counted_step(run.next_sample())
            finally:
                run.close()
            out[s.name] = values["flops"] / values["tokens"]
            say(f"{s.name}: {out[s.name] / 1e9:.3f} GFLOP per encoder token")
    return out


def _hours(x: float) -> str:
    return f"{x:,.1f}" if x < 10 else f"{x:,.0f}"


def table(rates: Dict[str, float]) -> str:
    """One row per objective: its counted FLOPs, and per GPU type the GPU-hours of the recipe (the same on
    any number of GPUs when scaling is linear) with the hours on 8 / 16 / 64 of them."""
    base = rates.get(FAIRSEQ_BASELINE)
    n = " / ".join(str(g) for g in PROJECTION_GPUS)
    lines = [
        "| objective | GFLOP / token | x masked_lm | PFLOP / update | "
        + " | ".join(f"{gpu}: GPU-hours (hours on {n})" for gpu in GPUS)
        + " |",
        "|---|---|---|---|" + "---|" * len(GPUS),
    ]
    for name, rate in rates.items():
        cells = []
        for gpu in GPUS:
            proj = projection(rate, None, PEAK_TFLOPS[gpu]["fp16"])
            rows = list(proj["gpus"].values())
            hours = " / ".join(_hours(r["estimated_hours"]) for r in rows)
            cells.append(f"{rows[0]['estimated_gpu_hours']:,.0f} ({hours})")
        ratio = f"{rate / base:.2f}" if base else "-"
        lines.append(
            f"| {name} | {rate / 1e9:.3f} | {ratio} | {rate * recipe_tokens_per_update() / 1e15:.3f} | "
            + " | ".join(cells)
            + " |"
        )
    peaks = ", ".join(f"{g} {PEAK_TFLOPS[g]['fp16']:g}" for g in GPUS)
    return "\n".join(lines) + f"\n\nfp16 dense peaks (TFLOP/s): {peaks}; MFU {ASSUMED_MFU:.0%} assumed.\n"


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(
        prog="python -m seed_fairseq.workflows.gpucheck.estimate", description=__doc__.split("\n")[0]
    )
    ap.add_argument("--data", type=Path, required=True, help="a data-bin (preprocess.build)")
    ap.add_argument("--batch", type=int, default=2, help="blocks of 512 in the counted update (default 2)")
    args = ap.parse_args(argv)
    if not (args.data / "dict.txt").is_file():
        print(f"error: {args.data}: no dict.txt (not a data-bin of preprocess.build)", file=sys.stderr)
        return 2
    rates = count_base_flops(args.data, args.batch, say=lambda m: print(m, file=sys.stderr))
    print(table(rates), end="")
    print(json.dumps({"gflop_per_token": {k: round(v / 1e9, 4) for k, v in rates.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
