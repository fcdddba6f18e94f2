#!/usr/bin/env python
"""Small-scale reproduction of the paper's comparison: does the weak decoder help retrieval?

    python examples/reproduce_small.py --out runs/reproduce_small       # defaults: 2 CPU cores, < 60 min

Pre-trains three encoders on the same text with identical encoder size, data,
updates and seed, exports each to HuggingFace (examples/export_to_hf.py),
fine-tunes each identically as a dual encoder and evaluates it:

  seed    SEED-Encoder: MLM + 3-layer weak decoder, attention window k=2
  mlm     MLM only (no decoder): the BERT baseline of the paper
  full    MLM + 3-layer decoder with full causal attention (the "strong decoder" ablation)

and prints one table (MRR@10, R@100, nDCG@10, permutation-test p-value of
MRR@10 vs MLM-only) plus the Figure 1b / Figure 5 analysis: mean cosine
similarity of the [CLS] vectors of random text pairs of 64/128/256/512 tokens,
before fine-tuning.

Retrieval set (unless --retrieval-data is given): derived from the same
corpus, see examples/retrieval/data.py:derive_retrieval_set -- passages are the
corpus paragraphs; one sentence of each paragraph (>= 3 sentences) is a query
and is removed from its passage; queries are split train/dev/test by
*document*, so test queries come from articles never seen in fine-tuning.

Every stage writes into --out and is skipped when its output exists, so an
interrupted run resumes (--force-stage NAME redoes one stage and those after
it).  Each stage's folder is built under a hidden ``.NAME.partial`` name and
renamed into place when complete, so a stage killed half-way is redone, never
taken as done.  --out must be new, empty, or an earlier output of this script
(it holds ``reproduce_small.json``, the script's record); the script only ever
replaces or deletes things inside such a folder.

At real scale, e.g. on a GPU box with your corpus and MS MARCO:

    python examples/reproduce_small.py --corpus my_corpus.txt --vocab-size 32768 \\
        --seed-arch seed_encoder_base --mlm-arch seed_encoder_mlm_only --encoder-args "" \\
        --tokens-per-sample 512 --batch-size 32 --updates 100000 --warmup 10000 --lr 1e-4 --gpu \\
        --fairseq-args "--fp16" --retrieval-data msmarco/ --train-split train --test-split dev.small \\
        --dev-split none --ft-epochs 1 --ft-batch-size 64 --ft-lr 2e-5 --max-seq-length 128
"""

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path

from seed_fairseq.fileio import (
    OutputError,
    check_output_dir,
    chmod_tree,
    own_staging_dir,
    replace_dir,
    write_json_atomic,
    write_text_atomic,
)
from seed_fairseq.retrieval.analysis import cls_similarity
from seed_fairseq.retrieval.bm25 import BM25
from seed_fairseq.retrieval.cli import fraction, nonneg_int, positive_int, report, seed_int
from seed_fairseq.retrieval.data import DataFormatError, derive_retrieval_set, load_data
from seed_fairseq.retrieval.evaluate import evaluate_model
from seed_fairseq.retrieval.metrics import compare, evaluate, read_trec_run, write_trec_run
from seed_fairseq.retrieval.search import SearchError, load_model
from seed_fairseq.retrieval.training import FinetuneConfig, finetune

REPO = Path(__file__).resolve().parents[1]
TINY_ENCODER = "--encoder-layers 2 --encoder-embed-dim 128 --encoder-ffn-embed-dim 256 --encoder-attention-heads 4"
MODELS = ("seed", "mlm", "full")
LABELS = {"seed": "SEED-Encoder (k=2)", "mlm": "MLM only", "full": "full-attention decoder"}
STAGES = ("data", "pretrain", "export", "similarity", "retrieval", "finetune")
TOOL = "examples/reproduce_small.py"
RECORD = "reproduce_small.json"  # the script's record in --out: the folder is its own
# what the script writes in --out (used to recognise folders written before the record existed)
LAYOUT = {
    RECORD,
    "data-bin",
    "pretrain",
    "hf",
    "logs",
    "cls_similarity.json",
    "retrieval",
    "runs",
    "finetuned",
    "results.md",
    "results.json",
}


