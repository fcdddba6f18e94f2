"""``--optimizer torch_adam``: fairseq's ``adam`` update, computed by torch's fused AdamW kernel.

Without NVIDIA apex, fairseq 0.12's ``adam`` is its own Python ``Adam``: a loop over the
parameters with about ten element-wise kernels each.  Under ``--fp16`` the fp32 master weights
are one flat tensor, so the loop is short; under ``--bf16`` fairseq keeps them unflattened
(``FP16Optimizer.build_optimizer``: "faster on TPUs"), ~200 tensors at base size, ~2000 kernel
launches per update.  ``torch_adam`` takes the same options (``--adam-betas``, ``--adam-eps``,
``--weight-decay``) and computes the same update with torch's ``AdamW``: its fused kernel (one
call per parameter group) where torch has one for the parameters' device (CUDA, CPU), its
multi-tensor (``foreach``) kernels elsewhere.

fairseq's update is Kingma & Ba's, with the "epsilon hat" of their section 2::

    p -= lr * sqrt(1 - beta2^t) / (1 - beta1^t) * m / (sqrt(v) + eps)

torch's divides by ``sqrt(v / (1 - beta2^t)) + eps`` instead: the two agree exactly when torch is
given ``eps / sqrt(1 - beta2^t)`` at step t, which :class:`FairseqAdamW` sets for the step it is
about to take (:func:`fairseq_eps`).  The configured eps stays in the groups (and in the saved
state); only the groups handed to torch's kernel carry the step's.  A group whose parameters are
at different steps (in fp32 a parameter without a gradient skips the update, as in fairseq) is
handed over as one group per step.  Weight decay is decoupled in both (``p *= 1 - lr * wd``
before the update).  The results agree within float32 rounding (``tests/test_torch_adam.py``).

The saved state is fairseq's ``adam``'s format -- an int ``step``, ``exp_avg`` and ``exp_avg_sq``
per parameter -- so either optimizer resumes the other's run (fairseq records the optimizer's
class name in the checkpoint and refuses another; ``fairseq_patches/optimizer_switch.py`` lets
this pair through).  Not supported: ``--memory-efficient-fp16`` (fairseq refuses it for this
optimizer) and ``--fp16-adam-stats``/``--use-old-adam`` (options of apex's FusedAdam).
"""

import math
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

import torch
from fairseq.dataclass import FairseqDataclass
from fairseq.optim import FairseqOptimizer, register_optimizer
from fairseq.optim.adam import FairseqAdam
from omegaconf import II

# the ways torch's AdamW can run (its constructor's flags): "fused" is one kernel per parameter
# group and device, "foreach" about ten multi-tensor kernels
KERNELS = {"fused": {"fused": True, "foreach": False}, "foreach": {"fused": False, "foreach": True}}


def fused_devices() -> List[str]:
    """The device types torch has a fused AdamW kernel for (torch >= 2.4: CPU too)."""
    try:
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices
    except ImportError:  # a torch that moved the list: the two devices this plugin runs on
        return ["cuda", "cpu"]
    return list(_get_fused_kernels_supported_devices())


def default_kernel(params: List[torch.Tensor]) -> str:
    """``fused`` when torch has the kernel for every parameter's device and dtype, else ``foreach``."""
    devices = fused_devices()
    ok = all(p.device.type in devices and p.is_floating_point() for p in params)
    return "fused" if params and ok else "foreach"


def fairseq_eps(eps: float, beta2: float, step: int) -> float:
    """The eps that makes torch's denominator ``sqrt(v / bc2) + eps'`` equal to fairseq's
    ``(sqrt(v) + eps) / sqrt(bc2)`` at step ``step`` (1-based), bc2 = 1 - beta2^step."""
    return eps / math.sqrt(1.0 - beta2**step)


