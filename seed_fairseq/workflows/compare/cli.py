"""Command line of the comparison (``examples/compare_objectives.py``, alias ``examples/reproduce_small.py``).

    python examples/compare_objectives.py --out runs/compare                       # quick preset, all objectives
    bash examples/data/get_debian_corpus.sh                                        # once, for the standard preset
    python examples/compare_objectives.py --preset standard --out runs/standard    # <= 3 h on 2 cores
    python examples/compare_objectives.py --objectives seed,mlm --seeds 3 --out runs/x

Pre-trains every objective on the same data with the same encoder, token budget
and seeds, exports each to HuggingFace, evaluates it zero-shot, fine-tunes it
identically on 10/30/100% of the training queries, and writes results.md
(tables, the exact command), results.json and PNG plots into --out.
"""

import argparse
import shlex
from pathlib import Path
from typing import List, Optional

from ...base.fileio import OutputError, check_apart, check_out_path
from ...encoders.retrieval.cli import nonneg_int, positive_int, seed_int
from ...encoders.retrieval.config import add_config_args, config_from_args
from ...encoders.retrieval.metrics import check_depth
from ..kit.checks import check_gpu, check_model_folder
from ..kit.command import FINETUNE_FLAGS, FINETUNE_TYPES, run_command
from ..kit.corpus import read_corpus
from ..kit.heldout import plan_held_out
from ..kit.objectives import OBJECTIVES, ORDER, PretrainSettings, check_fairseq_args, parse_objectives
from .checks import check_plan
from .pipeline import Comparison
from .plan import COMPARISON, Plan
from .presets import PRESETS
from .report import METRICS

# flags whose value is a list of fairseq-train options (``--fairseq-args "--fp16"``, as the docs write it)
OPTION_LISTS = ("--fairseq-args", "--encoder-args", "--generator-args")


def _fractions(text: str) -> List[float]:
    try:
        values = [float(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--fractions: {text!r} is not a comma-separated list of numbers") from None
    if not values or any(not 0 < v <= 1 for v in values):
        raise ValueError(f"--fractions: each must be in (0, 1], got {text!r}")
    if len({f"{v * 100:g}" for v in values}) != len(values):
        raise ValueError(f"--fractions: {text!r} lists a share twice")
    return sorted(values)


def _lengths(text: str) -> List[int]:
    try:
        values = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"--cos-lengths: {text!r} is not a comma-separated list of integers") from None
    if any(v < 3 for v in values):
        raise ValueError("--cos-lengths: each length must be >= 3 ([CLS] + text + </s>)")
    return values


# where the comparison's defaults are not FinetuneConfig's: the preset's (None: filled from PRESETS),
# and 64 texts per encoding batch (FinetuneConfig: 128)
FINETUNE_DEFAULTS = {"epochs": None, "batch_size": None, "lr": None, "encode_batch_size": 64}
FLAG_HELP = {
    "--valid-docs": "documents held out for validation, at least; more are held out when they give fewer blocks "
    "than a validation batch and --probe-size need (seed_fairseq/workflows/kit/heldout.py)",
    "--probe-size": "validation blocks of the diagnostics' retrieval probe (0: no probe)",
}


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="compare_objectives.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--out", default="runs/compare", help="missing, empty, or an earlier output of this tool")
    p.add_argument("--preset", choices=tuple(PRESETS), default="quick")
    p.add_argument("--objectives", "--models", default=",".join(ORDER), help=f"subset of {','.join(ORDER)}")
    p.add_argument("--seeds", type=positive_int, default=None, help="pre-training seeds (preset: quick 1, standard 2)")
    p.add_argument("--seed", type=seed_int, default=1, help="the first seed; the others follow it")
    p.add_argument(
        "--init",
        default="scratch",
        help="'scratch' or a local HuggingFace BERT/RoBERTa/XLM-R folder: continued pre-training of that model "
        "(imported with examples/import_from_hf.py; its tokenizer and encoder sizes replace the preset's)",
    )
    p.add_argument("--corpus", help="pre-training text: one paragraph per line, blank line between documents")
    p.add_argument("--retrieval-data", help="BEIR or MS MARCO folder (default: derived from --corpus)")
    g = p.add_argument_group("pre-training (identical for every objective; defaults from the preset)")
    for flag, kind in (
        ("--vocab-size", positive_int),
        ("--valid-docs", positive_int),
        ("--retrieval-docs", nonneg_int),
        ("--tokens-per-sample", positive_int),
        ("--batch-size", positive_int),
        ("--update-freq", positive_int),
        ("--updates", positive_int),
        ("--warmup", nonneg_int),
        ("--lr", float),
        ("--validate-every", nonneg_int),
        ("--probe-size", nonneg_int),
        ("--generator-updates", positive_int),
    ):
        g.add_argument(flag, type=kind, default=None, help=FLAG_HELP.get(flag))
    g.add_argument("--encoder-args", default=None, help="encoder sizes given to every objective")
    g.add_argument("--generator-args", default=None, help="SimLM generator's encoder sizes")
    g.add_argument("--fairseq-args", default="", help="extra fairseq-train arguments for every run, e.g. --fp16")
    g.add_argument("--gpu", action="store_true", help="train and evaluate on the GPU (default: CPU)")
    g.add_argument("--threads", type=positive_int, default=2, help="CPU threads per process")
    g = p.add_argument_group("fine-tuning and evaluation (identical for every model)")
    g.add_argument("--train-split", default="train")
    g.add_argument("--test-split", default="test")
    add_config_args(g, FINETUNE_FLAGS, defaults=FINETUNE_DEFAULTS, types=FINETUNE_TYPES)
    g.add_argument("--fractions", default=None, help="shares of the training queries (few-shot curve)")
    g.add_argument("--max-seq-length", type=positive_int, default=None)
    g.add_argument("--k", type=positive_int, default=1000)
    g.add_argument("--resamples", type=positive_int, default=10000, help="permutation test resamples")
    g.add_argument("--cos-lengths", default=None)
    g.add_argument("--cos-pairs", type=positive_int, default=None)
    return p


