"""The randomness of replaced language modelling (SimLM), drawn in the data pipeline.

For every block ``[CLS] x1 .. xn`` this draws, from ``(seed, epoch, index)``
only (never from torch's RNG in the model):

* the encoder's masked set (``enc_prob`` of the maskable units) and the
  decoder's (``dec_prob``), the decoder's CONTAINING the encoder's (SimLM,
  Sec. 3.1): one random order of the units, the encoder takes the first
  ``k_enc`` of it and the decoder the first ``k_dec >= k_enc``;
* uniform noise per position, one array for each side, with which the frozen
  generator samples its replacements by inverse CDF (``generator.py``).

Maskable units are the non-special positions (special = an id below the
dictionary's ``nspecial``: ``<s>`` = [CLS], ``<pad>``, ``</s>``, ``<unk>``,
plus ``<mask>``), or, with whole-word masking, the words they form.  The count
is ``floor(p * units + r)`` with one uniform ``r`` for both sides (fairseq's
probabilistic rounding; ``k_dec >= k_enc`` since ``dec_prob >= enc_prob``).

Each item is a dict:

``enc`` / ``dec``
    the block with ``<mask>`` at the side's masked positions: the generator's
    input (the paper's ``Mask(x, p)``; the reference's ``--all_use_mask_token``);
``target``
    the ORIGINAL token at every non-special position, ``<pad>`` elsewhere: what
    both encoder and decoder predict (replaced language modelling);
``enc_noise`` / ``dec_noise``
    int32 in ``[0, 2**24)``: ``u = noise / 2**24`` is a float32-exact uniform
    in ``[0, 1)``.  Integers, because fairseq casts every floating tensor of a
    batch to fp16/bf16 under ``--fp16``/``--bf16``, which would round ``u``.
"""

from typing import Dict, Optional, Tuple

import numpy as np
import torch
from fairseq.data import BaseWrapperDataset, Dictionary

from ...base.vocabulary.dictionary import is_ordinary

NOISE_BITS = 24
FIELDS = ("enc", "dec", "target", "enc_noise", "dec_noise")


def special_ids(vocab: Dictionary, mask_idx: int) -> np.ndarray:
    """Boolean over the dictionary: never masked, never predicted, never sampled."""
    return ~is_ordinary(np.arange(len(vocab)), vocab.nspecial, mask_idx)


def unit_ids(tokens: np.ndarray, special: np.ndarray, word_starts: Optional[np.ndarray]) -> np.ndarray:
    """Per position: the index of the maskable unit it belongs to, -1 for specials.

    Without ``word_starts`` every non-special position is its own unit; with it
    a unit is a word (a word-start piece and the pieces continuing it).  A
    special token ends a word, so a piece right after one starts a new unit.
    """
    maskable = ~special[tokens]
    starts = maskable.copy()
    if word_starts is not None:
        previous_maskable = np.concatenate([[False], maskable[:-1]])
        starts &= word_starts[tokens] | ~previous_maskable
    units = np.cumsum(starts) - 1
    return np.where(maskable, units, -1)


def draw_masks(
    rng: np.random.Generator, units: np.ndarray, enc_prob: float, dec_prob: float
) -> Tuple[np.ndarray, np.ndarray]:
    """(encoder masked positions, decoder masked positions), decoder ⊇ encoder."""
    n = int(units.max()) + 1 if units.size else 0
    r = rng.random()
    k_enc = min(n, int(enc_prob * n + r))
    k_dec = min(n, int(dec_prob * n + r))
    order = rng.permutation(n)
    enc = np.isin(units, order[:k_enc])
    dec = np.isin(units, order[:k_dec])
    return enc, dec


class ReplacedLMNoiseDataset(BaseWrapperDataset):
    """Blocks -> dicts of :data:`FIELDS` (see the module docstring)."""

    def __init__(
        self,
        dataset,
        vocab: Dictionary,
        mask_idx: int,
        seed: int,
        enc_prob: float,
        dec_prob: float,
        word_starts: Optional[torch.Tensor] = None,
    ):
        super().__init__(dataset)
        if not 0.0 <= enc_prob <= dec_prob <= 1.0:
            raise ValueError(f"need 0 <= encoder mask prob ({enc_prob}) <= decoder mask prob ({dec_prob}) <= 1")
        self.pad_idx = vocab.pad()
        self.mask_idx = mask_idx
        self.seed = seed
        self.enc_prob = enc_prob
        self.dec_prob = dec_prob
        self.special = special_ids(vocab, mask_idx)
        self.word_starts = None if word_starts is None else np.asarray(word_starts, dtype=bool)
        self.epoch = 0
        self._last = (None, None)

    @property
    def can_reuse_epoch_itr_across_epochs(self) -> bool:
        return True  # only the noise changes with the epoch, not the sizes

    def set_epoch(self, epoch, **unused) -> None:
        super().set_epoch(epoch)
        self.epoch = epoch

    def __getitem__(self, index: int) -> Dict[str, torch.Tensor]:
        # The batch's NestedDictionaryDataset reads the fields of one index one
        # after the other: draw once, serve all five.
        key = (self.seed, self.epoch, index)
        if self._last[0] != key:
            self._last = (key, self._draw(*key))
        return self._last[1]

    def _draw(self, seed: int, epoch: int, index: int) -> Dict[str, torch.Tensor]:
        tokens = np.asarray(self.dataset[index], dtype=np.int64)
        if (tokens == self.mask_idx).any():
            raise ValueError(f"block {index} contains <mask> (id {self.mask_idx}): the data must not")
        rng = np.random.default_rng([seed, epoch, index])
        units = unit_ids(tokens, self.special, self.word_starts)
        enc, dec = draw_masks(rng, units, self.enc_prob, self.dec_prob)
        target = np.where(units >= 0, tokens, self.pad_idx)
        noise = rng.integers(0, 2**NOISE_BITS, size=(2, len(tokens)), dtype=np.int32)
        return {
            "enc": torch.from_numpy(np.where(enc, self.mask_idx, tokens)),
            "dec": torch.from_numpy(np.where(dec, self.mask_idx, tokens)),
            "target": torch.from_numpy(target),
            "enc_noise": torch.from_numpy(noise[0]),
            "dec_noise": torch.from_numpy(noise[1]),
        }


class FieldDataset(BaseWrapperDataset):
    """One field of a dataset of dicts (sizes, epochs and caching stay the wrapped one's)."""

    def __init__(self, dataset, key: str):
        super().__init__(dataset)
        self.key = key

    def __getitem__(self, index):
        return self.dataset[index][self.key]
