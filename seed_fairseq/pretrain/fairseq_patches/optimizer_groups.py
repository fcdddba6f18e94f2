"""Parameter groups with their own learning rate in fairseq's optimizers (fix 10).

fairseq 0.12 builds every optimizer over one parameter group
(``Trainer._build_optimizer``) and its schedulers set one learning rate on all
groups (``FairseqOptimizer.set_lr``); per-group rates exist only through the
``composite`` optimizer, which needs one optimizer and one scheduler config per
group in a YAML file.  The encoder's own schedule of continued pre-training
(``tasks/encoder_lr.py``) needs the encoder's groups at a fraction of the
scheduled rate, so the replacement of ``_build_optimizer``:

1. asks the task for ``lr_group_labels(model)`` (``{id(parameter): label}``,
   or None when one group serves) -- tasks without that method are untouched;
2. with labels, turns off fairseq's flattening of fp16/bf16 parameters
   (``--fp16-no-flatten-grads``: a flat fp32 copy is one tensor, which cannot
   be split), then builds the optimizer as fairseq does;
3. splits the torch optimizer's single group into runs of consecutive
   parameters with the same label (each group remembers it as
   ``GROUP_KEY``), before any state is loaded.

Because the groups are consecutive runs of fairseq's own parameter order, the
index of every parameter in a saved optimizer state is the same whatever the
grouping; the optimizer's ``load_state_dict`` is wrapped to re-cut a saved
state's groups to the current ones.  A run can therefore be resumed with the
encoder's schedule turned on or off, and a checkpoint of a run without it
resumes with it.  The task sets each group's rate around the step
(``BottleneckPretrainTask.optimizer_step``) and puts the scheduled one back,
so fairseq's scheduler, its ``lr`` log column and its saved state never see
the factors.

The same replacement lets a run of fairseq's ``adam`` resume with ``torch_adam`` and back
(``optimizer_switch.accept_switch``, called once the optimizer is built: fairseq compares the
checkpoint's optimizer with it right after).
"""

import functools
from typing import TYPE_CHECKING, Dict, List, Optional

if TYPE_CHECKING:
    import torch

from ._common import MARK, logger, mark
from .optimizer_switch import accept_switch

GROUP_KEY = "seed_fairseq_lr_group"


def torch_optimizer(optimizer) -> "torch.optim.Optimizer":
    """The ``torch.optim.Optimizer`` inside fairseq's wrappers (fp16, memory-efficient, AMP)."""
    inner = optimizer
    for attribute in ("fp32_optimizer", "wrapped_optimizer"):
        inner = getattr(inner, attribute, inner)
    return inner.optimizer


def held_labels(optimizer, labels: Dict[int, str]) -> List[str]:
    """The label of each parameter the torch optimizer holds, in its order.  fairseq's fp16
    optimizer (unflattened) holds fp32 copies, in the order of the model's parameters."""
    held = torch_optimizer(optimizer).param_groups[0]["params"]
    sources = getattr(optimizer, "fp16_params", None) or held
    if len(sources) != len(held):
        raise RuntimeError("optimizer_groups: fp16 parameters and their fp32 copies differ in number")
    return [labels.get(id(p), "heads") for p in sources]


def split_groups(optimizer, labels: Dict[int, str]) -> None:
    """Cut the torch optimizer's one group into runs of consecutive parameters with one label."""
    inner = torch_optimizer(optimizer)
    if len(inner.param_groups) != 1:
        raise RuntimeError(f"optimizer_groups: expected fairseq's one parameter group, found {len(inner.param_groups)}")
    (group,) = inner.param_groups
    params, names = group["params"], held_labels(optimizer, labels)
    options = {k: v for k, v in group.items() if k != "params"}
    inner.param_groups.clear()
    start = 0
    for i in range(1, len(params) + 1):
        if i == len(params) or names[i] != names[start]:
            inner.add_param_group({**options, "params": params[start:i], GROUP_KEY: names[start]})
            start = i


def recut(state: dict, current: List[dict]) -> dict:
    """``state`` (a torch optimizer state dict) with its groups cut like ``current``, when both
    hold the same number of parameters; the hyper-parameters come from its first group."""
    saved = state.get("param_groups") or []
    indices = [i for g in saved for i in g["params"]]
    sizes = [len(g["params"]) for g in current]
    if [len(g["params"]) for g in saved] == sizes or len(indices) != sum(sizes):
        return state  # already cut alike, or not ours to re-cut: torch names the mismatch
    options = {k: v for k, v in saved[0].items() if k not in ("params", GROUP_KEY)}
    groups, start = [], 0
    for g, size in zip(current, sizes):
        group = {**options, "params": indices[start : start + size]}
        if GROUP_KEY in g:
            group[GROUP_KEY] = g[GROUP_KEY]
        groups.append(group)
        start += size
    return {**state, "param_groups": groups}


def accept_any_cut(optimizer) -> None:
    """Wrap the torch optimizer's ``load_state_dict`` to re-cut a saved state's groups (see :func:`recut`)."""
    inner = torch_optimizer(optimizer)
    load = inner.load_state_dict

    def load_state_dict(state_dict):
        return load(recut(state_dict, inner.param_groups))

    inner.load_state_dict = load_state_dict


def install() -> None:
    from fairseq.trainer import Trainer

    original = Trainer._build_optimizer
    if getattr(original, MARK, None):
        return

    @functools.wraps(original)
    def _build_optimizer(self):
        hook = getattr(self.task, "lr_group_labels", None)
        labels: Optional[Dict[int, str]] = hook(self._model) if hook is not None else None
        common = self.cfg.common
        flat = (common.fp16 or common.bf16) and not (common.memory_efficient_fp16 or common.memory_efficient_bf16)
        if labels and flat and not common.amp and not common.fp16_no_flatten_grads:
            logger.info("per-group learning rates: fp16/bf16 parameters kept unflattened (--fp16-no-flatten-grads)")
            common.fp16_no_flatten_grads = True
        original(self)
        accept_switch(self)
        if hook is None:
            return
        if labels:
            split_groups(self._optimizer, labels)
        accept_any_cut(self._optimizer)

    Trainer._build_optimizer = mark(_build_optimizer, __name__)
