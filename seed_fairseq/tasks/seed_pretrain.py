"""``seed_pretrain``: SEED-Encoder's data (Lu et al., EMNLP 2021).

On top of the shared pipeline (``bottleneck_pretrain.py``: blocks, [CLS], the
encoder's MLM view), the weak decoder reads the UNMASKED block shifted right
and predicts it shifted left:

    s = [CLS] x1 .. xn </s>   ->   prev_output_tokens = s[:-1],  dec_target = s[1:]
"""

from dataclasses import dataclass
from typing import Dict

import torch
from fairseq.data import RightPadDataset
from fairseq.tasks import register_task

from ..data.shift_tokens_dataset import ShiftTokensDataset
from .bottleneck_pretrain import WORD_START, BottleneckPretrainConfig, BottleneckPretrainTask  # noqa: F401


@dataclass
class SeedPretrainConfig(BottleneckPretrainConfig):
    pass


@register_task("seed_pretrain", dataclass=SeedPretrainConfig)
class SeedPretrainTask(BottleneckPretrainTask):
    """MLM + weak-decoder reconstruction pre-training (SEED-Encoder)."""

    cfg: SeedPretrainConfig

    def extra_inputs(self, split, blocks, src, target) -> Dict:
        pad = self.source_dictionary.pad()
        return {
            "net_input": {"prev_output_tokens": RightPadDataset(ShiftTokensDataset(blocks, drop="last"), pad_idx=pad)},
            "dec_target": RightPadDataset(ShiftTokensDataset(blocks, drop="first"), pad_idx=pad),
        }

    def term_counts(self, sample) -> Dict[str, torch.Tensor]:
        counts = super().term_counts(sample)
        counts["dec"] = sample["dec_target"].ne(self.source_dictionary.pad()).sum()
        return counts
