"""The encoder's own learning rate while continuing a trained model: freeze, warm-up, scale, layer decay.

Continuing an encoder with a bottleneck objective adds parameters it has never
seen: the decoders and projections of every objective, and the MLM head of a
model saved without one (a sentence-embedding model).  At their first updates
those fresh heads send large, meaningless gradients into the encoder, which
measurably damages what it knew (issue 23: zero-shot MRR@10 of all-MiniLM-L6-v2
0.63 -> 0.43-0.54 after 40 updates).  The remedy of the fine-tuning literature
(ULMFiT's gradual unfreezing, ELECTRA/BEiT's layer-wise decay) applied here:

* ``--freeze-encoder-updates N``: the first N updates train only what lies
  outside the encoder body (``encoder.sentence_encoder.*``: embeddings and
  layers; the MLM head's output weight is tied to the token embeddings and so
  counts as encoder).  Its gradients are zeroed before the update (they leave
  the gradient norm and clipping to the heads, and Adam's moments empty) and
  its learning rate is 0, so its weights stay exactly what they were -- also
  under fairseq's decoupled weight decay, which moves any parameter with a
  gradient, even a zero one.
* ``--encoder-warmup-updates W`` (default: N): then the encoder's learning rate
  rises linearly from 0 to its full value over W updates, whatever the
  schedule of the heads is doing.
* ``--encoder-lr-scale S``: the encoder's learning rate is S times the
  scheduled one (the heads keep the scheduled one).
* ``--layer-lr-decay D``: BEiT/ELECTRA layer-wise decay -- layer i of L gets
  D^(L - i), the embeddings D^(L + 1), the heads 1.

The factors multiply.  fairseq has one parameter group and sets one learning
rate on all groups; ``fairseq_patches/optimizer_groups.py`` splits the
optimizer's group along :func:`group_labels` and :meth:`EncoderSchedule.scale`
gives each group's factor at each update (``EncoderLRHooks.optimizer_step``).
Everything depends on the update number only, so a resumed run continues the
same schedule.
"""

import logging
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple

import torch

from ...base.errors import ConfigurationError
from ..fairseq_patches.optimizer_groups import GROUP_KEY

logger = logging.getLogger(__name__)

ENCODER_BODY = "encoder.sentence_encoder."
HEADS = "heads"
EMBEDDINGS = "encoder.embeddings"
LAYER = "encoder.layer"  # + the layer's index


def layer_label(i: int) -> str:
    return f"{LAYER}{i}"


@dataclass(frozen=True)
class EncoderSchedule:
    freeze_updates: int = 0
    warmup_updates: int = 0
    lr_scale: float = 1.0
    layer_decay: float = 1.0
    layers: int = 0  # the encoder's number of layers (for the decay)

    @classmethod
    def from_cfg(cls, cfg, layers: int = 0) -> "EncoderSchedule":
        """The schedule of the task options (refused in one line when out of range)."""
        freeze, warmup = cfg.freeze_encoder_updates, cfg.encoder_warmup_updates
        if freeze < 0:
            raise ConfigurationError(f"--freeze-encoder-updates must be >= 0, got {freeze}")
        if warmup < -1:
            raise ConfigurationError(
                f"--encoder-warmup-updates must be >= 0 (or -1: as --freeze-encoder-updates), got {warmup}"
            )
        if not cfg.encoder_lr_scale >= 0:
            raise ConfigurationError(f"--encoder-lr-scale must be >= 0, got {cfg.encoder_lr_scale}")
        if not 0 < cfg.layer_lr_decay <= 1:
            raise ConfigurationError(f"--layer-lr-decay must be in (0, 1], got {cfg.layer_lr_decay}")
        return cls(
            freeze_updates=freeze,
            warmup_updates=freeze if warmup == -1 else warmup,
            lr_scale=float(cfg.encoder_lr_scale),
            layer_decay=float(cfg.layer_lr_decay),
            layers=layers,
        )

    @property
    def active(self) -> bool:
        """Whether the encoder's learning rate ever differs from the heads' (else one group serves)."""
        return bool(self.freeze_updates or self.warmup_updates or self.lr_scale != 1 or self.layer_decay != 1)

    def frozen(self, update_num: int) -> bool:
        return update_num < self.freeze_updates

    def ramp(self, update_num: int) -> float:
        """The freeze and warm-up factor of the encoder at 0-based update ``update_num``."""
        if self.frozen(update_num):
            return 0.0
        if self.warmup_updates <= 0:
            return 1.0
        return min(1.0, (update_num - self.freeze_updates + 1) / self.warmup_updates)

    def depth_factor(self, label: str) -> float:
        """The constant factor of a group: 1 for the heads, S x D^k for the encoder's."""
        if label == HEADS:
            return 1.0
        if label == EMBEDDINGS:
            k = self.layers + 1
        else:
            k = self.layers - int(label[len(LAYER) :])
        return self.lr_scale * self.layer_decay**k

    def scale(self, label: str, update_num: int) -> float:
        """The factor on the scheduled learning rate of group ``label`` at update ``update_num``."""
        if label == HEADS:
            return 1.0
        return self.depth_factor(label) * self.ramp(update_num)

    def describe(self) -> str:
        """One log line: what the encoder's learning rate does."""
        parts = []
        if self.freeze_updates:
            parts.append(f"frozen for the first {self.freeze_updates} updates (only the heads train)")
        if self.warmup_updates:
            parts.append(f"then warmed up from 0 over {self.warmup_updates} updates")
        if self.lr_scale != 1:
            parts.append(f"x{self.lr_scale:g} the scheduled learning rate")
        if self.layer_decay != 1:
            parts.append(
                f"layer decay {self.layer_decay:g} (top layer x{self.depth_factor(layer_label(self.layers - 1)):.3g}, "
                f"embeddings x{self.depth_factor(EMBEDDINGS):.3g})"
            )
        return "encoder learning rate: " + ", ".join(parts) + "; the heads follow the schedule"