def log(msg):
    print(f"[reproduce {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def sh(cmd, log_file=None, env=None):
    """Run a CLI; its output goes to log_file, and the tail of it to stderr on failure."""
    cmd = [str(c) for c in cmd]
    log(" ".join(shlex.quote(c) for c in cmd))
    with open(log_file, "w") if log_file else open(os.devnull, "w") as out:
        proc = subprocess.run(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=str(REPO))
    if proc.returncode != 0:
        tail = Path(log_file).read_text()[-4000:] if log_file else ""
        raise SystemExit(f"error: command failed ({proc.returncode}): {' '.join(cmd)}\n{tail}")


def bin_of(name):
    return str(Path(sys.executable).with_name(name))


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="runs/reproduce_small")
    p.add_argument(
        "--corpus",
        default=str(REPO / "examples" / "data" / "demo_corpus.txt"),
        help="pre-training text: one paragraph per line, blank line between documents",
    )
    p.add_argument("--seed", type=seed_int, default=1, help="one seed for pre-training, fine-tuning and sampling")
    p.add_argument("--models", default=",".join(MODELS), help="subset of seed,mlm,full")
    p.add_argument("--force-stage", choices=STAGES, help="redo this stage and every later one")
    g = p.add_argument_group("pre-training (identical for the three models)")
    g.add_argument("--vocab-size", type=int, default=2000)
    g.add_argument("--valid-docs", type=int, default=2, help="held out by preprocess.build (unused: no validation)")
    g.add_argument("--updates", type=int, default=1000)
    g.add_argument("--warmup", type=int, default=100)
    g.add_argument("--lr", type=float, default=5e-4)
    g.add_argument("--batch-size", type=int, default=16, help="sequences per GPU/process per step")
    g.add_argument("--update-freq", type=int, default=1)
    g.add_argument("--tokens-per-sample", type=int, default=128)
    g.add_argument("--seed-arch", default="seed_encoder_tiny", help="3-layer k=2 decoder architecture")
    g.add_argument("--mlm-arch", default="seed_encoder_mlm_only")
    g.add_argument(
        "--full-arch",
        default=None,
        help="full-attention decoder arch (default: --seed-arch with --decoder-attention-window full)",
    )
    g.add_argument(
        "--encoder-args",
        default=TINY_ENCODER,
        help="encoder sizes given to ALL three runs (empty for the archs' own sizes)",
    )
    g.add_argument("--fairseq-args", default="", help="extra fairseq-train arguments for all runs, e.g. --fp16")
    g.add_argument("--gpu", action="store_true", help="train on GPU (default: --cpu)")
    g.add_argument("--threads", type=int, default=2, help="OMP_NUM_THREADS for the CLIs")
    g = p.add_argument_group("retrieval")
    g.add_argument(
        "--retrieval-data",
        default=None,
        help="BEIR or MS MARCO folder (default: derived from --corpus into OUT/retrieval)",
    )
    g.add_argument("--train-split", default="train")
    g.add_argument("--dev-split", default="dev", help="'none' to skip the dev curve")
    g.add_argument("--test-split", default="test")
    g.add_argument("--negatives", choices=("bm25", "ance", "none"), default="bm25")
    g.add_argument("--loss", choices=("mnrl", "triplet"), default="mnrl")
    g.add_argument("--train-fraction", type=fraction, default=1.0)
    g.add_argument("--ft-epochs", type=positive_int, default=20)
    g.add_argument("--ft-batch-size", type=positive_int, default=32)
    g.add_argument("--ft-lr", type=float, default=1e-4)
    g.add_argument("--num-negatives", type=nonneg_int, default=1)
    g.add_argument("--eval-every", type=nonneg_int, default=0)
    g.add_argument("--max-seq-length", type=positive_int, default=128)
    g.add_argument("--encode-batch-size", type=positive_int, default=64)
    g.add_argument("--index", default="flat")
    g.add_argument("--k", type=positive_int, default=1000)
    g.add_argument("--resamples", type=positive_int, default=10000, help="permutation test resamples")
    g = p.add_argument_group("[CLS] similarity analysis (Figure 1b / 5)")
    g.add_argument("--cos-lengths", default="64,128,256,512")
    g.add_argument("--cos-pairs", type=positive_int, default=200)
    return p.parse_args(argv)


