"""Command line of the adaptation (``examples/adapt.py``).

    python examples/adapt.py --model HF_DIR --corpus TEXT --objective seed --out OUT
    python examples/adapt.py --model HF_DIR --corpus TEXT --objective retromae \\
        --retrieval-dev BEIR_DIR --train-queries BEIR_DIR --out OUT

Imports the model, builds the data with its tokenizer, continues its pre-training with
the objective (the heads it lacks trained alone first), keeps the checkpoint that retrieves best
on the dev set (without --retrieval-dev: a set derived from documents held out of
pre-training), exports it to OUT/model, and writes OUT/report.md, report.json and
report.png: zero-shot retrieval of the original and the adapted model (and BM25), and,
with --train-queries, both after identical fine-tuning, with paired p-values.  The
original model is --model itself, scored as it is; every model is scored in the model's
own representation (its sentence-transformers pooling, normalisation and similarity),
which the continued pre-training trains and validates too; the report's first sentence
says when the import -> export round trip does not give the model back exactly.  A rerun
resumes; a rerun after a change redoes only what depends on it (docs/adapt.md).
"""

import argparse
import tempfile
from pathlib import Path
from typing import Any, Callable, List, Optional

from ...base.fileio import OutputError, check_apart, check_out_path
from ...base.retrieval_data import DataFormatError, has_split, load_data
from ...encoders.hf.folder import HFFolderError
from ...encoders.hf.sentence import read_folder
from ...encoders.retrieval.cli import nonneg_int, positive_float, positive_int, seed_int
from ...encoders.retrieval.config import add_config_args, config_from_args
from ...encoders.retrieval.metrics import check_depth
from ..kit.checks import check_gpu, check_model_folder, init_positions
from ..kit.command import FINETUNE_FLAGS, FINETUNE_TYPES, run_command
from ..kit.corpus import read_corpus, write_retrieval_set
from ..kit.heldout import plan_held_out
from ..kit.objectives import OBJECTIVES, ORDER, ObjectiveSpec, PretrainSettings, check_fairseq_args
from . import plan as defaults
from .pipeline import Adaptation
from .plan import ADAPTATION, AdaptPlan, default_heldout, heldout_split
from .report import METRICS

VALID_DOCS = 4  # documents held out of the pre-training text for validation, at least (kit/heldout.py)
# flags whose value is a list of fairseq-train options (``--fairseq-args "--fp16"``, as the docs write it)
OPTION_LISTS = ("--fairseq-args",)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="adapt.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    add_options(p, lambda p: p.add_argument("--objective", required=True,
                                            help=f"one of {', '.join(ORDER)} (the comparison's names)"))  # fmt: skip
    return p


