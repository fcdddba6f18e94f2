"""``retromae_pretrain`` and ``dupmae_pretrain``: the data of RetroMAE / DupMAE
(Xiao et al.; DupMAE = RetroMAE v2, ``shared/papers/dupmae-retromae-v2.txt``).

One implementation: DupMAE is RetroMAE plus a bag-of-words term, so
``DupMAEPretrainTask`` only adds that term's unit count.  On top of the shared
pipeline (``bottleneck_pretrain.py``: blocks, [CLS], the encoder's masked view
and MLM target) both add:

* ``net_input["dec_tokens"]``: the UNMASKED block ``[CLS] x1 .. x(n-1)`` -- the
  enhanced decoder's content stream and its reconstruction target (every
  ordinary position), and DupMAE's bag of words;
* ``net_input["dec_hidden"]``: the decoder's per-row attention masks
  (``data/decoder_mask_dataset.py``), drawn from ``(seed, epoch, index)``.

Encoder masking defaults to the papers' 30% of whole words (``--mask-prob``,
``--leave-unmasked-prob`` ... apply as usual; ``--mask-single-pieces`` masks
sentencepiece pieces independently).

"Ordinary" tokens are everything but ``<s> <pad> </s> <unk> <mask>``: the
decoder predicts them, the bag of words is the set of them, DupMAE max-pools
over their positions.
"""

from dataclasses import dataclass, field
from typing import Dict, Tuple

import torch
from fairseq.data import Dictionary, RightPadDataset
from fairseq.dataclass import ChoiceEnum
from fairseq.tasks import register_task

from ...base.objectives import ObjectiveDescription
from ...base.vocabulary.dictionary import is_ordinary
from ..data.decoder_mask_dataset import DecoderMaskDataset
from ..option_ranges import Range
from .bottleneck_pretrain import BottleneckPretrainTask
from .config import BottleneckPretrainConfig

BOW_NORMALIZE_CHOICES = ChoiceEnum(["distinct", "tokens"])


def ordinary_tokens(tokens: torch.Tensor, dictionary: Dictionary, mask_idx: int) -> torch.Tensor:
    """Bool, same shape as ``tokens``: True for ordinary tokens (not a special symbol or <mask>)."""
    return is_ordinary(tokens, dictionary.nspecial, mask_idx)


def decoder_targets(dec_tokens: torch.Tensor, dictionary: Dictionary, mask_idx: int) -> torch.Tensor:
    """Positions the enhanced decoder is trained on: every ordinary position after [CLS]."""
    ordinary = ordinary_tokens(dec_tokens, dictionary, mask_idx)
    ordinary[:, :1] = False
    return ordinary


