"""Fine-tune an exported encoder as a shared-weight dual encoder ([CLS], dot product).

    python examples/retrieval/finetune.py --model HF_DIR --data DIR --split train --out OUT_DIR \\
        [--negatives bm25|ance|none] [--loss mnrl|triplet] [--train-fraction F] [--eval-every N]

* ``--negatives bm25`` (default): the paper's "DPR (BM25 Neg)": in-batch
  negatives plus hard negatives sampled from the bm25s top-k of each query,
  positives excluded.
* ``--negatives ance``: ANCE-style rounds: encode the corpus with the current
  model, mine hard negatives from a faiss top-k (positives excluded), train,
  repeat (``--ance-rounds``).  Each round restarts the optimizer and the
  linear schedule (warm-up only in the first round); the original ANCE
  refreshes the index asynchronously instead, which needs a second GPU.
* ``--loss mnrl`` (default): sentence-transformers' MultipleNegativesRankingLoss
  with a raw dot product (scale 1), i.e. DPR's softmax over in-batch + hard
  negatives.  ``--loss triplet``: the paper's Eq. (4.2)
  ``relu(margin - (s(q,d+) - s(q,d-)))`` with s = dot product, via
  TripletLoss with a negative-dot-product "distance".
* ``--train-fraction F``: a deterministic subset of the training queries
  (Figure 6c/d few-shot curves); nested fractions are nested subsets.
* ``--eval-every N``: retrieval metrics on ``--dev-split`` at step 0, every
  N steps counted within each epoch (sentence-transformers'
  ``evaluation_steps``) and at every epoch end, appended as JSON lines
  ``{"step", "MRR@10", "R@100", "nDCG@10"}`` to ``OUT/curve.jsonl`` (Figure 6a/b).
* Hard negatives are documents not judged for the query.  A query with fewer
  such documents than ``--num-negatives`` (tiny corpora) gets as many as exist,
  with a note on stderr; batches only group examples with the same number of
  texts, because MultipleNegativesRankingLoss stacks them column by column.
  When no negative at all is possible (every document is judged for every
  training query, e.g. a one-passage corpus) the run stops with an error that
  names the data folder.
* ``--representation dupmae`` (the default for a folder with DupMAE's head files):
  the score is DupMAE's Eq. 12 (projected [CLS] dot + sparse dot over shared
  vocabulary indices), trained with the same losses (Eq. 13: in-batch plus hard
  negatives); the [CLS] projection and the vocabulary projection are trained
  with the encoder and saved back beside it.
* ``OUT`` is built under a temporary name beside it and renamed into place when
  complete, with ``OUT/finetune.json`` as this tool's record (it lists the
  files written).  A rerun into an earlier output needs ``--force`` and
  replaces exactly the files that record lists: anything else in ``OUT`` (notes,
  a save-dir) stays.  A non-empty folder without the record is refused.

Training uses sentence-transformers' own loop (``SentenceTransformer.old_fit``:
AdamW, linear warm-up/decay, gradient clipping, AMP on CUDA) rather than
``SentenceTransformerTrainer``, which would add the ``datasets`` and
``accelerate`` packages for no gain here.
"""

import argparse
import json
import math
import os
import random
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Dict, List, Optional, Sequence

import numpy as np
import torch

from ..fileio import OutputError, owned_output, staged_output, write_output_record
from .cli import fraction, nonneg_float, nonneg_int, positive_float, positive_int, seed_int, unit_interval
from .data import DataFormatError, RetrievalData, subsample
from .dupmae import dupmae_head, save_model
from .evaluate import evaluate_model
from .negatives import mine_bm25, mine_dense, negatives_per_query
from .search import load_model

if TYPE_CHECKING:
    from sentence_transformers import InputExample, SentenceTransformer

CURVE_METRICS = ("MRR@10", "R@100", "nDCG@10")
TOOL = "examples/retrieval/finetune.py"
RECORD = "finetune.json"  # this tool's record in OUT: the files it may replace
OUT_TOOL = "finetune.py"  # how messages about OUT name the tool


