"""Does one data-loader worker keep an H100 busy?  Blocks per second produced vs consumed, per objective.

    python benchmarks/data_pipeline.py [--batch-size 32] [--tokens-per-sample 512] [--batches 20]
                                       [--objectives seed,retromae,...] [--peak-tflops 989.4] [--mfu 0.4]
                                       [--no-flops] [--threads 1] [--json OUT]

For every objective of the registry (``seed_fairseq.pretrain.tasks.registry.registered_objectives``) and
fairseq's own ``masked_lm`` (the reference), at the paper's shape:

* produced: the blocks per CPU second ONE data-loader worker makes (``seed_fairseq.workflows.measure.feed``):
  the task's real dataset chain (``task.load_dataset("train")``), ``dataset[i]`` for each of a
  batch's ``--batch-size`` blocks of ``--tokens-per-sample`` tokens, then ``dataset.collater``:
  masking, decoder inputs and attention masks, SimLM's masked sets and sampling noise, CPDAE's
  second view.  ``--batches`` batches after one untimed, a new epoch (new masks) whenever the
  split is used up; ``time.process_time`` (the figure: other jobs share the cores), wall time too;
* consumed: the blocks per second an H100 trains at ``--mfu`` (0.4) of its dense BF16 peak
  (``--peak-tflops``, default 989.4: H100 SXM5, NVIDIA's Hopper architecture whitepaper; 1,979 is
  the figure with 2:4 sparsity) = mfu x peak / FLOPs per block, the FLOPs of forward + backward
  counted (``torch.utils.flop_counter``, ``seed_fairseq.workflows.measure.flops``) at base shape (12 x 768,
  FFN 3072, 12 heads; the objective's full-size architecture and settings from its description;
  SimLM's frozen generator, ELECTRA-base's generator shape 12 x 256, included) on one real batch
  of ``--flop-batch`` full blocks (no padding);
* workers needed = consumed / produced per worker.  Target (issue 24): at most 4 for every objective.

Data: the demo corpus through ``preprocess.build``, the dictionary widened to 32768 entries
(``step_time.build_data``); ``--sample-break-mode none`` by default, so that every block holds
exactly ``--tokens-per-sample`` tokens (the task's default ``complete`` gives whole sentences,
476 tokens on average here).  Everything runs in this process, one objective at a time,
``torch.set_num_threads(--threads)``.  Nothing is asserted.
"""

import argparse
import gc
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import step_time  # this folder's: the data-bin and SimLM's generator, made as for the step time

BASE = ["--encoder-layers", "12", "--encoder-embed-dim", "768", "--encoder-ffn-embed-dim", "3072"]
BASE += ["--encoder-attention-heads", "12"]


def setups():
    """name -> its ObjectiveDescription: fairseq's masked_lm, then the registry's."""
    import seed_fairseq  # noqa: F401  (registers the plugin)
    from seed_fairseq.pretrain.tasks.registry import plugin_objectives
    from seed_fairseq.workflows.kit.argv import FAIRSEQ_MLM

    out = {FAIRSEQ_MLM.name: FAIRSEQ_MLM}
    for d in plugin_objectives():  # fairseq-train there loads the plugin alone
        out[d.name] = d
    return out


def setup_args(setup, args):
    """fairseq-train's arguments after DATA (the kit's builder)."""
    from seed_fairseq.workflows.kit import argv

    rest = ["--cpu", "--seed", "1", "--tokens-per-sample", str(args.tokens_per_sample), "--sample-break-mode",
            args.sample_break_mode, "--optimizer", "adam", "--lr", "1e-4", "--num-workers", "0"]  # fmt: skip
    generator = str(args.generator) if setup.needs_generator else None
    return argv.train_args(setup, *rest, model=BASE, generator=generator)


def measure(name, setup, args):
    from seed_fairseq.workflows.measure import feed

    argv = setup_args(setup, args)
    task, _ = feed.setup_task(args.data, [*argv, "--batch-size", str(args.batch_size)])
    row = {"objective": name, "args": argv}
    row.update(feed.producer_rate(task, args.batch_size, args.batches))
    del task
    if not args.no_flops:
        counted = feed.flops_per_block(args.data, argv, args.flop_batch)
        if counted["tokens_per_block"] != args.tokens_per_sample:
            print(f"note: {name}: FLOPs counted on blocks of {counted['tokens_per_block']:.0f} tokens")
        row["flops_per_block"] = counted["per_block"]
        row["consumed_per_s"] = feed.consumer_rate(row["flops_per_block"], args.peak_tflops * 1e12, args.mfu)
        row["workers_needed"] = row["consumed_per_s"] / row["blocks_per_cpu_s"]
    gc.collect()
    return row


