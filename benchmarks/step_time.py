"""Training-step time, peak memory and FLOPs of every pre-training objective vs fairseq's ``masked_lm``.

    python benchmarks/step_time.py [--arch-size {tiny,base}] [--steps 3] [--warmup 1] [--rounds 1]
                                   [--batch-size 8] [--tokens-per-sample T] [--threads 2] [--json OUT]

Setups (``setups()`` below; ``--help`` lists them):

* ``masked_lm``: fairseq's own task/criterion ``masked_lm``, model ``roberta_base`` -- the reference;
* every objective of the plugin's registry (``seed_fairseq.pretrain.tasks.registry``), by its name, with its
  description's full-size architecture and settings (``seed_fairseq/base/objectives.py``): an objective
  added to the plugin is measured without an edit here.  An objective that needs a frozen generator
  (SimLM) gets one in ELECTRA-base's generator shape at base size (12 x 256, FFN 1024, 4 heads;
  1 x 64 at tiny size; a 1-update ``seed_encoder_mlm_only`` checkpoint made here: its weights do not
  change the cost);
* the benchmark's own variants of them (``VARIANTS``): ``seed_plain``, SEED with ``--vocab-loss plain``
  (full logits, the reference of the fused loss); ``cpdae_one_batch``, CPDAE with
  ``--cpdae-views-in-one-batch`` (both views as one batch, no recomputation: the path before the
  recomputed first view).

Every setup runs at its paper's masking (its task's defaults; a decoder that predicts every
position shows in its FLOPs).

All with the same encoder shape (tiny: 2 layers x 128, FFN 256, 4 heads, 128 tokens; base:
12 x 768, FFN 3072, 12 heads, 512 tokens), the same optimizer (adam, fixed lr), default
dropout and the same batch: the demo corpus goes once through ``preprocess.build`` (cased),
the dictionary is widened to ``--dict-size`` entries (default 32768: the decoder projects every
position onto the vocabulary, so its size matters), each setup builds its task through
fairseq's parser, loads ``train`` and collates the ``--batch-size`` longest blocks; the
unmasked blocks are identical in every setup (checked with a hash of the original tokens).

Each setup runs in a fresh interpreter (this script with ``--worker``), one at a time (at
base shape each needs several GB), ``torch.set_num_threads(--threads)``. A worker builds the
model and fairseq's ``Trainer``, runs ``--warmup`` untimed ``train_step``s, then
``--steps`` timed ones (wall clock and process CPU time), then counts the FLOPs of one
forward + backward with ``torch.utils.flop_counter.FlopCounterMode`` (``count_flops``: the
model's FLOPs, on the plain vocabulary loss). With ``--rounds R`` every setup runs R
times, the order reversed every other round; medians over all timed steps are compared.

Denormal floats are flushed to zero (``torch.set_flush_denormal(True)``) unless
``--keep-denormals``: Adam's second moments of vocabulary rows that only get the softmax's tiny
gradients sink into the denormal range, where x86 CPUs compute many times slower (measured:
fairseq's ``masked_lm`` tiny step 1.59 s with denormals, 0.18 s flushed, the same batch). GPUs do not
pay this, so the ratios with denormals kept measure the CPU's denormal penalty, not the objectives.

Two peak memories per setup:

* "tensor peak" (``tensor MiB``, ``tensor x``): the most bytes of live tensors during one
  more ``train_step`` after the timed ones -- parameters, gradients, adam state, the batch,
  activations -- counted by ``seed_fairseq.workflows.measure.memory.peak_tensor_bytes`` (the torch
  profiler's allocation record, checked against the tensors alive afterwards). It is what
  ``torch.cuda.max_memory_allocated`` reports on a GPU, and what decides whether a batch fits
  one: the memory targets are read on it.
* "RSS peak" (``peak MiB``, ``mem x``): the worker's peak resident set size (``ru_maxrss``)
  minus its RSS just before the model was built, over the warm-up and timed steps. It adds
  what glibc's ``malloc`` keeps of freed memory (see ``seed_fairseq/workflows/measure/memory.py``: a
  model that frees one set of activations and then allocates another keeps both in its RSS),
  which a GPU's caching allocator would reuse.

Nothing is asserted; numbers are printed (and written with ``--json``).
"""

