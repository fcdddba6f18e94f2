"""Linear cross-entropy: output projection + log-softmax + NLL without the full logits.

A vocabulary prediction at many positions (the weak decoder predicts every token
of a 512-token block over a 32k vocabulary) is usually computed as
``F.cross_entropy(F.linear(hidden, weight, bias), target)``: that materialises the
``positions x vocabulary`` logits, an fp32 copy of them for the log-softmax and
their gradient, which at 8 x 512 tokens and 32k words is ~0.5 GB each and
dominates the step's memory.  This module computes the same loss and the same
gradients chunk by chunk over the positions; the logits of one chunk exist at a
time, and in backward they are recomputed (one extra ``chunk x C x V`` matmul)
instead of stored.

API (stable; every objective that predicts the vocabulary at many positions uses it)::

    nll_sum, correct = linear_cross_entropy(
        hidden,              # (..., C) in fp32 / fp16 / bf16: the features before the projection
        weight,              # (V, C), same dtype: e.g. decoder.output_projection.weight
        target,              # (...) int64 class ids, same leading shape as hidden
        bias=None,           # optional (V,)
        ignore_index=-100,   # positions with this target add nothing (pass the padding index)
        chunk_size=None,     # positions per chunk; None: about 2**22 logits per chunk
        implementation="chunked",  # or "plain" (the reference), "liger", "cce" (see below)
    )
    # nll_sum: 0-d fp32 tensor, the SUMMED negative log-likelihood over the kept
    #          positions (natural log) -- what a MultiTermCriterion Term takes;
    # correct: 0-d int64 tensor (no gradient), the kept positions whose argmax is the target.

``linear_cross_entropy(h, w, t, ignore_index=pad)`` equals
``F.cross_entropy(F.linear(h, w).float(), t, ignore_index=pad, reduction="sum")``
and its gradients (``plain_linear_cross_entropy`` is that reference), up to
floating-point summation order: ``tests/test_linear_cross_entropy.py`` states the
tolerance per dtype.  Numerics: the logits of a chunk are computed in the input
dtype (as ``F.linear`` would), then everything else -- log-sum-exp, the NLL sum,
the softmax gradient, the weight and bias gradient accumulators -- is fp32; the
gradients are returned in the dtype of their inputs.  The argmax counted in
``correct`` is the first maximal logit, as ``Tensor.argmax`` (ties are rare and
only change the logged accuracy).

Only plain PyTorch: the same code on CPU and CUDA.  On a CUDA machine that has
``liger-kernel`` (``implementation="liger"``) or ``cut-cross-entropy``
(``"cce"``) installed, their fused kernels can be used instead (neither is ever
required; ``correct`` is then computed under ``no_grad`` from chunked logits, an
extra forward-only matmul).  The chunked path is the reference they are compared
with.
"""

from typing import Optional, Tuple

import torch
import torch.nn.functional as F

IMPLEMENTATIONS = ("chunked", "plain", "liger", "cce")
# Logits per chunk when chunk_size is None: 2**22 fp32 values = 16 MiB (plus the
# same in the input dtype and one fp32 temporary): small beside the activations,
# large enough that each chunk is an efficient matmul.
DEFAULT_CHUNK_ELEMENTS = 2**22


