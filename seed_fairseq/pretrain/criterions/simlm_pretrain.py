"""Replaced language modelling for encoder and decoder (SimLM, Eq. 2).

    loss = w_enc * L_enc + w_dec * L_dec

The frozen generator first fills the masked views (``task.replaced_inputs``);
then encoder and decoder both predict the ORIGINAL token at every non-special
position.  Two named terms of
:class:`~seed_fairseq.pretrain.criterions.multi_term.MultiTermCriterion`, ``enc`` and
``dec``, each a per-token mean over the global count of those positions in
the update.  Also logged: ``enc_replaced`` / ``dec_replaced``, the % of
predicted positions whose input token differs from the original (a sample may
equal the original; a too strong generator drives this down).
"""

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, Tuple

from fairseq import metrics
from fairseq.criterions import register_criterion

from .multi_term import MultiTermCriterion, Term
from .vocab_loss import VocabLossConfig, VocabLossMixin

if TYPE_CHECKING:
    import torch


@dataclass
class SimLMPretrainCriterionConfig(VocabLossConfig):
    encoder_weight: float = field(
        default=1.0,
        metadata={"help": "weight of the encoder's replaced-LM mean loss (paper and reference code: a plain sum, 1/1)"},
    )
    decoder_weight: float = field(
        default=1.0,
        metadata={"help": "weight of the decoder's replaced-LM mean loss (see --encoder-weight)"},
    )


@register_criterion("simlm_pretrain", dataclass=SimLMPretrainCriterionConfig)
class SimLMPretrainCriterion(VocabLossMixin, MultiTermCriterion):
    bottleneck_terms = ("dec",)

    def __init__(self, cfg: SimLMPretrainCriterionConfig, task):
        super().__init__(task, {"enc": cfg.encoder_weight, "dec": cfg.decoder_weight})
        self.set_vocab_loss(cfg)
        self._replaced = {}

    def compute_terms(self, model, sample) -> Dict[str, Term]:
        pad = self.padding_idx
        target = sample["target"]
        predicted = target.ne(pad)
        dtype = next(model.parameters()).dtype  # the generator runs in the model's precision
        enc_in, dec_in = self.task.replaced_inputs(sample, dtype)
        enc_features, extra = model(enc_in, dec_tokens=dec_in, masked_tokens=predicted)
        gold = target[predicted]
        terms = {"enc": self.vocabulary_term(enc_features, model.mlm_projection(), gold)}
        if extra["decoder_features"] is not None:  # None: no decoder (--decoder-layers 0)
            terms["dec"] = self.vocabulary_term(extra["decoder_features"], model.decoder_projection(), gold)
        self._replaced = {
            "enc_replaced_sum": int((enc_in.ne(target) & predicted).sum()),
            "dec_replaced_sum": int((dec_in.ne(target) & predicted).sum()),
        }
        return terms

    def forward(self, model, sample, reduce=True) -> Tuple["torch.Tensor", int, Dict[str, Any]]:
        loss, sample_size, logging_output = super().forward(model, sample, reduce)
        logging_output.update(self._replaced)
        logging_output["predicted_ntokens"] = int(sample["target"].ne(self.padding_idx).sum())
        return loss, sample_size, logging_output

    @classmethod
    def reduce_metrics(cls, logging_outputs) -> None:
        super().reduce_metrics(logging_outputs)
        n = sum(log.get("predicted_ntokens", 0) for log in logging_outputs)
        if n > 0:
            for side in ("enc", "dec"):
                replaced = sum(log.get(f"{side}_replaced_sum", 0) for log in logging_outputs)
                metrics.log_scalar(f"{side}_replaced", 100.0 * replaced / n, n, round=2)
