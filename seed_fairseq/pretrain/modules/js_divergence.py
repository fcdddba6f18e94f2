"""Jensen-Shannon divergence between word distributions, for CPDAE's contrastive term.

    JS(P, Q) = 1/2 sum_x P(x) (log P(x) - log M(x)) + 1/2 sum_x Q(x) (log Q(x) - log M(x)),   M = (P + Q) / 2

in nats, so 0 <= JS <= log 2.  Always computed in fp32 (inputs of any dtype are
cast) and with the logarithms' arguments clamped to ``EPS``: ``0 * log 0`` is 0,
and a zero entry in bf16 distributions gives finite values and gradients.
Written as above (not as entropies minus a cross term) it is exactly 0 for
equal rows (``log P - log M`` is exactly 0) and exactly symmetric (every
summand is a commutative sum of the same two numbers).

The contrastive loss needs JS between every local view and every view of the
global batch: ``(n, N)`` pairs over a ``|V|``-entry vocabulary.  Broadcasting
would materialise (and autograd would keep) several ``n x N x |V|`` tensors:
4 GB each for 64 local views, 512 global views and 32k words.  ``pairwise_js``
is an autograd Function that walks the pairs in chunks of at most
``CHUNK_ELEMENTS`` and recomputes ``log M`` in backward, so its memory is one
chunk whatever the batch.  Its gradient, with ``l = log clamp(., EPS)``:

    d JS(P_i, Q_k) / d P_i = 1/2 (l(P_i) - l(M_ik)),    d JS / d Q_k = 1/2 (l(Q_k) - l(M_ik))

(the ``+1`` terms of ``d(p log p)/dp`` cancel).
"""

import torch

EPS = 1e-12  # log(EPS) ~ -27.6: finite in fp32, far below any probability that matters
CHUNK_ELEMENTS = 1 << 22  # 16 MB of fp32 per chunk tensor (a few are alive at once)


def _log(x: torch.Tensor) -> torch.Tensor:
    return x.clamp(min=EPS).log()


def js_divergence(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Row-wise JS divergence of ``p`` and ``q`` (same shape ``(..., V)``) -> ``(...)``, fp32."""
    p, q = p.float(), q.float()
    lm = _log((p + q) / 2)
    return 0.5 * (p * (_log(p) - lm) + q * (_log(q) - lm)).sum(-1)


def _rows_per_chunk(k: int, v: int) -> int:
    return max(1, CHUNK_ELEMENTS // max(1, k * v))


class _PairwiseJS(torch.autograd.Function):
    @staticmethod
    def forward(ctx, p, q):
        lp, lq = _log(p), _log(q)
        out = p.new_empty(p.size(0), q.size(0))
        step = _rows_per_chunk(q.size(0), q.size(1))
        for s in range(0, p.size(0), step):
            pc, lpc = p[s : s + step, None, :], lp[s : s + step, None, :]
            lm = _log((pc + q[None]) / 2)
            out[s : s + step] = 0.5 * (pc * (lpc - lm) + q[None] * (lq[None] - lm)).sum(-1)
        ctx.save_for_backward(p, q, lp, lq)
        return out

    @staticmethod
    def backward(ctx, grad):
        p, q, lp, lq = ctx.saved_tensors
        grad_p = torch.zeros_like(p) if ctx.needs_input_grad[0] else None
        grad_q = torch.zeros_like(q) if ctx.needs_input_grad[1] else None
        step = _rows_per_chunk(q.size(0), q.size(1))
        for s in range(0, p.size(0), step):
            g = grad[s : s + step, :, None]  # (c, k, 1)
            lm = _log((p[s : s + step, None, :] + q[None]) / 2)  # (c, k, V)
            if grad_p is not None:
                grad_p[s : s + step] = 0.5 * (g * (lp[s : s + step, None, :] - lm)).sum(1)
            if grad_q is not None:
                grad_q += 0.5 * (g * (lq[None] - lm)).sum(0)
        return grad_p, grad_q


def pairwise_js(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """``(n, V)`` x ``(k, V)`` distributions -> ``(n, k)`` JS divergences, fp32, chunked."""
    if p.dim() != 2 or q.dim() != 2 or p.size(1) != q.size(1):
        raise ValueError(
            f"pairwise_js needs (n, V) and (k, V) distributions, got {tuple(p.shape)} and {tuple(q.shape)}"
        )
    return _PairwiseJS.apply(p.float().contiguous(), q.float().contiguous())
