"""MLM + weak-decoder reconstruction loss (SEED-Encoder, Eq. 10).

    loss = w_mlm * L_MLM + w_dec * L_dec

Two named terms of :class:`~seed_fairseq.pretrain.criterions.multi_term.MultiTermCriterion`:
``mlm`` (cross-entropy at the masked positions) and ``dec`` (the weak decoder's
cross-entropy at every non-pad target), each a per-token mean over the global
count of its tokens in the update.

Both vocabulary predictions go through ``--vocab-loss`` (``vocab_loss.py``): by
default the fused chunked linear cross-entropy, which never materialises the
decoder's ``batch x length x vocabulary`` logits; ``--vocab-loss plain`` computes
the full logits, then ``F.cross_entropy`` (the reference).
"""

from dataclasses import dataclass, field
from typing import Dict

from fairseq.criterions import register_criterion

from .multi_term import MultiTermCriterion, Term
from .vocab_loss import VocabLossConfig, VocabLossMixin


@dataclass
class SeedPretrainCriterionConfig(VocabLossConfig):
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


@register_criterion("seed_pretrain", dataclass=SeedPretrainCriterionConfig)
class SeedPretrainCriterion(VocabLossMixin, MultiTermCriterion):
    bottleneck_terms = ("dec",)

    def __init__(self, cfg: SeedPretrainCriterionConfig, task):
        super().__init__(task, {"mlm": cfg.mlm_weight, "dec": cfg.decoder_weight})
        self.set_vocab_loss(cfg)

    def compute_terms(self, model, sample) -> Dict[str, Term]:
        masked_tokens = sample["target"].ne(self.padding_idx)
        mlm_features, extra = model(**sample["net_input"], masked_tokens=masked_tokens)
        terms = {"mlm": self.vocabulary_term(mlm_features, model.mlm_projection(), sample["target"][masked_tokens])}
        if extra["decoder_features"] is not None:  # None: the MLM-only baseline
            terms["dec"] = self.vocabulary_term(
                extra["decoder_features"], model.decoder_projection(), sample["dec_target"]
            )
        return terms
