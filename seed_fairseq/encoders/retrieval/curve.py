"""Watching fine-tuning: the dev curve (``--eval-every``: retrieval metrics during training,
appended to ``OUT/curve.jsonl``, Figure 6a/b) and the progress lines on stderr."""

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING, List, Optional

from ...base.retrieval_data import RetrievalData
from .config import FinetuneConfig
from .evaluate import evaluate_model
from .metrics import CURVE_METRICS

if TYPE_CHECKING:
    import torch
    from sentence_transformers import SentenceTransformer
    from torch.utils.hooks import RemovableHandle

PROGRESS_SECONDS = 30.0  # a progress line at least this often (and at the first and last step)


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    h, rest = divmod(seconds, 3600)
    m, s = divmod(rest, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s" if m else f"{s}s"


class ProgressLog:
    """Progress lines on stderr during ``old_fit`` (step, mean loss, rate, ETA), whether or not
    the progress bar is shown (``--no-progress`` turns off the bar only): one at the first step,
    then one every ``every`` seconds, and one at the last step of each round.

    It is a forward hook on the loss module (each forward is one training step), so the loss
    sentence-transformers trains, and the model card it writes, stay the loss itself.
    """

    def __init__(self, every: float = PROGRESS_SECONDS, stream=None):
        self.every, self.stream = every, stream

    def watch(self, loss: "torch.nn.Module", steps: int, round_: int = 0, rounds: int = 1) -> "RemovableHandle":
        """Hook ``loss`` for a round of ``steps`` steps; returns the handle (``.remove()`` it)."""
        start = last = time.monotonic()
        state = {"step": 0, "sum": 0.0, "n": 0}
        where = f" (round {round_ + 1}/{rounds})" if rounds > 1 else ""

        def hook(module, inputs, output) -> None:
            nonlocal last
            state["step"] += 1
            state["sum"] += float(output.detach())
            state["n"] += 1
            step, now = state["step"], time.monotonic()
            if step == 1 or step >= steps or now - last >= self.every:
                rate = step / max(now - start, 1e-9)
                eta = (steps - step) / rate
                print(
                    f"[train] step {step}/{steps}{where} loss {state['sum'] / state['n']:.4f} "
                    f"{rate:.2f} steps/s elapsed {_duration(now - start)} ETA {_duration(eta)}",
                    file=self.stream or sys.stderr,
                    flush=True,
                )
                last, state["sum"], state["n"] = now, 0.0, 0

        return loss.register_forward_hook(hook)


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
            names=CURVE_METRICS,  # refused when --eval-k is below R@100's cutoff (config.validate)
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
