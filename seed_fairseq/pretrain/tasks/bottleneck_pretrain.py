"""The data pipeline every bottleneck pre-training objective shares.

Composed like fairseq's ``masked_lm`` (whose ``_load_dataset_split`` builds
the blocks):

    mmap shards --TokenBlockDataset(tokens_per_sample - 1, break mode)--> blocks
    --PrependTokenDataset(<s> = [CLS])--> s = [CLS] x1 .. xn   (UNMASKED)
       |-- MaskTokensDataset --> src_tokens (encoder input) + MLM target
       '-- extra_inputs(s, ...)  the objective's own inputs and targets
           (SEED: the decoder's input/target; others: a second masked view,
           per-row attention masks, bag-of-words targets, sampling noise ...)

An objective subclasses :class:`BottleneckPretrainTask` and overrides
``extra_inputs`` (datasets, keyed like the batch: ``{"net_input": {...},
"name": dataset}``) and ``term_counts`` (the units each loss term is averaged
over).  Everything random is drawn in the data pipeline from
``(seed, epoch, index)`` -- never from the model's RNG -- so a batch gives the
same inputs however it is split across ``--update-freq`` and workers, and a
resumed run sees what the uninterrupted one saw.

The base also carries what every objective shares: the dictionary and its
identity (recorded in every checkpoint and checked on restore), whole-word
masking from sentencepiece's word-start marker, the global-count lookahead of
``--update-freq`` micro-batches, and one-line refusals before training
(``errors.ConfigurationError``) for data that is missing, empty, truncated
(``data/split_files.py``) or split at ':', and for a split that would give no
batch or fewer validation blocks than the retrieval probe needs.  At validation it adds the
diagnostics (``diagnostics.py``) and the zero-shot retrieval scores of the probe and of
``--retrieval-dev`` (``retrieval_dev.py``), each also against the starting model's, scored
before the first update.  Every numeric option is checked against its range when the task is set
up (``option_ranges.py``), and a run continuing a checkpoint trains the vector the checkpoint
records, or records the switch (``representation.py``).

One job a module, mixed into the task: ``config.py`` (the options), ``identity.py`` (the data
folder and the dictionary's identity), ``representation.py`` (the vector across a continued run),
``batching.py``, ``encoder_lr.py`` (the encoder's own learning rate) and ``validation.py``; this
file holds the data pipeline.
"""

import logging
import os
from typing import TYPE_CHECKING, Dict, Optional, Tuple

import numpy as np
import torch
from fairseq import utils
from fairseq.data import (
    FairseqDataset,
    IdDataset,
    NestedDictionaryDataset,
    NumelDataset,
    NumSamplesDataset,
    RightPadDataset,
    SortDataset,
    data_utils,
)
from fairseq.tasks.masked_lm import MaskedLMTask

from ...base.errors import ConfigurationError
from ...base.objectives import ObjectiveDescription
from ...base.vocabulary.dictionary import dictionary_sha256, is_ordinary
from ...base.vocabulary.tokenizer import load_record as load_tokenizer_record
from ...base.vocabulary.tokenizer import word_start_table
from .. import retrieval_dev
from ..data.mask_tokens_dataset import MaskTokensDataset
from ..data.split_files import check_split_files
from ..option_ranges import check_ranges
from . import encoder_lr
from .batching import Batching
from .config import BottleneckPretrainConfig
from .identity import DictionaryIdentity
from .representation import RepresentationRecord, check_max_length
from .validation import Validation

if TYPE_CHECKING:
    from ..models.bottleneck import BottleneckEncoderModel

logger = logging.getLogger(__name__)

# sentencepiece marks the first piece of a word with U+2581; the dictionary
# holds pieces, so whole-word masking can be read off the dictionary itself.
WORD_START = "\u2581"


