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

Training uses sentence-transformers' own loop (``SentenceTransformer.old_fit``:
AdamW, linear warm-up/decay, gradient clipping, AMP on CUDA) rather than
``SentenceTransformerTrainer``, which would add the ``datasets`` and
``accelerate`` packages for no gain here.
"""
import argparse
import json
import random
import sys
import time
from collections import deque
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence

import numpy as np
import torch

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from examples.retrieval.bm25 import BM25  # noqa: E402
from examples.retrieval.data import DataFormatError, RetrievalData, load_data, subsample  # noqa: E402
from examples.retrieval.evaluate import add_search_args, evaluate_model, index_kwargs  # noqa: E402
from examples.retrieval.search import DenseRetriever, load_model  # noqa: E402

CURVE_METRICS = ("MRR@10", "R@100", "nDCG@10")


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


def neg_dot_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """TripletLoss minimises d(q,d+) - d(q,d-) + margin; with d = -dot this is the paper's loss."""
    return -(a * b).sum(-1)


class NoDuplicateBatches:
    """Batch sampler: reshuffled every epoch, no text twice in one batch.

    With in-batch negatives a passage that is one query's positive and another's
    hard negative in the same batch would be a false negative.  The library's
    NoDuplicatesDataLoader loops forever when a batch cannot be filled, so
    conflicting examples are deferred to a later batch instead.
    """

    def __init__(self, examples, batch_size: int, seed: int):
        self.keys = [frozenset(t.strip().lower() for t in ex.texts) for ex in examples]
        self.batch_size = batch_size
        self.rng = random.Random(seed)

    def __len__(self):
        return max(1, len(self.keys) // self.batch_size) if self.keys else 0

    def __iter__(self):
        pending = deque(self.rng.sample(range(len(self.keys)), len(self.keys)))
        for _ in range(len(self)):
            batch, seen, deferred = [], set(), []
            while pending and len(batch) < self.batch_size:
                i = pending.popleft()
                if self.keys[i] & seen:
                    deferred.append(i)
                else:
                    batch.append(i)
                    seen |= self.keys[i]
            pending.extendleft(reversed(deferred))
            if not batch:
                return
            yield batch


class CurveEvaluator:
    """Dev-set retrieval metrics during training, appended to a JSON-lines curve.

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
        step = self.offset + (epoch * self.steps_per_epoch + steps if steps >= 0
                              else (epoch + 1) * self.steps_per_epoch)
        return self.evaluate_at(model, step)

    def evaluate_at(self, model, step: int) -> float:
        if step == self.last_step:
            return self.history[-1]["MRR@10"]
        metrics, _ = evaluate_model(model, self.dev, k=self.cfg.eval_k, batch_size=self.cfg.encode_batch_size,
                                    precision=self.cfg.precision, index=self.cfg.index,
                                    show_progress=False, **self.index_kw)
        row = {"step": step, "round": self.round, **{m: metrics[m] for m in CURVE_METRICS}}
        self.history.append(row)
        self.last_step = step
        if self.curve_path is not None:
            with open(self.curve_path, "a", encoding="utf-8") as f:
                f.write(json.dumps(row) + "\n")
        print(f"[dev] {json.dumps(row)}", file=sys.stderr)
        model.train()
        return row["MRR@10"]


def mine_bm25(data: RetrievalData, qids: Sequence[str], k: int) -> Dict[str, List[str]]:
    bm25 = BM25(data.corpus)
    run = bm25.retrieve({q: data.queries[q] for q in qids}, k=k + 10)
    return {q: _ranked_non_positives(run.get(q, {}), data.qrels.get(q, {}), k) for q in qids}


def mine_dense(model, data: RetrievalData, qids: Sequence[str], k: int, cfg: FinetuneConfig,
               **index_kw) -> Dict[str, List[str]]:
    retriever = DenseRetriever(model, data.corpus, batch_size=cfg.encode_batch_size, precision=cfg.precision,
                               index=cfg.index, show_progress=cfg.show_progress, **index_kw)
    run = retriever.retrieve({q: data.queries[q] for q in qids}, k=k + 10)
    return {q: _ranked_non_positives(run.get(q, {}), data.qrels.get(q, {}), k) for q in qids}


def _ranked_non_positives(scores: Dict[str, float], rels: Dict[str, int], k: int) -> List[str]:
    # every judged document is excluded, not only positives: a judged 0 may be a near-miss label
    ranked = sorted(scores, key=lambda d: -scores[d])
    return [d for d in ranked if d not in rels][:k]


def build_examples(data: RetrievalData, qids: Sequence[str], negatives: Optional[Dict[str, List[str]]],
                   cfg: FinetuneConfig, rng: random.Random):
    from sentence_transformers import InputExample

    doc_ids = list(data.corpus)
    examples = []
    for q in qids:
        for pos in data.positives(q):
            if negatives is None:
                examples.append(InputExample(texts=[data.queries[q], data.corpus[pos]]))
                continue
            pool = negatives.get(q, [])
            negs = rng.sample(pool, min(cfg.num_negatives, len(pool)))
            # too few mined candidates (tiny corpora, queries without BM25 matches): pad at random
            while len(negs) < cfg.num_negatives:
                d = rng.choice(doc_ids)
                if d not in data.qrels.get(q, {}) and d not in negs:
                    negs.append(d)
            texts = [data.queries[q], data.corpus[pos]]
            if cfg.loss == "triplet":
                examples.extend(InputExample(texts=texts + [data.corpus[n]]) for n in negs)
            else:
                examples.append(InputExample(texts=texts + [data.corpus[n] for n in negs]))
    return examples


def make_loss(model, cfg: FinetuneConfig):
    from sentence_transformers import util
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss, TripletLoss

    if cfg.loss == "triplet":
        return TripletLoss(model, distance_metric=neg_dot_distance, triplet_margin=cfg.margin)
    return MultipleNegativesRankingLoss(model, scale=cfg.scale, similarity_fct=util.dot_score)


def seed_everything(seed: int):
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


def finetune(model, train: RetrievalData, cfg: FinetuneConfig, dev: Optional[RetrievalData] = None,
             curve_path: Optional[Path] = None, **index_kw) -> dict:
    """Fine-tune ``model`` (a SentenceTransformer) in place; returns a summary."""
    from torch.utils.data import DataLoader

    if cfg.loss == "triplet" and cfg.negatives == "none":
        raise ValueError("--loss triplet needs negatives: use --negatives bm25 or ance")
    seed_everything(cfg.seed)
    rng = random.Random(cfg.seed)
    qids = [q for q in train.query_ids() if train.positives(q)]
    if not qids:
        raise ValueError(f"no training query of split {train.split!r} has a positive document in the corpus")
    qids = subsample(qids, cfg.train_fraction, cfg.seed)
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
    return {"train_queries": len(qids), "train_examples_last_round": n_examples, "steps": total_steps,
            "rounds": rounds, "curve": evaluator.history if evaluator else []}


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", required=True, help="exported HF / sentence-transformers folder to start from")
    p.add_argument("--data", required=True, help="BEIR or MS MARCO folder")
    p.add_argument("--split", default="train")
    p.add_argument("--out", required=True, help="where the fine-tuned sentence-transformers model goes")
    p.add_argument("--dev-split", default=None,
                   help="split for the dev curve (default with --eval-every: 'dev' if the folder has it)")
    d = FinetuneConfig()
    p.add_argument("--negatives", choices=("bm25", "ance", "none"), default=d.negatives)
    p.add_argument("--loss", choices=("mnrl", "triplet"), default=d.loss)
    p.add_argument("--train-fraction", type=float, default=d.train_fraction)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--train-batch-size", type=int, default=d.batch_size, help="queries per step")
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--epochs", type=int, default=d.epochs, help="epochs (per round with --negatives ance)")
    p.add_argument("--warmup-ratio", type=float, default=d.warmup_ratio)
    p.add_argument("--weight-decay", type=float, default=d.weight_decay)
    p.add_argument("--num-negatives", type=int, default=d.num_negatives, help="hard negatives per query")
    p.add_argument("--neg-top-k", type=int, default=d.neg_top_k, help="sample hard negatives from this top-k")
    p.add_argument("--ance-rounds", type=int, default=d.ance_rounds)
    p.add_argument("--ance-first", choices=("dense", "bm25"), default=d.ance_first,
                   help="negatives of the first ANCE round: the starting model's own top-k, or BM25")
    p.add_argument("--margin", type=float, default=d.margin, help="triplet margin")
    p.add_argument("--scale", type=float, default=d.scale, help="MNRL logit scale (1 = raw dot product)")
    p.add_argument("--eval-every", type=int, default=0,
                   help="dev metrics every N steps within an epoch (0: step 0 and epoch ends only)")
    p.add_argument("--eval-k", type=int, default=d.eval_k)
    p.add_argument("--no-progress", action="store_true")
    add_search_args(p)
    args = p.parse_args(argv)

    cfg = FinetuneConfig(
        negatives=args.negatives, loss=args.loss, train_fraction=args.train_fraction, seed=args.seed,
        batch_size=args.train_batch_size, lr=args.lr, epochs=args.epochs, warmup_ratio=args.warmup_ratio,
        weight_decay=args.weight_decay, num_negatives=args.num_negatives, neg_top_k=args.neg_top_k,
        ance_rounds=args.ance_rounds, ance_first=args.ance_first, margin=args.margin, scale=args.scale,
        eval_every=args.eval_every, eval_k=args.eval_k, encode_batch_size=args.batch_size,
        precision=args.precision, index=args.index, show_progress=not args.no_progress,
    )
    data_dir = Path(args.data)
    dev_split = args.dev_split
    # dev evaluation re-encodes the whole corpus: only when a curve is asked for
    if dev_split is None and args.eval_every > 0 and (
            (data_dir / "qrels" / "dev.tsv").is_file() or (data_dir / "qrels.dev.tsv").is_file()):
        dev_split = "dev"
    try:
        train = load_data(data_dir, args.split)
        dev = load_data(data_dir, dev_split) if dev_split else None
    except DataFormatError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    t0 = time.time()
    model = load_model(args.model, args.device, args.max_seq_length)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    summary = finetune(model, train, cfg, dev=dev, curve_path=out / "curve.jsonl" if dev else None,
                       **index_kwargs(args))
    model.save(str(out))
    summary.update(config=asdict(cfg), model=str(args.model), data=str(data_dir), split=args.split,
                   dev_split=dev_split, seconds=round(time.time() - t0, 1))
    (out / "finetune.json").write_text(json.dumps(summary, indent=2) + "\n")
    last = summary["curve"][-1] if summary["curve"] else {}
    print(json.dumps({"out": str(out), "steps": summary["steps"], "train_queries": summary["train_queries"],
                      **{k: v for k, v in last.items() if k in CURVE_METRICS}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
