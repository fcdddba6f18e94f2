"""MLM + weak-decoder reconstruction loss (SEED-Encoder, Eq. 10).

    loss = w_mlm * L_MLM + w_dec * L_dec

Two named terms of :class:`~seed_fairseq.criterions.multi_term.MultiTermCriterion`:
``mlm`` (cross-entropy at the masked positions) and ``dec`` (the weak decoder's
cross-entropy at every non-pad target), each a per-token mean over the global
count of its tokens in the update.
"""

from dataclasses import dataclass, field
from typing import Dict

import torch.nn.functional as F
from fairseq.criterions import register_criterion
from fairseq.dataclass import FairseqDataclass

from .multi_term import MultiTermCriterion, Term


@dataclass
class SeedPretrainCriterionConfig(FairseqDataclass):
    mlm_weight: float = field(
        default=0.5,
        metadata={
            "help": "weight of the MLM mean loss. 0.5/0.5 is the authors' code; the "
            "paper's Eq. 10 is a plain sum (1/1), which differs only by a factor 2 "
            "(relevant with gradient clipping)"
        },
    )
    decoder_weight: float = field(
        default=0.5,
        metadata={"help": "weight of the weak decoder's reconstruction mean loss (see --mlm-weight)"},
    )


def token_nll(logits, target, pad):
    """(summed NLL in fp32, number correct) over the positions where target != pad."""
    logits = logits.float().view(-1, logits.size(-1))
    target = target.reshape(-1)
    nll = F.cross_entropy(logits, target, ignore_index=pad, reduction="sum")
    correct = (logits.argmax(-1).eq(target) & target.ne(pad)).sum()
    return Term(nll, correct)


@register_criterion("seed_pretrain", dataclass=SeedPretrainCriterionConfig)
class SeedPretrainCriterion(MultiTermCriterion):
    bottleneck_terms = ("dec",)

    def __init__(self, task, mlm_weight=0.5, decoder_weight=0.5):
        super().__init__(task, {"mlm": mlm_weight, "dec": decoder_weight})

    def compute_terms(self, model, sample) -> Dict[str, Term]:
        pad = self.padding_idx
        masked_tokens = sample["target"].ne(pad)
        mlm_logits, extra = model(**sample["net_input"], masked_tokens=masked_tokens)
        terms = {"mlm": token_nll(mlm_logits, sample["target"][masked_tokens], pad)}
        if extra.get("decoder_out") is not None:  # None: the MLM-only baseline
            terms["dec"] = token_nll(extra["decoder_out"], sample["dec_target"], pad)
        return terms