class Stages:
    """Skip finished stages; --force-stage S reruns S and everything after it."""

    def __init__(self, out: Path, force: str = None):
        self.out, self.force_from = out, STAGES.index(force) if force else len(STAGES)

    def done(self, stage, marker: Path) -> bool:
        return not self.forced(stage) and marker.exists()

    def forced(self, stage) -> bool:
        return STAGES.index(stage) >= self.force_from


def is_own_record(path: Path) -> bool:
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(rec, dict) and rec.get("tool") == TOOL


def claim_out(out: Path) -> None:
    """Make sure ``out`` is this script's folder, or refuse with :class:`OutputError`.

    New or empty: created with the record.  With the record: an earlier run,
    resumed.  A folder of an earlier version of the script (before the record)
    is recognised by its layout and adopted.  Anything else is the user's.
    """
    legacy = (
        out.is_dir()
        and not (out / RECORD).exists()
        and (out / "logs" / "data.log").is_file()
        and all(child.name in LAYOUT for child in out.iterdir())
    )
    if not legacy and check_output_dir(out, RECORD, "reproduce_small.py", is_own=is_own_record):
        return
    out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(out / RECORD, {"tool": TOOL, "created": time.strftime("%Y-%m-%d %H:%M:%S")})


def stage_target(target: Path, marker: str) -> None:
    """Refuse (OutputError) to replace ``target`` inside --out unless it is empty
    or holds ``marker``, the file the stage itself writes there."""
    check_output_dir(target, marker, "reproduce_small.py")


def pretrain_commands(args, data_bin: Path, out: Path, save_dirs=None):
    """fairseq-train command per model; ``save_dirs`` overrides OUT/pretrain/M."""
    common = [
        str(data_bin),
        "--user-dir",
        str(REPO / "seed_fairseq"),
        "--task",
        "seed_pretrain",
        "--criterion",
        "seed_pretrain",
        "--tokens-per-sample",
        str(args.tokens_per_sample),
        "--sample-break-mode",
        "complete",
        "--batch-size",
        str(args.batch_size),
        "--update-freq",
        str(args.update_freq),
        "--optimizer",
        "adam",
        "--adam-betas",
        "(0.9,0.999)",
        "--adam-eps",
        "1e-6",
        "--weight-decay",
        "0.01",
        "--lr",
        str(args.lr),
        "--lr-scheduler",
        "polynomial_decay",
        "--warmup-updates",
        str(args.warmup),
        "--total-num-update",
        str(args.updates),
        "--max-update",
        str(args.updates),
        "--clip-norm",
        "1.0",
        "--dropout",
        "0.1",
        "--attention-dropout",
        "0.1",
        "--disable-validation",
        "--no-epoch-checkpoints",
        "--save-interval-updates",
        "0",
        "--log-format",
        "simple",
        "--log-interval",
        "50",
        "--seed",
        str(args.seed),
        *([] if args.gpu else ["--cpu"]),
        *shlex.split(args.encoder_args),
        *shlex.split(args.fairseq_args),
    ]
    archs = {
        "seed": ["--arch", args.seed_arch],
        # plain MLM, as the paper's BERT baseline (seed_pretrain's default 0.5
        # weight is the MLM half of the SEED loss; with --clip-norm it matters)
        "mlm": ["--arch", args.mlm_arch, "--mlm-weight", "1.0"],
        "full": (
            ["--arch", args.full_arch]
            if args.full_arch
            else ["--arch", args.seed_arch, "--decoder-attention-window", "full"]
        ),
    }
    save_dirs = save_dirs or {}
    return {
        m: [bin_of("fairseq-train"), *common, *archs[m], "--save-dir", str(save_dirs.get(m, out / "pretrain" / m))]
        for m in archs
    }


