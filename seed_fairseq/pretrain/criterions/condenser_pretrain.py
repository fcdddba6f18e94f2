"""Condenser's and coCondenser's losses.

Condenser (Gao & Callan, EMNLP 2021, Sec. 3.2-3.3): the MLM loss of the head's output plus the MLM
loss of the backbone's own (late) output,

    loss = w_head * L_mlm(head) + w_mlm * L_mlm(late)                       (paper: 1, 1)

coCondenser (ACL 2022, Sec. 3.3), over the 2n spans of n documents,

    loss = w_head * L_mlm(head) + w_mlm * L_mlm(late) + w_co * L_co        (paper: 1, 1, 1)
    L_co(s_ij) = -log exp(<h_i1, h_i2>) / sum over every other span s_kl of exp(<h_ij, h_kl>)

Named terms of :class:`~seed_fairseq.pretrain.criterions.multi_term.MultiTermCriterion`:

``mlm``   the backbone's cross-entropy at the masked positions (of both spans, coCondenser); a mean
          over the update's masked tokens (``--mlm-units spans``: a span's sum, averaged over spans);
``head``  the head's cross-entropy at the same positions, through the same MLM head; units as ``mlm``.
          Sees the last layer only through the bottleneck vector (and the early layer's token states);
``co``    InfoNCE over the spans of the GLOBAL batch (gathered across workers with their gradients,
          ``modules/contrastive.py``, the one CPDAE uses): every span an anchor, the other span of its
          document the positive, every other span a candidate; logits the dot product of the
          bottleneck vectors (the late [CLS] by default) divided by ``--contrast-temperature`` (the
          paper has none: 1); a mean over the update's spans.  ``--update-freq`` micro-batches are not
          gathered: each contrasts its own spans only.  Validation contrasts within each worker's
          batch; a batch of one document on its own has no negative: its ``co`` is skipped (warned
          once), and a single worker's ``--batch-size 1`` is refused.
"""

import logging
from dataclasses import dataclass, field
from typing import Dict, Optional, Tuple

from fairseq.criterions import register_criterion
from fairseq.utils import safe_getattr
from omegaconf import II

from ..modules.condenser_head import stack_views
from ..modules.contrastive import data_parallel_group, dense_similarity, info_nce_sum
from ..tasks.batching import DUMMY_BATCH
from ..tasks.cocondenser_pretrain import has_negatives
from .cpdae_pretrain import check_two_texts_per_batch
from .multi_term import MultiTermCriterion, Term
from .vocab_loss import VocabLossConfig, VocabLossMixin

logger = logging.getLogger(__name__)


@dataclass
class CondenserCriterionConfig(VocabLossConfig):
    mlm_weight: float = field(
        default=1.0,
        metadata={
            "help": "weight of the backbone's own (late) MLM loss (the paper's: 1; the authors' code adds it with "
            "--late_mlm, which their commands pass; 0 = the head's MLM alone)"
        },
    )
    head_weight: float = field(default=1.0, metadata={"help": "weight of the Condenser head's MLM loss (paper: 1)"})


@dataclass
class CoCondenserCriterionConfig(CondenserCriterionConfig):
    contrastive_weight: float = field(
        default=1.0,
        metadata={"help": "weight of the span contrastive loss L_co (paper: 1, the plain sum); must be >= 0"},
    )
    contrast_temperature: float = field(
        default=1.0, metadata={"help": "divides the contrastive logits (the paper and the authors' code: none, 1)"}
    )
    batch_size: Optional[int] = II("dataset.batch_size")
    max_tokens: Optional[int] = II("dataset.max_tokens")
    tokens_per_sample: int = II("task.tokens_per_sample")
    distributed_world_size: int = II("distributed_training.distributed_world_size")


@register_criterion("condenser_pretrain", dataclass=CondenserCriterionConfig)
class CondenserCriterion(VocabLossMixin, MultiTermCriterion):
    bottleneck_terms = ("head",)

    def __init__(self, cfg: CondenserCriterionConfig, task):
        super().__init__(task, self.term_weights(cfg))
        self.set_vocab_loss(cfg)

    @staticmethod
    def term_weights(cfg) -> Dict[str, float]:
        return {"mlm": cfg.mlm_weight, "head": cfg.head_weight}

    def per_token(self) -> bool:
        """Do the MLM terms average over tokens (and report an accuracy)?"""
        return str(safe_getattr(self.task.cfg, "mlm_units", "tokens")) == "tokens"

    def mlm_terms(self, model, net_input: dict, target, **inputs) -> Tuple[Dict[str, Term], dict]:
        """(the MLM terms of the batch ``target`` is over, the model's extra)."""
        masked = target.ne(self.padding_idx)
        mlm_features, extra = model(**net_input, masked_tokens=masked, head_positions=masked, **inputs)
        gold = target[masked]
        terms = {
            "mlm": self.vocabulary_term(mlm_features, model.mlm_projection(), gold),
            "head": self.vocabulary_term(extra["decoder_features"], model.decoder_projection(), gold),
        }
        if not self.per_token():
            terms = {name: Term(term.loss) for name, term in terms.items()}
        return terms, extra

    def compute_terms(self, model, sample) -> Dict[str, Term]:
        return self.mlm_terms(model, sample["net_input"], sample["target"])[0]


@register_criterion("cocondenser_pretrain", dataclass=CoCondenserCriterionConfig)
class CoCondenserCriterion(CondenserCriterion):
    bottleneck_terms = ("head", "co")

    def __init__(self, cfg: CoCondenserCriterionConfig, task):
        if not hasattr(task, "span_views"):
            raise ValueError(
                f"--criterion cocondenser_pretrain needs --task cocondenser_pretrain (got {type(task).__name__}): "
                "the two spans of each document come from the task"
            )
        if cfg.contrastive_weight > 0 and (cfg.distributed_world_size or 1) <= 1:
            check_two_texts_per_batch(cfg.batch_size, cfg.max_tokens, cfg.tokens_per_sample)
        super().__init__(cfg, task)
        self.temperature = float(cfg.contrast_temperature)
        self._warned_single_document = False

    @staticmethod
    def term_weights(cfg) -> Dict[str, float]:
        return {**CondenserCriterion.term_weights(cfg), "co": cfg.contrastive_weight}

    def compute_terms(self, model, sample) -> Dict[str, Term]:
        target = stack_views(sample["target"], sample["target_2"], self.padding_idx)
        terms, extra = self.mlm_terms(model, sample["net_input"], target)
        group = data_parallel_group() if model.training else None
        if not has_negatives(sample, group is not None):
            if not self._warned_single_document:
                self._warned_single_document = True
                logger.warning(
                    "a batch holds a single document: its contrastive term has no negative and is skipped (no "
                    "loss, no units in co_loss / co_acc) (said once)"
                )
            return terms
        loss, correct = info_nce_sum(
            extra["bottleneck"].float(),
            dense_similarity,
            self.temperature,
            group=group,
            contribute=not sample.get(DUMMY_BATCH, False),
        )
        terms["co"] = Term(loss, correct)
        return terms
