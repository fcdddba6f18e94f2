"""``seed_pretrain``: SEED-Encoder's data (Lu et al., EMNLP 2021).

On top of the shared pipeline (``bottleneck_pretrain.py``: blocks, [CLS], the
encoder's MLM view), the weak decoder reads the UNMASKED block shifted right
and predicts it shifted left:

    s = [CLS] x1 .. xn </s>   ->   prev_output_tokens = s[:-1],  dec_target = s[1:]
"""

import dataclasses
from dataclasses import dataclass
from typing import Dict

import torch
from fairseq.data import RightPadDataset
from fairseq.tasks import register_task

from ...base.objectives import ObjectiveDescription
from ..data.shift_tokens_dataset import ShiftTokensDataset
from ..modules.windowed_decoder import FULL
from .bottleneck_pretrain import BottleneckPretrainTask
from .config import BottleneckPretrainConfig


@dataclass
class SeedPretrainConfig(BottleneckPretrainConfig):
    pass


SEED = ObjectiveDescription(
    "seed",
    "seed_pretrain",
    title="SEED-Encoder",
    card_text="MLM plus a weak decoder that reconstructs the input from the [CLS] vector alone "
    "(SEED-Encoder, Lu et al., EMNLP 2021)",
    tag="seed-encoder",
    paper="Lu et al., 'Less is More: Pre-train a Strong Text Encoder for Dense Retrieval Using a Weak "
    "Decoder', EMNLP 2021",
    paper_url="https://arxiv.org/abs/2102.09206",
    doc="docs/objectives/seed_encoder.md",
    heads_text="3 causal layers, attention window k=2",
    label="SEED-Encoder (weak decoder, k=2)",
    arch="seed_encoder_base",
    notes="MLM 15% + 3-layer decoder with attention window 2 over the unmasked text; 0.5/0.5 weights",
    order=10,
    test_arch="seed_encoder_tiny",
    test_args=("--decoder-layers", "2"),
    terms=("mlm", "dec"),
    bottleneck_terms=("dec",),
    heads=("weak_decoder.",),
)
SEED_FULL = dataclasses.replace(
    SEED,
    name="seed_full",
    matches=lambda model_cfg: (
        bool(model_cfg.get("decoder_layers")) and str(model_cfg.get("decoder_attention_window")) == FULL
    ),
    title="SEED-Encoder (full-attention decoder ablation)",
    heads_text="the same decoder with full causal attention",
    label="SEED, full-attention decoder",
    compare_name="full",
    args=("--decoder-attention-window", FULL),
    notes="the paper's strong-decoder ablation: the same decoder with full causal attention",
    order=11,
    test_args=("--decoder-layers", "1", "--decoder-attention-window", FULL),
)
MLM_ONLY = dataclasses.replace(
    SEED,
    name="mlm_only",
    matches=lambda model_cfg: not model_cfg.get("decoder_layers"),
    title="MLM-only encoder",
    card_text="masked language modelling only (the baseline of SEED-Encoder's comparison)",
    paper="",
    paper_url="",
    heads_text="",
    label="MLM only",
    compare_name="mlm",
    arch="seed_encoder_mlm_only",
    args=("--mlm-weight", "1.0"),
    notes="the BERT baseline on the identical pipeline (MLM 15%, weight 1)",
    order=12,
    test_arch="seed_encoder_mlm_only",
    test_args=(),
    terms=("mlm",),
    bottleneck_terms=(),
    heads=(),
)


@register_task("seed_pretrain", dataclass=SeedPretrainConfig)
class SeedPretrainTask(BottleneckPretrainTask):
    """MLM + weak-decoder reconstruction pre-training (SEED-Encoder)."""

    cfg: SeedPretrainConfig
    objectives = (SEED, SEED_FULL, MLM_ONLY)

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
