"""The loss of Bag-of-Word Prediction ("Drop your Decoder", Ma et al., SIGIR 2024):

    loss = w_mlm * L_MLM + w_bow(t) * L_BoW

Two named terms of :class:`~seed_fairseq.pretrain.criterions.multi_term.MultiTermCriterion`:

``mlm``  cross-entropy at the masked positions (``--vocab-loss``, like every objective's);
         a mean over the global count of masked tokens.
``bow``  the bag of words of the unmasked text predicted from the bottleneck vector
         ``h`` ([CLS] by default; ``--bottleneck-pooling``) through the MLM head -- its
         transform and its vocabulary projection, no parameter of its own:

             p = softmax(W . LN(gelu(D h)) + b)               (|V| entries)
             L_BoW(text) = - 1/|S| sum_{w in S} log p_w        S: the text's distinct ordinary tokens

         then the mean over texts (``--bow-normalize text``, the task's default; ``distinct``
         divides the summed loss by the number of (text, token) pairs instead).  ``bow_acc``
         (``distinct`` only) is the share of the bag ranked in the text's top-|S| entries.
         The |V| logits are computed in full for the B bottleneck vectors (B x |V|: a
         batch's worth, not a position's), in fp32.

``w_bow(t)``: ``--bow-weight`` throughout (the paper's sum of the two losses), or with
``--bow-weight-decay-to R`` times a factor that falls along a cosine from 1 at update 0 to R
at ``--max-update`` (the reference code's published commands: R = 0.1).  The factor scales
the weight for the update only: ``self.weights`` keeps the configured weights.  ``bow``
sees the encoder only through the bottleneck vector.
"""

import math
from dataclasses import dataclass, field
from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn.functional as F
from fairseq.criterions import register_criterion
from omegaconf import II

from .multi_term import MultiTermCriterion, Term
from .vocab_loss import VocabLossConfig, VocabLossMixin


@dataclass
class BowPredPretrainCriterionConfig(VocabLossConfig):
    mlm_weight: float = field(default=1.0, metadata={"help": "weight of the MLM mean loss (paper: 1)"})
    bow_weight: float = field(default=1.0, metadata={"help": "weight of the bag-of-words loss (paper: 1)"})
    bow_weight_decay_to: Optional[float] = field(
        default=None,
        metadata={
            "help": "multiply the bag-of-words weight by a factor falling along a cosine from 1 at update 0 to "
            "this at --max-update (the reference code's commands: 0.1); default: a constant --bow-weight (the paper)"
        },
    )
    max_update: int = II("optimization.max_update")


def decay_factor(decay_to: Optional[float], num_updates: int, max_update: int) -> float:
    """The factor of the ``bow`` weight at ``num_updates``: 1, or the cosine from 1 to ``decay_to``."""
    if decay_to is None or not max_update:
        return 1.0
    progress = min(max(num_updates, 0), max_update) / max_update
    return decay_to + (1.0 - decay_to) * 0.5 * (1.0 + math.cos(math.pi * progress))


def bow_term(logits: torch.Tensor, bag: torch.Tensor, normalize: str) -> Term:
    """L_BoW summed over the texts of a batch: ``logits`` (batch, vocab), ``bag`` (batch, vocab) bool."""
    nll = -F.log_softmax(logits.float(), dim=-1).masked_fill(~bag, 0.0).sum(-1)  # per text, over its bag
    size = bag.sum(-1)
    if normalize == "text":
        return Term((nll / size.clamp(min=1)).sum())
    order = logits.float().argsort(dim=-1, descending=True)
    positions = torch.arange(logits.size(1), device=logits.device).expand_as(order)
    rank = torch.empty_like(order).scatter_(1, order, positions)
    return Term(nll.sum(), (bag & rank.lt(size.unsqueeze(1))).sum())


@register_criterion("bowpred_pretrain", dataclass=BowPredPretrainCriterionConfig)
class BowPredPretrainCriterion(VocabLossMixin, MultiTermCriterion):
    bottleneck_terms = ("bow",)

    def __init__(self, cfg: BowPredPretrainCriterionConfig, task):
        super().__init__(task, {"mlm": cfg.mlm_weight, "bow": cfg.bow_weight})
        self.set_vocab_loss(cfg)
        self.decay_to, self.max_update = cfg.bow_weight_decay_to, int(cfg.max_update or 0)

    def forward(self, model, sample, reduce=True) -> Tuple[torch.Tensor, int, Dict[str, Any]]:
        factor = decay_factor(self.decay_to, int(getattr(model, "num_updates", 0) or 0), self.max_update)
        if factor == 1.0:
            return super().forward(model, sample, reduce)
        configured = self.weights
        self.weights = {**configured, "bow": configured.get("bow", 1.0) * factor}
        try:
            return super().forward(model, sample, reduce)
        finally:
            self.weights = configured

    def compute_terms(self, model, sample) -> Dict[str, Term]:
        src, target = sample["net_input"]["src_tokens"], sample["target"]
        masked = target.ne(self.padding_idx)
        # no pre-training input: RoBERTa's forward, the features of every position
        features, _ = model(src, features_only=True)
        weight, bias = projection = model.mlm_projection()
        terms = {"mlm": self.vocabulary_term(model.mlm_hidden(features, masked), projection, target[masked])}
        logits = F.linear(model.mlm_hidden(model.bottleneck_vector(features, src)), weight, bias)
        bag, _ = self.task.bag(sample)
        terms["bow"] = bow_term(logits, bag, str(self.task.cfg.bow_normalize))
        return terms