def corpus_documents(path: Path):
    return [
        " ".join(p.strip() for p in d.splitlines() if p.strip())
        for d in path.read_text(encoding="utf-8").split("\n\n")
        if d.strip()
    ]


def fmt(x, digits=3):
    return "-" if x is None else f"{x:.{digits}f}"


def fmt_p(p):
    return "-" if p is None else "<0.001" if p < 0.001 else f"{p:.3f}"


def main(argv=None):
    args = parse_args(argv)
    try:
        return run(args)
    except (DataFormatError, OutputError, SearchError) as e:
        return report(e)


def run(args):
    t_start = time.time()
    out = Path(args.out).resolve()
    # everything that can be refused is checked before --out is created or touched
    models = [m for m in args.models.split(",") if m]
    unknown = set(models) - set(MODELS)
    if unknown or not models:
        return report(
            f"--models: unknown {sorted(unknown)}; choose from {','.join(MODELS)}"
            if unknown
            else f"--models: no model given; choose from {','.join(MODELS)}"
        )
    cfg = FinetuneConfig(
        negatives=args.negatives,
        loss=args.loss,
        train_fraction=args.train_fraction,
        seed=args.seed,
        batch_size=args.ft_batch_size,
        lr=args.ft_lr,
        epochs=args.ft_epochs,
        num_negatives=args.num_negatives,
        eval_every=args.eval_every,
        encode_batch_size=args.encode_batch_size,
        index=args.index,
        show_progress=False,
    )
    try:
        cfg.validate()  # now, not after an hour of pre-training
    except ValueError as e:
        return report(e)
    claim_out(out)
    (out / "logs").mkdir(exist_ok=True)
    stages = Stages(out, args.force_stage)
    env = dict(os.environ, OMP_NUM_THREADS=str(args.threads), PYTHONWARNINGS="ignore")
    times = {}

    # 1. sentencepiece + fairseq binarisation, shared by all models
    t0 = time.time()
    data_bin = out / "data-bin"
    if not stages.done("data", data_bin / "preprocess.json"):
        # preprocess.build resumes its own interrupted build and refuses a folder it
        # did not write; --force (discard its earlier build) only when asked to redo it
        sh(
            [
                sys.executable,
                "-m",
                "preprocess.build",
                "--text",
                args.corpus,
                "--out",
                data_bin,
                *(["--force"] if stages.forced("data") else []),
                "--vocab-size",
                args.vocab_size,
                "--workers",
                min(2, args.threads) or 1,
                "--valid-docs",
                args.valid_docs,
                "--test-docs",
                0,
                "--seed",
                args.seed,
            ],
            out / "logs" / "data.log",
            env,
        )
    times["data"] = time.time() - t0

    # 2. pre-training: identical except the decoder.  fairseq-train writes
    # checkpoint_last.pt at every epoch end, long before its last update, so it
    # trains in a staging folder that becomes pretrain/M only once it finished:
    # an interrupted pre-training is redone from scratch (fairseq would resume
    # from the staged checkpoints, with a different data order), never taken as done.
    for m in models:
        t0 = time.time()
        target = out / "pretrain" / m
        if not stages.done("pretrain", target / "checkpoint_last.pt"):
            stage_target(target, "checkpoint_last.pt")
            staging = own_staging_dir(target)
            sh(pretrain_commands(args, data_bin, out, {m: staging})[m], out / "logs" / f"pretrain_{m}.log", env)
            stage_target(target, "checkpoint_last.pt")
            replace_dir(staging, target)
        times[f"pretrain_{m}"] = time.time() - t0

    # 3. export
    hf = {m: out / "hf" / m for m in models}
    for m in models:
        if not stages.done("export", hf[m] / "config.json"):
            # export_to_hf writes atomically; --force (replace) only for an earlier export of ours
            stage_target(hf[m], "config.json")
            sh(
                [
                    sys.executable,
                    REPO / "examples" / "export_to_hf.py",
                    "--checkpoint",
                    out / "pretrain" / m / "checkpoint_last.pt",
                    "--data",
                    data_bin,
                    "--out",
                    hf[m],
                    *(["--force"] if (hf[m] / "config.json").is_file() else []),
                ],
                out / "logs" / f"export_{m}.log",
                env,
            )

    import torch

    torch.set_num_threads(args.threads)

    # 4. Figure 1b / 5: [CLS] similarity of random text pairs, before fine-tuning
    t0 = time.time()
    lengths = [int(x) for x in args.cos_lengths.split(",") if x]
    sim_file = out / "cls_similarity.json"
    sims = json.loads(sim_file.read_text()) if stages.done("similarity", sim_file) else {}
    if set(sims) != set(models):
        docs = corpus_documents(Path(args.corpus))
        for m in models:
            s, notes, max_len = cls_similarity(hf[m], docs, lengths, args.cos_pairs, args.seed)
            sims[m] = {"cosine": {str(k): v for k, v in s.items()}, "notes": notes, "max_positions": max_len}
        write_text_atomic(sim_file, json.dumps(sims, indent=2) + "\n")
    times["similarity"] = time.time() - t0

    # 5. retrieval set
    if args.retrieval_data:
        rdir = Path(args.retrieval_data)
        design = f"given: {rdir}"
    else:
        rdir = out / "retrieval"
        # stats.json is written last, so it marks a complete set; the set is built
        # beside its place and renamed, so a kill never leaves half a corpus
        if not stages.done("retrieval", rdir / "stats.json"):
            stage_target(rdir, "stats.json")
            staging = own_staging_dir(rdir)
            st = derive_retrieval_set(args.corpus, staging, seed=args.seed)
            write_text_atomic(staging / "stats.json", json.dumps(st.__dict__, indent=2) + "\n")
            replace_dir(staging, rdir)
        st = json.loads((rdir / "stats.json").read_text())
        design = (
            f"derived from {Path(args.corpus).name}: {st['passages']} passages (paragraphs), "
            f"queries = one removed sentence per paragraph, split by document: "
            + ", ".join(f"{k} {v}" for k, v in st["queries"].items())
        )
    train = load_data(rdir, args.train_split)
    test = load_data(rdir, args.test_split)
    dev = None if args.dev_split == "none" else load_data(rdir, args.dev_split)

    runs_dir = out / "runs"
    runs_dir.mkdir(exist_ok=True)
    bm25_run = runs_dir / "bm25.trec"
    if not stages.done("finetune", bm25_run):
        write_trec_run(
            BM25(test.corpus).retrieve({q: test.queries[q] for q in test.query_ids()}, k=args.k), bm25_run, tag="bm25"
        )

    # 6. identical fine-tuning and evaluation (cfg built and checked at the start)
    device = "cuda" if args.gpu else "cpu"
    zero_shot = {}
    for m in models:
        t0 = time.time()
        ft_dir = out / "finetuned" / m
        run_file = runs_dir / f"{m}.trec"
        zs_file = runs_dir / f"{m}.zeroshot.trec"
        if not stages.done("finetune", run_file):
            stage_target(ft_dir, "finetune.json")
            model = load_model(hf[m], device, args.max_seq_length)
            _, zs_run = evaluate_model(
                model, test, k=args.k, batch_size=args.encode_batch_size, index=args.index, show_progress=False
            )
            write_trec_run(zs_run, zs_file, tag=f"{m}-zeroshot")
            log(f"fine-tuning {m}")
            # built beside finetuned/M and renamed: a kill never leaves half a model there
            staging = own_staging_dir(ft_dir)
            summary = finetune(model, train, cfg, dev=dev, curve_path=staging / "curve.jsonl" if dev else None)
            model.save(str(staging))
            chmod_tree(staging)
            write_text_atomic(staging / "finetune.json", json.dumps(summary, indent=2))
            stage_target(ft_dir, "finetune.json")
            replace_dir(staging, ft_dir)
            _, run = evaluate_model(
                model, test, k=args.k, batch_size=args.encode_batch_size, index=args.index, show_progress=False
            )
            write_trec_run(run, run_file, tag=m)
        zero_shot[m] = evaluate(test.qrels, read_trec_run(zs_file))
        times[f"finetune_{m}"] = time.time() - t0

    # 7. table
    runs = {m: read_trec_run(runs_dir / f"{m}.trec") for m in models}
    runs_bm25 = read_trec_run(bm25_run)
    results = {"bm25": {"metrics": evaluate(test.qrels, runs_bm25)}}
    for m in models:
        results[m] = {
            "metrics": evaluate(test.qrels, runs[m]),
            "zero_shot": zero_shot[m],
            "cls_cosine": sims[m]["cosine"],
        }
        if "mlm" in runs and m != "mlm":
            results[m]["p_vs_mlm"] = compare(
                test.qrels, runs[m], runs["mlm"], n_resamples=args.resamples, seed=args.seed
            )
    if "mlm" in runs:
        results["bm25"]["p_vs_mlm"] = compare(
            test.qrels, runs_bm25, runs["mlm"], n_resamples=args.resamples, seed=args.seed
        )

    n_q = len(test.query_ids())
    lines = [
        f"Retrieval ({args.test_split}, {n_q} queries, {len(test.corpus)} passages; {design})",
        f"pre-training: {args.updates} updates x {args.batch_size * args.update_freq} x {args.tokens_per_sample} "
        f"tokens, seed {args.seed}; fine-tuning: {args.negatives} negatives, {args.loss} loss, "
        f"{args.ft_epochs} epochs, batch {args.ft_batch_size}, lr {args.ft_lr}",
        "",
        "| model | MRR@10 | R@100 | nDCG@10 | p (MRR@10 vs MLM only) | MRR@10 before fine-tuning |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    for m in ["bm25", *models]:
        r = results[m]
        label = "BM25 (bm25s)" if m == "bm25" else LABELS[m]
        p = r.get("p_vs_mlm", {}).get("MRR@10")
        zs = r.get("zero_shot", {}).get("MRR@10")
        lines.append(
            f"| {label} | {fmt(r['metrics']['MRR@10'])} | {fmt(r['metrics']['R@100'])} | "
            f"{fmt(r['metrics']['nDCG@10'])} | {fmt_p(p)} | {fmt(zs)} |"
        )
    lines += [
        "",
        "Mean [CLS] cosine of random text pairs before fine-tuning (paper Fig. 1b / 5; lower = more diverse)",
        "",
        "| model | " + " | ".join(f"{L} tokens" for L in lengths) + " |",
        "| --- |" + " --- |" * len(lengths),
    ]
    for m in models:
        cos = sims[m]["cosine"]
        cells = [
            fmt(cos[str(L)]) + ("*" if L > args.tokens_per_sample else "") if str(L) in cos else "skipped"
            for L in lengths
        ]
        lines.append(f"| {LABELS[m]} | " + " | ".join(cells) + " |")
    notes = sorted({n for m in models for n in sims[m]["notes"]})
    if notes:
        lines.append("")
        lines.append("lengths " + "; ".join(notes))
    if any(L > args.tokens_per_sample for L in lengths if any(str(L) in sims[m]["cosine"] for m in models)):
        lines.append(
            f"* longer than the pre-training blocks ({args.tokens_per_sample} tokens): "
            "those positions were never trained"
        )
    times["total"] = time.time() - t_start
    lines += ["", "wall-clock seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in times.items())]
    table = "\n".join(lines)
    write_text_atomic(out / "results.md", table + "\n")
    write_text_atomic(
        out / "results.json", json.dumps({"results": results, "times": times, "args": vars(args)}, indent=2) + "\n"
    )
    print(table)
    return 0


if __name__ == "__main__":
    sys.exit(main())
