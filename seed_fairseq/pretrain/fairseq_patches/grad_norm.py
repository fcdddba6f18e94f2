"""The gradient norm in one multi-tensor kernel (fix 12).

``fairseq.utils.clip_grad_norm_`` (every optimizer's ``clip_grad_norm``, so every update of
fairseq-train) computes the norm with apex's ``amp_C.multi_tensor_l2norm`` when apex is
installed; without it, one ``torch.norm`` per gradient and a norm of their stack ("amp_C fused
kernels unavailable"): ~200 kernels per update at base size, unflattened in ``--bf16`` and
fp32.  The replacement computes the per-tensor norms with ``torch._foreach_norm`` (torch's
multi-tensor kernel, what ``torch.nn.utils.get_total_norm`` calls), in float32 like fairseq's
(``get_total_norm`` itself would take the norm of fp16 gradients in fp16, which overflows past
65504, so it is not called), and keeps the rest of fairseq's function as it is: the experts'
gradients left out of the norm but clipped, ``aggregate_norm_fn`` (the model-parallel sum),
no clipping for ``max_norm <= 0`` (the norm only), the clip coefficient ``max_norm / (norm +
1e-6)`` capped at 1, and a non-finite norm returned as it is (fairseq's trainer checks it).
"""

import functools

from ._common import MARK, mark


def total_norm(grads):  # noqa: ANN201 (a tensor; torch is imported inside)
    """The 2-norm of ``grads`` together, in float32: one multi-tensor norm per device, gathered where
    fairseq gathers its per-tensor norms (the current CUDA device for CUDA gradients)."""
    import torch

    by_device = {}
    for g in grads:
        by_device.setdefault(g.device, []).append(g)
    target = grads[0].device
    if target.type == "cuda":
        target = torch.device("cuda", torch.cuda.current_device())
    norms = []
    for device_grads in by_device.values():
        norms += [
            n if n.device == target else n.to(target)
            for n in torch._foreach_norm(device_grads, 2.0, dtype=torch.float32)
        ]
    return torch.linalg.vector_norm(torch.stack(norms))


def clip_grad_norm_(params, max_norm, aggregate_norm_fn=None):  # noqa: ANN201 (fairseq's signature)
    """fairseq's ``clip_grad_norm_`` with the norm of :func:`total_norm` (see the module's docstring)."""
    import torch

    with torch.no_grad():
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        with_grad = [p for p in params if p is not None and getattr(p, "grad", None) is not None]
        grads = [p.grad.detach() for p in with_grad if not hasattr(p, "expert")]
        expert_grads = [p.grad.detach() for p in with_grad if hasattr(p, "expert")]
        if not grads:
            return params[0].new_tensor(0.0) if params else torch.tensor(0.0)
        norm = total_norm(grads)
        if aggregate_norm_fn is not None:
            norm = aggregate_norm_fn(norm)
        if max_norm > 0:
            clip_coef = (float(max_norm) / (norm + 1e-6)).clamp_(max=1)
            torch._foreach_mul_(grads + expert_grads, clip_coef)
        return norm


def install() -> None:
    from fairseq import utils

    original = utils.clip_grad_norm_
    if getattr(original, MARK, None):
        return

    @functools.wraps(original)  # fairseq's own stays reachable as __wrapped__ (the tests compare with it)
    def replacement(params, max_norm, aggregate_norm_fn=None):
        return clip_grad_norm_(params, max_norm, aggregate_norm_fn)

    utils.clip_grad_norm_ = mark(replacement, __name__)
