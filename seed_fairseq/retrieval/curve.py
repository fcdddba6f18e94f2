"""The dev curve of fine-tuning (``--eval-every``): retrieval metrics during training,
appended to ``OUT/curve.jsonl`` (Figure 6a/b)."""

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

from .config import FinetuneConfig
from .data import RetrievalData
from .evaluate import evaluate_model

if TYPE_CHECKING:
    from sentence_transformers import SentenceTransformer

CURVE_METRICS = ("MRR@10", "R@100", "nDCG@10")


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