import argparse
import hashlib
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEMO_CORPUS = REPO / "examples" / "data" / "demo_corpus.txt"

SHAPES = {  # layers, embed dim, FFN dim, heads, tokens per sample
    "tiny": (2, 128, 256, 4, 128),
    "base": (12, 768, 3072, 12, 512),
}
# the benchmark's own variants: name -> (the objective it varies, its further options)
VARIANTS = {
    "seed_plain": ("seed", ("--vocab-loss", "plain")),
    "cpdae_one_batch": ("cpdae", ("--cpdae-views-in-one-batch",)),
}
# SimLM's generator per shape: layers, embed dim, FFN dim, heads
GENERATOR_SHAPES = {"tiny": (1, 64, 128, 2), "base": (12, 256, 1024, 4)}
REFERENCE = "masked_lm"
N_SPECIALS = 5  # <s> <pad> </s> <unk> from fairseq's Dictionary + <mask> added by the task
RESULT_TAG = "STEP_TIME_RESULT "


def build_data(corpus, out, spm_vocab, dict_size):
    """The project's own preprocessing, then the dictionary widened with unused symbols
    up to ``dict_size`` entries (appended after the pieces: every id keeps its meaning)."""
    from preprocess.build import build

    build(out, text=[corpus], vocab_size=spm_vocab, valid_docs=0, test_docs=0, workers=1, lowercase=False)
    n_symbols = len((out / "dict.txt").read_text(encoding="utf-8").splitlines())
    with open(out / "dict.txt", "a", encoding="utf-8") as f:
        for i in range(max(0, dict_size - N_SPECIALS - n_symbols)):
            f.write(f"madeupword{i:05d} 0\n")
    return out


def setups():
    """name -> its ObjectiveDescription: fairseq's masked_lm first (the reference), then every objective
    of the plugin's registry (its full-size arch and settings), then ``VARIANTS``."""
    import dataclasses

    import seed_fairseq  # noqa: F401  (registers the plugin)
    from seed_fairseq.pretrain.tasks.registry import plugin_objectives
    from seed_fairseq.workflows.kit.argv import FAIRSEQ_MLM

    out = {REFERENCE: FAIRSEQ_MLM}
    for d in plugin_objectives():  # fairseq-train there loads the plugin alone
        out[d.name] = d
    for name, (base, options) in VARIANTS.items():
        if base in out:
            out[name] = dataclasses.replace(out[base], name=name, args=(*out[base].args, *options))
    return out


def fairseq_argv(setup, args):
    """What the worker parses: ``DATA --user-dir seed_fairseq`` and the setup's arguments (the kit's builder)."""
    from seed_fairseq.base.user_dir import parse_argv
    from seed_fairseq.workflows.kit.argv import train_args

    layers, dim, ffn, heads, _ = SHAPES[args.arch_size]
    model = ["--encoder-layers", str(layers), "--encoder-embed-dim", str(dim), "--encoder-ffn-embed-dim", str(ffn)]
    rest = ["--cpu", "--seed", "1", "--tokens-per-sample", str(args.tokens_per_sample), "--sample-break-mode",
            "complete", "--batch-size", str(args.batch_size), "--optimizer", "adam", "--adam-betas", "(0.9,0.98)",
            "--adam-eps", "1e-6", "--weight-decay", "0.01", "--lr", "1e-4", "--lr-scheduler", "fixed",
            "--num-workers", "0"]  # fmt: skip
    model += ["--encoder-attention-heads", str(heads)]
    return parse_argv(args.data, train_args(setups()[setup], *rest, model=model, generator=args.generator))


def current_rss_kb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("VmRSS not found in /proc/self/status")


def pick_batch(dataset, batch_size, max_len):
    """Ids of the ``batch_size`` longest blocks that fit (ties: lowest id)."""
    import numpy as np

    sizes = np.asarray(dataset.sizes[0] if isinstance(dataset.sizes, list) else dataset.sizes)
    fits = np.flatnonzero(sizes <= max_len)
    if len(fits) < batch_size:
        raise SystemExit(f"only {len(fits)} blocks of <= {max_len} tokens; lower --batch-size")
    order = fits[np.lexsort((fits, -sizes[fits]))]
    return sorted(order[:batch_size].tolist())