def add_options(p: argparse.ArgumentParser, add_objective: Callable[[argparse.ArgumentParser], Any]) -> None:
    """The options of adapt.py and the study (``study.parser``): each adds its own objective flag
    (``add_objective``: --objective here, --objectives there), in the same place of the help."""
    p.add_argument("--model", required=True, help="a local HuggingFace BERT, RoBERTa or XLM-R folder")
    p.add_argument("--corpus", required=True, help="the domain's text: a paragraph a line, documents apart")
    add_objective(p)
    p.add_argument("--out", required=True, help="missing, empty, or an earlier output of this tool")
    g = p.add_argument_group("evaluation")
    g.add_argument(
        "--retrieval-dev",
        help="a labelled BEIR or MS MARCO folder of the domain: its dev split chooses the checkpoint, its test "
        "split (--test-split) is the report's (default: a set derived from documents held out of --corpus)",
    )
    g.add_argument(
        "--train-queries",
        help="a BEIR or MS MARCO folder with a train split: the original and the adapted model are both "
        "fine-tuned on it, identically, and evaluated again",
    )
    g.add_argument("--test-split", default=None, help="the report's split (default: test, or dev if there is none)")
    g.add_argument(
        "--heldout-docs",
        type=positive_int,
        default=None,
        help=f"without --retrieval-dev: documents held out of pre-training for the derived set (default: "
        f"{defaults.HELDOUT_SHARE:.0%}% of them, {defaults.MIN_HELDOUT_DOCS} to {defaults.MAX_HELDOUT_DOCS})",
    )
    g.add_argument("--max-seq-length", type=positive_int, default=None,
                   help="tokens per text in evaluation and fine-tuning (default: the model's own, sentence-"
                   "transformers' max_seq_length: 256 for all-MiniLM-L6-v2; its positions for a plain HuggingFace "
                   "folder)")  # fmt: skip
    g.add_argument("--k", type=positive_int, default=defaults.K, help="documents ranked per query")
    g.add_argument("--resamples", type=positive_int, default=defaults.RESAMPLES, help="permutation test resamples")
    g = p.add_argument_group("continued pre-training")
    g.add_argument("--updates", type=positive_int, default=defaults.UPDATES)
    g.add_argument("--batch-size", type=positive_int, default=defaults.BATCH_SIZE, help="blocks per update")
    g.add_argument("--lr", type=positive_float, default=defaults.LR)
    g.add_argument("--warmup", type=nonneg_int, default=None, help="warm-up updates (default: 10%% of --updates)")
    g.add_argument("--tokens-per-sample", type=positive_int, default=None,
                   help=f"block length (default: {defaults.TOKENS_PER_SAMPLE}, or the model's positions if "
                   "fewer)")  # fmt: skip
    g.add_argument("--validate-every", type=positive_int, default=None,
                   help=f"updates between validations and saved checkpoints (default: --updates / "
                   f"{defaults.VALIDATIONS})")  # fmt: skip
    g.add_argument("--probe-size", type=nonneg_int, default=None,
                   help="blocks of the unsupervised retrieval probe at every validation (0: none; default: "
                   f"{defaults.PROBE_SIZE} with --best-checkpoint-metric probe_mrr10, else 0)")  # fmt: skip
    g.add_argument(
        "--best-checkpoint-metric",
        choices=defaults.SELECTION_METRICS,
        default=defaults.DEV_METRIC,
        help="the validation score the kept checkpoint maximises (dev_*: the dev set; probe_mrr10: no labels)",
    )
    g.add_argument("--seed", type=seed_int, default=1)
    g.add_argument("--threads", type=positive_int, default=2, help="CPU threads per process")
    g.add_argument("--gpu", action="store_true", help="train and evaluate on the GPU (default: CPU)")
    g.add_argument("--fairseq-args", default="", help="extra fairseq-train arguments, e.g. --fp16")
    g = p.add_argument_group("safeguards of the original model (tasks/encoder_lr.py)")
    g.add_argument(
        "--freeze-encoder-updates",
        type=nonneg_int,
        default=None,
        help=f"updates that train only the new heads (default: {defaults.FREEZE_SHARE:.0%}% of --updates when "
        "the model lacks a head the objective trains -- its MLM head, the objective's decoder -- else 0)",
    )
    g.add_argument("--encoder-warmup-updates", type=int, default=-1,
                   help="then the encoder's LR rises over this many updates (-1: as many as frozen)")  # fmt: skip
    g.add_argument("--encoder-lr-scale", type=float, default=defaults.ENCODER_LR_SCALE,
                   help=f"the encoder's LR = this x the heads' (default: {defaults.ENCODER_LR_SCALE})")  # fmt: skip
    g.add_argument("--layer-lr-decay", type=float, default=1.0, help="layer-wise LR decay (1: none)")
    g.add_argument("--generator-updates", type=positive_int, default=None,
                   help="SimLM from a model without MLM head: updates of its generator's head (default: "
                   "--updates / 2)")  # fmt: skip
    g = p.add_argument_group("fine-tuning with --train-queries (identical for both models)")
    add_config_args(g, FINETUNE_FLAGS, types=FINETUNE_TYPES)


def parse_objective(text: str) -> ObjectiveSpec:
    """--objective: one objective's name -> its spec (its description in it); ValueError names what is
    wrong: none, several, an unknown name."""
    names = [n.strip() for n in text.split(",") if n.strip()]
    if not names:
        raise ValueError(f"--objective: none given; choose from {','.join(ORDER)}")
    if len(names) > 1:
        raise ValueError("--objective: one objective (examples/compare_objectives.py compares several)")
    if names[0] not in OBJECTIVES:
        raise ValueError(f"--objective: unknown {names[0]}; choose from {','.join(OBJECTIVES)}")
    return OBJECTIVES[names[0]]


