"""CPDAE's loss (Xu et al., CIKM 2022, Eq. 6):

    loss = w_mlm * L_MLM + w_bow * L_REC + λ * L_CL            (paper: 1, 1, λ = 0.1)

Three named terms of :class:`~seed_fairseq.pretrain.criterions.multi_term.MultiTermCriterion`:

``mlm``  cross-entropy at the masked positions of BOTH views; a mean over the
         global count of their masked tokens.
``bow``  L_REC (Eq. 4): per-vocabulary sigmoid + binary cross-entropy of the MLP
         decoder's logits against the multi-hot set of the text's tokens
         (specials and <mask> excluded from targets AND predictions), for each
         view; summed over the vocabulary as Eq. 4 writes it (``--bow-reduction
         mean`` divides by the word count), then a mean over the global views.
``cl``   L_CL (Eq. 5): InfoNCE over the 2m views of the GLOBAL batch (gathered
         across workers, ``modules/contrastive.py``), every view an anchor, the
         other view of its text the positive; logits ``-JS(z_i, z_k)`` between
         word distributions (the sigmoids normalised to sum 1, fp32, clamped
         logs: ``modules/js_divergence.py``), or with ``--contrast cls``
         (CPDAE') the dot product of the bottleneck vectors (the [CLS] vectors by
         default; pooled as ``--bottleneck-pooling``, unit vectors -- so the cosine --
         with ``--retrieval-similarity cosine``); a mean over the global
         views.  What this makes split-invariant: the worker split (negatives are
         gathered); NOT ``--update-freq``, whose micro-batches see only their
         own negatives -- the update is then exactly the count-weighted mean of
         the micro-batches' own losses.  Validation contrasts within each
         worker's batch (no collectives outside training).  A batch of ONE text
         contrasted on its own (a single worker, or validation) has no
         negative: its ``cl`` is skipped -- no loss, no units, nothing in
         ``cl_acc`` (the task counts it 0) -- with a warning; settings where
         every batch could be one text (``--batch-size 1``, ``--max-tokens``
         below two blocks) are refused on a single worker.

``bow`` and ``cl`` see the encoder only through the bottleneck vector ([CLS] by default).
"""

import logging
from dataclasses import dataclass, field
from typing import Dict, Optional

import torch
import torch.nn.functional as F
from fairseq.criterions import register_criterion
from fairseq.dataclass import ChoiceEnum
from omegaconf import II

from ...base.errors import ConfigurationError
from ...base.vocabulary.dictionary import is_ordinary
from ..modules.contrastive import data_parallel_group, dense_similarity, info_nce_sum
from ..modules.js_divergence import pairwise_js
from ..tasks.batching import DUMMY_BATCH
from ..tasks.cpdae_pretrain import has_negatives
from .multi_term import MultiTermCriterion, Term
from .vocab_loss import VocabLossConfig, VocabLossMixin

logger = logging.getLogger(__name__)

CONTRAST_CHOICES = ChoiceEnum(["words", "cls"])
REDUCTION_CHOICES = ChoiceEnum(["sum", "mean"])


@dataclass
class CpdaePretrainCriterionConfig(VocabLossConfig):
    mlm_weight: float = field(default=1.0, metadata={"help": "weight of the MLM mean loss (paper Eq. 6: 1)"})
    bow_weight: float = field(
        default=1.0, metadata={"help": "weight of the bag-of-words reconstruction loss L_REC (paper Eq. 6: 1)"}
    )
    contrastive_weight: float = field(
        default=0.1, metadata={"help": "λ, weight of the contrastive loss L_CL (paper: 0.1); must be >= 0"}
    )
    contrast: CONTRAST_CHOICES = field(
        default="words",
        metadata={
            "help": "what the contrastive loss compares: 'words' = the decoder's word distributions "
            "with -JS divergence (CPDAE, the paper's method), 'cls' = the encoder's bottleneck vectors "
            "([CLS] by default, --bottleneck-pooling) with the dot product (the paper's variant CPDAE'; "
            "the cosine with --retrieval-similarity cosine, which normalises them)"
        },
    )
    bow_reduction: REDUCTION_CHOICES = field(
        default="sum",
        metadata={
            "help": "how L_REC reduces the per-word binary cross-entropies of a view: 'sum' over the "
            "vocabulary (paper Eq. 4) or 'mean' (divides it by the number of words, ~|V|, which makes "
            "it tiny next to MLM)"
        },
    )
    contrast_temperature: float = field(
        default=1.0,
        metadata={"help": "divides the contrastive logits (the paper has none: 1); must be > 0"},
    )
    batch_size: Optional[int] = II("dataset.batch_size")
    max_tokens: Optional[int] = II("dataset.max_tokens")
    tokens_per_sample: int = II("task.tokens_per_sample")
    distributed_world_size: int = II("distributed_training.distributed_world_size")