def count_flops(model, criterion, sample):
    """FLOPs of one forward + backward of the model's loss (the optimizer's are elementwise).

    Counted with ``FlopCounterMode`` (matmuls and attention) on the plain vocabulary loss:
    the model's own FLOPs, the same for every ``--vocab-loss`` (ops inside a custom
    autograd Function's forward are invisible to the counter anyway).
    """
    from torch.utils.flop_counter import FlopCounterMode

    saved = getattr(criterion, "vocab_loss", None)
    if saved is not None:
        criterion.vocab_loss = "plain"
    model.train()
    model.zero_grad()
    try:
        with FlopCounterMode(display=False) as counter:
            loss, _, _ = criterion(model, sample)
            loss.backward()
    finally:
        if saved is not None:
            criterion.vocab_loss = saved
        model.zero_grad()
    return counter.get_total_flops()


def worker(setup, args):
    import torch

    torch.set_num_threads(args.threads)
    torch.set_flush_denormal(not args.keep_denormals)
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    parser = options.get_training_parser()
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(parser, fairseq_argv(setup, args)))
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train")
    dataset = task.dataset("train")
    ids = pick_batch(dataset, args.batch_size, args.tokens_per_sample)
    sample = dataset.collater([dataset[i] for i in ids])
    if hasattr(task, "term_counts"):
        # what the task's batch iterator attaches in fairseq-train (update_freq 1)
        from seed_fairseq.pretrain.data.update_counts import UPDATE_COUNTS

        sample[UPDATE_COUNTS] = task.term_counts(sample)
    src, target = sample["net_input"]["src_tokens"], sample["target"]
    pad = task.source_dictionary.pad()
    # the unmasked blocks: the MLM target holds the original token wherever the input was changed
    # (SimLM's target holds every original token)
    original = target.where(target.ne(pad), src)
    digest = hashlib.sha1(original.numpy().tobytes()).hexdigest()[:12]

    rss_before_model = current_rss_kb()
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    trainer = Trainer(cfg, task, model, criterion)
    for _ in range(args.warmup):
        trainer.train_step([sample])
    times, cpu_times = [], []
    for _ in range(args.steps):
        t, c = time.perf_counter(), time.process_time()
        log = trainer.train_step([sample])
        times.append(time.perf_counter() - t)
        cpu_times.append(time.process_time() - c)
        if log is None:
            raise RuntimeError(f"{setup}: train_step returned no log (overflow/OOM?)")
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux, before the FLOP count
    from seed_fairseq.workflows.measure.memory import peak_tensor_bytes

    trainer.zero_grad()  # what train_step does first: the profiler cannot see frees of older blocks
    _, tensor_mem = peak_tensor_bytes(lambda: trainer.train_step([sample]))
    flops = count_flops(model, criterion, sample)
    result = {
        "setup": setup,
        "arch": cfg.model._name,
        "params": sum(p.numel() for p in model.parameters()),
        "vocab": len(task.source_dictionary),
        "batch_shape": list(src.shape),
        "real_tokens": int(src.ne(pad).sum()),
        "predicted_tokens": int(target.ne(pad).sum()),  # the encoder's MLM/replaced-LM positions
        "digest": digest,
        "flops": flops,
        "times": times,
        "cpu_times": cpu_times,
        "peak_mem_mib": (peak_kb - rss_before_model) / 1024,
        "peak_rss_mib": peak_kb / 1024,
        "tensor_peak_mib": tensor_mem["peak"] / 2**20,
        "threads": torch.get_num_threads(),
    }
    print(RESULT_TAG + json.dumps(result), flush=True)


def run_worker(setup, args, data, log_dir):
    cmd = [sys.executable, os.path.abspath(__file__), "--worker", setup, "--data", str(data)]
    for name in ("arch_size", "batch_size", "tokens_per_sample", "threads", "steps", "warmup"):
        cmd += ["--" + name.replace("_", "-"), str(getattr(args, name))]
    if args.keep_denormals:
        cmd.append("--keep-denormals")
    if getattr(args, "generator", None):
        cmd += ["--generator", args.generator]
    env = dict(
        os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads)
    )
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    log = Path(log_dir) / f"{setup}.log"
    with open(log, "w") as err:
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=err, text=True, env=env)
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG) :])
    raise RuntimeError(f"{setup} worker failed ({proc.returncode}):\n{log.read_text()[-6000:]}")


