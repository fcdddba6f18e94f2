"""Training-step time and peak memory of ``seed_pretrain`` vs fairseq's ``masked_lm``.

    python benchmarks/step_time.py [--arch-size {tiny,base}] [--steps 10] [--warmup 2]
                                   [--batch-size 8] [--tokens-per-sample 128] [--threads 2]

What is measured, in one run on this CPU (``--cpu``):

* ``seed_pretrain``: task/criterion ``seed_pretrain``, model ``seed_encoder_{tiny,base}``
  (RoBERTa encoder + MLM head + the weak windowed decoder, arch defaults);
* ``masked_lm``: fairseq's own task/criterion ``masked_lm``, model ``roberta_base``;

with the same encoder shape (tiny: 2 layers x 128, FFN 256, 4 heads; base: 12 x 768,
FFN 3072, 12 heads, passed explicitly to both), the same optimizer (adam, fixed lr),
default dropout, and the same batch: the demo corpus
(``examples/data/demo_corpus.txt``) goes once through the project's own
preprocessing (``preprocess.build``, cased) in a temporary directory; each setup builds its
task through fairseq's parser, loads ``train`` with the same ``--tokens-per-sample``,
``--sample-break-mode`` and seed, takes the ``--batch-size`` longest blocks and
collates them with its own collater.  The two batches hold identical encoder
inputs and MLM targets (checked with a hash); ``seed_pretrain`` additionally
carries the decoder input/target that its pipeline derives from the same blocks.

The dictionary is padded with unused symbols up to ``--dict-size`` entries
(default 32768, the default of ``python -m preprocess.build``): the MLM head only
projects the masked positions onto the vocabulary, while the weak decoder projects
every position, so the vocabulary size matters to the ratio.  ``--dict-size 0``
keeps only the sentencepiece pieces of the demo corpus.

Each setup runs in its own fresh interpreter (this script with ``--worker``) with
``torch.set_num_threads(--threads)``.  Both are started together and then step in
turn, never at the same time, the order alternating every round (so that other
load on the machine falls on both alike).  Steps are fairseq's
``Trainer.train_step([sample])`` (forward, backward, gradient-norm, adam update);
the first ``--warmup`` steps are run but not timed, then ``--steps`` steps are
timed one by one with ``time.perf_counter`` (wall clock; the ratio printed last
is of the medians) and ``time.process_time`` (CPU time of all the worker's
threads, a cross-check when other processes share the cores).

"Peak memory" is the worker's peak resident set size (``getrusage(RUSAGE_SELF)
.ru_maxrss``) at the end of the steps, minus its resident set size just before
the model was built: i.e. parameters, gradients, adam state, activations and
allocator overhead of model build + warm-up + timed steps (the interpreter,
imports and the loaded dataset are excluded).  The absolute peak RSS is printed
too.  Nothing is asserted; numbers are printed.
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
USER_DIR = REPO / "seed_fairseq"
DEMO_CORPUS = REPO / "examples" / "data" / "demo_corpus.txt"

SETUPS = ("masked_lm", "seed_pretrain")
ARCHS = {"seed_pretrain": "seed_encoder_{}", "masked_lm": "roberta_base"}
SHAPES = {  # layers, embed dim, FFN dim, heads
    "tiny": (2, 128, 256, 4),
    "base": (12, 768, 3072, 12),
}
N_SPECIALS = 5  # <s> <pad> </s> <unk> from fairseq's Dictionary + <mask> added by the task
RESULT_TAG = "STEP_TIME_RESULT "
READY_TAG = "STEP_TIME_READY"
STEP_TAG = "STEP_TIME_STEP "


# --------------------------------------------------------------------------- data


def build_data(corpus, out, spm_vocab, dict_size):
    """The project's own preprocessing (``preprocess.build``), then the dictionary
    widened with unused symbols up to ``dict_size`` entries (appended after the
    pieces, so every binarized id keeps its meaning)."""
    from preprocess.build import build

    build(out, text=[corpus], vocab_size=spm_vocab, valid_docs=0, test_docs=0, workers=1, lowercase=False)
    n_symbols = len((out / "dict.txt").read_text(encoding="utf-8").splitlines())
    fillers = max(0, dict_size - N_SPECIALS - n_symbols)
    with open(out / "dict.txt", "a", encoding="utf-8") as f:
        for i in range(fillers):  # never occur in the data; only widen the vocabulary
            f.write(f"madeupword{i:05d} 0\n")
    return out


# ------------------------------------------------------------------------- worker


def fairseq_argv(setup, args):
    layers, dim, ffn, heads = SHAPES[args.arch_size]
    return [
        args.data,
        "--user-dir",
        str(USER_DIR),
        "--cpu",
        "--seed",
        "1",
        "--task",
        setup,
        "--criterion",
        setup,
        "--arch",
        ARCHS[setup].format(args.arch_size),
        "--encoder-layers",
        str(layers),
        "--encoder-embed-dim",
        str(dim),
        "--encoder-ffn-embed-dim",
        str(ffn),
        "--encoder-attention-heads",
        str(heads),
        "--tokens-per-sample",
        str(args.tokens_per_sample),
        "--sample-break-mode",
        args.sample_break_mode,
        "--batch-size",
        str(args.batch_size),
        "--optimizer",
        "adam",
        "--adam-betas",
        "(0.9,0.98)",
        "--adam-eps",
        "1e-6",
        "--weight-decay",
        "0.01",
        "--lr",
        "1e-4",
        "--lr-scheduler",
        "fixed",
        "--num-workers",
        "0",
    ]


def current_rss_kb():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("VmRSS not found in /proc/self/status")


def pick_batch(dataset, batch_size, max_len):
    """Ids of the ``batch_size`` longest blocks that fit (ties: lowest id)."""
    import numpy as np

    sizes = dataset.sizes[0] if isinstance(dataset.sizes, list) else dataset.sizes
    sizes = np.asarray(sizes)
    fits = np.flatnonzero(sizes <= max_len)
    if len(fits) < batch_size:
        raise SystemExit(f"only {len(fits)} blocks of <= {max_len} tokens; lower --batch-size")
    order = fits[np.lexsort((fits, -sizes[fits]))]
    return sorted(order[:batch_size].tolist())


def worker(setup, args):
    import torch

    torch.set_num_threads(args.threads)
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
        from seed_fairseq.data.update_counts import UPDATE_COUNTS

        sample[UPDATE_COUNTS] = task.term_counts(sample)
    src, target = sample["net_input"]["src_tokens"], sample["target"]
    pad = task.source_dictionary.pad()
    digest = hashlib.sha1(src.numpy().tobytes() + target.numpy().tobytes()).hexdigest()[:12]

    rss_before_model = current_rss_kb()
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    trainer = Trainer(cfg, task, model, criterion)

    # The parent drives the steps: one "step" line on stdin = one timed
    # train_step, answered on stdout; "done" = report and exit.
    print(READY_TAG, flush=True)
    for command in sys.stdin:
        if command.strip() != "step":
            break
        t, c = time.perf_counter(), time.process_time()
        log = trainer.train_step([sample])
        dt, dc = time.perf_counter() - t, time.process_time() - c
        if log is None:
            raise RuntimeError(f"{setup}: train_step returned no log (overflow/OOM?)")
        print(STEP_TAG + json.dumps([dt, dc]), flush=True)
    peak_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux

    result = {
        "setup": setup,
        "arch": cfg.model._name,
        "params": sum(p.numel() for p in model.parameters()),
        "vocab": len(task.source_dictionary),
        "batch_shape": list(src.shape),
        "real_tokens": int(src.ne(pad).sum()),
        "masked_tokens": int(target.ne(pad).sum()),
        "ids": ids,
        "digest": digest,
        "peak_rss_kb": peak_kb,
        "rss_before_model_kb": rss_before_model,
        "threads": torch.get_num_threads(),
    }
    print(RESULT_TAG + json.dumps(result), flush=True)


# --------------------------------------------------------------------------- main


class Worker:
    """One setup in its own interpreter (this script with --worker), driven step by step."""

    def __init__(self, setup, args, data, log_dir):
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", setup, "--data", str(data)]
        for name in ("arch_size", "batch_size", "tokens_per_sample", "threads", "sample_break_mode"):
            cmd += ["--" + name.replace("_", "-"), str(getattr(args, name))]
        env = dict(
            os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS=str(args.threads), MKL_NUM_THREADS=str(args.threads)
        )
        self.setup = setup
        self.stderr_path = Path(log_dir) / f"{setup}.stderr"
        self.stderr = open(self.stderr_path, "w")
        self.proc = subprocess.Popen(
            cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self.stderr, text=True, env=env
        )

    def _expect(self, tag):
        for line in self.proc.stdout:
            if line.startswith(tag):
                return line[len(tag) :].strip()
        self.proc.wait()
        self.stderr.close()
        err = self.stderr_path.read_text()[-6000:]
        raise RuntimeError(f"{self.setup} worker failed ({self.proc.returncode}):\n{err}")

    def _send(self, command):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def wait_ready(self):
        self._expect(READY_TAG)

    def step(self):
        """(wall seconds, CPU seconds) of one train_step."""
        self._send("step")
        return tuple(json.loads(self._expect(STEP_TAG)))

    def finish(self):
        self._send("done")
        result = json.loads(self._expect(RESULT_TAG))
        self.proc.wait()
        self.stderr.close()
        return result


def run_interleaved(args, data, log_dir):
    """Both setups alive at once, stepping in turn (never concurrently), the order
    alternating every round: load that other programs put on the machine falls
    on both alike.  Returns {setup: result} with "times" / "cpu_times"."""
    workers = {setup: Worker(setup, args, data, log_dir) for setup in SETUPS}
    try:
        for w in workers.values():  # model build etc. may overlap: untimed
            w.wait_ready()
        times = {setup: [] for setup in SETUPS}
        for step in range(args.warmup + args.steps):
            order = SETUPS if step % 2 == 0 else SETUPS[::-1]
            for setup in order:
                measured = workers[setup].step()
                if step >= args.warmup:
                    times[setup].append(measured)
            print(
                f"  step {step + 1}/{args.warmup + args.steps}{' (warm-up)' if step < args.warmup else ''} done",
                flush=True,
            )
        results = {}
        for setup, w in workers.items():
            r = w.finish()
            r["times"] = [dt for dt, _ in times[setup]]
            r["cpu_times"] = [dc for _, dc in times[setup]]
            results[setup] = r
        return results
    finally:
        for w in workers.values():
            if w.proc.poll() is None:
                w.proc.kill()
                w.proc.wait()


def mib(kb):
    return kb / 1024


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--arch-size", choices=sorted(SHAPES), default="tiny", help="encoder shape of both setups (default tiny)"
    )
    p.add_argument("--steps", type=int, default=10, help="timed training steps per setup (default 10)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before (default 2)")
    p.add_argument("--batch-size", type=int, default=8, help="sequences per batch (default 8)")
    p.add_argument("--tokens-per-sample", type=int, default=128, help="block length incl. <s>/[CLS] (default 128)")
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads (default 2)")
    p.add_argument(
        "--sample-break-mode",
        default="complete",
        choices=["none", "complete", "complete_doc", "eos"],
        help="same for both tasks (default complete, the seed_pretrain default)",
    )
    p.add_argument(
        "--dict-size",
        type=int,
        default=32768,
        help="pad the dictionary with unused symbols to this many entries "
        "(default 32768; 0 = the corpus' sentencepiece pieces only)",
    )
    p.add_argument(
        "--spm-vocab", type=int, default=1000, help="sentencepiece pieces learned from the corpus (default 1000)"
    )
    p.add_argument("--corpus", default=str(DEMO_CORPUS), help="plain-text corpus (default: the demo corpus)")
    p.add_argument("--worker", choices=SETUPS, help=argparse.SUPPRESS)
    p.add_argument("--data", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.steps < 1 or args.warmup < 0 or args.batch_size < 1 or args.threads < 1:
        p.error("--steps, --batch-size and --threads must be >= 1, --warmup >= 0")

    if args.worker:
        return worker(args.worker, args)

    with tempfile.TemporaryDirectory(prefix="step_time_") as tmp:
        t = time.perf_counter()
        data = build_data(Path(args.corpus), Path(tmp) / "data-bin", args.spm_vocab, args.dict_size)
        print(f"binarized {Path(args.corpus).name} in {time.perf_counter() - t:.1f}s")
        print(f"building both setups, then {args.warmup} + {args.steps} steps each, in turn", flush=True)
        results = run_interleaved(args, data, tmp)

    seed, mlm = results["seed_pretrain"], results["masked_lm"]
    if seed["digest"] != mlm["digest"] or seed["ids"] != mlm["ids"]:
        raise SystemExit(f"the two setups got different batches: {seed['digest']} vs {mlm['digest']}")
    layers, dim, ffn, heads = SHAPES[args.arch_size]
    b, t = seed["batch_shape"]
    print()
    print(
        f"encoder {layers} layers x {dim}, FFN {ffn}, {heads} heads; vocabulary {seed['vocab']}; "
        f"adam; {seed['threads']} threads; --cpu"
    )
    print(
        f"batch: {b} x {t} tokens ({seed['real_tokens']} non-pad, {seed['masked_tokens']} masked), "
        f"identical encoder input and MLM target in both (sha1 {seed['digest']})"
    )
    print(f"{args.warmup} warm-up steps excluded, {args.steps} timed steps each")
    print()
    header = (
        f"{'setup':<14} {'arch':<18} {'params':>11} {'median s/step':>14} {'mean s/step':>12} "
        f"{'CPU s/step':>11} {'peak mem MiB':>13} {'peak RSS MiB':>13}"
    )
    print(header)
    print("-" * len(header))
    for setup in SETUPS:
        r = results[setup]
        print(
            f"{setup:<14} {r['arch']:<18} {r['params']:>11,} {statistics.median(r['times']):>14.4f} "
            f"{statistics.mean(r['times']):>12.4f} {statistics.median(r['cpu_times']):>11.4f} "
            f"{mib(r['peak_rss_kb'] - r['rss_before_model_kb']):>13.1f} {mib(r['peak_rss_kb']):>13.1f}"
        )
    print()
    for setup in SETUPS:
        print(f"{setup} step times (s): " + " ".join(f"{x:.4f}" for x in results[setup]["times"]))
    print()
    print(
        "s/step = wall clock per train_step; CPU s/step = median process CPU time per step "
        "(all threads; less sensitive to other load on the machine)"
    )
    print(
        "peak mem = peak RSS of the setup's own process (ru_maxrss) minus its RSS just before the "
        "model was built: parameters, gradients, adam state, activations"
    )
    mem_ratio = (seed["peak_rss_kb"] - seed["rss_before_model_kb"]) / max(
        1, mlm["peak_rss_kb"] - mlm["rss_before_model_kb"]
    )
    print(f"ratio seed_pretrain/masked_lm peak mem: {mem_ratio:.2f}x")
    print(
        f"ratio seed_pretrain/masked_lm CPU time per step: "
        f"{statistics.median(seed['cpu_times']) / statistics.median(mlm['cpu_times']):.2f}x (median)"
    )
    print(
        f"ratio seed_pretrain/masked_lm mean step time: "
        f"{statistics.mean(seed['times']) / statistics.mean(mlm['times']):.2f}x"
    )
    print(
        f"ratio seed_pretrain/masked_lm step time: "
        f"{statistics.median(seed['times']) / statistics.median(mlm['times']):.2f}x (median)"
    )


if __name__ == "__main__":
    sys.exit(main())