def check_two_texts_per_batch(batch_size: Optional[int], max_tokens: Optional[int], tokens_per_sample) -> None:
    """On a single worker, refuse batch settings under which a batch can hold one text: its
    contrastive loss would have no negative (L_CL 0, cl_acc 100) for every such batch."""
    why = None
    if batch_size == 1:
        why = "--batch-size 1"
    elif max_tokens is not None and tokens_per_sample and max_tokens < 2 * tokens_per_sample:
        why = (
            f"--max-tokens {max_tokens} (below two blocks of --tokens-per-sample {tokens_per_sample}: a batch of "
            "full blocks holds one text)"
        )
    if why is not None:
        raise ConfigurationError(
            f"{why} on a single worker gives the contrastive loss no negatives (the other view of the same text "
            "is its only candidate, so L_CL would be 0): use --batch-size >= 2 and --max-tokens >= "
            "2 x --tokens-per-sample, more workers, or --contrastive-weight 0"
        )


def word_columns(dictionary) -> torch.Tensor:
    """Ids of the vocabulary entries that are words: every symbol but the specials
    (<s>=[CLS], <pad>, </s>, <unk>) and <mask>, which never belong to a text's bag."""
    ids = torch.arange(len(dictionary))
    return ids[is_ordinary(ids, dictionary.nspecial, dictionary.index("<mask>"))]


def word_distributions(bow_logits: torch.Tensor) -> torch.Tensor:
    """The decoder's sigmoids normalised to sum 1 per row (fp32)."""
    probs = torch.sigmoid(bow_logits.float())
    return probs / probs.sum(-1, keepdim=True).clamp(min=torch.finfo(probs.dtype).tiny)


def js_similarity(a: torch.Tensor, c: torch.Tensor) -> torch.Tensor:
    return -pairwise_js(a, c)


@register_criterion("cpdae_pretrain", dataclass=CpdaePretrainCriterionConfig)
class CpdaePretrainCriterion(VocabLossMixin, MultiTermCriterion):
    bottleneck_terms = ("bow", "cl")

    def __init__(self, cfg: CpdaePretrainCriterionConfig, task):
        # the weights' and the temperature's ranges: MultiTermCriterion.build_criterion
        if cfg.contrastive_weight > 0 and (cfg.distributed_world_size or 1) <= 1:
            check_two_texts_per_batch(cfg.batch_size, cfg.max_tokens, cfg.tokens_per_sample)
        super().__init__(task, {"mlm": cfg.mlm_weight, "bow": cfg.bow_weight, "cl": cfg.contrastive_weight})
        self._warned_single_text = False
        self.set_vocab_loss(cfg)
        self.contrast = str(cfg.contrast)
        self.bow_reduction = str(cfg.bow_reduction)
        self.temperature = float(cfg.contrast_temperature)
        self.register_buffer("word_ids", word_columns(task.source_dictionary), persistent=False)

    def _warn_single_text(self) -> None:
        if not self._warned_single_text:
            self._warned_single_text = True
            logger.warning(
                "a batch holds a single text: its contrastive term has no negative and is skipped (no loss, "
                "no units in cl_loss / cl_acc); the last batch of an epoch can be one text with "
                "--required-batch-size-multiple 1 (said once)"
            )

    def bow_targets(self, tokens: torch.Tensor) -> torch.Tensor:
        """(B, T) token ids -> (B, words) multi-hot over the word columns (fp32)."""
        bag = torch.zeros(tokens.size(0), len(self.task.source_dictionary), device=tokens.device)
        bag.scatter_(1, tokens, 1.0)
        return bag.index_select(1, self.word_ids)

    def compute_terms(self, model, sample) -> Dict[str, Term]:
        pad = self.padding_idx
        targets = torch.cat([sample["target"], sample["target_2"]])
        masked = targets.ne(pad)
        mlm_features, extra = model(**sample["net_input"], masked_tokens=masked)
        terms = {"mlm": self.vocabulary_term(mlm_features, model.mlm_projection(), targets[masked])}

        logits = extra["bow_logits"].float().index_select(1, self.word_ids)  # (2B, words)
        bag = self.bow_targets(sample["bow_tokens"]).repeat(2, 1)  # the same text behind both views
        bce = F.binary_cross_entropy_with_logits(logits, bag, reduction="none")
        per_view = bce.sum(-1) if self.bow_reduction == "sum" else bce.mean(-1)
        terms["bow"] = Term(per_view.sum())

        if self.contrast == "words":
            views, similarity = word_distributions(logits), js_similarity
        else:
            views, similarity = extra["bottleneck"].float(), dense_similarity
        group = data_parallel_group() if model.training else None
        if not has_negatives(sample, group is not None):
            self._warn_single_text()
            return terms  # no "cl": logged with 0 units, like a term the model does not produce
        loss, correct = info_nce_sum(
            views, similarity, self.temperature, group=group, contribute=not sample.get(DUMMY_BATCH, False)
        )
        terms["cl"] = Term(loss, correct)
        return terms