def print_table(rows, args):
    print(
        f"\nbatch {args.batch_size} x {args.tokens_per_sample} tokens (--sample-break-mode {args.sample_break_mode}); "
        f"one worker, {args.batches} batches, CPU time; consumer: {args.mfu:.0%} MFU of {args.peak_tflops} TFLOP/s"
    )
    header = f"{'objective':<11}{'blocks/CPU s':>13}{'blocks/wall s':>14}{'GFLOP/block':>12}{'GPU blocks/s':>13}"
    header += f"{'workers':>9}"
    print(header)
    print("-" * len(header))
    for r in rows:
        gflop = r.get("flops_per_block", float("nan")) / 1e9
        print(
            f"{r['objective']:<11}{r['blocks_per_cpu_s']:>13.0f}{r['blocks_per_wall_s']:>14.0f}{gflop:>12.0f}"
            f"{r.get('consumed_per_s', float('nan')):>13.0f}{r.get('workers_needed', float('nan')):>9.2f}"
        )


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch-size", type=int, default=32, help="blocks per batch (default 32, the paper's)")
    p.add_argument("--tokens-per-sample", type=int, default=512, help="tokens per block (default 512)")
    p.add_argument("--sample-break-mode", default="none", choices=["none", "complete", "complete_doc", "eos"])
    p.add_argument("--batches", type=int, default=20, help="timed batches per objective (default 20)")
    p.add_argument("--flop-batch", type=int, default=2, help="blocks the FLOPs are counted on (default 2)")
    p.add_argument("--peak-tflops", type=float, default=989.4, help="the GPU's dense peak (default: H100 SXM BF16)")
    p.add_argument("--mfu", type=float, default=0.4, help="model FLOP utilisation of the GPU (default 0.4)")
    p.add_argument("--no-flops", action="store_true", help="measure the producers only (no base-shape model)")
    p.add_argument("--objectives", help="comma-separated subset (default: masked_lm and every registered one)")
    p.add_argument("--threads", type=int, default=1, help="torch.set_num_threads (default 1)")
    p.add_argument("--dict-size", type=int, default=32768, help="dictionary entries (default 32768)")
    p.add_argument("--spm-vocab", type=int, default=1000, help="sentencepiece pieces learned (default 1000)")
    p.add_argument("--corpus", default=str(step_time.DEMO_CORPUS), help="plain-text corpus (default: the demo one)")
    p.add_argument("--json", help="write the results here")
    args = p.parse_args(argv)
    if min(args.batch_size, args.tokens_per_sample, args.batches, args.flop_batch, args.threads) < 1:
        p.error("--batch-size, --tokens-per-sample, --batches, --flop-batch and --threads must be >= 1")
    if not (0 < args.mfu <= 1 and args.peak_tflops > 0):
        p.error("--mfu must be in (0, 1] and --peak-tflops > 0")
    return args


def main(argv=None):
    args = parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(True)
    all_setups = setups()
    names = args.objectives.split(",") if args.objectives else list(all_setups)
    unknown = [n for n in names if n not in all_setups]
    if unknown:
        raise SystemExit(f"--objectives: unknown {unknown}; known: {', '.join(all_setups)}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="data_pipeline_") as tmp:
        data = step_time.build_data(Path(args.corpus), Path(tmp) / "data-bin", args.spm_vocab, args.dict_size)
        args.data = str(data)
        if any(all_setups[n].needs_generator for n in names):
            args.generator = step_time.train_generator(data, Path(tmp) / "generator", "base", 1, args.tokens_per_sample)
        for name in names:
            t = time.perf_counter()
            rows.append(measure(name, all_setups[name], args))
            print(f"  {name}: {time.perf_counter() - t:.0f}s", flush=True)
    print_table(rows, args)
    if args.json:
        out = {k: v for k, v in vars(args).items() if k not in ("data", "generator")}
        Path(args.json).write_text(json.dumps({"args": out, "rows": rows}, indent=1))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONWARNINGS", "ignore")
    sys.exit(main())