def _folder(value: Optional[str], flag: str) -> Optional[Path]:
    if value is None:
        return None
    path = Path(value).resolve()
    if not path.is_dir():
        raise OutputError(path, f"{flag}: not a folder")
    return path


def _split(folder: Path, split: str, flag: str) -> None:
    """``split`` of ``folder`` has judged queries (DataFormatError naming the file otherwise)."""
    try:
        load_data(folder, split)
    except DataFormatError as e:
        raise DataFormatError(e.path, e.line, f"{e.problem} ({flag}, split {split})") from None


def check_derived_set(docs: List[List[str]], corpus: Path, need_dev: bool) -> None:
    """The set derived from the held-out documents has test (and dev) queries; derived into a
    folder that is thrown away, as the retrieval stage will."""
    with tempfile.TemporaryDirectory(prefix="adapt-retrieval-") as tmp:
        queries = write_retrieval_set(docs, 0, Path(tmp)).queries
    for split in ("test", "dev") if need_dev else ("test",):
        if not queries.get(split):
            raise ValueError(
                f"{corpus}: the retrieval set derived from the {len(docs)} held-out documents has no {split} query "
                "(a query is one sentence of a paragraph of 3 or more sentences): hold out more with "
                "--heldout-docs, or give --retrieval-dev"
            )