class FairseqAdamW(torch.optim.AdamW):
    """torch's ``AdamW`` taking fairseq's ``adam`` step (see the module's docstring)."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8, weight_decay=0.0, kernel: Optional[str] = None):
        params = list(params)
        flat = [p for g in params for p in g["params"]] if params and isinstance(params[0], dict) else params
        self.kernel = kernel or default_kernel(flat)
        super().__init__(params, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, **KERNELS[self.kernel])
        # each parameter's step count, kept in Python: torch's step tensors live on the device with
        # the fused kernel, and reading them would synchronise with it at every update
        self._steps: Dict[torch.Tensor, int] = {}

    @property
    def supports_flat_params(self) -> bool:  # fairseq's --fp16 flat master weights
        return True

    @torch.no_grad()
    def step(self, closure=None):  # noqa: ANN201 (torch's signature)
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        # torch's kernel takes one eps per group, and the step's eps depends on the step count: torch is
        # handed copies of the groups, one per step count, with that step's eps; the groups themselves
        # (what fairseq's scheduler, the encoder-lr factors and the saved state see) keep the configured one
        groups, at_one_step, stepped = self.param_groups, [], []
        for group in groups:
            by_step: Dict[int, List[torch.Tensor]] = {}
            for p in group["params"]:
                if p.grad is not None:  # torch and fairseq both skip a parameter without a gradient
                    by_step.setdefault(self._steps.get(p, 0) + 1, []).append(p)
            for t, params in by_step.items():
                eps = fairseq_eps(group["eps"], group["betas"][1], t)
                at_one_step.append({**group, "params": params, "eps": eps})
                stepped += params
        self.param_groups = at_one_step
        try:
            super().step()
        finally:
            self.param_groups = groups
        for p in stepped:
            self._steps[p] = self._steps.get(p, 0) + 1
        return loss

    def state_dict(self) -> Dict[str, Any]:
        """torch's state dict with fairseq's int ``step`` per parameter (fairseq's ``adam`` reads it)."""
        out = super().state_dict()
        params = [p for g in self.param_groups for p in g["params"]]  # torch's index order
        steps = self._steps
        out["state"] = {
            i: {**s, "step": steps[params[i]] if params[i] in steps else int(s["step"])} if "step" in s else s
            for i, s in out["state"].items()
        }
        return out

    def load_state_dict(self, state_dict: Dict[str, Any]) -> None:
        """A state of this optimizer or of fairseq's ``adam`` (int steps, groups without torch's flags):
        the steps become torch's step tensors for this run's kernel, and the groups keep this run's kernel."""
        super().load_state_dict(state_dict)
        self._steps = {}
        for group in self.param_groups:
            group.update(KERNELS[self.kernel])
            for p in group["params"]:
                s = self.state.get(p)
                if s and "step" in s:
                    n = int(s["step"])  # once per resume: a device synchronisation is fine here
                    self._steps[p] = n
                    on = p.device if self.kernel == "fused" else "cpu"  # torch's placement of the step
                    s["step"] = torch.tensor(float(n), dtype=torch.float32, device=on)


@dataclass
class TorchAdamConfig(FairseqDataclass):
    # fairseq's adam's options, with its defaults and meaning (FairseqAdamConfig, without apex's)
    adam_betas: Any = field(default=(0.9, 0.999), metadata={"help": "betas for Adam optimizer"})
    adam_eps: float = field(
        default=1e-8,
        metadata={"help": "epsilon for Adam optimizer (fairseq's: added to sqrt(v) before the bias correction)"},
    )
    weight_decay: float = field(default=0.0, metadata={"help": "weight decay"})
    lr: List[float] = II("optimization.lr")


@register_optimizer("torch_adam", dataclass=TorchAdamConfig)
class TorchAdam(FairseqOptimizer):
    """fairseq's ``adam`` (decoupled weight decay, betas, eps, bias correction) on torch's fused kernel."""

    def __init__(self, cfg: TorchAdamConfig, params):
        super().__init__(cfg)
        self._optimizer = FairseqAdamW(params, **self.optimizer_config)

    # the same reading of the options as fairseq's adam (lr list, betas as a string), and its BMUF averaging
    optimizer_config = FairseqAdam.optimizer_config
    average_params = FairseqAdam.average_params
