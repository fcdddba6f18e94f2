"""The fp32 master gradients of ``--bf16`` zeroed in one multi-tensor kernel (fix 13).

fairseq's ``FP16Optimizer`` (``--fp16``, ``--bf16``) keeps fp32 master copies of the weights: one
flat tensor under ``--fp16``, one tensor per parameter under ``--bf16`` (and with
``--fp16-no-flatten-grads``, or the encoder's learning-rate groups).  Its ``zero_grad`` zeroes the
unflattened masters' gradients one ``zero_()`` at a time: ~200 kernel launches per update at base
size, where the flat master takes one -- with ``torch_adam`` (one fused kernel per step) that loop was
what kept bf16's optimizer launches above fp16's (``benchmarks/optimizer_step.py``).  The replacement
zeroes them with ``torch._foreach_zero_``; everything else of fairseq's ``zero_grad`` is unchanged
(the model's gradients set to None, the sync flag, the loss scale's factor), and a flat master goes
through fairseq's own method.
"""

import functools

from ._common import MARK, mark


def install() -> None:
    from fairseq.optim.fp16_optimizer import _FP16OptimizerMixin

    original = _FP16OptimizerMixin.zero_grad
    if getattr(original, MARK, None):
        return

    @functools.wraps(original)
    def zero_grad(self):
        if self.has_flat_params:
            return original(self)
        import torch

        for p in self.fp16_params:
            p.grad = None
        grads = [p32.grad for p32 in self.fp32_params if p32.grad is not None]
        if grads:
            torch._foreach_zero_(grads)
        self._needs_sync = False
        if self.scaler is not None:
            self._multiply_factor = 1.0 / float(self.scaler.loss_scale)

    _FP16OptimizerMixin.zero_grad = mark(zero_grad, __name__)