def train_generator(data, out, arch_size, threads, tokens_per_sample):
    """SimLM's frozen generator: a 1-update masked LM in the generator's shape (its cost, not its quality)."""
    from seed_fairseq.workflows.kit.argv import GENERATOR, command, train_args

    layers, dim, ffn, heads = GENERATOR_SHAPES[arch_size]
    model = ["--encoder-layers", str(layers), "--encoder-embed-dim", str(dim), "--encoder-ffn-embed-dim", str(ffn),
             "--encoder-attention-heads", str(heads)]  # fmt: skip
    rest = ["--cpu", "--tokens-per-sample", str(tokens_per_sample),  # the generator's positions cover SimLM's blocks
            "--batch-size", "2", "--optimizer", "adam", "--lr", "1e-4", "--max-update", "1", "--num-workers", "0",
            "--no-epoch-checkpoints", "--disable-validation"]  # fmt: skip
    cmd = command(data, train_args(GENERATOR, *rest, model=model), save_dir=out)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(REPO), env.get("PYTHONPATH")]))
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"SimLM generator training failed:\n{proc.stdout[-4000:]}")
    return Path(out) / "checkpoint_last.pt"


def run(args, chosen):
    with tempfile.TemporaryDirectory(prefix="step_time_") as tmp:
        t = time.perf_counter()
        data = build_data(Path(args.corpus), Path(tmp) / "data-bin", args.spm_vocab, args.dict_size)
        args.data = str(data)
        print(f"binarized {Path(args.corpus).name} in {time.perf_counter() - t:.1f}s", flush=True)
        known = setups()
        if any(known[name].needs_generator for name in chosen):
            args.generator = str(
                train_generator(data, Path(tmp) / "generator", args.arch_size, args.threads, args.tokens_per_sample)
            )
        results = {}
        for r in range(args.rounds):
            for setup in chosen if r % 2 == 0 else chosen[::-1]:
                t = time.perf_counter()
                res = run_worker(setup, args, data, tmp)
                print(f"  round {r + 1}/{args.rounds} {setup}: {time.perf_counter() - t:.0f}s", flush=True)
                if setup in results:
                    results[setup]["times"] += res["times"]
                    results[setup]["cpu_times"] += res["cpu_times"]
                    for key in ("peak_mem_mib", "tensor_peak_mib"):
                        results[setup][key] = max(results[setup][key], res[key])
                else:
                    results[setup] = res
    digests = {r["digest"] for r in results.values()}
    if len(digests) != 1:
        raise SystemExit(f"the setups got different blocks: {digests}")
    return results


def summarize(results, reference=REFERENCE):
    """{setup: {time, cpu, mem, flops and their ratios to the reference}}."""
    ref = results[reference]
    out = {}
    for setup, r in results.items():
        row = {
            "step_s": statistics.median(r["times"]),
            "cpu_s": statistics.median(r["cpu_times"]),
            "peak_mem_mib": r["peak_mem_mib"],
            "tensor_peak_mib": r["tensor_peak_mib"],
            "gflop": r["flops"] / 1e9 if r["flops"] else None,
            "params": r["params"],
        }
        row["time_ratio"] = row["step_s"] / statistics.median(ref["times"])
        row["cpu_ratio"] = row["cpu_s"] / statistics.median(ref["cpu_times"])
        row["mem_ratio"] = r["peak_mem_mib"] / ref["peak_mem_mib"]
        row["tensor_mem_ratio"] = r["tensor_peak_mib"] / ref["tensor_peak_mib"]
        row["flop_ratio"] = r["flops"] / ref["flops"] if r["flops"] and ref["flops"] else None
        out[setup] = row
    return out


