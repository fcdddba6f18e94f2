"""Fine-tune an exported encoder as a shared-weight dual encoder, in the model's own representation.

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
* The model keeps its representation: its pooling and normalisation (the folder's
  sentence-transformers modules, saved back as they are) and its similarity s
  (``config_sentence_transformers.json``'s, cosine for a model that normalises; the
  papers' [CLS] models compare by dot product; ``--representation cls`` forces [CLS] + dot).
* ``--loss mnrl`` (default): sentence-transformers' MultipleNegativesRankingLoss,
  a softmax over in-batch + hard negatives of s x ``--scale``.  The default scale
  follows the similarity: 20 for cosine (sentence-transformers' default for its
  cosine models), 1 for dot product (DPR's softmax over raw dot products).
  ``--loss triplet``: the paper's Eq. (4.2) ``relu(margin - (s(q,d+) - s(q,d-)))``,
  via TripletLoss with -s as "distance".
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

import json
import os
import random
import sys
import time
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

import numpy as np
import torch

from ...base.derived_set import subsample
from ...base.fileio import OutputError, owned_output, staged_dir
from ...base.retrieval_data import DataFormatError, RetrievalData
from . import representations
from .batching import (
    NoDuplicateBatches,
    build_examples,
    check_training_data,
)
from .config import FinetuneConfig
from .curve import CurveEvaluator, ProgressLog
from .index import NonFiniteError
from .negatives import mine_bm25, mine_dense
from .search import FOLDER_ATTR, length_source, load_model, similarity

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer
    from torch.utils.hooks import RemovableHandle
TOOL = "examples/retrieval/finetune.py"
RECORD = "finetune.json"  # this tool's record in OUT: the files it may replace
OUT_TOOL = "finetune.py"  # how messages about OUT name the tool


# MNRL's logit scale by the model's similarity when --scale is not given: sentence-transformers'
# default for its cosine models, DPR's raw dot products
SCALES = {"cosine": 20.0, "dot": 1.0}


def neg_dot_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """TripletLoss minimises d(q,d+) - d(q,d-) + margin; with d = -dot this is the paper's loss."""
    return -(a * b).sum(-1)


def neg_cosine_distance(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """d = -cosine: the paper's loss for a model that compares by cosine."""
    return -torch.nn.functional.cosine_similarity(a, b, dim=-1)


def loss_scale(model: "SentenceTransformer", cfg: FinetuneConfig) -> float:
    """MNRL's logit scale: ``--scale``, else the one of the model's similarity (:data:`SCALES`)."""
    return float(cfg.scale) if cfg.scale is not None else SCALES[similarity(model)]


def make_loss(model: "SentenceTransformer", cfg: FinetuneConfig) -> torch.nn.Module:
    """The loss in the model's similarity (``search.similarity``): dot product or cosine."""
    from sentence_transformers import util
    from sentence_transformers.sentence_transformer.losses import MultipleNegativesRankingLoss, TripletLoss

    cosine = similarity(model) == "cosine"
    if cfg.loss == "triplet":
        distance = neg_cosine_distance if cosine else neg_dot_distance
        return TripletLoss(model, distance_metric=distance, triplet_margin=cfg.margin)
    return MultipleNegativesRankingLoss(
        model, scale=loss_scale(model, cfg), similarity_fct=util.cos_sim if cosine else util.dot_score
    )


def diverged(model: "SentenceTransformer", problem: str, cfg: FinetuneConfig) -> NonFiniteError:
    where = getattr(model, FOLDER_ATTR, None) or "the model"
    return NonFiniteError(
        f"{where}: fine-tuning diverged: {problem} (learning rate {cfg.lr:g}); nothing is saved or scored: try a "
        "lower learning rate"
    )


def stop_when_diverged(
    model: "SentenceTransformer", loss: torch.nn.Module, cfg: FinetuneConfig, amp: bool
) -> "RemovableHandle":
    """A forward hook on ``loss`` (one call per training step) that raises :class:`NonFiniteError` at the
    first loss that is NaN or infinite; with AMP only the weights are checked (``finetune``), since
    its gradient scaler skips the steps whose fp16 loss overflowed.  Returns the handle."""
    step = [0]

    def hook(module, inputs, output) -> None:
        step[0] += 1
        if not amp and not bool(torch.isfinite(output.detach()).all()):
            raise diverged(model, f"the loss is {float(output.detach())} at step {step[0]}", cfg)

    return loss.register_forward_hook(hook)


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
        watching = ProgressLog().watch(loss, steps, r, rounds)
        guard = stop_when_diverged(model, loss, cfg, use_amp)
        try:
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
        finally:
            watching.remove()
            guard.remove()
        bad = [name for name, p in model.named_parameters() if not bool(torch.isfinite(p.detach()).all())]
        if bad:
            raise diverged(model, f"weights hold NaN or infinite values after round {r + 1} ({bad[0]})", cfg)
        total_steps += steps
    return {
        "train_queries": len(qids),
        "similarity": similarity(model),
        "scale": loss_scale(model, cfg) if cfg.loss == "mnrl" else None,
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
    print(length_source(model, max_seq_length), file=sys.stderr)
    created = _make_parents(out.parent)
    try:
        with staged_dir(out, RECORD, OUT_TOOL, replace=force, is_own=is_finetune_record) as (staging, record):
            summary = finetune(
                model, train, cfg, dev=dev, curve_path=staging / "curve.jsonl" if dev else None, **(index_kw or {})
            )
            rep = representations.of_model(model)
            rep.mark_finetuned(model, TOOL)
            rep.save(model, staging)  # a DupMAE model keeps its head files (seed_fairseq/encoders/dupmae/)
            summary.update(
                tool=TOOL,
                config=asdict(cfg),
                model=str(model_path),
                representation=rep.name,
                data=str(train.folder or train.name),
                split=train.split,
                dev_split=dev.split if dev is not None else None,
                seconds=round(time.time() - t0, 1),
            )
            record.update(summary)  # written last (staged_dir): its presence means complete
        created = []
    finally:
        for folder in reversed(created):  # parents this run made for OUT, if still empty
            try:
                folder.rmdir()
            except OSError:
                break
    return summary
