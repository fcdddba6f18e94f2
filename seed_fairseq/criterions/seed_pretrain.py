"""MLM + weak-decoder reconstruction loss (SEED-Encoder, Eq. 10).

    loss = w_mlm * L_MLM + w_dec * L_dec

Two named terms of :class:`~seed_fairseq.criterions.multi_term.MultiTermCriterion`:
``mlm`` (cross-entropy at the masked positions) and ``dec`` (the weak decoder's
cross-entropy at every non-pad target), each a per-token mean over the global
count of its tokens in the update.

Both vocabulary predictions go through ``--vocab-loss`` (``vocab_loss.py``): by
default the fused chunked linear cross-entropy, which never materialises the
decoder's ``batch x length x vocabulary`` logits; ``--vocab-loss plain`` is the
earlier code path (the model's logits, then ``F.cross_entropy``).
"""

from dataclasses import dataclass, field
from typing import Dict

from fairseq.criterions import register_criterion

from .multi_term import MultiTermCriterion, Term
from .vocab_loss import VocabLossConfig, VocabLossMixin, token_nll, vocab_term


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

    def __init__(self, task, mlm_weight=0.5, decoder_weight=0.5, vocab_loss="chunked", vocab_loss_chunk_size=0):
        super().__init__(task, {"mlm": mlm_weight, "dec": decoder_weight})
        self.set_vocab_loss(vocab_loss, vocab_loss_chunk_size)

    def compute_terms(self, model, sample) -> Dict[str, Term]:
        if not self.head_inputs:
            return self._plain_terms(model, sample)
        pad = self.padding_idx
        masked_tokens = sample["target"].ne(pad)
        mlm_hidden, extra = model(**sample["net_input"], masked_tokens=masked_tokens, head_inputs=True)
        terms = {"mlm": self.lm_head_term(model, mlm_hidden, sample["target"][masked_tokens])}
        options = dict(implementation=self.vocab_loss, chunk_size=self.vocab_loss_chunk_size)
        if extra.get("decoder_features") is not None:  # None: the MLM-only baseline
            projection = model.weak_decoder.output_projection.weight  # tied to the token embeddings, no bias
            terms["dec"] = vocab_term(extra["decoder_features"], projection, sample["dec_target"], pad, **options)
        return terms

    def _plain_terms(self, model, sample) -> Dict[str, Term]:
        pad = self.padding_idx
        masked_tokens = sample["target"].ne(pad)
        mlm_logits, extra = model(**sample["net_input"], masked_tokens=masked_tokens)
        terms = {"mlm": token_nll(mlm_logits, sample["target"][masked_tokens], pad)}
        if extra.get("decoder_out") is not None:  # None: the MLM-only baseline
            terms["dec"] = token_nll(extra["decoder_out"], sample["dec_target"], pad)
        return terms
