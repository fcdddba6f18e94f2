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
batch or fewer validation blocks than the retrieval probe needs.
"""

import inspect
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple

import numpy as np
import torch
from fairseq import utils
from fairseq.data import (
    Dictionary,
    FairseqDataset,
    IdDataset,
    MaskTokensDataset,
    NestedDictionaryDataset,
    NumelDataset,
    NumSamplesDataset,
    RightPadDataset,
    SortDataset,
    data_utils,
)
from fairseq.distributed import utils as distributed_utils
from fairseq.tasks.language_modeling import SAMPLE_BREAK_MODE_CHOICES
from fairseq.tasks.masked_lm import MaskedLMConfig, MaskedLMTask
from omegaconf import II

from .. import diagnostics
from ..checkpoint import DICTIONARY_SHA256, CheckpointError, check_dictionary
from ..data.split_files import check_split_files
from ..data.update_counts import UPDATE_COUNTS, UpdateCountsEpochBatchIterator
from ..errors import ConfigurationError
from ..objectives import ObjectiveDescription
from ..vocabulary.dictionary import dictionary_sha256, is_ordinary
from ..vocabulary.tokenizer import load_record as load_tokenizer_record
from ..vocabulary.tokenizer import word_start_table

logger = logging.getLogger(__name__)

POSITIONS_KEY = "encoder.sentence_encoder.embed_positions.weight"

# set on fairseq's dummy batch (see BottleneckPretrainTask.train_step)
DUMMY_BATCH = "dummy_batch"

# sentencepiece marks the first piece of a word with U+2581; the dictionary
# holds pieces, so whole-word masking can be read off the dictionary itself.
WORD_START = "\u2581"


def check_data_paths(data: str, paths: List[str]) -> None:
    """fairseq reads DATA as ``DIR1:DIR2:...`` (one folder per epoch): a folder whose
    name holds ':' is split apart, and the error must say so."""
    if len(paths) < 2 or "://" in data:
        return
    if os.path.isdir(data):
        raise ConfigurationError(
            "the folder's name contains ':', which fairseq reads as a list of data folders "
            "(DATA1:DATA2:...); rename it, or pass a symbolic link to it whose name has no ':'",
            data,
        )
    for path in paths:
        if not os.path.isdir(path):
            raise ConfigurationError(
                f"data folder not found (fairseq split DATA {data!r} at ':' into {len(paths)} folders)", path
            )


@dataclass
class BottleneckPretrainConfig(MaskedLMConfig):
    # The SEED-Encoder authors used fairseq's "complete" mode: a block holds
    # whole sentences and may cross document boundaries.
    sample_break_mode: SAMPLE_BREAK_MODE_CHOICES = field(
        default="complete",
        metadata={
            "help": "how the token stream is cut into blocks of tokens-per-sample - 1 "
            "tokens (+[CLS]): 'complete' (default, as the authors) = whole sentences, "
            "may cross documents; 'complete_doc' = never crosses a document "
            "boundary (empty line); 'none' = fixed-size blocks; 'eos' = one sentence"
        },
    )
    tokens_per_sample: int = field(
        default=512,
        metadata={"help": "encoder input length including [CLS] (paper: 512)"},
    )
    allow_dictionary_change: bool = field(
        default=False,
        metadata={
            "help": "restore a checkpoint trained with another dict.txt of the same size "
            "(a deliberate vocabulary change: each id keeps its embedding row); without it "
            "such a restore is refused"
        },
    )
    # the run's own decision (seed_fairseq/checkpoint.py, fairseq_patches/checkpoint_loading.py): a
    # checkpoint's saved config never turns it on (see SimLMPretrainTask.setup_task)
    trust_checkpoint: bool = field(
        default=False,
        metadata={
            "help": "load the checkpoints this run reads (--restore-file, --finetune-from-model, "
            "checkpoint_last.pt restarts, --generator-path) with Python's full unpickler, which runs any "
            "code pickled in them: only for files you trust.  Without it a checkpoint holding anything but "
            "the types fairseq checkpoints hold is refused"
        },
    )
    # Diagnostics at every validation (seed_fairseq/diagnostics.py); a bool option
    # defaulting to True would become a flag that turns it off, hence the names.
    no_diagnostics: bool = field(
        default=False,
        metadata={
            "help": "do not compute the pre-training diagnostics at validation (bits through [CLS] per "
            "bottleneck term, [CLS] anisotropy, the retrieval probe)"
        },
    )
    flush_denormal: bool = field(
        default=False,
        metadata={
            "help": "flush denormal floats to zero on the CPU (torch.set_flush_denormal): Adam's second moments "
            "of rarely seen vocabulary rows sink into the denormal range, where CPUs compute many times slower "
            "(GPUs do not); the update is unchanged in practice (a denormal second moment is far below --adam-eps)"
        },
    )
    retrieval_probe_size: int = field(
        default=0,
        metadata={
            "help": "at every validation, MRR@10 of the first halves of the first N validation blocks "
            "retrieving their own second halves by [CLS] dot product (0 = off, the default)"
        },
    )
    # Read from fairseq's optimisation config so that the criterion can
    # normalise by the unit counts of the whole update (see data/update_counts.py).
    update_freq: List[int] = II("optimization.update_freq")


class BottleneckPretrainTask(MaskedLMTask):
    """Blocks + [CLS] + the encoder's MLM view, plus the objective's ``extra_inputs``."""

    cfg: BottleneckPretrainConfig
    # what this task trains, for the model card, the comparison and the contract tests: one
    # description per variant, declared in the class's own body (seed_fairseq/objectives.py)
    objectives: Tuple[ObjectiveDescription, ...] = ()

    def __init__(self, cfg: BottleneckPretrainConfig, dictionary=None):
        if cfg.d2v2_multi or cfg.include_target_tokens or cfg.skip_masking:
            raise ValueError(
                f"{type(self).__name__} does not support the data2vec options "
                "--d2v2-multi / --include-target-tokens / --skip-masking"
            )
        if cfg.retrieval_probe_size < 0:
            raise ValueError(f"--retrieval-probe-size must be >= 0, got {cfg.retrieval_probe_size}")
        super().__init__(cfg, dictionary)
        if cfg.flush_denormal and not torch.set_flush_denormal(True):
            logger.warning("--flush-denormal: this CPU cannot flush denormals (no SSE3); computing with them")
        self.unmasked_blocks = {}  # split -> [CLS] x1 .. xn, for the retrieval probe
        self._probe_pending = False
        self.dict_path = os.path.join(utils.split_paths(cfg.data)[0], "dict.txt")
        self.dictionary_sha256 = dictionary_sha256(self.dict_path)

    @classmethod
    def load_dict(cls, cfg) -> Dictionary:
        paths = utils.split_paths(cfg.data)
        if not paths:
            raise ConfigurationError("no data directory given")
        check_data_paths(cfg.data, paths)
        dict_path = os.path.join(paths[0], "dict.txt")
        if not os.path.isfile(dict_path):
            raise ConfigurationError(
                "dictionary not found; DATA must be a folder written by "
                "fairseq-preprocess (or python -m preprocess.build) holding dict.txt",
                dict_path,
            )
        dictionary = Dictionary.load(dict_path)
        if len(dictionary) <= dictionary.nspecial:
            raise ConfigurationError("dictionary has no symbols besides the specials", dict_path)
        logger.info("dictionary: {} types".format(len(dictionary)))
        return dictionary

    # -- the dictionary identity travels with every checkpoint (task_state) ------------

    def state_dict(self) -> Dict[str, str]:
        return {DICTIONARY_SHA256: self.dictionary_sha256}

    def load_state_dict(self, state_dict) -> None:
        """Called by fairseq's ``load_model_ensemble`` with the checkpoint's task state
        (the tools that read whole checkpoints call ``check_checkpoint`` themselves)."""
        if state_dict and state_dict.get(DICTIONARY_SHA256):
            self.check_checkpoint({"task_state": state_dict}, "the checkpoint")

    def check_checkpoint(self, state, filename) -> None:
        """Refuse a checkpoint trained with another dictionary (size or symbols), or whose
        model has fewer positions than a block (an imported model's, restored without
        the ``--max-positions`` of its ``model_args.txt``)."""
        check_dictionary(
            state, filename, self.dict_path, len(self.source_dictionary), allow_change=self.cfg.allow_dictionary_change
        )
        table = (state.get("model") or {}).get(POSITIONS_KEY)
        if table is not None:
            positions = int(table.shape[0]) - self.source_dictionary.pad() - 1  # fairseq's learned positions
            if positions < self.cfg.tokens_per_sample:
                raise CheckpointError(
                    filename,
                    f"the model has {positions} positions, fewer than --tokens-per-sample "
                    f"{self.cfg.tokens_per_sample}: use --tokens-per-sample {positions} or less",
                )

    # -- data -----------------------------------------------------------------------------

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

    def get_batch_iterator(self, dataset, *args, **kwargs) -> UpdateCountsEpochBatchIterator:
        options = inspect.signature(super().get_batch_iterator).bind(dataset, *args, **kwargs)
        options.apply_defaults()
        max_tokens = options.arguments["max_tokens"]
        if max_tokens is not None and max_tokens < self.cfg.tokens_per_sample:
            raise ConfigurationError(
                f"--max-tokens {max_tokens} is below --tokens-per-sample {self.cfg.tokens_per_sample}: "
                "a full block would not fit in any batch; raise --max-tokens or lower --tokens-per-sample"
            )
        epoch_iter = super().get_batch_iterator(dataset, *args, **kwargs)
        split = next((name for name, d in self.datasets.items() if d is dataset), None)
        if split is not None:
            self.check_batches(split, len(epoch_iter.frozen_batches), options.arguments["required_batch_size_multiple"])
        try:
            update_freq = [int(u) for u in self.cfg.update_freq]  # a ListConfig in fairseq-train
        except (TypeError, ValueError):
            update_freq = [1]  # the task built outside fairseq-train: no interpolation
        return UpdateCountsEpochBatchIterator(epoch_iter, update_freq, self.term_counts)

    def check_batches(self, split: str, batches: int, required_batch_size_multiple: int) -> None:
        """Refuse, before training, a split that gives no batch and a probe larger than the
        validation split (what fairseq would report as "The dataset is empty", or never)."""
        split_file = self._split_path(split) + ".bin"
        blocks = len(self.datasets[split])
        if batches == 0:
            if split == "train":
                what, fix = "training would have no batch", "use more training text, or pass"
            else:
                what = "validation would be empty"
                fix = "hold out more documents (preprocess.build --valid-docs), pass --disable-validation, or"
            default = " (fairseq's default)" if required_batch_size_multiple == 8 else ""
            raise ConfigurationError(
                f"{what}: the '{split}' split has {blocks} blocks of up to {self.cfg.tokens_per_sample} tokens "
                "and fairseq drops the last batch of a split whose size is not a multiple of "
                f"--required-batch-size-multiple {required_batch_size_multiple}{default}, which leaves no batch; "
                f"{fix} --required-batch-size-multiple 1",
                split_file,
            )
        size = self.cfg.retrieval_probe_size
        if split == "valid" and size > 0 and not self.cfg.no_diagnostics:
            d = self.source_dictionary
            pairs = len(diagnostics.probe_pairs(self.unmasked_blocks[split], size, d.bos(), d.eos(), d.pad()))
            if pairs < size:
                raise ConfigurationError(
                    f"--retrieval-probe-size {size} needs {size} validation blocks of at least 4 tokens, the "
                    f"'valid' split has {pairs}: lower --retrieval-probe-size or hold out more documents "
                    "(preprocess.build --valid-docs)",
                    split_file,
                )

    def train_step(
        self, sample, model, criterion, optimizer, update_num, ignore_grad=False
    ) -> Tuple[torch.Tensor, Any, Dict[str, Any]]:
        if ignore_grad:
            # fairseq's dummy batch (a copy of an earlier one, used when this worker ran out of
            # data): marked DUMMY_BATCH for the criterion (CPDAE's views must not become the other
            # workers' negatives) and adding nothing to the update's counts
            sample = dict(sample)
            sample[DUMMY_BATCH] = True
            if UPDATE_COUNTS in sample:
                sample[UPDATE_COUNTS] = {
                    k: torch.zeros_like(torch.as_tensor(v)) for k, v in sample[UPDATE_COUNTS].items()
                }
        return super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)

    # -- diagnostics at validation (seed_fairseq/diagnostics.py) ------------------------------

    def begin_valid_epoch(self, epoch, model) -> None:
        super().begin_valid_epoch(epoch, model)
        self._probe_pending = self.cfg.retrieval_probe_size > 0  # once per validation

    def valid_step(self, sample, model, criterion) -> Tuple[torch.Tensor, Any, Dict[str, Any]]:
        loss, sample_size, logging_output = super().valid_step(sample, model, criterion)
        if self.cfg.no_diagnostics or not sample:
            return loss, sample_size, logging_output
        logging_output.update(diagnostics.validation_logs(criterion, model, sample, logging_output))
        if self._probe_pending and "valid" in self.unmasked_blocks:
            self._probe_pending = False
            single = distributed_utils.get_data_parallel_world_size() == 1
            if single or distributed_utils.get_data_parallel_rank() == 0:  # the same probe on every worker otherwise
                d = self.source_dictionary
                probe = diagnostics.retrieval_probe(
                    model, self.unmasked_blocks["valid"], self.cfg.retrieval_probe_size, d.bos(), d.eos(), d.pad()
                )
                logging_output.update(probe or {})
        return loss, sample_size, logging_output

    def reduce_metrics(self, logging_outputs, criterion) -> None:
        super().reduce_metrics(logging_outputs, criterion)
        diagnostics.reduce(logging_outputs)