def group_of(name: str) -> str:
    """The learning-rate group of parameter ``name`` (a name of ``model.named_parameters()``, of
    the model or of its distributed wrappers, which prefix ``module.``)."""
    while name.startswith("module."):
        name = name[len("module.") :]
    if not name.startswith(ENCODER_BODY):
        return HEADS
    rest = name[len(ENCODER_BODY) :].split(".")
    if rest[0] == "layers" and len(rest) > 1 and rest[1].isdigit():
        return layer_label(int(rest[1]))
    return EMBEDDINGS  # token/position embeddings and their LayerNorm


def group_labels(model: torch.nn.Module) -> Dict[int, str]:
    """``{id(parameter): group}`` over ``model``'s parameters (a shared tensor takes the
    group of its first name: the tied output embedding is the encoder's token embedding)."""
    return {id(p): group_of(name) for name, p in model.named_parameters()}


def encoder_parameters(model: torch.nn.Module) -> List[torch.nn.Parameter]:
    """The encoder body's parameters (what ``--freeze-encoder-updates`` holds still)."""
    return [p for name, p in model.named_parameters() if group_of(name) != HEADS]


def zero_grads(params: List[torch.nn.Parameter]) -> None:
    for p in params:
        if p.grad is not None:
            p.grad.zero_()


def encoder_layers(model: torch.nn.Module) -> Optional[int]:
    layers = getattr(getattr(getattr(model, "encoder", None), "sentence_encoder", None), "layers", None)
    return len(layers) if layers is not None else None


class EncoderLRHooks:
    """The task's hooks of the encoder's own learning rate (``fairseq_patches/optimizer_groups.py``)."""

    def train_step(
        self, sample, model, criterion, optimizer, update_num, ignore_grad=False
    ) -> Tuple[torch.Tensor, Any, Dict[str, Any]]:
        out = super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)
        schedule, encoder = self.encoder_schedule(model)
        if schedule.frozen(update_num):
            zero_grads(encoder)  # out of the gradient norm and Adam's moments
        return out

    def encoder_schedule(self, model) -> Tuple[EncoderSchedule, List[torch.nn.Parameter]]:
        """The encoder's schedule for ``model`` (whose depth the layer decay needs) and its body's parameters."""
        if self._encoder_lr is None or self._encoder_lr[0] != id(model):
            schedule = EncoderSchedule.from_cfg(self.cfg, encoder_layers(model) or 0)
            self._encoder_lr = (id(model), schedule, encoder_parameters(model))
        return self._encoder_lr[1:]

    def lr_group_labels(self, model) -> Optional[Dict[int, str]]:
        """``{id(parameter): learning-rate group}`` for the optimizer, None when one group serves."""
        schedule, _ = self.encoder_schedule(model)
        if not schedule.active:
            return None
        logger.info(schedule.describe())
        return group_labels(model)

    def optimizer_step(self, optimizer, model, update_num) -> None:
        schedule, _ = self.encoder_schedule(model)
        if not schedule.active:
            return super().optimizer_step(optimizer, model, update_num)
        if schedule.freeze_updates and update_num == schedule.freeze_updates:
            logger.info(f"update {update_num + 1}: the encoder trains from now on")
        groups = optimizer.param_groups
        scheduled = [g["lr"] for g in groups]
        for g in groups:
            g["lr"] *= schedule.scale(g.get(GROUP_KEY, HEADS), update_num)
        try:
            super().optimizer_step(optimizer, model, update_num)
        finally:  # the scheduler, the log and the saved state keep the scheduled rate
            for g, lr in zip(groups, scheduled):
                g["lr"] = lr
