"""InfoNCE over the views of the GLOBAL batch, gathered across data-parallel workers.

Every worker holds ``2b`` views of its ``b`` texts, ordered ``[view 1 of
text 1..b, view 2 of text 1..b]``; the positive of local view ``j`` is view
``(j + b) mod 2b``.  Each local view is an anchor; its candidates are every
view of every worker except itself (paper Eq. 5: ``k != i`` over the 2m views).

Why the gradient is right
-------------------------
Worker ``w`` returns ``L_w = sum over ITS anchors of InfoNCE`` (divided by the
global view count by the criterion), computed against the gathered views
``G``.  The objective of the update is ``sum_w L_w``: the InfoNCE of every view
of the global batch, as if one process held it.  A local view ``x`` enters it
as an anchor of its own worker (ordinary autograd) and as a candidate of EVERY
worker's loss (through ``G``).  ``torch.distributed.all_gather`` has no
backward, so a plain gather silently drops the second path; ``_Gather`` below
all-reduces (sums) ``dL_w/dG`` over the workers in backward and returns this
worker's slice, i.e. ``sum_w dL_w/dx``.  fairseq then sums the parameter
gradients over workers (DDP averages; the criterion reports ``sample_size 0``,
so the trainer multiplies by the world size), which gives ``d(sum_w L_w)/dθ``.
(``torch.distributed.nn.functional.all_gather`` does the same but needs equal
sizes on every worker and an all-to-all in backward; batches differ in size and
gloo has no all-to-all.)

Every worker must run the same collectives in the same order: the gather in
forward and its all-reduce in backward.  A worker whose batch must not add
negatives (fairseq's dummy batch when it ran out of data) still takes part,
with zero rows, and contrasts its own views against the gathered ones so that
its backward still reaches the all-reduce.
"""

from typing import Callable, Optional, Tuple

import torch
import torch.distributed as dist

Similarity = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


class _Gather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, group, sizes, rank):
        padded = x.new_zeros((max(sizes),) + tuple(x.shape[1:]))
        padded[: x.size(0)] = x
        parts = [torch.empty_like(padded) for _ in sizes]
        dist.all_gather(parts, padded, group=group)
        ctx.group, ctx.offset, ctx.n = group, sum(sizes[:rank]), x.size(0)
        return torch.cat([part[:n] for part, n in zip(parts, sizes)])

    @staticmethod
    def backward(ctx, grad):
        grad = grad.contiguous().clone()
        dist.all_reduce(grad, op=dist.ReduceOp.SUM, group=ctx.group)
        return grad[ctx.offset : ctx.offset + ctx.n], None, None, None


def gather_with_grad(x: torch.Tensor, group) -> Tuple[torch.Tensor, int]:
    """Concatenation of every worker's ``x`` (rows may differ in number) and the
    row offset of this worker's rows in it; gradients flow back to every worker."""
    world, rank = dist.get_world_size(group), dist.get_rank(group)
    n = torch.tensor([x.size(0)], dtype=torch.long, device=x.device)
    sizes = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(sizes, n, group=group)
    return _Gather.apply(x.contiguous(), group, [int(s) for s in sizes], rank), sum(int(s) for s in sizes[:rank])


def info_nce_sum(
    views: torch.Tensor,
    similarity: Similarity,
    temperature: float = 1.0,
    group=None,
    contribute: bool = True,
) -> Tuple[torch.Tensor, torch.Tensor]:
    """(sum over the local anchors of InfoNCE, number of anchors whose positive ranks first).

    ``views``: ``(2b, ...)`` local views ordered as above; ``similarity(a, c)``
    gives the ``(len(a), len(c))`` logits; ``group``: gather the candidates over
    this process group (None: the local views are the whole batch);
    ``contribute=False``: add no negatives to the other workers.

    With a single text in the whole batch the positive is the only candidate and
    the loss is exactly 0 with zero gradient (log of a softmax over one entry):
    nothing to contrast, nothing learnt, no NaN.
    """
    n = views.size(0)
    if n % 2:
        raise ValueError(f"expected two views per text, got {n} views")
    anchors = torch.arange(n, device=views.device)
    positives = (anchors + n // 2) % n
    candidates, offset = views, 0
    if group is not None:
        gathered, offset = gather_with_grad(views if contribute else views[:0], group)
        if not contribute:  # own views first, so that the indices above stay right
            gathered, offset = torch.cat([views, gathered]), 0
        candidates = gathered
    logits = similarity(views, candidates).float() / temperature
    self_mask = torch.zeros_like(logits, dtype=torch.bool)
    self_mask[anchors, offset + anchors] = True
    logits = logits.masked_fill(self_mask, float("-inf"))
    positive_logits = logits[anchors, offset + positives]
    loss = torch.logsumexp(logits, dim=-1) - positive_logits
    correct = logits.argmax(-1).eq(offset + positives).sum()
    return loss.sum(), correct


def dense_similarity(a: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    """Dot product (the score dense retrieval fine-tunes and searches with)."""
    return a.float() @ c.float().t()


def data_parallel_group() -> Optional[object]:
    """fairseq's data-parallel group when there is more than one worker, else None."""
    from fairseq.distributed import utils as distributed_utils

    if not dist.is_available() or not dist.is_initialized():
        return None
    if distributed_utils.get_data_parallel_world_size() <= 1:
        return None
    return distributed_utils.get_data_parallel_group()
