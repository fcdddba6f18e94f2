"""fairseq's ``MaskTokensDataset`` with its whole-word bookkeeping vectorised: the same items.

fairseq 0.12 finds the word lengths of a block with ``np.split`` of a torch tensor at every
word start (one sub-array, and one torch ``swapaxes``, per word: ~400 per block of 512 pieces)
and picks the masked target tokens through a torch boolean index.  With whole-word masking
(RetroMAE/DupMAE's default) that was 60% of a data-loader worker's time (issue 24).  Here
the lengths are ``np.diff`` of the word starts and everything stays in numpy; the random
draws are fairseq's, in fairseq's order, so every item is identical to fairseq's
(``tests/test_mask_tokens.py`` compares them exactly, option by option).
"""

from functools import lru_cache

import numpy as np
import torch
from fairseq.data import MaskTokensDataset as FairseqMaskTokensDataset


class MaskTokensDataset(FairseqMaskTokensDataset):
    """Drop-in for fairseq's (``apply_mask`` included): identical items, faster whole-word masking."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        words = self.mask_whole_words
        self._word_starts = None if words is None else np.asarray(words).astype(bool)

    def __getitem__(self, index: int):
        return self._item(self.seed, self.epoch, index)

    @lru_cache(maxsize=8)  # noqa: B019  (as fairseq's: the src and target views of one index, read in turn)
    def _item(self, seed: int, epoch: int, index: int) -> torch.Tensor:
        rng = np.random.default_rng(int(hash((seed, epoch, index)) % 1e6))  # fairseq's seeding
        item = np.asarray(self.dataset[index])
        if (item == self.mask_idx).any():
            raise AssertionError(f"Dataset contains mask_idx (={self.mask_idx}), this is not expected!")
        if self.skip_masking:
            return torch.from_numpy(np.copy(item))
        sz = len(item)
        word_lens = None
        if self._word_starts is not None:
            begins = np.flatnonzero(self._word_starts[item])
            sz = len(begins)
            # fairseq drops what precedes the first word start (np.split(...)[1:])
            word_lens = np.diff(np.append(begins, len(item)))

        mask = np.full(sz, False)
        num_mask = int(self.mask_prob * sz / float(self.mask_multiple_length) + rng.random())
        mask_idc = rng.choice(sz, num_mask, replace=False)
        if self.mask_stdev > 0.0:
            lengths = rng.normal(self.mask_multiple_length, self.mask_stdev, size=num_mask)
            lengths = np.maximum(0, np.round(lengths).astype(np.int64))  # fairseq: max(0, int(round(x)))
            mask_idc = np.repeat(mask_idc, lengths) + _ranges(lengths)
        else:
            mask_idc = np.concatenate([mask_idc + i for i in range(self.mask_multiple_length)])
        mask[mask_idc[mask_idc < len(mask)]] = True

        if self.return_masked_tokens:
            if word_lens is not None:
                mask = np.repeat(mask, word_lens)
            new_item = np.full(len(mask), self.pad_idx)
            new_item[mask] = item[mask]
            return torch.from_numpy(new_item)

        rand_or_unmask_prob = self.random_token_prob + self.leave_unmasked_prob
        unmask = rand_mask = None
        if rand_or_unmask_prob > 0.0:
            rand_or_unmask = mask & (rng.random(sz) < rand_or_unmask_prob)
            if self.random_token_prob == 0.0:
                unmask = rand_or_unmask
            elif self.leave_unmasked_prob == 0.0:
                rand_mask = rand_or_unmask
            else:
                decision = rng.random(sz) < self.leave_unmasked_prob / rand_or_unmask_prob
                unmask = rand_or_unmask & decision
                rand_mask = rand_or_unmask & ~decision
        if unmask is not None:
            mask = mask ^ unmask
        if word_lens is not None:
            mask = np.repeat(mask, word_lens)
        new_item = np.copy(item)
        new_item[mask] = self.mask_idx
        if rand_mask is not None and rand_mask.sum() > 0:
            if word_lens is not None:
                rand_mask = np.repeat(rand_mask, word_lens)
            new_item[rand_mask] = rng.choice(len(self.vocab), rand_mask.sum(), p=self.weights)
        return torch.from_numpy(new_item)


def _ranges(lengths: np.ndarray) -> np.ndarray:
    """``concatenate([arange(n) for n in lengths])``."""
    ends = np.cumsum(lengths)
    return np.arange(int(ends[-1]) if len(ends) else 0) - np.repeat(ends - lengths, lengths)