def bag_of_words(dec_tokens: torch.Tensor, dictionary: Dictionary, mask_idx: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """``(bag, length)``: bag (batch, vocab) bool, the set of distinct ordinary tokens of
    each text; length (batch,), its ordinary tokens counted with repetitions."""
    ordinary = decoder_targets(dec_tokens, dictionary, mask_idx)
    bag = torch.zeros(dec_tokens.size(0), len(dictionary), dtype=torch.bool, device=dec_tokens.device)
    bag.scatter_(1, torch.where(ordinary, dec_tokens, dictionary.pad()), True)
    bag[:, dictionary.pad()] = False  # where the non-ordinary positions went
    return bag, ordinary.sum(1)


@dataclass
class RetroMAEPretrainConfig(BottleneckPretrainConfig):
    mask_prob: float = field(
        default=0.3,
        metadata={"help": "encoder masking ratio (papers and reference code: 0.3, whole words)"},
    )
    mask_single_pieces: bool = field(
        default=False,
        metadata={
            "help": "mask sentencepiece pieces independently, in the encoder and the decoder "
            "(default: whole words, as the reference code)"
        },
    )
    decoder_mask_prob: float = field(
        default=0.5,
        metadata={
            "help": "share of the tokens (whole words) each row of the enhanced decoder's attention "
            "mask hides, in (0, 1) (paper: 50-90%%; 0.5 in the reference code)",
            "range": Range(0, 1, low_open=True, high_open=True),
        },
    )
    decoder_separators_visible: bool = field(
        default=False,
        metadata={
            "help": "keep </s> (and other special tokens) visible in every row of the decoder's "
            "attention mask, as the reference code (default: drawn like any token, as Eq. 5)"
        },
    )


RETROMAE = ObjectiveDescription(
    "retromae",
    "retromae_pretrain",
    title="RetroMAE",
    card_text="MLM plus RetroMAE's one-layer enhanced decoder that reconstructs the unmasked input from "
    "the [CLS] vector (Xiao & Liu)",
    tag="retromae",
    paper="Xiao et al., 'RetroMAE: Pre-Training Retrieval-oriented Language Models Via Masked Auto-Encoder', "
    "EMNLP 2022",
    paper_url="https://arxiv.org/abs/2205.12035",
    doc="docs/objectives/retromae_dupmae.md",
    heads_text="1 layer, two streams, per-row attention masks",
    label="RetroMAE",
    arch="retromae_base",
    notes="encoder masking 30% whole words + 1-layer enhanced decoder (50% per-row masks)",
    masking="30% whole words",
    order=20,
    test_arch="retromae_tiny",
    test_args=("--decoder-ffn-embed-dim", "23"),
    terms=("mlm", "dec"),
    bottleneck_terms=("dec",),
    heads=("enhanced_decoder.",),
)


@register_task("retromae_pretrain", dataclass=RetroMAEPretrainConfig)
class RetroMAEPretrainTask(BottleneckPretrainTask):
    """MLM + enhanced-decoder reconstruction from the [CLS] vector (RetroMAE)."""

    cfg: RetroMAEPretrainConfig
    with_bow = False
    objectives = (RETROMAE,)

    def __init__(self, cfg: RetroMAEPretrainConfig, dictionary=None):
        if cfg.mask_single_pieces and cfg.mask_whole_words:
            raise ValueError("--mask-single-pieces and --mask-whole-words contradict each other")
        # whole words unless asked otherwise (a bool option defaulting to True would be a
        # flag that turns it off); the base's mask_view reads mask_whole_words
        cfg.mask_whole_words = not cfg.mask_single_pieces
        super().__init__(cfg, dictionary)

    def ordinary(self, tokens: torch.Tensor) -> torch.Tensor:
        return ordinary_tokens(tokens, self.source_dictionary, self.mask_idx)

    def extra_inputs(self, split, blocks, src, target) -> Dict:
        d = self.source_dictionary
        special = ~is_ordinary(torch.arange(len(d)), d.nspecial, self.mask_idx)
        return {
            "net_input": {
                "dec_tokens": RightPadDataset(blocks, pad_idx=d.pad()),
                "dec_hidden": DecoderMaskDataset(
                    blocks,
                    self.cfg.decoder_mask_prob,
                    self.cfg.seed,
                    word_starts=self.whole_word_mask().bool() if self.cfg.mask_whole_words else None,
                    special_symbols=special if self.cfg.decoder_separators_visible else None,
                ),
            }
        }

    def term_counts(self, sample) -> Dict[str, torch.Tensor]:
        counts = super().term_counts(sample)
        dec_tokens = sample["net_input"]["dec_tokens"]
        counts["dec"] = decoder_targets(dec_tokens, self.source_dictionary, self.mask_idx).sum()
        return counts


@dataclass
class DupMAEPretrainConfig(RetroMAEPretrainConfig):
    bow_normalize: BOW_NORMALIZE_CHOICES = field(
        default="distinct",
        metadata={
            "help": "how the bag-of-words loss is averaged: 'distinct' (default) = the cross-entropy of "
            "Eq. 8 summed over each text's distinct tokens, divided by the number of distinct "
            "(text, token) pairs in the update; 'tokens' = the reference code: per text, that sum "
            "divided by the text's token count (repeats included), then the mean over texts"
        },
    )


DUPMAE = ObjectiveDescription(
    "dupmae",
    "dupmae_pretrain",
    title="DupMAE",
    card_text="MLM, RetroMAE's enhanced decoder from [CLS], and a bag-of-words loss on the max-pooled MLM "
    "head (DupMAE, Xiao & Liu, 'RetroMAE v2')",
    tag="dupmae",
    paper="Xiao & Liu, 'RetroMAE v2: Duplex Masked Auto-Encoder For Pre-Training Retrieval-Oriented Language Models'",
    paper_url="https://arxiv.org/abs/2211.08769",
    doc="docs/objectives/retromae_dupmae.md",
    heads_text="RetroMAE's decoder, plus a bag of words from the max-pooled MLM head",
    label="DupMAE",
    arch="dupmae_base",
    representations=("dupmae", "own"),
    notes="RetroMAE + bag-of-words term (weight 1, the paper's); evaluated with its dense+sparse "
    "representation and with its pooled vector alone ([CLS] from scratch)",
    masking="30% whole words",
    order=21,
    test_arch="dupmae_tiny",
    test_args=("--decoder-ffn-embed-dim", "23"),
    terms=("mlm", "dec", "bow"),
    bottleneck_terms=("dec",),
    heads=("enhanced_decoder.",),
)


@register_task("dupmae_pretrain", dataclass=DupMAEPretrainConfig)
class DupMAEPretrainTask(RetroMAEPretrainTask):
    """RetroMAE + DupMAE's bag-of-words decoder over the ordinary tokens' embeddings."""

    cfg: DupMAEPretrainConfig
    with_bow = True
    objectives = (DUPMAE,)

    def bag_of_words(self, dec_tokens: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
        return bag_of_words(dec_tokens, self.source_dictionary, self.mask_idx)

    def term_counts(self, sample) -> Dict[str, torch.Tensor]:
        counts = super().term_counts(sample)
        bag, length = self.bag_of_words(sample["net_input"]["dec_tokens"])
        counts["bow"] = bag.sum() if self.cfg.bow_normalize == "distinct" else length.gt(0).sum()
        return counts
