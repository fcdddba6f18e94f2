"""What fairseq-train gets from the plan and the import, and which of its checkpoints the adapted model is.

The objective's arguments are every workflow's (``kit.objectives.objective_args``:
the same task, criterion, arch and schedule options), with the import's
``model_args.txt`` after ``--arch``, the import as ``--finetune-from-model``, the
encoder's own schedule while the heads the model lacks catch up
(``tasks/encoder_lr.py``), and the validation that scores the dev set and keeps
the best checkpoint.  Everything read from the import is read when the stage runs
(the stage's fingerprint covers the import), never when the stages are listed.
"""

from dataclasses import replace
from pathlib import Path
from typing import Any, Dict, List, Optional

from ..kit.folder import StageError
from ..kit.logs import read_valid
from ..kit.objectives import ObjectiveSpec, generator_args, objective_args
from .plan import FREEZE_SHARE, Paths


class Training(Paths):
    """The continued pre-training of one plan."""

    @property
    def spec(self) -> ObjectiveSpec:
        return self.plan.objective

    def model_args(self) -> List[str]:
        """The import's ``model_args.txt``: its encoder's sizes, after the objective's ``--arch``."""
        from ...encoders.hf.import_ import read_model_args

        return read_model_args(self.imported) or []

    def new_heads(self) -> List[str]:
        """The heads of the objective's model the original model does not have: the import's
        ``fresh_heads`` (its MLM head, when it was saved without one) and the objective's
        pre-training heads (``heads`` of its description, ``seed_fairseq/base/objectives.py``; freshly
        initialised, except SimLM's decoder, copied from the encoder's last layers).  Untrained
        for the encoder's outputs, each sends it large gradients at first."""
        return [*self.import_record()["fresh_heads"], *(h.rstrip(".") for h in self.spec.description.heads)]

    def freeze_updates(self) -> int:
        """--freeze-encoder-updates: the user's, or FREEZE_SHARE of the updates when there is a new head."""
        p = self.plan
        if p.freeze_updates is not None:
            return p.freeze_updates
        return round(FREEZE_SHARE * p.pretrain.updates) if self.new_heads() else 0

    def safeguard_args(self, freeze: Optional[int] = None) -> List[str]:
        """The encoder's own schedule while the new heads catch up (tasks/encoder_lr.py)."""
        p = self.plan
        return [
            "--freeze-encoder-updates", str(self.freeze_updates() if freeze is None else freeze),
            "--encoder-warmup-updates", str(p.encoder_warmup_updates),
            "--encoder-lr-scale", str(p.encoder_lr_scale),
            "--layer-lr-decay", str(p.layer_lr_decay),
        ]  # fmt: skip

    def selection_args(self) -> List[str]:
        """Validation scores the dev set (or the probe) and fairseq keeps the best checkpoint by it."""
        p = self.plan
        dev = ["--retrieval-dev", str(self.retrieval_dir), "--retrieval-dev-split", "dev"] if p.dev_in_training else []
        return [*dev, "--best-checkpoint-metric", p.best_metric, "--maximize-best-checkpoint-metric"]

    def generator_checkpoint(self) -> Path:
        """SimLM's frozen masked LM: the import itself when its MLM head was imported, else the head
        trained on the frozen import (``stage_generator``)."""
        from ...encoders.hf.import_ import CHECKPOINT

        if self.import_record().get("mlm_head") == "fresh":
            return self.generator_dir / "checkpoint_last.pt"
        return self.imported / CHECKPOINT

    def warm_start(self) -> List[str]:
        from ...encoders.hf.import_ import CHECKPOINT

        # loaded only while the save-dir has no checkpoint of its own: a rerun resumes
        return ["--finetune-from-model", str(self.imported / CHECKPOINT)]

    def pretrain_args(self, planned: bool = False) -> List[str]:
        """fairseq-train's arguments (after DATA) of the continued pre-training.  ``planned``: the
        tool's own, before the import exists (placeholders for what it decides) and without
        --fairseq-args: the options --fairseq-args may not set (``cli.build_plan``)."""
        p = self.plan
        own = [*self.warm_start(), *self.safeguard_args(0 if planned else None), *self.selection_args()]
        s = replace(
            p.pretrain,
            encoder_args=[] if planned else self.model_args(),
            fairseq_args=own if planned else [*own, *p.pretrain.fairseq_args],
        )
        gen = ("GENERATOR" if planned else str(self.generator_checkpoint())) if self.spec.needs_generator else None
        args = objective_args(self.spec, s, p.seed, gen)
        if planned and self.spec.needs_generator:  # its generator may be trained with --fairseq-args too
            args += self.generator_train_args(planned=True)
        return args

    def generator_train_args(self, planned: bool = False) -> List[str]:
        """The import's MLM head trained alone (the encoder frozen for every update): a masked LM
        that predicts with the model's own features, for SimLM's replaced tokens."""
        p = self.plan
        s = replace(p.pretrain, updates=p.generator_updates, warmup=max(1, p.generator_updates // 10))
        rest = [*self.warm_start(), "--freeze-encoder-updates", str(p.generator_updates)]
        return generator_args(s, p.seed, *rest, *([] if planned else s.fairseq_args),
                              model=[] if planned else self.model_args())  # fmt: skip

    def choose_checkpoint(self) -> Dict[str, Any]:
        """The checkpoint the adapted model is: fairseq's ``checkpoint_best.pt`` (the best
        validation by ``--best-checkpoint-metric``) if it scored above the starting model
        (``<metric>_vs_start`` > 0 at its validation; the task logs the start's score), else
        the start itself: the adapted model is then the original.  A tie keeps the start (a
        checkpoint of the frozen encoder ties it with the original encoder)."""
        from ...encoders.hf.import_ import CHECKPOINT
        from ...pretrain.checkpoint import CheckpointError, num_updates, peek_checkpoint

        metric = self.plan.best_metric
        rows = {int(r["num_updates"]): r for r in read_valid(self.pretrain_dir / "train.log") if metric in r}
        best = self.pretrain_dir / "checkpoint_best.pt"
        start = next((r[metric] - r[f"{metric}_vs_start"] for r in rows.values() if f"{metric}_vs_start" in r), None)
        chosen = {"metric": metric, "start": start, "validations": {u: r[metric] for u, r in sorted(rows.items())}}
        if best.is_file():
            try:
                update = num_updates(peek_checkpoint(best))
            except CheckpointError as e:
                raise StageError(best, str(e)) from None
            value = rows.get(update, {}).get(metric)
            if value is not None and (start is None or value > start):
                return {**chosen, "checkpoint": str(best), "update": update, "value": value, "kept_start": False}
        return {**chosen, "checkpoint": str(self.imported / CHECKPOINT), "update": 0, "value": start,
                "kept_start": True}  # fmt: skip
