"""Attach, to every micro-batch, the unit counts of the whole update it belongs to.

A pre-training loss here is a weighted sum of terms, each a mean over ITS OWN
units (SEED-Encoder: masked tokens for MLM, every decoder target for the
reconstruction).  fairseq normalises gradients by a single ``sample_size``
summed over the micro-batches of an update, so with ``--update-freq > 1`` a
plain criterion could only normalise each term by its own micro-batch count,
and the gradient would depend on how the batch is split.  The SEED-Encoder
authors patched fairseq's trainer to all-reduce the counts; a ``--user-dir``
plugin cannot replace the trainer, so we look ahead instead: this iterator
reads the ``update_freq`` micro-batches of an update before yielding the first
one and stores their summed counts in ``sample["update_counts"]`` (a dict
term -> count, from the task's ``term_counts(sample)``).  The criterion then
all-reduces them over the data-parallel workers, which gives the exact global
denominators of the update.

The lookahead is aligned with fairseq's ``GroupedIterator`` (both chunk the
epoch iterator from the same offset into groups of ``update_freq``) and only
pulls a group when its first micro-batch is requested, so at every update
boundary the wrapped iterator's position (what checkpoints record) is exact.
"""

from typing import Callable, Dict

import torch
from fairseq.data import iterators

UPDATE_COUNTS = "update_counts"

CountFn = Callable[[dict], Dict[str, torch.Tensor]]


def _annotate_groups(itr, group_size: int, count_fn: CountFn):
    while itr.has_next():
        group = []
        while len(group) < group_size and itr.has_next():
            group.append(next(itr))
        real = [s for s in group if s]  # fairseq pads shards with empty batches
        if real:
            per_batch = [count_fn(s) for s in real]
            total = {name: sum(c[name] for c in per_batch) for name in per_batch[0]}
            for s in real:
                s[UPDATE_COUNTS] = total
        yield from group


class UpdateCountsEpochBatchIterator:
    """Wraps a fairseq ``EpochBatchIterator``; everything but ``next_epoch_itr``
    is delegated, so checkpointing, resuming and epoch bookkeeping are fairseq's."""

    def __init__(self, epoch_iter, update_freq, count_fn: CountFn):
        self._epoch_iter = epoch_iter
        self._update_freq = list(update_freq) if update_freq else [1]
        self._count_fn = count_fn

    def __getattr__(self, name):
        return getattr(self._epoch_iter, name)

    def __len__(self):
        return len(self._epoch_iter)

    def update_freq_for_epoch(self, epoch: int) -> int:
        # same rule as fairseq_cli/train.py
        if epoch <= len(self._update_freq):
            return int(self._update_freq[epoch - 1])
        return int(self._update_freq[-1])

    def next_epoch_itr(self, *args, **kwargs) -> iterators.CountingIterator:
        itr = self._epoch_iter.next_epoch_itr(*args, **kwargs)
        group = self.update_freq_for_epoch(self._epoch_iter.epoch)
        return iterators.CountingIterator(_annotate_groups(itr, group, self._count_fn), start=itr.n, total=len(itr))