def print_table(summary, results, args):
    any_r = next(iter(results.values()))
    layers, dim, ffn, heads, _ = SHAPES[args.arch_size]
    b, t = any_r["batch_shape"]
    print(
        f"\nencoder {layers} x {dim}, FFN {ffn}, {heads} heads; vocabulary {any_r['vocab']}; batch {b} x {t} "
        f"({any_r['real_tokens']} tokens; the same blocks in every setup, sha1 {any_r['digest']}); adam; "
        f"{any_r['threads']} threads; denormals {'kept' if args.keep_denormals else 'flushed'}; "
        f"{args.warmup} warm-up + {args.steps} timed "
        f"steps x {args.rounds} round(s)"
    )
    header = (
        f"{'setup':<16}{'params':>13}{'pred':>6}{'s/step':>9}{'CPU s':>9}{'peak MiB':>10}{'tensor MiB':>11}"
        f"{'GFLOP':>9}{'time x':>8}{'CPU x':>8}{'mem x':>8}{'tensor x':>9}{'FLOP x':>8}"
    )
    print(header)
    print("-" * len(header))
    for setup, row in summary.items():
        print(
            f"{setup:<16}{row['params']:>13,}{results[setup]['predicted_tokens']:>6}"
            f"{row['step_s']:>9.3f}{row['cpu_s']:>9.3f}{row['peak_mem_mib']:>10.0f}{row['tensor_peak_mib']:>11.0f}"
            f"{row['gflop'] or float('nan'):>9.1f}{row['time_ratio']:>8.2f}{row['cpu_ratio']:>8.2f}"
            f"{row['mem_ratio']:>8.2f}{row['tensor_mem_ratio']:>9.2f}{row['flop_ratio'] or float('nan'):>8.2f}"
        )
    print(
        "pred = positions the encoder's own loss predicts; x = ratio to masked_lm; peak MiB = RSS peak,\n"
        "tensor MiB = live-tensor peak of one step (what a GPU must hold; see the docstring);\n"
        "GFLOP = the model's forward + backward (torch FlopCounterMode: matmuls and "
        "attention), the same for every --vocab-loss"
    )


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--arch-size", choices=sorted(SHAPES), default="tiny")
    p.add_argument("--steps", type=int, default=3, help="timed training steps per setup and round (default 3)")
    p.add_argument("--warmup", type=int, default=1, help="untimed steps before (default 1)")
    p.add_argument("--rounds", type=int, default=1, help="runs of every setup, order reversed every other round")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per batch (default 8)")
    p.add_argument("--tokens-per-sample", type=int, help="block length (default: 128 tiny, 512 base)")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    p.add_argument("--dict-size", type=int, default=32768, help="dictionary entries (default 32768)")
    p.add_argument("--spm-vocab", type=int, default=1000, help="sentencepiece pieces learned (default 1000)")
    p.add_argument("--corpus", default=str(DEMO_CORPUS), help="plain-text corpus (default: the demo corpus)")
    known = setups()
    p.add_argument("--setups", default=",".join(known), help=f"comma-separated subset of {','.join(known)}")
    p.add_argument("--json", help="write the results here")
    p.add_argument(
        "--keep-denormals", action="store_true", help="do not flush denormal floats to zero (see the docstring)"
    )
    p.add_argument("--worker", choices=sorted(known), help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    p.add_argument("--generator", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.tokens_per_sample is None:
        args.tokens_per_sample = SHAPES[args.arch_size][4]
    if args.steps < 1 or args.warmup < 1 or args.batch_size < 1 or args.threads < 1 or args.rounds < 1:
        p.error("--steps, --warmup, --rounds, --batch-size and --threads must be >= 1")
    chosen = args.setups.split(",")
    unknown = [s for s in chosen if s not in known]
    if unknown or REFERENCE not in chosen:
        p.error(f"--setups: unknown {unknown}" if unknown else f"--setups must include {REFERENCE}")
    return args, chosen


def main(argv=None):
    args, chosen = parse_args(argv)
    if args.worker:
        return worker(args.worker, args)
    results = run(args, chosen)
    summary = summarize(results)
    print_table(summary, results, args)
    if args.json:
        Path(args.json).write_text(
            json.dumps({"args": vars(args), "results": results, "summary": summary}, indent=1)
        )


if __name__ == "__main__":
    sys.exit(main())