@dataclass
class FinetuneConfig:
    negatives: str = "bm25"  # none | bm25 | ance
    loss: str = "mnrl"  # mnrl | triplet
    train_fraction: float = 1.0
    seed: int = 1
    batch_size: int = 32
    lr: float = 2e-5
    epochs: int = 1  # per ANCE round
    warmup_ratio: float = 0.1
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    num_negatives: int = 1  # hard negatives per (query, positive)
    neg_top_k: int = 100  # negatives are sampled from this many top-ranked non-positives
    ance_rounds: int = 2
    ance_first: str = "dense"  # where round 1 mines: the starting model (dense) or bm25
    margin: float = 1.0  # triplet loss
    scale: float = 1.0  # MNRL logit scale; 1 = plain dot product as in DPR
    eval_every: int = 0
    eval_k: int = 100
    encode_batch_size: int = 128
    precision: str = "fp16"  # autocast dtype on CUDA; CPU always trains in fp32
    index: str = "flat"
    show_progress: bool = True

    @staticmethod
    def add_args(p: argparse.ArgumentParser) -> None:
        """The fine-tuning flags of ``examples/retrieval/finetune.py`` (defaults from this class)."""
        d = FinetuneConfig()
        p.add_argument("--negatives", choices=("bm25", "ance", "none"), default=d.negatives)
        p.add_argument("--loss", choices=("mnrl", "triplet"), default=d.loss)
        p.add_argument("--train-fraction", type=fraction, default=d.train_fraction)
        p.add_argument("--seed", type=seed_int, default=d.seed)
        p.add_argument("--train-batch-size", type=positive_int, default=d.batch_size, help="queries per step")
        p.add_argument("--lr", type=positive_float, default=d.lr)
        p.add_argument("--epochs", type=positive_int, default=d.epochs, help="epochs (per round with --negatives ance)")
        p.add_argument("--warmup-ratio", type=unit_interval, default=d.warmup_ratio)
        p.add_argument("--weight-decay", type=nonneg_float, default=d.weight_decay)
        p.add_argument(
            "--num-negatives",
            type=nonneg_int,
            default=d.num_negatives,
            help="hard negatives per query (fewer, with a note, when the corpus has fewer unjudged documents)",
        )
        p.add_argument(
            "--neg-top-k", type=positive_int, default=d.neg_top_k, help="sample hard negatives from this top-k"
        )
        p.add_argument("--ance-rounds", type=positive_int, default=d.ance_rounds)
        p.add_argument(
            "--ance-first",
            choices=("dense", "bm25"),
            default=d.ance_first,
            help="negatives of the first ANCE round: the starting model's own top-k, or BM25",
        )
        p.add_argument("--margin", type=nonneg_float, default=d.margin, help="triplet margin")
        p.add_argument("--scale", type=positive_float, default=d.scale, help="MNRL logit scale (1 = raw dot product)")
        p.add_argument(
            "--eval-every",
            type=nonneg_int,
            default=0,
            help="dev metrics every N steps within an epoch (0: step 0 and epoch ends only)",
        )
        p.add_argument("--eval-k", type=positive_int, default=d.eval_k)
        p.add_argument("--no-progress", action="store_true")

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> "FinetuneConfig":
        """The config of parsed :meth:`add_args` flags plus the search flags (``cli.add_search_args``)."""
        return cls(
            negatives=args.negatives,
            loss=args.loss,
            train_fraction=args.train_fraction,
            seed=args.seed,
            batch_size=args.train_batch_size,
            lr=args.lr,
            epochs=args.epochs,
            warmup_ratio=args.warmup_ratio,
            weight_decay=args.weight_decay,
            num_negatives=args.num_negatives,
            neg_top_k=args.neg_top_k,
            ance_rounds=args.ance_rounds,
            ance_first=args.ance_first,
            margin=args.margin,
            scale=args.scale,
            eval_every=args.eval_every,
            eval_k=args.eval_k,
            encode_batch_size=args.batch_size,
            precision=args.precision,
            index=args.index,
            show_progress=not args.no_progress,
        )

    def validate(self) -> None:
        """ValueError for settings that would hang, crash late or train on nothing."""
        if self.negatives not in ("none", "bm25", "ance"):
            raise ValueError(f"negatives must be none, bm25 or ance, got {self.negatives!r}")
        if self.loss not in ("mnrl", "triplet"):
            raise ValueError(f"loss must be mnrl or triplet, got {self.loss!r}")
        if self.loss == "triplet" and self.negatives == "none":
            raise ValueError("--loss triplet needs negatives: use --negatives bm25 or ance")
        if self.loss == "triplet" and self.num_negatives < 1:
            raise ValueError("--loss triplet needs --num-negatives >= 1")
        if self.ance_first not in ("dense", "bm25"):
            raise ValueError(f"ance_first must be dense or bm25, got {self.ance_first!r}")
        at_least = {
            "batch_size": 1,
            "epochs": 1,
            "neg_top_k": 1,
            "ance_rounds": 1,
            "eval_k": 1,
            "encode_batch_size": 1,
            "num_negatives": 0,
            "eval_every": 0,
        }
        for name, low in at_least.items():
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < low:
                raise ValueError(f"{name} must be an integer >= {low}, got {value!r}")
        ranges = {
            "train_fraction": (0, 1, False),
            "lr": (0, math.inf, False),
            "scale": (0, math.inf, False),
            "max_grad_norm": (0, math.inf, False),
            "warmup_ratio": (0, 1, True),
            "weight_decay": (0, math.inf, True),
            "margin": (0, math.inf, True),
        }
        for name, (low, high, low_ok) in ranges.items():
            value = getattr(self, name)
            ok = (
                isinstance(value, (int, float))
                and math.isfinite(value)
                and value <= high
                and (value >= low if low_ok else value > low)
            )
            if not ok:
                raise ValueError(
                    f"{name} must be a finite number {'>=' if low_ok else '>'} {low}"
                    f"{'' if high == math.inf else f' and <= {high}'}, got {value!r}"
                )


