"""The enhanced decoder's attention masks, one per example and per row (RetroMAE, Eq. 5).

For a block ``s = [CLS] x1 .. x(n-1)`` the item is a boolean ``(n, n)`` matrix,
True where query row ``i`` may NOT attend key ``j``:

* every row draws its own set of hidden keys among positions ``1 .. n-1``:
  ``int(ratio * U + u)`` of the ``U`` units (whole words when ``word_starts``
  is given, else single pieces), ``u ~ U[0, 1)`` -- fairseq's probabilistic
  rounding of the masked count -- chosen uniformly without replacement;
* column 0 (the [CLS] slot, which carries the encoder's vector) is always
  visible, except to row 0 itself;
* the diagonal is always hidden: position ``i`` never sees its own token;
* ``separators_visible``: special tokens (``</s>`` between sentences) are never
  drawn and stay visible (the reference code); by default they are drawn like
  any other token (the paper's Eq. 5 makes only the first position special).

The draws come from ``numpy.random.default_rng([seed, epoch, index, SALT])``:
independent of the encoder's masking (fairseq's ``MaskTokensDataset`` seeds
with ``hash((seed, epoch, index))``), identical however a batch is split over
``--update-freq`` micro-batches and workers, and on resume.  The collater pads
to ``(batch, T, T)`` with padding rows and columns hidden.
"""

from typing import Optional

import numpy as np
import torch
from fairseq.data import BaseWrapperDataset

# separates these draws from any other stream seeded with (seed, epoch, index)
SALT = 0x5E7D


def decoder_mask(
    tokens: np.ndarray,
    ratio: float,
    rng: np.random.Generator,
    word_starts: Optional[np.ndarray] = None,
    special: Optional[np.ndarray] = None,
) -> np.ndarray:
    """Boolean (n, n): True = hidden.  ``word_starts``/``special``: boolean per position."""
    n = len(tokens)
    hidden = np.zeros((n, n), dtype=bool)
    candidates = np.arange(1, n)
    if special is not None:
        candidates = candidates[~special[1:]]
    if len(candidates):
        if word_starts is not None:
            starts = word_starts[candidates].copy()
            starts[0] = True  # a block may begin inside a word
            unit = np.cumsum(starts) - 1
        else:
            unit = np.arange(len(candidates))
        n_units = int(unit[-1]) + 1
        counts = (ratio * n_units + rng.random(n)).astype(np.int64)  # per row
        keys = rng.random((n, n_units))
        # a row hides its `count` units of smallest key: those up to the count-th smallest key
        # (counts take at most two values, so one partial sort finds every threshold)
        kths = sorted({int(c) - 1 for c in counts if c > 0})
        threshold = np.full(n, -1.0)
        if kths:
            part = np.partition(keys, kths, axis=1)
            has = counts > 0
            threshold[has] = part[has, counts[has] - 1]
        hidden_units = keys <= threshold[:, None]
        hidden[:, candidates] = hidden_units[:, unit]
    hidden[:, 0] = False
    np.fill_diagonal(hidden, True)
    return hidden


class DecoderMaskDataset(BaseWrapperDataset):
    """Per-row attention masks of the enhanced decoder over the UNMASKED blocks."""

    def __init__(
        self,
        blocks,
        ratio: float,
        seed: int,
        word_starts: Optional[torch.Tensor] = None,
        special_symbols: Optional[torch.Tensor] = None,
    ):
        super().__init__(blocks)
        if not 0.0 < ratio < 1.0:
            raise ValueError(f"--decoder-mask-prob must be in (0, 1), got {ratio}")
        self.ratio = float(ratio)
        self.seed = int(seed)
        # per dictionary symbol
        self.word_starts = None if word_starts is None else np.asarray(word_starts, dtype=bool)
        self.special_symbols = None if special_symbols is None else np.asarray(special_symbols, dtype=bool)
        self.epoch = 0

    @property
    def can_reuse_epoch_itr_across_epochs(self) -> bool:
        return True  # only the draws change with the epoch, not the sizes

    def set_epoch(self, epoch, **unused) -> None:
        super().set_epoch(epoch)
        self.epoch = epoch

    def __getitem__(self, index):
        tokens = np.asarray(self.dataset[index])
        rng = np.random.default_rng([self.seed, self.epoch, int(index), SALT])
        return torch.from_numpy(
            decoder_mask(
                tokens,
                self.ratio,
                rng,
                word_starts=None if self.word_starts is None else self.word_starts[tokens],
                special=None if self.special_symbols is None else self.special_symbols[tokens],
            )
        )

    def collater(self, samples) -> torch.Tensor:
        if len(samples) == 0:
            return torch.zeros(0, 0, 0, dtype=torch.bool)
        t = max(s.size(0) for s in samples)
        out = torch.ones(len(samples), t, t, dtype=torch.bool)  # padding: hidden
        for i, s in enumerate(samples):
            out[i, : s.size(0), : s.size(0)] = s
        return out
