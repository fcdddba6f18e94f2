"""Linear cross-entropy: output projection + log-softmax + NLL without the full logits.

A vocabulary prediction at many positions (the weak decoder predicts every token
of a 512-token block over a 32k vocabulary) is usually computed as
``F.cross_entropy(F.linear(hidden, weight, bias), target)``: that materialises the
``positions x vocabulary`` logits, their log-softmax and their gradient, at 8 x 512
tokens and 32k words 0.5 GiB each in fp32, the largest tensors of the step.  This
module computes the same loss and gradients chunk by chunk over the positions; the
logits of one chunk exist at a time.  Two ways to get the gradient (both tested
against the plain path):

* ``implementation="chunked"`` (default): when autograd will need gradients, each
  chunk's gradients are computed in the forward pass while its logits are at hand
  (as liger-kernel's fused linear cross-entropy does); backward only scales them.
  The same matmuls as the plain path; ``grad_weight`` (V x C) and ``grad_hidden``
  (N x C) are held in fp32 from forward to backward.
* ``implementation="recompute"``: forward keeps one log-sum-exp per position and
  backward computes each chunk's logits again (as cut-cross-entropy does): the least
  memory, for one extra ``N x C x V`` matmul (4 projection matmuls instead of 3:
  the loss costs ~1.3x on CPU, measured in ``benchmarks/vocab_loss.py``).

API (stable; every objective that predicts the vocabulary at many positions uses it)::

    nll_sum, correct = linear_cross_entropy(
        hidden,              # (..., C) in fp32 / fp16 / bf16: the features before the projection
        weight,              # (V, C), same dtype: e.g. decoder.output_projection.weight
        target,              # (...) int64 class ids, same leading shape as hidden
        bias=None,           # optional (V,)
        ignore_index=-100,   # positions with this target add nothing (pass the padding index)
        chunk_size=None,     # positions per chunk; None: about 2**24 logits per chunk
        implementation="chunked",  # or "recompute", "plain" (the reference), "liger", "cce"
    )
    # nll_sum: 0-d fp32 tensor, the SUMMED negative log-likelihood over the kept
    #          positions (natural log) -- what a MultiTermCriterion Term takes;
    # correct: 0-d int64 tensor (no gradient), the kept positions whose argmax is the target.

In a criterion: let the model return the features before its vocabulary projection
(every pre-training model of the plugin does: ``BottleneckEncoderModel.pretraining_forward``;
a fairseq decoder: ``features_only=True``) and pass the projection's weight and bias:
``model.mlm_projection()`` / ``model.decoder_projection()`` (``models/bottleneck.py``),
e.g. a decoder's ``output_projection.weight`` (tied to the token embeddings, no bias).
``criterions/vocab_loss.py`` wraps this as ``VocabLossMixin.vocabulary_term(...) -> Term``
with the ``--vocab-loss`` options.

``linear_cross_entropy(h, w, t, ignore_index=pad)`` equals
``F.cross_entropy(F.linear(h, w).float(), t, ignore_index=pad, reduction="sum")``
and its gradients (``plain_linear_cross_entropy`` is that reference), up to
floating-point summation order: ``tests/test_linear_cross_entropy.py`` states the
tolerance per dtype.  Numerics: the logits of a chunk are computed in the input
dtype (as ``F.linear`` would), then everything else -- log-sum-exp, the NLL sum,
the softmax gradient, the gradient accumulators -- is fp32; the gradients are
returned in the dtype of their inputs.  The argmax counted in ``correct`` is the
first maximal logit, as ``Tensor.argmax``.  Double backward is not supported.

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

IMPLEMENTATIONS = ("chunked", "recompute", "plain", "liger", "cce")
DEFAULT_IMPLEMENTATION = IMPLEMENTATIONS[0]  # --vocab-loss's default
# Logits per chunk when chunk_size is None: 2**24 fp32 values = 64 MiB (512 positions
# of a 32k vocabulary; plus a copy in the input dtype): small beside the activations,
# and few passes over the fp32 weight-gradient accumulator (larger chunks were no
# faster on CPU, smaller ones up to 15% slower).
DEFAULT_CHUNK_ELEMENTS = 2**24


def default_chunk_size(vocab_size: int) -> int:
    return max(16, DEFAULT_CHUNK_ELEMENTS // max(1, vocab_size))


def _chunk_logits(h: torch.Tensor, weight: torch.Tensor, bias: Optional[torch.Tensor]) -> torch.Tensor:
    # exactly what F.linear computes for these rows, then fp32 for the softmax
    return F.linear(h, weight, bias).float()


def _softmax_grad_(logits, lse, target):
    """In place: fp32 logits -> d nll / d logits = softmax - onehot(target)."""
    g = logits.sub_(lse.unsqueeze(1)).exp_()
    g[torch.arange(g.size(0), device=g.device), target] -= 1.0
    return g


class _ChunkedLinearCrossEntropy(torch.autograd.Function):
    """Chunks of positions; ``recompute`` selects where the gradient is computed.

    ``recompute=True``: forward keeps only each position's log-sum-exp; backward
    computes the logits of each chunk again (one extra ``chunk x C x V`` matmul).
    ``recompute=False``: when autograd will need them, forward computes each chunk's
    gradients right away (the logits are at hand) and keeps ``grad_hidden`` and
    ``grad_weight`` (fp32) for backward, which only scales them: the same matmuls as
    the plain path, ``(N + V) x C`` fp32 held instead of ``N x V`` logits.
    """

    @staticmethod
    def forward(ctx, hidden, weight, bias, target, chunk_size, recompute, grad_enabled):
        n = hidden.size(0)
        dev = hidden.device
        nll = torch.zeros((), dtype=torch.float32, device=dev)
        correct = torch.zeros((), dtype=torch.long, device=dev)
        # grad mode is off inside forward (and needs_input_grad ignores no_grad): the caller says
        grads_now = not recompute and grad_enabled and any(ctx.needs_input_grad[:3])
        need_h, need_w, need_b = ctx.needs_input_grad[:3] if grads_now else (False, False, False)
        lse = torch.empty(n, dtype=torch.float32, device=dev) if recompute else None
        grad_h = torch.empty(hidden.shape, dtype=torch.float32, device=dev) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=dev) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=dev) if need_b else None
        for start in range(0, n, chunk_size):
            end = min(n, start + chunk_size)
            h = hidden[start:end]
            logits = _chunk_logits(h, weight, bias)
            t = target[start:end]
            picked = logits.gather(1, t.unsqueeze(1)).squeeze(1)
            # one pass gives the max for a stable log-sum-exp and the argmax for `correct`
            top, argmax = logits.max(dim=-1)
            correct += argmax.eq(t).sum()
            exp = logits.sub_(top.unsqueeze(1)).exp_()  # in place: the chunk's only V-wide buffer
            total = exp.sum(dim=-1)
            chunk_lse = top + total.log()
            nll += (chunk_lse - picked).sum()
            if recompute:
                lse[start:end] = chunk_lse
            elif grads_now:
                g = exp.div_(total.unsqueeze(1))  # softmax
                g[torch.arange(end - start, device=dev), t] -= 1.0
                _accumulate(g, h, weight, start, end, grad_h, grad_w, grad_b)
        if recompute:
            ctx.save_for_backward(hidden, weight, bias, target, lse)
        else:
            ctx.save_for_backward(grad_h, grad_w, grad_b)
        ctx.recompute, ctx.chunk_size = recompute, chunk_size
        ctx.dtypes = (hidden.dtype, weight.dtype, bias.dtype if bias is not None else None)
        ctx.mark_non_differentiable(correct)
        return nll, correct

    @staticmethod
    def backward(ctx, grad_nll, _grad_correct):
        scale = grad_nll.float()
        if not ctx.recompute:
            grads = ctx.saved_tensors
            if any(need and g is None for need, g in zip(ctx.needs_input_grad[:3], grads)):
                raise RuntimeError("linear_cross_entropy: backward through a forward run without gradients")
            out = [None if g is None else (g * scale).to(d) for g, d in zip(grads, ctx.dtypes)]
            return (*out, None, None, None, None)
        hidden, weight, bias, target, lse = ctx.saved_tensors
        need_h, need_w, need_b = ctx.needs_input_grad[:3]
        grad_h = torch.empty(hidden.shape, dtype=torch.float32, device=hidden.device) if need_h else None
        grad_w = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if need_w else None
        grad_b = torch.zeros(bias.shape, dtype=torch.float32, device=bias.device) if need_b else None
        for start in range(0, hidden.size(0), ctx.chunk_size):
            end = min(hidden.size(0), start + ctx.chunk_size)
            h = hidden[start:end]
            g = _softmax_grad_(_chunk_logits(h, weight, bias), lse[start:end], target[start:end])
            _accumulate(g.mul_(scale), h, weight, start, end, grad_h, grad_w, grad_b)
        out = [None if g is None else g.to(d) for g, d in zip((grad_h, grad_w, grad_b), ctx.dtypes)]
        return (*out, None, None, None, None)


def _accumulate(g, h, weight, start, end, grad_h, grad_w, grad_b):
    """Add one chunk's gradients (``g``: fp32 d loss / d logits) into the fp32 accumulators."""
    if grad_b is not None:
        grad_b += g.sum(0)
    g = g.to(h.dtype)  # the matmuls run in the input dtype, as F.linear's backward does
    if grad_h is not None:
        if g.dtype == torch.float32:
            torch.mm(g, weight, out=grad_h[start:end])
        else:
            grad_h[start:end] = torch.mm(g, weight)
    if grad_w is not None:
        if g.dtype == torch.float32:
            grad_w.addmm_(g.t(), h)
        else:
            grad_w.add_(torch.mm(g.t(), h))


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
    # the loss module's forward(lin_weight, input, target, bias) is the same in every release
    from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss

    nll = LigerFusedLinearCrossEntropyLoss(reduction="sum")(weight, h, t, bias)
    nll = nll[0] if isinstance(nll, tuple) else nll  # (loss, z_loss) in some releases
    return nll.float(), _correct_no_grad(h, weight, bias, t, chunk_size)


def _cce(h, weight, bias, t, chunk_size):
    from cut_cross_entropy import linear_cross_entropy as cce

    extra = {"bias": bias} if bias is not None else {}  # older releases have no bias argument
    nll = cce(h, weight, t, reduction="sum", **extra)
    return nll.float(), _correct_no_grad(h, weight, bias, t, chunk_size)


def linear_cross_entropy(
    hidden: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    bias: Optional[torch.Tensor] = None,
    ignore_index: int = -100,
    chunk_size: Optional[int] = None,
    implementation: str = DEFAULT_IMPLEMENTATION,
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
    recompute = implementation == "recompute"
    grad_enabled = torch.is_grad_enabled()
    return _ChunkedLinearCrossEntropy.apply(
        h.contiguous(), weight, bias, t.contiguous(), chunk, recompute, grad_enabled
    )
