"""Validation: the diagnostics (``diagnostics.py``) and the zero-shot retrieval scores of the probe
and of ``--retrieval-dev`` (``retrieval_dev.py``), each also against the starting model's, scored
before the first update and kept in the checkpoint for a run that continues."""

import logging
from typing import Any, Dict, List, Tuple

import torch
from fairseq import utils
from fairseq.distributed import utils as distributed_utils
from omegaconf.errors import OmegaConfBaseException

from ...base.errors import ConfigurationError
from ...base.representation import PAPERS
from ...base.retrieval_data import DataFormatError, load_data
from ...base.vocabulary.text_ids import for_data_folder
from ...base.vocabulary.tokenizer import TokenizerError
from .. import diagnostics, retrieval_dev
from .config import BottleneckPretrainConfig

logger = logging.getLogger(__name__)


class Validation:
    """The task's validation: diagnostics, retrieval scores and the starting model's scores."""

    cfg: BottleneckPretrainConfig

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
    def setup_task(cls, cfg: BottleneckPretrainConfig, **kwargs) -> "Validation":
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
        if list(record.get("representation") or [PAPERS.pooling, PAPERS.similarity]) != self.representation():
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
