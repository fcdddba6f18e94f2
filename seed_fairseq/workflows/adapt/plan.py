"""What one adaptation does, resolved from the flags, and where it keeps everything.

OUT/adapt.json          the tool's record: the folder is its own
OUT/.stages/            the stage records (preprocess.stages.Runner)
OUT/import/             the model, imported (seed_fairseq.encoders.hf.import_)
OUT/corpus/             pretrain.txt and heldout.txt: the documents held out of pre-training
                        for the derived retrieval set (without --retrieval-dev)
OUT/retrieval/          the retrieval set derived from heldout.txt (without --retrieval-dev)
OUT/data-bin/           the pre-training text encoded with the model's tokenizer (preprocess.build)
OUT/generator/          SimLM's generator, when the model has no MLM head of its own
OUT/pretrain/           fairseq-train's save-dir and train.log
OUT/model/              THE ADAPTED MODEL: the best checkpoint, exported to HuggingFace
OUT/roundtrip/          the import exported unchanged, compared with --model (the reference,
                        evaluated as it is: kit/roundtrip.py)
OUT/bm25/  OUT/eval/<stage>/     the runs of every evaluated model
OUT/report.md  report.json  report.png
"""

import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple

from ..kit.folder import ToolFolder, tool_log
from ..kit.objectives import ObjectiveSpec
from ..kit.pipeline import Pipeline, RunPlan

TOOL = "seed_fairseq.adapt"
RECORD = "adapt.json"
ADAPTATION = ToolFolder(TOOL, RECORD, "the adaptation (examples/adapt.py)", "adaptation")

# ---------------------------------------------------------------------------
# defaults, each with its reason (docs/adapt.md repeats them for users)
# ---------------------------------------------------------------------------

# Issue 23's measurements were made at batch 16 x 128, lr 1e-4: the damage to a trained
# encoder shows within 40 updates, so 200 are enough to see whether an objective helps.
UPDATES = 200
BATCH_SIZE = 16
# A trained encoder continues at a fine-tuning rate: the comparison's 5e-4 trains from noise.
LR = 1e-4
WARMUP_SHARE = 0.1  # of --updates: the schedule's linear warm-up
# The comparison's --init blocks; a model with fewer positions gets blocks of its size.
TOKENS_PER_SAMPLE = 128
VALIDATIONS = 5  # validations (and saved checkpoints) per run: the best one is kept
# The unsupervised probe's candidates (diagnostics.py; chance is about 2.9/N), when it chooses the
# checkpoint.  With a dev set it is off: its N validation blocks made every validation of MiniLM
# at 16 x 128 cost minutes on 2 cores (the loss and diagnostics run over every validation block).
PROBE_SIZE = 128
# New heads (an MLM head the model lacks, the objective's decoders) are trained alone
# for this share of the updates, then the encoder joins with its own linear warm-up.
FREEZE_SHARE = 0.25
# ... and then learns at this share of the heads' rate.  Measured on MiniLM + the Debian corpus
# (docs/hf.md, docs/adapt_study.md): after the freeze alone zero-shot nDCG@10 still fell from 0.216
# to 0.166 within 40 updates of SEED; with the encoder at 0.1x it stayed at 0.215 (p 0.20).
ENCODER_LR_SCALE = 0.1
GENERATOR_SHARE = 0.5  # SimLM: updates of the generator's head, trained on the frozen model
# Without --retrieval-dev: documents held out of pre-training for the derived retrieval set
# (a query must not have been seen next to its passage in pre-training).
HELDOUT_SHARE = 0.2
MAX_HELDOUT_DOCS = 400  # the comparison's standard preset derives its set from 400 documents
MIN_HELDOUT_DOCS = 6  # derive_retrieval_set's test, dev and train splits need a few documents each
K = 100  # ranked documents per query: enough for R@100
RESAMPLES = 10000  # the paired permutation test's resamples

# the validation metrics the best checkpoint is chosen by (logged by the task at every validation)
DEV_METRIC = "dev_ndcg10"  # with a labelled dev set (the task's --retrieval-dev)
PROBE_METRIC = "probe_mrr10"  # without one: the unsupervised probe (--retrieval-probe-size)
SELECTION_METRICS = (DEV_METRIC, "dev_mrr10", PROBE_METRIC)

# the files each stage writes in its folder (Stage.writes)
SPLIT_FILES = ("pretrain.txt", "heldout.txt")
RUN_FILES = ("run.trec", "summary.json")
REPORT_FILES = ("report.md", "report.json", "report.png")


log = tool_log("adapt")


@dataclass
class AdaptPlan(RunPlan):
    """Everything one run does, resolved from the flags and the defaults (``pretrain.encoder_args`` is
    empty: the import's model_args.txt is read when the stage runs)."""

    model: Path
    objective: ObjectiveSpec  # as parsed from --objective (a stage's fingerprint holds its name)
    seed: int
    retrieval_dev: Optional[Path]  # a labelled BEIR / MS MARCO folder, else the set is derived
    train_queries: Optional[Path]  # a BEIR / MS MARCO folder with a train split: both models fine-tuned
    heldout_docs: int  # documents held out for the derived set (0 with --retrieval-dev)
    freeze_updates: Optional[int]  # None: chosen from the heads the import lacks
    encoder_warmup_updates: int
    encoder_lr_scale: float
    layer_lr_decay: float
    best_metric: str
    dev_in_training: bool  # the task scores the dev set at every validation (--retrieval-dev)

    @property
    def derived(self) -> bool:
        return self.retrieval_dev is None


class Paths(Pipeline):
    """The folders of one plan's run (the shared stages': ``kit.pipeline``)."""

    @property
    def pretrain_dir(self) -> Path:
        return self.out / "pretrain"

    @property
    def model_dir(self) -> Path:
        return self.out / "model"

    @property
    def train_set(self) -> Optional[Path]:
        """The folder whose train split fine-tunes both models (--train-queries)."""
        return self.plan.train_queries

    @property
    def pretrain_text(self) -> Path:
        return self.out / "corpus" / "pretrain.txt" if self.plan.derived else self.plan.corpus

    def eval_dir(self, stage: str) -> Path:
        return self.out / "eval" / stage

    def import_record(self) -> Dict[str, Any]:
        from ...encoders.hf.import_ import IMPORT_RECORD

        return json.loads((self.imported / IMPORT_RECORD).read_text(encoding="utf-8"))


def heldout_split(n_docs: int, heldout: int, seed: int = 1) -> Tuple[List[int], List[int]]:
    """(pre-training, held-out) document indices, each in corpus order: a seeded choice of ``heldout``."""
    chosen = set(random.Random(seed).sample(range(n_docs), heldout)) if heldout else set()
    return [i for i in range(n_docs) if i not in chosen], sorted(chosen)


def default_heldout(n_docs: int) -> int:
    return min(MAX_HELDOUT_DOCS, max(MIN_HELDOUT_DOCS, round(HELDOUT_SHARE * n_docs)))
