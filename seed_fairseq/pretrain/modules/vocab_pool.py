"""Token-wise max-pool of vocabulary logits without materialising them for backward.

DupMAE's bag-of-words decoder (Eq. 6-7) and its retrieval representation
(Eq. 11) need, per text, ``mu[v] = max_t (h_t . W_v + b_v)`` over a set of
positions ``t``: the MLM head's vocabulary logits at every pooled position,
max-pooled.  Plain autograd keeps the ``(batch, time, vocab)`` logits for the
backward pass (512 x 32k floats per sequence, more than BERT-base's own
activations).  The gradient of a max only reaches the arg-max position of each
vocabulary entry, so here the forward pass computes the logits chunk by chunk,
keeps the running max and arg-max, and the backward pass touches one position
per (text, vocabulary entry): ``O(batch x vocab x dim)`` instead of
``O(batch x time x vocab x dim)``.  Ties go to the first position (``torch.max``
gives the lowest index among equal values; plain ``amax`` would split the
gradient), which only matters for bit-identical logits.

A text with no pooled position gets ``fill`` (the dtype's most negative finite
value) everywhere and no gradient.
"""

from typing import Tuple

import torch

# logits held at once in the forward pass (rows x vocab), and gathered rows in the backward
CHUNK_ELEMENTS = 1 << 24


def pool_fill(dtype: torch.dtype) -> float:
    return torch.finfo(dtype).min


class _VocabMaxPool(torch.autograd.Function):
    @staticmethod
    def forward(ctx, hidden, weight, bias, pool):
        batch, _, dim = hidden.shape
        vocab = weight.size(0)
        mu = hidden.new_full((batch, vocab), pool_fill(hidden.dtype))
        arg = torch.full((batch, vocab), -1, dtype=torch.long, device=hidden.device)
        rows = max(1, CHUNK_ELEMENTS // max(vocab, 1))
        for b in range(batch):
            positions = pool[b].nonzero().squeeze(1)
            for start in range(0, positions.numel(), rows):
                pos = positions[start : start + rows]
                logits = torch.addmm(bias, hidden[b, pos], weight.t())  # (rows, vocab)
                best, best_row = logits.max(0)
                # strictly greater: an earlier chunk keeps ties (first position wins)
                better = best > mu[b]
                mu[b] = torch.where(better, best, mu[b])
                arg[b] = torch.where(better, pos[best_row], arg[b])
        ctx.save_for_backward(hidden, weight, arg)
        ctx.mark_non_differentiable(arg)
        ctx.bias_needs_grad = bias.requires_grad
        ctx.bias_dtype = bias.dtype
        return mu, arg

    @staticmethod
    def backward(ctx, grad_mu, _grad_arg):
        hidden, weight, arg = ctx.saved_tensors
        batch, _, dim = hidden.shape
        vocab = weight.size(0)
        # accumulated in at least float32 whatever the dtypes (half models, autocast), cast at the end
        acc = torch.promote_types(torch.promote_types(hidden.dtype, weight.dtype), torch.float32)
        grad_hidden = torch.zeros_like(hidden, dtype=acc) if ctx.needs_input_grad[0] else None
        grad_weight = torch.zeros_like(weight, dtype=acc) if ctx.needs_input_grad[1] else None
        valid = arg >= 0
        g = torch.where(valid, grad_mu.to(acc), torch.zeros((), dtype=acc, device=grad_mu.device))
        rows = max(1, CHUNK_ELEMENTS // max(dim, 1))
        for b in range(batch):
            for start in range(0, vocab, rows):
                sl = slice(start, start + rows)
                keep = valid[b, sl]
                if not keep.any():
                    continue
                v = torch.arange(start, min(start + rows, vocab), device=arg.device)[keep]
                t = arg[b, sl][keep]
                gv = g[b, sl][keep].unsqueeze(1)
                if grad_hidden is not None:
                    grad_hidden[b].index_add_(0, t, gv * weight[v].to(acc))
                if grad_weight is not None:
                    grad_weight.index_add_(0, v, gv * hidden[b, t].to(acc))
        grad_bias = g.sum(0).to(ctx.bias_dtype) if ctx.bias_needs_grad else None
        return (
            None if grad_hidden is None else grad_hidden.to(hidden.dtype),
            None if grad_weight is None else grad_weight.to(weight.dtype),
            grad_bias,
            None,
        )


def vocab_max_pool(
    hidden: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, pool: torch.Tensor
) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(mu, argmax)``: ``mu[b, v] = max over t with pool[b, t] of hidden[b, t] . weight[v] + bias[v]``.

    ``hidden`` (batch, time, dim) is the MLM head's input to its output
    projection, ``weight`` (vocab, dim) and ``bias`` (vocab,) the projection,
    ``pool`` (batch, time) bool.  ``argmax`` (batch, vocab) is the pooled
    position, -1 for a text without pooled positions (whose ``mu`` is the
    dtype's most negative finite value).
    """
    if hidden.dim() != 3 or pool.shape != hidden.shape[:2]:
        raise ValueError(f"hidden must be (batch, time, dim) and pool (batch, time); got {hidden.shape}, {pool.shape}")
    mu, arg = _VocabMaxPool.apply(hidden, weight, bias.to(hidden.dtype), pool.bool())
    return mu, arg
