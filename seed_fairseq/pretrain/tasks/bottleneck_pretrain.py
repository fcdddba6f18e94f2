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
before the first update.
"""

import inspect
import logging
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
from fairseq import utils
from fairseq.data import (
    Dictionary,
    FairseqDataset,
    IdDataset,
    NestedDictionaryDataset,
    NumelDataset,
    NumSamplesDataset,
    RightPadDataset,
    SortDataset,
    data_utils,
)
from fairseq.dataclass import ChoiceEnum
from fairseq.distributed import utils as distributed_utils
from fairseq.tasks.language_modeling import SAMPLE_BREAK_MODE_CHOICES
from fairseq.tasks.masked_lm import MaskedLMConfig, MaskedLMTask
from omegaconf import II
from omegaconf.errors import OmegaConfBaseException

from ...base.errors import ConfigurationError
from ...base.objectives import ObjectiveDescription
from ...base.retrieval_data import DataFormatError, load_data
from ...base.vocabulary.dictionary import dictionary_sha256, is_ordinary
from ...base.vocabulary.text_ids import for_data_folder
from ...base.vocabulary.tokenizer import TokenizerError, word_start_table
from ...base.vocabulary.tokenizer import load_record as load_tokenizer_record
from .. import diagnostics, retrieval_dev
from ..checkpoint import DICTIONARY_SHA256, CheckpointError, check_dictionary
from ..data.mask_tokens_dataset import MaskTokensDataset
from ..data.split_files import check_split_files
from ..data.update_counts import UPDATE_COUNTS, UpdateCountsEpochBatchIterator
from ..fairseq_patches.optimizer_groups import GROUP_KEY
from ..models.bottleneck import POOLING_MODES, SIMILARITIES
from . import encoder_lr

logger = logging.getLogger(__name__)

POSITIONS_KEY = "encoder.sentence_encoder.embed_positions.weight"

# set on fairseq's dummy batch (see BottleneckPretrainTask.train_step)
DUMMY_BATCH = "dummy_batch"

# sentencepiece marks the first piece of a word with U+2581; the dictionary
# holds pieces, so whole-word masking can be read off the dictionary itself.
WORD_START = "\u2581"

POOLING_CHOICES = ChoiceEnum(list(POOLING_MODES))
SIMILARITY_CHOICES = ChoiceEnum(list(SIMILARITIES))


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
    # the run's own decision (seed_fairseq/pretrain/checkpoint.py, fairseq_patches/checkpoint_loading.py): a
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
    # Diagnostics at every validation (seed_fairseq/pretrain/diagnostics.py); a bool option
    # defaulting to True would become a flag that turns it off, hence the names.
    no_diagnostics: bool = field(
        default=False,
        metadata={
            "help": "do not compute the pre-training diagnostics at validation (bits through the bottleneck "
            "vector per bottleneck term, its anisotropy, the retrieval probe)"
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
    # The encoder's own learning rate while continuing a trained model (tasks/encoder_lr.py)
    freeze_encoder_updates: int = field(
        default=0,
        metadata={
            "help": "train only the parameters outside the encoder body (MLM head, decoders, projections) for "
            "the first N updates; the encoder's weights stay exactly as loaded.  For continued pre-training, "
            "where these heads start untrained (docs/hf.md recommends a value)"
        },
    )
    encoder_warmup_updates: int = field(
        default=-1,
        metadata={
            "help": "after --freeze-encoder-updates, raise the encoder's learning rate linearly from 0 over "
            "this many updates (-1, the default: as many as --freeze-encoder-updates)"
        },
    )
    encoder_lr_scale: float = field(
        default=1.0,
        metadata={"help": "the encoder body's learning rate = this x the scheduled one (the heads keep it)"},
    )
    layer_lr_decay: float = field(
        default=1.0,
        metadata={
            "help": "layer-wise learning-rate decay (BEiT/ELECTRA): layer i of L gets this^(L - i), the "
            "embeddings this^(L + 1), the heads 1 (1.0, the default: off)"
        },
    )
    # The model's representation (models/bottleneck.py): what every bottleneck reads, what the
    # validation scores; recorded in the checkpoint's task config (an old checkpoint: cls, dot)
    bottleneck_pooling: POOLING_CHOICES = field(
        default="cls",
        metadata={
            "help": "how the encoder's last-layer vectors become the one vector per text that every decoder and "
            "bottleneck head reads (SEED's weak decoder, RetroMAE/DupMAE's enhanced decoder, SimLM's decoder, "
            "CPDAE's bag-of-words MLP and contrast) and that the validation's retrieval scores: cls (the [CLS] "
            "vector, the papers', the default), mean, max, mean_sqrt_len or lasttoken over the non-pad positions "
            "(sentence-transformers' Pooling modes: continue a model with the pooling it ships with)"
        },
    )
    retrieval_similarity: SIMILARITY_CHOICES = field(
        default="dot",
        metadata={
            "help": "how the pooled vectors are compared: dot (inner product, the papers', the default) or cosine "
            "(a sentence-transformers model with a Normalize module or a cosine similarity_fn_name).  The "
            "validation's retrieval (--retrieval-dev, the probe) scores with it, and with cosine the bottleneck "
            "reads the L2-normalised vector, the one the model compares (see --bottleneck-unnormalized)"
        },
    )
    bottleneck_unnormalized: bool = field(
        default=False,
        metadata={
            "help": "with --retrieval-similarity cosine: the bottleneck reads the pooled vector as it is, not "
            "L2-normalised (the default with cosine normalises it, as TSDAE's decoder reads a normalising "
            "model's output: then pre-training changes only the direction, what cosine sees)"
        },
    )
    retrieval_probe_size: int = field(
        default=0,
        metadata={
            "help": "at every validation, MRR@10 of the first halves of the first N validation blocks "
            "retrieving their own second halves by the pooled vectors (--bottleneck-pooling) compared "
            "by --retrieval-similarity (0 = off, the default)"
        },
    )
    # zero-shot retrieval on a labelled dev set at every validation (seed_fairseq/pretrain/retrieval_dev.py)
    retrieval_dev: Optional[str] = field(
        default=None,
        metadata={
            "help": "a labelled BEIR or MS MARCO folder: at every validation, zero-shot retrieval of its queries "
            "by the current pooled vectors (--bottleneck-pooling; exact search by --retrieval-similarity, as "
            "the exported model's evaluation), logged as "
            "dev_ndcg10, dev_mrr10 and dev_recall100 (keep the best checkpoint with --best-checkpoint-metric "
            "dev_ndcg10 --maximize-best-checkpoint-metric); the starting model's scores are logged before the "
            "first update, and every validation logs <score>_vs_start (docs/diagnostics.md).  Runs even with "
            "--no-diagnostics"
        },
    )
    retrieval_dev_split: str = field(
        default="dev",
        metadata={
            "help": "the split of --retrieval-dev (BEIR: qrels/SPLIT.tsv; MS MARCO: queries.SPLIT.tsv, qrels.SPLIT.tsv)"
        },
    )
    retrieval_dev_queries: int = field(
        default=200,
        metadata={"help": "score at most this many judged queries of --retrieval-dev (a fixed sample; 0 = all)"},
    )
    retrieval_dev_docs: int = field(
        default=1000,
        metadata={
            "help": "search among at most this many documents of --retrieval-dev: every document judged for the "
            "scored queries, filled up with a fixed sample of the others (0 = the whole corpus)"
        },
    )
    # Read from fairseq's checkpoint config: a best-checkpoint metric that only --retrieval-dev or
    # the probe logs is refused before training without them (fairseq fails at the first validation)
    best_checkpoint_metric: str = II("checkpoint.best_checkpoint_metric")
    # Read from fairseq's optimisation config so that the criterion can
    # normalise by the unit counts of the whole update (see data/update_counts.py).
    update_freq: List[int] = II("optimization.update_freq")


class BottleneckPretrainTask(MaskedLMTask):
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
        if cfg.retrieval_probe_size < 0:
            raise ValueError(f"--retrieval-probe-size must be >= 0, got {cfg.retrieval_probe_size}")
        for name in ("retrieval_dev_queries", "retrieval_dev_docs"):
            if getattr(cfg, name) < 0:
                raise ConfigurationError(f"--{name.replace('_', '-')} must be >= 0 (0 = all), got {getattr(cfg, name)}")
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
        out = super().train_step(sample, model, criterion, optimizer, update_num, ignore_grad)
        schedule, encoder = self.encoder_schedule(model)
        if schedule.frozen(update_num):
            encoder_lr.zero_grads(encoder)  # out of the gradient norm and Adam's moments
        return out

    # -- the encoder's own learning rate (tasks/encoder_lr.py, fairseq_patches/optimizer_groups.py) ----

    def encoder_schedule(self, model) -> Tuple[encoder_lr.EncoderSchedule, List[torch.nn.Parameter]]:
        """The encoder's schedule for ``model`` (whose depth the layer decay needs) and its body's parameters."""
        if self._encoder_lr is None or self._encoder_lr[0] != id(model):
            schedule = encoder_lr.EncoderSchedule.from_cfg(self.cfg, encoder_lr.encoder_layers(model) or 0)
            self._encoder_lr = (id(model), schedule, encoder_lr.encoder_parameters(model))
        return self._encoder_lr[1:]

    def lr_group_labels(self, model) -> Optional[Dict[int, str]]:
        """``{id(parameter): learning-rate group}`` for the optimizer, None when one group serves."""
        schedule, _ = self.encoder_schedule(model)
        if not schedule.active:
            return None
        logger.info(schedule.describe())
        return encoder_lr.group_labels(model)

    def optimizer_step(self, optimizer, model, update_num) -> None:
        schedule, _ = self.encoder_schedule(model)
        if not schedule.active:
            return super().optimizer_step(optimizer, model, update_num)
        if schedule.freeze_updates and update_num == schedule.freeze_updates:
            logger.info(f"update {update_num + 1}: the encoder trains from now on")
        groups = optimizer.param_groups
        scheduled = [g["lr"] for g in groups]
        for g in groups:
            g["lr"] *= schedule.scale(g.get(GROUP_KEY, encoder_lr.HEADS), update_num)
        try:
            super().optimizer_step(optimizer, model, update_num)
        finally:  # the scheduler, the log and the saved state keep the scheduled rate
            for g, lr in zip(groups, scheduled):
                g["lr"] = lr

    # -- diagnostics at validation (seed_fairseq/pretrain/diagnostics.py) ------------------------------

    def begin_valid_epoch(self, epoch, model) -> None:
        super().begin_valid_epoch(epoch, model)
        self._retrieval_pending = bool(self.retrieval_names())  # once per validation

    def valid_step(self, sample, model, criterion) -> Tuple[torch.Tensor, Any, Dict[str, Any]]:
        loss, sample_size, logging_output = super().valid_step(sample, model, criterion)
        if not sample:
            return loss, sample_size, logging_output
        if not self.cfg.no_diagnostics:
            logging_output.update(diagnostics.validation_logs(criterion, model, sample, logging_output))
        if self._retrieval_pending:
            self._retrieval_pending = False
            logging_output.update(self.retrieval_logs(model))
        return loss, sample_size, logging_output

    def reduce_metrics(self, logging_outputs, criterion) -> None:
        super().reduce_metrics(logging_outputs, criterion)
        total = diagnostics.totals(logging_outputs)
        scores = diagnostics.reduce(logging_outputs)
        scores.update(retrieval_dev.reduce(total))
        diagnostics.log_vs_start(scores, total)

    # -- zero-shot retrieval: the probe, --retrieval-dev, and the starting model's scores ----------

    @classmethod
    def setup_task(cls, cfg: BottleneckPretrainConfig, **kwargs) -> "BottleneckPretrainTask":
        task = super().setup_task(cfg, **kwargs)
        # a task set up from a checkpoint's saved config (the export, a generator, fairseq-validate)
        # scores nothing: the dev set belongs to the training command, which may not run here
        if not kwargs.get("from_checkpoint", False):
            if cfg.retrieval_dev:
                task.load_retrieval_dev()
            task.check_best_checkpoint_metric()
        return task

    def check_best_checkpoint_metric(self) -> None:
        """``--best-checkpoint-metric`` naming a retrieval score this run does not log."""
        try:
            metric = str(self.cfg.best_checkpoint_metric)
        except OmegaConfBaseException:  # the task built outside fairseq-train: nothing to check
            return
        score = metric.removesuffix("_vs_start")
        if score in ("probe_mrr10", *retrieval_dev.MEASURES) and score not in self.retrieval_names():
            needs = "--retrieval-probe-size N without --no-diagnostics" if score == "probe_mrr10" else "--retrieval-dev"
            raise ConfigurationError(f"--best-checkpoint-metric {metric}: this run does not log it; it needs {needs}")

    def load_retrieval_dev(self) -> None:
        """Read and tokenise ``--retrieval-dev`` once (every worker: an error stops them all
        before training); a bad folder or file, or data without its tokenizer, is a
        ``ConfigurationError`` naming the file."""
        cfg = self.cfg
        try:
            import ir_measures  # noqa: F401  (scores() imports it at each validation)
        except ImportError:
            raise ConfigurationError("--retrieval-dev needs ir_measures: pip install ir_measures") from None
        try:
            data = load_data(cfg.retrieval_dev, cfg.retrieval_dev_split)
        except DataFormatError as e:
            where = e.path if e.line is None else f"{e.path}:{e.line}"
            raise ConfigurationError(f"{e.problem} (--retrieval-dev)", where) from None
        data_dir = utils.split_paths(cfg.data)[0]
        try:
            text_ids = for_data_folder(data_dir, self.source_dictionary.symbols)
        except (TokenizerError, ImportError) as e:
            problem, path = (e.problem, e.path) if isinstance(e, TokenizerError) else (str(e), data_dir)
            raise ConfigurationError(f"{problem} (--retrieval-dev tokenizes its text as the data was)", path) from None
        self.retrieval_dev = retrieval_dev.load_dev_set(
            data, text_ids, cfg.retrieval_dev_queries, cfg.retrieval_dev_docs, cfg.tokens_per_sample
        )
        logger.info(
            f"--retrieval-dev {cfg.retrieval_dev} (split {cfg.retrieval_dev_split}): {self.retrieval_dev.describe()}, "
            f"tokenised with {text_ids.describe}, cut at {cfg.tokens_per_sample} tokens; scored at every validation"
        )

    def representation(self) -> List[str]:
        """[pooling, similarity]: what the retrieval scores of this run are computed on."""
        return [str(self.cfg.bottleneck_pooling), str(self.cfg.retrieval_similarity)]

    def retrieval_names(self) -> List[str]:
        """The retrieval scores this run logs at every validation and for the starting model."""
        probe = ["probe_mrr10"] if self.cfg.retrieval_probe_size > 0 and not self.cfg.no_diagnostics else []
        return probe + (list(retrieval_dev.MEASURES) if self.retrieval_dev is not None else [])

    def retrieval_logs(self, model) -> Dict[str, float]:
        """The logging output of the probe and the dev set for ``model`` as it is, with the start
        scores.  Scored by the first worker only (the same numbers on every worker); the others
        give the same keys, zero, since fairseq sums the workers' outputs key by key."""
        names = self.retrieval_names()
        first = _first_worker()
        logs: Dict[str, float] = {}
        if "probe_mrr10" in names:
            logs.update(dict.fromkeys(diagnostics.PROBE_KEYS, 0))
            if first and "valid" in self.unmasked_blocks:
                d = self.source_dictionary
                blocks = self.unmasked_blocks["valid"]
                logs.update(
                    diagnostics.retrieval_probe(model, blocks, self.cfg.retrieval_probe_size, d.bos(), d.eos(), d.pad())
                    or {}
                )
        if self.retrieval_dev is not None:
            dev = self.retrieval_dev
            values = retrieval_dev.scores(model, dev, self.source_dictionary.pad()) if first else {}
            logs.update(retrieval_dev.logs(values, len(dev.qids) if first else 0))
        logs.update(diagnostics.start_logs(self.retrieval_start if first else {}, names))
        return logs

    def begin_epoch(self, epoch, model) -> None:
        super().begin_epoch(epoch, model)
        if self._start_pending:  # fairseq-train calls this after loading the checkpoint, before any update
            self._start_pending = False
            self.log_start(model)

    def log_start(self, model) -> None:
        """The starting model's retrieval scores, in one line (first worker): computed for a run
        that starts (a fresh model, ``--finetune-from-model``, a ``--restore-file`` with its
        optimizer reset), taken from the checkpoint for a run that continues."""
        names = self.retrieval_names()
        if not names or not _first_worker():
            return
        resumed = _restored_updates()
        if resumed:
            self.retrieval_start = {n: v for n, v in self._recorded_start.items() if n in names}
            if self.retrieval_start:
                logger.info(diagnostics.start_line(self.retrieval_start, "recorded in the checkpoint"))
            missing = [n for n in names if n not in self.retrieval_start]
            if missing:
                logger.warning(
                    f"no score of the starting model for {', '.join(missing)}: the run continues at update "
                    f"{resumed} from a checkpoint without one for this setting (no <score>_vs_start for them)"
                )
            return
        was_training = model.training
        model.eval()
        try:
            with torch.no_grad():
                total = diagnostics.totals([self.retrieval_logs(model)])
        finally:
            model.train(was_training)
        self.retrieval_start = {**diagnostics.probe_score(total), **retrieval_dev.means(total)}
        if self.retrieval_start:  # (the probe needs the validation split, not loaded with --disable-validation)
            logger.info(diagnostics.start_line(self.retrieval_start))

    def get_checkpoint_dict(self) -> Dict[str, Any]:
        """The start scores, with what they were computed on.  fairseq keeps this in a
        checkpoint's ``extra_state`` and gives it back (``set_checkpoint_dict``) to a run that
        continues from it, not to ``--finetune-from-model`` or ``--reset-dataloader``; fairseq-train
        never restores the task state (``state_dict``) of a checkpoint it continues."""
        if not self.retrieval_start:
            return {}
        record = {
            "scores": dict(self.retrieval_start),
            "probe_size": self.cfg.retrieval_probe_size,
            "dev_identity": self.retrieval_dev.identity if self.retrieval_dev else None,
            "representation": self.representation(),
        }
        return {type(self).__name__: {START_SCORES: record}}

    def set_checkpoint_dict(self, state: Dict[str, Any]) -> None:
        """The start scores of the run this one continues, each kept only if it was computed on
        what this run scores (the same probe size, the same dev queries, documents and tokens, the
        same pooling and similarity: a record without them was [CLS] and dot product)."""
        record = (state or {}).get(START_SCORES) or {}
        dev = self.retrieval_dev.identity if self.retrieval_dev else None
        if list(record.get("representation") or ["cls", "dot"]) != self.representation():
            record = {}
        same = {
            "probe_mrr10": record.get("probe_size") == self.cfg.retrieval_probe_size,
            **{name: dev is not None and record.get("dev_identity") == dev for name in retrieval_dev.MEASURES},
        }
        self._recorded_start = {n: float(v) for n, v in (record.get("scores") or {}).items() if same.get(n)}


START_SCORES = "retrieval_start"  # the key of the start scores in the task's checkpoint dict


def _first_worker() -> bool:
    return distributed_utils.get_data_parallel_world_size() == 1 or distributed_utils.get_data_parallel_rank() == 0


def _restored_updates() -> int:
    """The updates of the checkpoint fairseq-train continues (0 for a run that starts).

    All a task sees of it: loading a checkpoint to continue its run sets the trainer's
    update count, which fairseq logs as ``num_updates`` into its "default" meters (or
    restores with the checkpoint's meters); ``--finetune-from-model`` and
    ``--reset-optimizer`` start at 0 and log nothing."""
    from fairseq import metrics

    meter = metrics.get_meter("default", "num_updates")
    value = getattr(meter, "val", None)
    return int(value) if value else 0
