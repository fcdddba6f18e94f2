"""``cocondenser_pretrain``: coCondenser's data (Gao & Callan, ACL 2022, Sec. 3.3): "given a random list
of n documents, we extract randomly from each a pair of spans".

An item of the training split is a DOCUMENT of the binarized split (the preprocessing keeps them: an
empty line between two documents), not a block: ``data/document_spans.py`` cuts every document into spans of at most
``--tokens-per-sample - 1`` tokens that never cross its boundaries (``--sample-break-mode``: whole
lines, runs of tokens or single lines) and picks two different spans of each document per epoch from
``(seed, epoch, index)``.  Each span gets [CLS] and its own mask (the task's masking options; span 2
from ``--seed + VIEW_2_SEED_OFFSET``):

    document i  ->  span a = [CLS] ..  ->  src_tokens,   target      (the longer of the two)
                    span b = [CLS] ..  ->  src_tokens_2, target_2

Documents that give fewer than two spans are left out (``--short-documents drop``, the authors'
preprocessing) or give the two halves of their one span (``halves``).  A document's size for the
batching is its first span's length this epoch; the batches are rebuilt every epoch.

Validation (any split but ``train``) scores every span of its documents once, in fixed pairs (spans
1-2, 3-4, ... of each document, ``FixedSpanPairs``): the same pairs at every validation, so that its
losses compare across a run; an item there is a pair, and two pairs of one document are each other's
negatives when a batch holds both.
"""

import logging
from dataclasses import dataclass, field
from typing import Dict

import numpy as np
import torch
from fairseq.data import FairseqDataset, PrependTokenDataset, RightPadDataset, TokenBlockDataset
from fairseq.dataclass import ChoiceEnum
from fairseq.distributed import utils as distributed_utils
from fairseq.tasks import register_task

from ...base.errors import ConfigurationError
from ...base.objectives import ObjectiveDescription
from ..data.document_spans import (
    SEPARATOR_SIZE,
    SHORT_DOCUMENT_POLICIES,
    DocumentSpanView,
    FixedSpanPairs,
    SpanBlocks,
    SpanPairs,
    document_spans,
)
from ..option_ranges import Range
from .condenser_pretrain import CondenserPretrainConfig, CondenserPretrainTask

logger = logging.getLogger(__name__)

# any constant works: fairseq hashes (seed, epoch, index) into the mask generator's seed
VIEW_2_SEED_OFFSET = 104729
SHORT_DOCUMENTS_CHOICES = ChoiceEnum(list(SHORT_DOCUMENT_POLICIES))
MLM_UNITS_CHOICES = ChoiceEnum(["tokens", "spans"])


def has_negatives(sample, gathered: bool) -> bool:
    """Does the contrastive loss of this batch have a negative?  Not for one document contrasted on
    its own (``gathered``: over several workers, in training)."""
    return gathered or sample["net_input"]["src_tokens"].size(0) >= 2


def lines_of(blocks) -> FairseqDataset:
    """The dataset of lines under the shared pipeline's ``[CLS]`` + fairseq blocks of a split."""
    if not (isinstance(blocks, PrependTokenDataset) and isinstance(blocks.dataset, TokenBlockDataset)):
        raise TypeError(f"expected fairseq's [CLS] + TokenBlockDataset blocks, got {type(blocks).__name__}")
    return blocks.dataset.dataset


@dataclass
class CoCondenserPretrainConfig(CondenserPretrainConfig):
    tokens_per_sample: int = field(
        default=128,
        metadata={
            "help": "a span's length including [CLS]: spans have at most this minus 1 tokens (128: the authors' "
            "spans for passage retrieval, their batches of 2000 x 128 tokens; the paper states no length)",
            "range": Range(5),
        },
    )
    short_documents: SHORT_DOCUMENTS_CHOICES = field(
        default="drop",
        metadata={
            "help": "a document that gives fewer than two spans: 'drop' it (the authors' preprocessing keeps only "
            "documents of two spans or more; the paper samples a pair 'from each' document) or cut its one span "
            "into two 'halves'"
        },
    )
    mlm_units: MLM_UNITS_CHOICES = field(
        default="tokens",
        metadata={
            "help": "what the two MLM terms average over: 'tokens' (default: a mean over the masked tokens, as the "
            "authors' code and every objective's mlm) or 'spans' (the paper's Eq. read literally: each span's MLM "
            "summed over its masked tokens, then 1/2n over the spans; mlm_loss and head_loss are then bits per span, "
            "without accuracy)"
        },
    )


