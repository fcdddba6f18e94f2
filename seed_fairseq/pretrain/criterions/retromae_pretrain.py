"""RetroMAE / DupMAE losses (DupMAE paper, Eq. 4, 8, 9).

    loss = w_mlm * L_MLM + w_dec * L_dec [+ w_bow * L_BoW]

Named terms of :class:`~seed_fairseq.pretrain.criterions.multi_term.MultiTermCriterion`,
each divided by the global count of its units in the update:

* ``mlm``: cross-entropy at the encoder's masked positions (units: masked tokens);
* ``dec``: the enhanced decoder's cross-entropy at every ordinary position of
  the unmasked block (units: those positions) -- sees the encoder only through
  the bottleneck vector, [CLS] by default (``bottleneck_terms``);
* ``bow`` (DupMAE only): ``mu = max_t`` of the MLM head's vocabulary logits over
  the ordinary, unmasked positions of the encoder's input; cross-entropy of
  ``log_softmax(mu)`` at every distinct ordinary token of the text (units: see
  ``--bow-normalize`` of the task).  ``bow_acc`` is the share of a text's
  distinct tokens among the top-|set| entries of ``mu``.

The weights default to the paper's plain sum (Eq. 9); the reference code
weighs the bag of words 0.1 (``--bow-weight 0.1``).
"""

from dataclasses import dataclass, field
from typing import Dict

import torch
import torch.nn.functional as F
from fairseq.criterions import register_criterion

from .multi_term import MultiTermCriterion, Term
from .vocab_loss import VocabLossConfig, VocabLossMixin


@dataclass
class RetroMAECriterionConfig(VocabLossConfig):
    mlm_weight: float = field(default=1.0, metadata={"help": "weight of the encoder's MLM mean loss (Eq. 9: 1)"})
    decoder_weight: float = field(
        default=1.0, metadata={"help": "weight of the enhanced decoder's reconstruction mean loss (Eq. 9: 1)"}
    )


@dataclass
class DupMAECriterionConfig(RetroMAECriterionConfig):
    bow_weight: float = field(
        default=1.0,
        metadata={"help": "weight of the bag-of-words loss (paper, Eq. 9: 1; reference code: 0.1)"},
    )
    bow_pool_all_positions: bool = field(
        default=False,
        metadata={
            "help": "max-pool the bag-of-words logits over every non-pad position after [CLS], masked "
            "positions and </s> included, as the reference code (default: the paper's ordinary tokens "
            "of the masked input, masked positions excluded, Eq. 6)"
        },
    )


def bow_term(mu: torch.Tensor, bag: torch.Tensor, length: torch.Tensor, normalize: str) -> Term:
    """Eq. 8 summed over the texts of a batch: ``mu`` (batch, vocab) pooled logits,
    ``bag`` (batch, vocab) bool targets, ``length`` (batch,) ordinary tokens per text."""
    nll = -F.log_softmax(mu.float(), dim=-1).masked_fill(~bag, 0.0).sum(-1)  # per text
    size = bag.sum(-1)
    if normalize == "tokens":
        return Term((nll / length.clamp(min=1)).sum())
    # a target counts as recovered when it ranks among the text's top-|set| entries
    order = mu.float().argsort(dim=-1, descending=True)
    rank = torch.empty_like(order).scatter_(1, order, torch.arange(mu.size(1), device=mu.device).expand_as(order))
    correct = (bag & rank.lt(size.unsqueeze(1))).sum()
    return Term(nll.sum(), correct)


@register_criterion("retromae_pretrain", dataclass=RetroMAECriterionConfig)
class RetroMAECriterion(VocabLossMixin, MultiTermCriterion):
    bottleneck_terms = ("dec",)
    with_bow = False

    def __init__(self, cfg: RetroMAECriterionConfig, task):
        super().__init__(task, self.term_weights(cfg))
        self.set_vocab_loss(cfg)

    @staticmethod
    def term_weights(cfg) -> Dict[str, float]:
        return {"mlm": cfg.mlm_weight, "dec": cfg.decoder_weight}

    def bow_positions(self, sample) -> None:
        """(batch, T) bool: the positions DupMAE max-pools over; None: no bag of words."""
        return None

    def compute_terms(self, model, sample) -> Dict[str, Term]:
        masked_tokens = sample["target"].ne(self.padding_idx)
        dec_tokens = sample["net_input"]["dec_tokens"]
        dec_positions = self.task.ordinary(dec_tokens)
        dec_positions[:, 0] = False
        mlm_features, extra = model(
            **sample["net_input"],
            masked_tokens=masked_tokens,
            dec_positions=dec_positions,
            bow_positions=self.bow_positions(sample),
        )
        decoder_features = extra["decoder_features"]
        terms = {
            "mlm": self.vocabulary_term(mlm_features, model.mlm_projection(), sample["target"][masked_tokens]),
            "dec": self.vocabulary_term(decoder_features, model.decoder_projection(), dec_tokens[dec_positions]),
        }
        if self.with_bow:
            bag, length = self.task.bag_of_words(dec_tokens)
            terms["bow"] = bow_term(extra["bow_logits"], bag, length, self.task.cfg.bow_normalize)
        return terms


@register_criterion("dupmae_pretrain", dataclass=DupMAECriterionConfig)
class DupMAECriterion(RetroMAECriterion):
    with_bow = True

    def __init__(self, cfg: DupMAECriterionConfig, task):
        if not getattr(task, "with_bow", False):
            raise ValueError(
                f"--criterion dupmae_pretrain needs --task dupmae_pretrain (got {type(task).__name__}): "
                "the bag-of-words targets come from the task"
            )
        super().__init__(cfg, task)
        self.bow_pool_all_positions = cfg.bow_pool_all_positions

    @staticmethod
    def term_weights(cfg) -> Dict[str, float]:
        return {**RetroMAECriterion.term_weights(cfg), "bow": cfg.bow_weight}

    def bow_positions(self, sample) -> torch.Tensor:
        dec_tokens = sample["net_input"]["dec_tokens"]
        if self.bow_pool_all_positions:
            pool = dec_tokens.ne(self.padding_idx)
        else:
            pool = self.task.ordinary(dec_tokens) & sample["target"].eq(self.padding_idx)
        pool[:, 0] = False
        return pool