def build_plan(args: argparse.Namespace, argv: List[str], prog: str) -> AdaptPlan:
    """The resolved plan; ValueError / OutputError / DataFormatError for what must be refused before anything runs."""
    spec = parse_objective(args.objective)
    out = Path(args.out)
    check_out_path(out)  # a file on the way, a read-only folder, ':' (fairseq's DATA list)
    model = Path(args.model).resolve()
    if not (model / "config.json").is_file():
        raise OutputError(model, "--model: not a HuggingFace model folder (no config.json)")
    corpus = Path(args.corpus).resolve()
    if not corpus.is_file():
        raise OutputError(corpus, "--corpus: not a file")
    given = [("--model", model), ("--corpus", corpus), ("--retrieval-dev", args.retrieval_dev),
             ("--train-queries", args.train_queries)]  # fmt: skip
    check_apart(out, given, "adapt")  # --out inside an input: a new fingerprint on every run
    check_gpu(args.gpu)
    check_depth(args.k, METRICS)
    try:
        positions = init_positions(model)
    except HFFolderError as e:
        raise OutputError(e.path, e.problem) from None
    positions = positions or defaults.TOKENS_PER_SAMPLE
    tps = args.tokens_per_sample or min(defaults.TOKENS_PER_SAMPLE, positions)
    if tps > positions:
        raise ValueError(
            f"{model / 'config.json'}: the model has {positions} positions, fewer than --tokens-per-sample {tps}"
        )
    if tps < 8:
        raise ValueError("--tokens-per-sample must be >= 8")
    try:  # the model's own cut (sentence-transformers' max_seq_length): the model as given is scored at it
        own_cut = read_folder(model).seq_length(positions)
    except HFFolderError as e:
        raise OutputError(e.path, e.problem) from None
    max_seq = args.max_seq_length or own_cut
    if max_seq > positions:
        raise ValueError(f"--max-seq-length {max_seq} is more than the model's {positions} positions")
    warmup = round(defaults.WARMUP_SHARE * args.updates) if args.warmup is None else args.warmup
    if warmup > args.updates:
        raise ValueError(f"--warmup ({warmup}) must not exceed --updates ({args.updates})")
    if args.freeze_encoder_updates is not None and args.freeze_encoder_updates > args.updates:
        raise ValueError(f"--freeze-encoder-updates ({args.freeze_encoder_updates}) must not exceed --updates")
    _check_encoder_schedule(args)
    dev_in_training = args.best_checkpoint_metric.startswith("dev_")
    if args.probe_size is None:
        args.probe_size = 0 if dev_in_training else defaults.PROBE_SIZE
    if not dev_in_training and not args.probe_size:
        raise ValueError("--best-checkpoint-metric probe_mrr10 needs --probe-size > 0")

    retrieval_dev = _folder(args.retrieval_dev, "--retrieval-dev")
    train_queries = _folder(args.train_queries, "--train-queries")
    test_split = args.test_split or "test"
    if retrieval_dev is not None:
        if args.heldout_docs is not None:
            raise ValueError("--heldout-docs: documents are held out for a derived set, not with --retrieval-dev")
        # no test split at all: the report is on dev; a test split that is malformed is an error (below)
        if args.test_split is None and not has_split(retrieval_dev, "test"):
            test_split = "dev"
        _split(retrieval_dev, test_split, "--retrieval-dev")
        if dev_in_training:
            _split(retrieval_dev, "dev", "--retrieval-dev")
    if train_queries is not None:
        _split(train_queries, "train", "--train-queries")

    docs = read_corpus(corpus)
    heldout = 0
    if retrieval_dev is None:
        if args.test_split not in (None, "test"):
            raise ValueError("--test-split: the derived set's report split is test (give --retrieval-dev for others)")
        heldout = args.heldout_docs or default_heldout(len(docs))
        if heldout >= len(docs) - VALID_DOCS:
            raise ValueError(
                f"{corpus}: --heldout-docs {heldout} leaves too few of its {len(docs)} documents to pre-train on"
            )
        keep, held = heldout_split(len(docs), heldout)
        check_derived_set([docs[i] for i in held], corpus, dev_in_training)
        docs = [docs[i] for i in keep]
    cfg = config_from_args(args, FINETUNE_FLAGS, show_progress=False)
    cfg.validate()
    validate_every = args.validate_every or max(1, args.updates // defaults.VALIDATIONS)
    settings = PretrainSettings.from_args(
        args,
        encoder_args=[],  # the import's model_args.txt, read when the stage runs
        tokens_per_sample=tps,
        update_freq=1,
        warmup=warmup,
        validate_every=validate_every,
        save_every=validate_every,
    )
    held_out = plan_held_out(corpus, docs, [settings.batch_for(spec)], settings, VALID_DOCS)
    # weights, tokenizer and vocabulary of the model the import stage will read (headers only)
    check_model_folder(model, "--model")
    plan = AdaptPlan(
        **AdaptPlan.as_flagged(args, argv, prog),
        **held_out,
        model=model,
        corpus=corpus,
        objective=spec,
        seed=args.seed,
        retrieval_dev=retrieval_dev,
        train_queries=train_queries,
        test_split=test_split,
        heldout_docs=heldout,
        pretrain=settings,
        freeze_updates=args.freeze_encoder_updates,
        encoder_warmup_updates=args.encoder_warmup_updates,
        encoder_lr_scale=args.encoder_lr_scale,
        layer_lr_decay=args.layer_lr_decay,
        best_metric=args.best_checkpoint_metric,
        dev_in_training=dev_in_training,
        generator_updates=args.generator_updates or max(1, round(defaults.GENERATOR_SHARE * args.updates)),
        finetune=cfg,
        max_seq_length=max_seq,
    )
    check_fairseq_args(settings.fairseq_args, Adaptation(plan).pretrain_args(planned=True))
    return plan


def _check_encoder_schedule(args: argparse.Namespace) -> None:
    """The encoder's schedule options, refused by the task's own rule (ConfigurationError, a
    ValueError) now rather than by fairseq-train after the import and the data."""
    from ...pretrain.tasks.encoder_lr import EncoderSchedule

    EncoderSchedule.from_cfg(
        argparse.Namespace(
            freeze_encoder_updates=args.freeze_encoder_updates or 0,
            encoder_warmup_updates=args.encoder_warmup_updates,
            encoder_lr_scale=args.encoder_lr_scale,
            layer_lr_decay=args.layer_lr_decay,
        )
    )


def main(argv: Optional[List[str]] = None, prog: str = "examples/adapt.py") -> int:
    """The command: the report, ``error:`` and exit 2, or, on SIGINT/SIGTERM/SIGHUP, every child
    stopped and 128 + the signal number (kit/interrupt.py)."""
    return run_command(argv, prog, parser, OPTION_LISTS, build_plan, _run)


def _run(plan: AdaptPlan) -> str:
    ADAPTATION.take(plan.out)
    Adaptation(plan).run()
    return (plan.out / "report.md").read_text(encoding="utf-8")