COCONDENSER = ObjectiveDescription(
    "cocondenser",
    "cocondenser_pretrain",
    title="coCondenser",
    card_text="Condenser's MLM terms plus a corpus-level contrastive loss between two random spans of each "
    "document, every other span of the global batch a negative (coCondenser, Gao & Callan, ACL 2022)",
    tag="cocondenser",
    paper="Gao & Callan, 'Unsupervised Corpus Aware Language Model Pre-training for Dense Passage Retrieval', ACL 2022",
    paper_url="https://arxiv.org/abs/2108.05540",
    doc="docs/objectives/condenser.md",
    heads_text="Condenser's head; two spans of each document contrasted on the bottleneck vector",
    label="coCondenser",
    arch="cocondenser_base",
    texts_per_update_factor=0.5,
    texts_per_update_reason="encodes two spans of every document",
    notes="Condenser + InfoNCE between two random spans of each document (dot product, no temperature, "
    "weight 1), every span of the global batch a candidate; half the texts per update (two spans each)",
    order=61,
    test_arch="cocondenser_tiny",
    terms=("mlm", "head", "co"),
    bottleneck_terms=("head", "co"),
    heads=("condenser_head.",),
    in_batch_terms=("co",),
)


@register_task("cocondenser_pretrain", dataclass=CoCondenserPretrainConfig)
class CoCondenserPretrainTask(CondenserPretrainTask):
    """Condenser on two random spans of each document + their contrast over the global batch."""

    cfg: CoCondenserPretrainConfig
    objectives = (COCONDENSER,)

    def __init__(self, cfg: CoCondenserPretrainConfig, dictionary=None):
        super().__init__(cfg, dictionary)
        self.span_views = {}  # split -> (span 2 of every document, every span as [CLS] + span)

    def _load_dataset_split(self, split, epoch, combine):
        lines = lines_of(super()._load_dataset_split(split, epoch, combine))  # the base's checks, then its lines
        sizes = np.asarray(lines.sizes, dtype=np.int64)
        mode, block = str(self.cfg.sample_break_mode), self.cfg.tokens_per_sample - 1
        spans, document = document_spans(sizes, mode, block, str(self.cfg.short_documents))
        separators = sizes == SEPARATOR_SIZE
        documents = len(np.unique((np.cumsum(separators) - separators)[~separators]))
        # training: two random spans of each document per epoch; validation: every span once, in fixed pairs
        pairs = (SpanPairs if split == "train" else FixedSpanPairs)(spans, document, self.cfg.seed)
        where = self._split_path(split, epoch) + ".bin"
        if len(spans) == 0:
            raise ConfigurationError(
                f"coCondenser needs documents of at least two spans of up to {block} tokens: none of the "
                f"{documents} documents of the '{split}' split has two (documents are separated by empty lines "
                "in the text the data was built from); use --short-documents halves, or a corpus of longer documents",
                where,
            )
        kept = len(np.unique(document))
        logger.info(
            f"coCondenser '{split}': {kept} of {documents} documents give two spans of up to {block} tokens "
            f"({len(spans)} spans, --sample-break-mode {mode}, --short-documents {self.cfg.short_documents}); "
            + ("two random spans of each per epoch" if split == "train" else f"{len(pairs)} fixed pairs of spans")
        )
        blocks = SpanBlocks(lines, spans)
        bos = self.source_dictionary.bos()
        self.span_views[split] = (DocumentSpanView(blocks, pairs, 1, bos, epoch), PrependTokenDataset(blocks, bos))
        return DocumentSpanView(blocks, pairs, 0, bos, epoch)

    def load_dataset(self, split, epoch=1, combine=False, **kwargs) -> None:
        super().load_dataset(split, epoch, combine, **kwargs)
        self.unmasked_blocks[split] = self.span_views[split][1]  # the retrieval probe: every span

    def extra_inputs(self, split, blocks, src, target) -> Dict:
        pad = self.source_dictionary.pad()
        src_2, target_2 = self.mask_view(self.span_views[split][0], seed=self.cfg.seed + VIEW_2_SEED_OFFSET)
        return {
            "net_input": {"src_tokens_2": RightPadDataset(src_2, pad_idx=pad)},
            "target_2": RightPadDataset(target_2, pad_idx=pad),
        }

    def can_reuse_epoch_itr(self, dataset) -> bool:
        return False  # a document's size is its span's, drawn per epoch: new batches every epoch

    def term_counts(self, sample) -> Dict[str, torch.Tensor]:
        pad = self.source_dictionary.pad()
        spans = torch.tensor(2 * sample["net_input"]["src_tokens"].size(0))
        masked = sample["target"].ne(pad).sum() + sample["target_2"].ne(pad).sum()
        mlm = spans.clone() if self.cfg.mlm_units == "spans" else masked
        # several workers: training gathers the negatives, validation's units are not summed over workers
        gathered = distributed_utils.get_data_parallel_world_size() > 1
        return {
            "mlm": mlm,
            "head": mlm.clone(),
            # one unit per span; none for a contrast without negatives, which the criterion skips
            "co": spans.clone() if has_negatives(sample, gathered) else torch.zeros_like(spans),
        }
