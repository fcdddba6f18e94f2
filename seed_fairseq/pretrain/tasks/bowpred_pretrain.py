"""``bowpred_pretrain``: the data of Bag-of-Word Prediction ("Drop your Decoder", Ma et al.,
SIGIR 2024; docs/objectives/bowpred.md).

On top of the shared pipeline (``bottleneck_pretrain.py``: blocks, [CLS], the encoder's
MLM view, here 30% whole words as the reference code) each text brings its unmasked
tokens, from which the criterion builds the bag of words -- the SET of the text's
distinct ordinary tokens (specials and <mask> excluded):

    s = [CLS] x1 .. xn  (unmasked)  ->  src_tokens, target   (the base task's MLM view)
                                        bow_tokens = s       (NOT a model input)

Units of the ``bow`` term (``--bow-normalize``): ``text`` (default) the texts whose bag
is not empty -- each text's loss is already the mean over its bag, so the term is the
mean over texts, as the reference code averages it; ``distinct`` the (text, token)
pairs of the update.
"""

from dataclasses import dataclass, field
from typing import Dict, Tuple

import torch
from fairseq.data import RightPadDataset
from fairseq.dataclass import ChoiceEnum
from fairseq.tasks import register_task

from ...base.objectives import ObjectiveDescription
from ...base.vocabulary.dictionary import is_ordinary
from .bottleneck_pretrain import BottleneckPretrainTask
from .config import BottleneckPretrainConfig

BOW_NORMALIZE_CHOICES = ChoiceEnum(["text", "distinct"])


def bag_of_words(tokens: torch.Tensor, nspecial: int, mask_idx: int, vocab_size: int) -> torch.Tensor:
    """(batch, vocab) bool: the set of each text's distinct ordinary tokens (``tokens``: (batch, time) ids)."""
    ordinary = is_ordinary(tokens, nspecial, mask_idx)
    bag = torch.zeros(tokens.size(0), vocab_size, dtype=torch.bool, device=tokens.device)
    bag.scatter_(1, tokens, ordinary)  # a special's column gets False, an ordinary token's True
    return bag


@dataclass
class BowPredPretrainConfig(BottleneckPretrainConfig):
    mask_prob: float = field(
        default=0.3,
        metadata={"help": "encoder masking ratio (the reference code's: 0.3, whole words)"},
    )
    mask_single_pieces: bool = field(
        default=False,
        metadata={"help": "mask sentencepiece pieces independently (default: whole words, as the reference code)"},
    )
    bow_normalize: BOW_NORMALIZE_CHOICES = field(
        default="text",
        metadata={
            "help": "how the bag-of-words loss is averaged: 'text' (default; the reference code's) = "
            "per text, the mean over its distinct tokens, then the mean over texts; 'distinct' = the sum over "
            "every (text, distinct token) pair of the update divided by their number"
        },
    )


BOWPRED = ObjectiveDescription(
    "bowpred",
    "bowpred_pretrain",
    title="Bag-of-Word Prediction",
    card_text="MLM plus the prediction of each text's bag of words from the [CLS] vector through the MLM head "
    "(Drop your Decoder, Ma et al., SIGIR 2024)",
    tag="bow-prediction",
    paper="Ma et al., 'Drop your Decoder: Pre-training with Bag-of-Word Prediction for Dense Passage Retrieval', "
    "SIGIR 2024",
    paper_url="https://arxiv.org/abs/2401.11248",
    doc="docs/objectives/bowpred.md",
    heads_text="none: the MLM head predicts the bag from the bottleneck vector",
    label="Bag-of-Word Prediction",
    arch="bowpred_base",
    notes="MLM 30% whole words + the text's distinct tokens predicted from [CLS] through the MLM head "
    "(no decoder, no new parameters)",
    masking="30% whole words",
    order=50,
    test_arch="bowpred_tiny",
    terms=("mlm", "bow"),
    bottleneck_terms=("bow",),
)


@register_task("bowpred_pretrain", dataclass=BowPredPretrainConfig)
class BowPredPretrainTask(BottleneckPretrainTask):
    """MLM + the bag of words of each text predicted from its bottleneck vector (Bag-of-Word Prediction)."""

    cfg: BowPredPretrainConfig
    objectives = (BOWPRED,)

    def __init__(self, cfg: BowPredPretrainConfig, dictionary=None):
        # whole words unless asked otherwise (a bool option defaulting to True would be a flag
        # that turns it off); the base's mask_view reads mask_whole_words
        cfg.mask_whole_words = not cfg.mask_single_pieces
        super().__init__(cfg, dictionary)

    def extra_inputs(self, split, blocks, src, target) -> Dict:
        return {"bow_tokens": RightPadDataset(blocks, pad_idx=self.source_dictionary.pad())}

    def bag(self, sample) -> Tuple[torch.Tensor, torch.Tensor]:
        """``(bag, size)``: each text's bag of words (batch, vocab) bool and its size (batch,)."""
        d = self.source_dictionary
        bag = bag_of_words(sample["bow_tokens"], d.nspecial, self.mask_idx, len(d))
        return bag, bag.sum(1)

    def term_counts(self, sample) -> Dict[str, torch.Tensor]:
        counts = super().term_counts(sample)
        _, size = self.bag(sample)
        counts["bow"] = size.sum() if self.cfg.bow_normalize == "distinct" else size.gt(0).sum()
        return counts
