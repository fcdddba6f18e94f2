"""``condenser_pretrain``: Condenser's data (Gao & Callan, EMNLP 2021).

The shared pipeline as it is (``bottleneck_pretrain.py``: blocks, [CLS], the encoder's masked view
and MLM target, BERT's masking: 15%, 80/10/10, the paper's "masking scheme in Devlin et al."); the
Condenser head predicts the same masked positions as the backbone, so both terms average over the
masked tokens.  What the objective adds is in the model (``models/condenser.py``: the head reading
the late [CLS] and the early layer's token states) and the criterion
(``criterions/condenser_pretrain.py``).  coCondenser (``cocondenser_pretrain.py``) builds on this
task.
"""

from dataclasses import dataclass
from typing import Dict

import torch
from fairseq.tasks import register_task

from ...base.objectives import ObjectiveDescription
from .bottleneck_pretrain import BottleneckPretrainTask
from .config import BottleneckPretrainConfig

PAPER = "Gao & Callan, 'Condenser: a Pre-training Architecture for Dense Retrieval', EMNLP 2021"
PAPER_URL = "https://arxiv.org/abs/2104.08253"
HEADS_TEXT = "2 Transformer layers over the late bottleneck vector and the token states of layer 6 (of 12)"


@dataclass
class CondenserPretrainConfig(BottleneckPretrainConfig):
    pass


CONDENSER = ObjectiveDescription(
    "condenser",
    "condenser_pretrain",
    title="Condenser",
    card_text="MLM plus Condenser's head: 2 Transformer layers predicting the masked tokens from the last "
    "layer's [CLS] vector and the token states of an early layer (Condenser, Gao & Callan, EMNLP 2021)",
    tag="condenser",
    paper=PAPER,
    paper_url=PAPER_URL,
    doc="docs/objectives/condenser.md",
    heads_text=HEADS_TEXT,
    label="Condenser",
    arch="condenser_base",
    notes="MLM 15% on the backbone (late MLM) + the same MLM from a 2-layer head over [late [CLS]; layer-6 "
    "tokens]; weights 1/1",
    order=60,
    test_arch="condenser_tiny",
    terms=("mlm", "head"),
    # the head reads the early layer's token states (a skip connection below the last layer) and, of the
    # last layer, only the bottleneck vector: the contract perturbs the LAST layer's output, so its check
    # is exactly "the head sees the late layer only through the pooling"
    bottleneck_terms=("head",),
    heads=("condenser_head.",),
)


@register_task("condenser_pretrain", dataclass=CondenserPretrainConfig)
class CondenserPretrainTask(BottleneckPretrainTask):
    """MLM on the backbone + MLM through the Condenser head (Condenser)."""

    cfg: CondenserPretrainConfig
    objectives = (CONDENSER,)

    def term_counts(self, sample) -> Dict[str, torch.Tensor]:
        counts = super().term_counts(sample)
        counts["head"] = counts["mlm"].clone()  # the head predicts the backbone's masked positions
        return counts