class BottleneckPretrainTask(
    Validation, encoder_lr.EncoderLRHooks, Batching, RepresentationRecord, DictionaryIdentity, MaskedLMTask
):
    """Blocks + [CLS] + the encoder's MLM view, plus the objective's ``extra_inputs``."""

    cfg: BottleneckPretrainConfig
    # what this task trains, for the model card, the comparison and the contract tests: one
    # description per variant, declared in the class's own body (seed_fairseq/base/objectives.py)
    objectives: Tuple[ObjectiveDescription, ...] = ()

    def __init__(self, cfg: BottleneckPretrainConfig, dictionary=None):
        if cfg.d2v2_multi or cfg.include_target_tokens or cfg.skip_masking:
            raise ValueError(
                f"{type(self).__name__} does not support the data2vec options "
                "--d2v2-multi / --include-target-tokens / --skip-masking"
            )
        if cfg.bottleneck_unnormalized and str(cfg.retrieval_similarity) != "cosine":
            raise ConfigurationError(
                "--bottleneck-unnormalized has no effect without --retrieval-similarity cosine (with dot the "
                "bottleneck reads the pooled vector as it is)"
            )
        if cfg.retrieval_raw_vectors and str(cfg.retrieval_similarity) != "cosine":
            raise ConfigurationError(
                "--retrieval-raw-vectors has no effect without --retrieval-similarity cosine (with dot the model's "
                "vectors are never normalised)"
            )
        encoder_lr.EncoderSchedule.from_cfg(cfg)  # out-of-range options refused before anything loads
        super().__init__(cfg, dictionary)
        self._encoder_lr = None  # (id of the model, its EncoderSchedule, its encoder parameters)
        if cfg.flush_denormal and not torch.set_flush_denormal(True):
            logger.warning("--flush-denormal: this CPU cannot flush denormals (no SSE3); computing with them")
        self.unmasked_blocks = {}  # split -> [CLS] x1 .. xn, for the retrieval probe
        self._retrieval_pending = False  # the probe and the dev set: once per validation
        self.retrieval_dev: Optional[retrieval_dev.DevSet] = None  # --retrieval-dev, read by setup_task
        self.retrieval_start: Dict[str, float] = {}  # the starting model's scores (log_start)
        self._start_pending = True  # before the first epoch of this process
        self._recorded_start: Dict[str, float] = {}  # from the checkpoint a resumed run continues
        self.dict_path = os.path.join(utils.split_paths(cfg.data)[0], "dict.txt")
        self.dictionary_sha256 = dictionary_sha256(self.dict_path)

    @classmethod
    def setup_task(cls, cfg: BottleneckPretrainConfig, **kwargs) -> "BottleneckPretrainTask":
        # the command line's options, before any file is read; a task set up from a checkpoint's
        # saved config (a tool reading the model) trains nothing with them
        if not kwargs.get("from_checkpoint", False):
            check_ranges(cfg)
        return super().setup_task(cfg, **kwargs)

    def build_model(self, cfg, from_checkpoint=False) -> "BottleneckEncoderModel":
        model = super().build_model(cfg, from_checkpoint)
        if not from_checkpoint:
            check_max_length(self.cfg.retrieval_max_length, model.max_positions())
        return model

    def whole_word_mask(self) -> torch.Tensor:
        """ByteTensor over the dictionary: 1 where a symbol starts a word.

        fairseq's ``get_whole_word_mask`` needs a BPE object built from a model
        path; the rule it applies for sentencepiece is just this prefix test,
        which we can read off the dictionary the data was binarized with.
        """
        d = self.source_dictionary
        rec = load_tokenizer_record(utils.split_paths(self.cfg.data)[0])
        if rec is not None:
            # the ids of a HuggingFace tokenizer (preprocess.build --tokenizer): its own
            # convention (WordPiece "##" continues, byte-level BPE "Ġ" / sentencepiece "▁" start)
            return torch.ByteTensor(word_start_table(d.symbols, rec, d.nspecial, self.mask_idx))
        # specials and <mask> stand alone; byte-fallback pieces (<0xNN>)
        # continue the word their "▁" piece started
        special = [not is_ordinary(i, d.nspecial, self.mask_idx) for i in range(len(d))]
        starts = [s or sym.startswith(WORD_START) for s, sym in zip(special, d.symbols)]
        return torch.ByteTensor(starts)

    def _split_path(self, split: str, epoch: int = 1) -> str:
        paths = utils.split_paths(self.cfg.data)
        return os.path.join(paths[(epoch - 1) % len(paths)], split)

    def _load_dataset_split(self, split, epoch, combine):
        split_path = self._split_path(split, epoch)
        empty = ConfigurationError(f"the '{split}' split is empty (no tokens)", split_path)
        # numpy cannot memory-map an empty .bin: catch it before fairseq does
        if os.path.isfile(split_path + ".bin") and os.path.getsize(split_path + ".bin") == 0:
            raise empty
        check_split_files(split_path)
        try:
            dataset = super()._load_dataset_split(split, epoch, combine)
        except FileNotFoundError as e:
            if not str(e).startswith("Dataset not found"):
                raise
            hint = " (or train with --disable-validation)" if split != "train" else ""
            raise ConfigurationError(
                f"the '{split}' split is missing: no {split}.bin / {split}.idx in the data folder{hint}", split_path
            ) from None
        except (ValueError, AssertionError) as e:  # numpy and fairseq on a damaged file
            raise ConfigurationError(f"not readable as fairseq data ({type(e).__name__}: {e})", split_path) from e
        if len(dataset) == 0:
            raise empty
        return dataset

    def mask_view(
        self, blocks: FairseqDataset, seed: int, mask_prob: float = None
    ) -> Tuple[FairseqDataset, FairseqDataset]:
        """(masked tokens, MLM target) of ``blocks`` with the task's masking options;
        another ``seed`` gives an independently masked view of the same blocks."""
        return MaskTokensDataset.apply_mask(
            blocks,
            self.source_dictionary,
            pad_idx=self.source_dictionary.pad(),
            mask_idx=self.mask_idx,
            seed=seed,
            mask_prob=self.cfg.mask_prob if mask_prob is None else mask_prob,
            leave_unmasked_prob=self.cfg.leave_unmasked_prob,
            random_token_prob=self.cfg.random_token_prob,
            freq_weighted_replacement=self.cfg.freq_weighted_replacement,
            mask_whole_words=self.whole_word_mask() if self.cfg.mask_whole_words else None,
            mask_multiple_length=self.cfg.mask_multiple_length,
            mask_stdev=self.cfg.mask_stdev,
        )

    def extra_inputs(self, split: str, blocks: FairseqDataset, src: FairseqDataset, target: FairseqDataset) -> Dict:
        """The objective's own inputs/targets, keyed like the batch (``net_input``
        entries go to the model).  ``blocks`` is the UNMASKED ``[CLS] x1 .. xn``,
        ``src``/``target`` the encoder's masked view and MLM target."""
        return {}

    def term_counts(self, sample) -> Dict[str, torch.Tensor]:
        """Units each loss term averages over in this batch (summed over the update
        by the batch iterator, all-reduced by the criterion)."""
        return {"mlm": sample["target"].ne(self.source_dictionary.pad()).sum()}

    def load_dataset(self, split, epoch=1, combine=False, **kwargs) -> None:
        blocks = self._load_dataset_split(split, epoch, combine)  # [CLS] x1 .. xn, unmasked
        self.unmasked_blocks[split] = blocks
        pad = self.source_dictionary.pad()
        src_dataset, tgt_dataset = self.mask_view(blocks, seed=self.cfg.seed)
        net_input = {
            "src_tokens": RightPadDataset(src_dataset, pad_idx=pad),
            "src_lengths": NumelDataset(src_dataset, reduce=False),
        }
        extra = dict(self.extra_inputs(split, blocks, src_dataset, tgt_dataset))
        net_input.update(extra.pop("net_input", {}))
        with data_utils.numpy_seed(self.cfg.seed):
            shuffle = np.random.permutation(len(src_dataset))
        self.datasets[split] = SortDataset(
            NestedDictionaryDataset(
                {
                    "id": IdDataset(),
                    "net_input": net_input,
                    "target": RightPadDataset(tgt_dataset, pad_idx=pad),
                    **extra,
                    "nsentences": NumSamplesDataset(),
                    "ntokens": NumelDataset(src_dataset, reduce=True),
                },
                sizes=[src_dataset.sizes],
            ),
            sort_order=[shuffle, src_dataset.sizes],
        )