def build_plan(args: argparse.Namespace, argv: List[str], prog: str):
    """The resolved :class:`Plan`; ValueError / OutputError for what must be refused before anything runs."""
    preset = dict(PRESETS[args.preset])
    for key, value in preset.items():
        if getattr(args, key, None) is None:
            setattr(args, key, value)
    objectives = parse_objectives(args.objectives)
    check_out_path(Path(args.out))  # a file on the way, a read-only folder, ':' (fairseq's DATA list)
    corpus = Path(args.corpus).resolve()
    if not corpus.is_file():
        hint = " (make it with: bash examples/data/get_debian_corpus.sh)" if args.corpus == preset["corpus"] else ""
        raise OutputError(corpus, f"--corpus: not a file{hint}")
    init = None
    if args.init != "scratch":
        init = Path(args.init).resolve()
        if not (init / "config.json").is_file():
            raise OutputError(init, "--init: not a HuggingFace model folder (no config.json); or pass 'scratch'")
    rdata = Path(args.retrieval_data).resolve() if args.retrieval_data else None
    if rdata is not None and not rdata.is_dir():
        raise OutputError(rdata, "--retrieval-data: not a folder")
    # --out inside an input (a new fingerprint on every run), or an input inside --out
    check_apart(Path(args.out), [("--corpus", corpus), ("--init", init), ("--retrieval-data", rdata)], "the comparison")
    check_gpu(args.gpu)
    check_depth(args.k, METRICS)
    if not args.lr > 0:
        raise ValueError("--lr must be > 0")
    if args.warmup > args.updates:
        raise ValueError(f"--warmup ({args.warmup}) must not exceed --updates ({args.updates})")
    if args.tokens_per_sample < 8:
        raise ValueError("--tokens-per-sample must be >= 8")
    cfg = config_from_args(args, FINETUNE_FLAGS, show_progress=False)
    cfg.validate()
    settings = PretrainSettings.from_args(args, save_every=max(50, args.updates // 10))
    # CPDAE needs an even batch: refused now, not after an hour
    batches = [settings.batch_for(OBJECTIVES[o]) for o in objectives]
    docs = read_corpus(corpus)
    plan = Plan(
        **Plan.as_flagged(args, argv, prog),
        **plan_held_out(corpus, docs, batches, settings, args.valid_docs),
        objectives=objectives,
        seeds=[args.seed + i for i in range(args.seeds)],
        corpus=corpus,
        init=init,
        vocab_size=args.vocab_size,
        pretrain=settings,
        generator_args=shlex.split(args.generator_args),
        generator_updates=args.generator_updates,
        retrieval_data=rdata,
        retrieval_docs=args.retrieval_docs,
        train_split=args.train_split,
        test_split=args.test_split,
        finetune=cfg,
        fractions=_fractions(args.fractions),
        max_seq_length=args.max_seq_length,
        cos_lengths=_lengths(args.cos_lengths),
        cos_pairs=args.cos_pairs,
        preset=args.preset,
    )
    check_plan(plan, docs)
    if init is not None:  # weights, tokenizer and vocabulary of the model the import stage will read
        check_model_folder(init, "--init")
    check_fairseq_args(settings.fairseq_args, Comparison(plan).planned_args())
    return plan


def main(argv: Optional[List[str]] = None, prog: str = "examples/compare_objectives.py") -> int:
    """The command: a result table, ``error:`` and exit 2, or, on SIGINT/SIGTERM/SIGHUP, every child
    stopped and 128 + the signal number (kit/interrupt.py)."""
    return run_command(argv, prog, parser, OPTION_LISTS, build_plan, _run)


def _run(plan: Plan) -> str:
    COMPARISON.take(plan.out)
    return Comparison(plan).run()["markdown"]
