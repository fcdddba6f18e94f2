"""Condenser's head (Gao & Callan, EMNLP 2021, Sec. 3.2): Transformer layers over the pair of a late
and an early representation,

    [h_cd] = Head([h_cls^late ; h^early])

position 0 the LAST layer's [CLS] vector (here the bottleneck vector, ``--bottleneck-pooling``),
positions 1.. the token states of an EARLY layer (its own [CLS] state is replaced).  The layers are
built like the encoder's (same class, sizes, activation, post-LayerNorm; the model sets their eps and
initialises them as BERT); the padding is the encoder input's.  ``stack_views`` makes one batch of
two views of different widths (coCondenser's two spans).
"""

from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn


def stack_views(first: torch.Tensor, second: torch.Tensor, pad: int) -> torch.Tensor:
    """``(2B, T)``: ``first`` and ``second`` (each ``(B, T_i)``, right-padded) one above the other,
    right-padded with ``pad`` to the wider one's width."""
    width = max(first.size(1), second.size(1))
    return torch.cat([F.pad(v, (0, width - v.size(1)), value=pad) for v in (first, second)])


class CondenserHead(nn.Module):
    def __init__(self, layers: Sequence[nn.Module]):
        super().__init__()
        self.layers = nn.ModuleList(layers)

    def forward(self, vector: torch.Tensor, early: torch.Tensor, padding_mask: torch.Tensor) -> torch.Tensor:
        """``(B, T, C)`` from the bottleneck vector ``(B, C)``, the early token states ``(B, T, C)`` and
        the input's padding ``(B, T)`` (True at a pad)."""
        x = torch.cat([vector.unsqueeze(1).to(early.dtype), early[:, 1:]], dim=1).transpose(0, 1)
        mask = padding_mask if padding_mask.any() else None  # as fairseq's encoder: no mask without pads
        for layer in self.layers:
            x = layer(x, encoder_padding_mask=mask)
        return x.transpose(0, 1)