def default_chunk_size(vocab_size: int) -> int:
    return max(16, DEFAULT_CHUNK_ELEMENTS // max(1, vocab_size))


def _chunk_logits(h: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    # exactly what F.linear computes for these rows, then fp32 for the softmax
    return F.linear(h, weight, bias).float()


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, target, chunk_size):
        n = hidden.size(0)
        nll = torch.zeros((), dtype=torch.float32, device=hidden.device)
        correct = torch.zeros((), dtype=torch.long, device=hidden.device)
        lse = torch.empty(n, dtype=torch.float32, device=hidden.device)
        for start in range(0, n, chunk_size):
            end = min(n, start + chunk_size)
            logits = _chunk_logits(hidden[start:end], weight, bias)
            t = target[start:end]
            chunk_lse = torch.logsumexp(logits, dim=-1)
            lse[start:end] = chunk_lse
            nll += (chunk_lse - logits.gather(1, t.unsqueeze(1)).squeeze(1)).sum()
            correct += logits.argmax(dim=-1).eq(t).sum()
        ctx.save_for_backward(hidden, weight, bias, target, lse)
        ctx.chunk_size = chunk_size
        ctx.mark_non_differentiable(correct)
        return nll, correct

    @staticmethod
    def backward(ctx, grad_nll, _grad_correct):
        hidden, weight, bias, target, lse = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        n = hidden.size(0)
        scale = grad_nll.float()
        grad_h = torch.empty_like(hidden) if need_h else None
        # fp32 accumulators across chunks (one matmul per chunk already accumulates in fp32)
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_b else None
        for start in range(0, n, ctx.chunk_size):
            end = min(n, start + ctx.chunk_size)
            h = hidden[start:end]
            # d nll / d logits = softmax - onehot, recomputed from the saved log-sum-exp
            g = _chunk_logits(h, weight, bias).sub_(lse[start:end].unsqueeze(1)).exp_()
            g[torch.arange(end - start, device=g.device), target[start:end]] -= 1.0
            g.mul_(scale)
            if need_b:
                grad_b += g.sum(0)
            g = g.to(hidden.dtype)
            if need_h:
                torch.mm(g, weight, out=grad_h[start:end])
            if need_w:
                if g.dtype == torch.float32:
                    grad_w.addmm_(g.t(), h)
                else:
                    grad_w.add_(torch.mm(g.t(), h))
        if need_w:
            grad_w = grad_w.to(weight.dtype)
        if need_b:
            grad_b = grad_b.to(bias.dtype)
        return grad_h, grad_w, grad_b, None, None


def _flat_kept(hidden, target, ignore_index):
    """(hidden rows, targets) of the positions whose target is not ``ignore_index``."""
    if hidden.shape[:-1] != target.shape:
        raise ValueError(f"hidden {tuple(hidden.shape)} and target {tuple(target.shape)} do not match")
    h = hidden.reshape(-1, hidden.size(-1))
    t = target.reshape(-1)
    keep = t.ne(ignore_index)
    if not bool(keep.all()):
        # selecting C-wide rows is cheap beside V-wide logits, and autograd scatters
        # their gradient back (ignored positions get exactly zero)
        idx = keep.nonzero().squeeze(1)
        h, t = h.index_select(0, idx), t.index_select(0, idx)
    return h, t


def plain_linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    ignore_index: int = -100,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """The reference: the full logits, then fp32 cross-entropy (what the criterions did before)."""
    logits = F.linear(hidden, weight, bias).float().reshape(-1, weight.size(0))
    target = target.reshape(-1)
    nll = F.cross_entropy(logits, target, ignore_index=ignore_index, reduction="sum")
    correct = (logits.argmax(-1).eq(target) & target.ne(ignore_index)).sum()
    return nll, correct


def _correct_no_grad(h, weight, bias, t, chunk_size):
    correct = torch.zeros((), dtype=torch.long, device=h.device)
    with torch.no_grad():
        for start in range(0, h.size(0), chunk_size):
            logits = F.linear(h[start : start + chunk_size], weight, bias)
            correct += logits.argmax(-1).eq(t[start : start + chunk_size]).sum()
    return correct


def _liger(h, weight, bias, t, chunk_size):
    from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy

    nll = liger_fused_linear_cross_entropy(h, weight, t, bias=bias, reduction="sum")
    return nll.float(), _correct_no_grad(h, weight, bias, t, chunk_size)


def _cce(h, weight, bias, t, chunk_size):
    from cut_cross_entropy import linear_cross_entropy as cce

    nll = cce(h, weight, t, bias=bias, reduction="sum")
    return nll.float(), _correct_no_grad(h, weight, bias, t, chunk_size)


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    ignore_index: int = -100,
    chunk_size: Optional[int] = None,
    implementation: str = "chunked",
) -> Tuple[torch.Tensor, torch.Tensor]:
    """Summed NLL (0-d fp32) and number of correct argmax predictions (0-d int64) of
    ``softmax(hidden @ weight.T + bias)`` against ``target``, positions with
    ``target == ignore_index`` left out; see the module docstring."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(
            f"linear cross-entropy implementation must be one of {IMPLEMENTATIONS}, got {implementation!r}"
        )
    if chunk_size is not None and chunk_size < 1:
        raise ValueError(f"chunk_size must be >= 1, got {chunk_size}")
    if implementation == "plain":
        return plain_linear_cross_entropy(hidden, weight, target, bias, ignore_index)
    h, t = _flat_kept(hidden, target, ignore_index)
    chunk = chunk_size or default_chunk_size(weight.size(0))
    if h.size(0) == 0:  # nothing to predict: a zero that still reaches the parameters
        zero = (hidden.sum() + weight.sum()).float() * 0.0
        return zero, torch.zeros((), dtype=torch.long, device=hidden.device)
    if implementation == "liger":
        return _liger(h, weight, bias, t, chunk)
    if implementation == "cce":
        return _cce(h, weight, bias, t, chunk)
    return _ChunkedLinearCrossEntropy.apply(h.contiguous(), weight, bias, t.contiguous(), chunk)