def neg_dot_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """TripletLoss minimises d(q,d+) - d(q,d-) + margin; with d = -dot this is the paper's loss."""
    return -(a * b).sum(-1)


class NoDuplicateBatches:
    """Batch sampler: reshuffled every epoch, no text twice in one batch, and
    every example of a batch with the same number of texts.

    With in-batch negatives a passage that is one query's positive and another's
    hard negative in the same batch would be a false negative.  Why not
    sentence-transformers' own: ``NoDuplicatesBatchSampler`` works on a
    ``datasets.Dataset`` for ``SentenceTransformerTrainer`` (we train with
    ``old_fit`` over ``InputExample`` lists, without ``datasets``/``accelerate``)
    and does not group by width, and the older ``NoDuplicatesDataLoader`` loops
    forever when a batch cannot be filled; here conflicting examples are
    deferred to a later batch instead.  Examples of
    queries that got fewer hard negatives (tiny corpora) are deferred the same
    way: the collate function zips the texts column by column, so a mixed batch
    would silently drop the extra negatives of the longer examples.
    """

    def __init__(self, examples, batch_size: int, seed: int):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.keys = [frozenset(t.strip().lower() for t in ex.texts) for ex in examples]
        self.sizes = [len(ex.texts) for ex in examples]
        self.batch_size = batch_size
        self.rng = random.Random(seed)

    def __len__(self):
        return max(1, len(self.keys) // self.batch_size) if self.keys else 0

    def __iter__(self):
        pending = deque(self.rng.sample(range(len(self.keys)), len(self.keys)))
        for _ in range(len(self)):
            batch, seen, deferred, size = [], set(), [], None
            while pending and len(batch) < self.batch_size:
                i = pending.popleft()
                if self.keys[i] & seen or (size is not None and self.sizes[i] != size):
                    deferred.append(i)
                else:
                    batch.append(i)
                    seen |= self.keys[i]
                    size = self.sizes[i]
            pending.extendleft(reversed(deferred))
            if not batch:
                return
            yield batch


class CurveEvaluator:
    """Dev-set retrieval metrics during training, appended to a JSON-lines curve.

    Why not sentence-transformers' ``InformationRetrievalEvaluator``: it scores
    the corpus with its own torch top-k and metric code; the curve must be the
    evaluation ``evaluate.py`` prints (the same faiss index, options and
    ir_measures metrics), so that its last point and the final number agree.

    Plugs into ``old_fit``'s evaluator hook, which passes the step within the
    epoch (or -1 at the epoch end); the global step is rebuilt from that.
    """

    def __init__(self, dev: RetrievalData, cfg: FinetuneConfig, curve_path: Optional[Path], **index_kw):
        self.dev, self.cfg, self.curve_path, self.index_kw = dev, cfg, curve_path, index_kw
        self.offset = 0  # steps done in earlier old_fit calls (ANCE rounds)
        self.steps_per_epoch = 0
        self.round = 0
        self.last_step = None
        self.history: List[dict] = []

    def __call__(self, model, output_path=None, epoch: int = -1, steps: int = -1) -> float:
        step = self.offset + (
            epoch * self.steps_per_epoch + steps if steps >= 0 else (epoch + 1) * self.steps_per_epoch
        )
        return self.evaluate_at(model, step)

    def evaluate_at(self, model: "SentenceTransformer", step: int) -> float:
        if step == self.last_step:
            return self.history[-1]["MRR@10"]
        metrics, _ = evaluate_model(
            model,
            self.dev,
            k=self.cfg.eval_k,
            batch_size=self.cfg.encode_batch_size,
            precision=self.cfg.precision,
            index=self.cfg.index,
            show_progress=False,
            **self.index_kw,
        )
        row = {"step": step, "round": self.round, **{m: metrics[m] for m in CURVE_METRICS}}
        self.history.append(row)
        self.last_step = step
        if self.curve_path is not None:
            with open(self.curve_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
        print(f"[dev] {json.dumps(row)}", file=sys.stderr)
        model.train()
        return row["MRR@10"]


def check_training_data(
    data: RetrievalData, cfg: FinetuneConfig, qids: Optional[Sequence[str]] = None, log: bool = True
) -> List[str]:
    """The training queries (with a positive in the corpus), or a :class:`DataFormatError`
    naming the data when the loss could not get a single negative.

    Called before any model is loaded or output written.  Logs a note (unless
    ``log`` is False) when some queries get fewer hard negatives than asked for.
    """
    where = data.folder or data.name or "training data"
    if qids is None:
        qids = [q for q in data.query_ids() if data.positives(q)]
    if not qids:
        raise DataFormatError(
            data.qrels_path or where,
            None,
            f"no training query of split {data.split!r} has a relevant document that is in "
            f"the corpus ({data.missing_docs} judged documents are missing from it)",
        )
    counts = negatives_per_query(data, qids, cfg)
    n_docs = len(data.corpus)
    if cfg.loss == "triplet" and not any(counts.values()):
        raise DataFormatError(
            where,
            None,
            f"no negatives possible: each of the {n_docs} corpus documents is "
            "judged for every training query, and --loss triplet needs a "
            "document that is not judged for the query",
        )
    if cfg.loss == "mnrl" and not any(counts.values()):
        # no hard negative anywhere: only in-batch negatives, i.e. other queries'
        # positives, and a batch never holds the same text twice
        distinct = {data.corpus[d].strip().lower() for q in qids for d in data.positives(q)}
        if len(distinct) < 2:
            raise DataFormatError(
                where,
                None,
                f"no negatives possible: the corpus has {n_docs} document(s), "
                "each judged for every training query, and every training query "
                "has the same positive passage, so the loss has nothing to rank "
                "it against",
            )
    short = [q for q in qids if counts[q] < cfg.num_negatives] if cfg.negatives != "none" else []
    if short and log:
        fewest = min(counts[q] for q in short)
        print(
            f"note: {where}: {len(short)} of {len(qids)} training queries have fewer than {cfg.num_negatives} "
            f"unjudged documents in the corpus ({n_docs} documents), so they get fewer hard negatives "
            f"(as few as {fewest}, e.g. query {short[0]!r})",
            file=sys.stderr,
        )
    return list(qids)


def sample_negatives(pool: Sequence[str], doc_ids: Sequence[str], judged, want: int, rng: random.Random) -> List[str]:
    """``want`` distinct documents, none judged for the query: from the mined
    ``pool`` first, then at random from the whole corpus.  Fewer only if the
    corpus has fewer; ``want`` must not exceed what it has (see
    :func:`negatives_per_query`), but even then this returns instead of looping.
    """
    negs = rng.sample(list(pool), min(want, len(pool)))
    if len(negs) >= want:
        return negs
    # too few mined candidates (tiny corpora, queries without BM25 matches): pad
    # at random.  Rejection sampling is fast when the judged documents are a small
    # part of the corpus, but the draws are bounded: in a tiny corpus they could
    # keep hitting judged documents, so the rest is picked from an explicit list.
    taken = set(negs)
    for _ in range(4 * want + 16):
        if len(negs) >= want:
            return negs
        d = rng.choice(doc_ids)
        if d not in judged and d not in taken:
            negs.append(d)
            taken.add(d)
    if len(negs) < want:
        rest = [d for d in doc_ids if d not in judged and d not in taken]
        negs.extend(rng.sample(rest, min(want - len(negs), len(rest))))
    return negs


def build_examples(
    data: RetrievalData,
    qids: Sequence[str],
    negatives: Optional[Dict[str, List[str]]],
    cfg: FinetuneConfig,
    rng: random.Random,
) -> List["InputExample"]:
    """InputExamples: (query, positive, hard negatives...) for MNRL, one
    (query, positive, negative) triplet per negative for the triplet loss.

    A query gets ``negatives_per_query`` hard negatives (fewer than
    ``cfg.num_negatives`` only in tiny corpora); with the triplet loss a query
    without any gives no example.
    """
    from sentence_transformers import InputExample

    doc_ids = list(data.corpus)
    counts = negatives_per_query(data, qids, cfg)
    examples = []
    for q in qids:
        judged = data.qrels.get(q, {})
        for pos in data.positives(q):
            texts = [data.queries[q], data.corpus[pos]]
            if negatives is None:
                examples.append(InputExample(texts=texts))
                continue
            negs = sample_negatives(negatives.get(q, []), doc_ids, judged, counts[q], rng)
            if cfg.loss == "triplet":
                examples.extend(InputExample(texts=texts + [data.corpus[n]]) for n in negs)
            else:
                examples.append(InputExample(texts=texts + [data.corpus[n] for n in negs]))
    return examples


def make_loss(model: "SentenceTransformer", cfg: FinetuneConfig) -> torch.nn.Module:
    from sentence_transformers import util
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss, TripletLoss

    if cfg.loss == "triplet":
        return TripletLoss(model, distance_metric=neg_dot_distance, triplet_margin=cfg.margin)
    return MultipleNegativesRankingLoss(model, scale=cfg.scale, similarity_fct=util.dot_score)


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def finetune(
    model: "SentenceTransformer",
    train: RetrievalData,
    cfg: FinetuneConfig,
    dev: Optional[RetrievalData] = None,
    curve_path: Optional[Path] = None,
    **index_kw,
) -> dict:
    """Fine-tune ``model`` (a SentenceTransformer) in place; returns a summary."""
    from torch.utils.data import DataLoader

    cfg.validate()
    seed_everything(cfg.seed)
    rng = random.Random(cfg.seed)
    qids = [q for q in train.query_ids() if train.positives(q)]
    if qids:
        qids = subsample(qids, cfg.train_fraction, cfg.seed)
    qids = check_training_data(train, cfg, qids)
    loss = make_loss(model, cfg)
    evaluator = CurveEvaluator(dev, cfg, curve_path, **index_kw) if dev is not None else None
    if curve_path is not None:
        Path(curve_path).write_text("")
    use_amp = model.device.type == "cuda" and cfg.precision != "fp32"
    rounds = cfg.ance_rounds if cfg.negatives == "ance" else 1
    total_steps, n_examples = 0, 0
    for r in range(rounds):
        if cfg.negatives == "bm25" or (cfg.negatives == "ance" and r == 0 and cfg.ance_first == "bm25"):
            negatives = mine_bm25(train, qids, cfg.neg_top_k)
        elif cfg.negatives == "ance":
            negatives = mine_dense(model, train, qids, cfg.neg_top_k, cfg, **index_kw)
        else:
            negatives = None
        examples = build_examples(train, qids, negatives, cfg, rng)
        if not examples:  # check_training_data rules this out; an empty loader would train 0 steps
            raise DataFormatError(train.folder or train.name, None, "no training example could be built")
        n_examples = len(examples)
        loader = DataLoader(examples, batch_sampler=NoDuplicateBatches(examples, cfg.batch_size, cfg.seed + r))
        steps = len(loader) * cfg.epochs
        if evaluator is not None:
            evaluator.round, evaluator.offset, evaluator.steps_per_epoch = r, total_steps, len(loader)
            if r == 0:
                evaluator.evaluate_at(model, 0)
        model.old_fit(
            train_objectives=[(loader, loss)],
            evaluator=evaluator,
            epochs=cfg.epochs,
            evaluation_steps=cfg.eval_every,
            scheduler="WarmupLinear",
            warmup_steps=int(cfg.warmup_ratio * steps) if r == 0 else 0,
            optimizer_params={"lr": cfg.lr},
            weight_decay=cfg.weight_decay,
            max_grad_norm=cfg.max_grad_norm,
            use_amp=use_amp,
            show_progress_bar=cfg.show_progress,
            output_path=None,
            save_best_model=False,
        )
        total_steps += steps
    return {
        "train_queries": len(qids),
        "train_examples_last_round": n_examples,
        "steps": total_steps,
        "rounds": rounds,
        "curve": evaluator.history if evaluator else [],
    }


def is_finetune_record(path: Path) -> bool:
    """Is ``path`` a ``finetune.json`` this tool wrote (also before it named itself in it)?"""
    try:
        rec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return False
    return isinstance(rec, dict) and (rec.get("tool") == TOOL or {"config", "steps", "train_queries"} <= rec.keys())


def _make_parents(folder: Path) -> List[Path]:
    """mkdir -p ``folder``; returns the folders it created, deepest last."""
    created = []
    for d in reversed([folder, *folder.parents]):
        if not d.exists():
            d.mkdir(exist_ok=True)
            created.append(d)
    return created


def finetune_to_folder(
    model_path: str,
    train: RetrievalData,
    cfg: FinetuneConfig,
    out: Path,
    dev: Optional[RetrievalData] = None,
    device: Optional[str] = None,
    max_seq_length: Optional[int] = None,
    index_kw: Optional[dict] = None,
    representation: Optional[str] = None,
    sparse_top_k: Optional[int] = None,
    force: bool = False,
) -> dict:
    """Fine-tune the model at ``model_path`` and save it as the folder ``out``.

    Every check that can fail runs before the model is loaded and before
    anything is created, so a refused run leaves nothing behind.  The folder is
    built under a temporary name beside ``out`` and renamed over it when
    complete, with ``finetune.json`` (this tool's record, written last, listing
    the files).  An earlier output is replaced only with ``force``, and then
    only the files its record lists: a user's notes or save-dir in ``out`` stay
    (``fileio.staged_output``).  Returns the summary written to the record.
    """
    t0 = time.time()
    # absolute and normalised ("." or "x/.." included): the staging folder goes beside it
    out = Path(os.path.abspath(out))
    earlier = owned_output(out, RECORD, OUT_TOOL, is_own=is_finetune_record)
    if earlier is not None and earlier.complete and not force:
        raise OutputError(out, f"holds an earlier output of {OUT_TOOL}; pass --force to replace its files")
    qids = [q for q in train.query_ids() if train.positives(q)]
    check_training_data(train, cfg, subsample(qids, cfg.train_fraction, cfg.seed) if qids else qids, log=False)
    model = load_model(model_path, device, max_seq_length, representation, sparse_top_k)
    created = _make_parents(out.parent)
    try:
        with staged_output(out, RECORD, OUT_TOOL, replace=force, is_own=is_finetune_record) as staging:
            summary = finetune(
                model, train, cfg, dev=dev, curve_path=staging / "curve.jsonl" if dev else None, **(index_kw or {})
            )
            head = dupmae_head(model)
            if head is not None:
                head.head_config["cls_projection"] += f"; then fine-tuned by {TOOL}"
            save_model(model, staging)  # a DupMAE model keeps its head files (dupmae.py)
            summary.update(
                tool=TOOL,
                config=asdict(cfg),
                model=str(model_path),
                representation="dupmae" if head is not None else "cls",
                data=str(train.folder or train.name),
                split=train.split,
                dev_split=dev.split if dev is not None else None,
                seconds=round(time.time() - t0, 1),
            )
            write_output_record(staging, RECORD, summary)  # the record last: its presence means complete
        created = []
    finally:
        for folder in reversed(created):  # parents this run made for OUT, if still empty
            try:
                folder.rmdir()
            except OSError:
                break
    return summary
