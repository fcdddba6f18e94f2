"""The options every bottleneck pre-training task shares (``BottleneckPretrainConfig``).

Each objective's config subclasses it (``tasks/*_pretrain.py``) and registers it with
fairseq's task registry together with its task; no ``from __future__ import annotations``
here: fairseq reads the dataclass fields' types.

A numeric field declares its range in its metadata (``"range": Range(...)``) unless its name gives it
(``option_ranges.py``: loss weights, temperatures, probabilities); ``setup_task`` checks them all.
"""

from dataclasses import dataclass, field
from typing import List, Optional

from fairseq.dataclass import ChoiceEnum
from fairseq.tasks.language_modeling import SAMPLE_BREAK_MODE_CHOICES
from fairseq.tasks.masked_lm import MaskedLMConfig
from omegaconf import II

from ...base.representation import DEFAULT_POOLING, DEFAULT_SIMILARITY, POOLING_MODES, SIMILARITIES
from ..option_ranges import NON_NEGATIVE, Range

POOLING_CHOICES = ChoiceEnum(list(POOLING_MODES))
SIMILARITY_CHOICES = ChoiceEnum(list(SIMILARITIES))


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
        metadata={"help": "encoder input length including [CLS] (paper: 512)", "range": Range(2)},
    )
    allow_dictionary_change: bool = field(
        default=False,
        metadata={
            "help": "restore a checkpoint trained with another dict.txt of the same size "
            "(a deliberate vocabulary change: each id keeps its embedding row); without it "
            "such a restore is refused"
        },
    )
    allow_representation_change: bool = field(
        default=False,
        metadata={
            "help": "continue a checkpoint (a resume, --restore-file, --finetune-from-model) with another "
            "--bottleneck-pooling / --retrieval-similarity / --retrieval-max-length / --retrieval-raw-vectors (or "
            "--bottleneck-unnormalized) "
            "than it records: a deliberate switch of the vector the model is trained and exported with, recorded "
            "in every checkpoint the run writes (task state 'representation_changes'); without it such a "
            "continuation is refused"
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
        default=DEFAULT_POOLING,
        metadata={
            "help": "how the encoder's last-layer vectors become the one vector per text that every objective's "
            "decoder and bottleneck heads read (the 'pre-training heads' of python scripts/objective_tables.py) "
            "and that the validation's retrieval scores: cls (the [CLS] "
            "vector, the papers', the default), mean, max, mean_sqrt_len or lasttoken over the non-pad positions "
            "(sentence-transformers' Pooling modes: continue a model with the pooling it ships with)"
        },
    )
    retrieval_similarity: SIMILARITY_CHOICES = field(
        default=DEFAULT_SIMILARITY,
        metadata={
            "help": "how the pooled vectors are compared: dot (inner product, the papers', the default) or cosine "
            "(a sentence-transformers model with a Normalize module or a cosine similarity_fn_name).  The "
            "validation's retrieval (--retrieval-dev, the probe) scores with it, and with cosine the bottleneck "
            "reads the L2-normalised vector, the one the model compares (see --bottleneck-unnormalized)"
        },
    )
    retrieval_max_length: int = field(
        default=0,
        metadata={
            "help": "the longest text, in tokens, the model's users encode (sentence-transformers' max_seq_length, "
            "recorded by the import: all-MiniLM-L6-v2 cuts at 256 of its 512 positions); the export writes it "
            "back. 0 (the default): the model's positions; else at least 3 ([CLS], a token of the text, </s>) and "
            "at most the model's positions",
            # 2 would keep [CLS] and </s> only: every text the same vector (the export writes it all the same)
            "range": Range(3, also=(0,), note=" (0: the model's positions)"),
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
    retrieval_raw_vectors: bool = field(
        default=False,
        metadata={
            "help": "with --retrieval-similarity cosine: the model's vectors are not unit vectors (a "
            "sentence-transformers model that compares by cosine without a Normalize module; the import sets it): "
            "the export writes no Normalize module.  Nothing else changes: cosine scores, what the bottleneck "
            "reads and the validation are the same"
        },
    )
    retrieval_probe_size: int = field(
        default=0,
        metadata={
            "help": "at every validation, MRR@10 of the first halves of the first N validation blocks "
            "retrieving their own second halves by the pooled vectors (--bottleneck-pooling) compared "
            "by --retrieval-similarity (0 = off, the default)",
            "range": NON_NEGATIVE,
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
        metadata={
            "help": "score at most this many judged queries of --retrieval-dev (a fixed sample; 0 = all)",
            "range": Range(0, note=" (0 = all)"),
        },
    )
    retrieval_dev_docs: int = field(
        default=1000,
        metadata={
            "help": "search among at most this many documents of --retrieval-dev: every document judged for the "
            "scored queries, filled up with a fixed sample of the others (0 = the whole corpus)",
            "range": Range(0, note=" (0 = all)"),
        },
    )
    # Read from fairseq's checkpoint config: a best-checkpoint metric that only --retrieval-dev or
    # the probe logs is refused before training without them (fairseq fails at the first validation)
    best_checkpoint_metric: str = II("checkpoint.best_checkpoint_metric")
    # Read from fairseq's optimisation config so that the criterion can
    # normalise by the unit counts of the whole update (see data/update_counts.py).
    update_freq: List[int] = II("optimization.update_freq")
