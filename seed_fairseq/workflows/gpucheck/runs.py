"""Training updates in this process, through fairseq's own ``Trainer``.

A :class:`Run` parses ``fairseq-train``'s own argument list (the options of a real run),
builds the task, model, criterion and ``fairseq.trainer.Trainer`` the way
``fairseq_cli/train.py`` does (seeds, ``--fp16`` / ``--bf16`` model casts, the loss scaler,
the optimizer wrappers), and runs ``train_step`` on the task's own batches.  In one
process the check can time every update, read the loss scaler after each one, reset
the peak-memory counter per run and probe batch sizes without a process start per
probe (a CUDA context and a base model take seconds each).

Counted per run: the losses; fairseq's "gradient overflow" notes (its ``fairseq.trainer``
log, read by a handler) and the loss scale after each update; the peak memory
(``torch.cuda.max_memory_allocated`` on CUDA, the process's peak RSS on the CPU, reset per
run through ``/proc/self/clear_refs``); the tokens the encoder received per second (the
non-padding tokens of every ``encoder.sentence_encoder`` call, as ``compare/flops.py``
counts them); and the FLOPs of one update, counted with ``FlopCounterMode`` like
``compare/flops.py`` (matrix products and attention, 2 FLOPs per multiply-add); what a run
measured is a ``training.TrainingResult``, and its kernel profile, taken after its updates, ``kernels.py``'s.
"""

import contextlib
import gc
import logging
import time
import warnings
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional, Tuple

from ...base.user_dir import parse_argv
from .budget import OutOfTime
from .training import TrainingResult

OVERFLOW_RETRIES = 8  # fp16's loss scale starts at 128: a fixed batch that overflows is retried at 64, 32 ...


class Unsupported(Exception):
    """This precision cannot run here (``str()`` says why); the check is skipped, not failed."""


class _OverflowCounter(logging.Handler):
    """Counts fairseq's "NOTE: gradient overflow detected" lines (``fairseq.trainer``)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.count = 0

    def emit(self, record):
        if "gradient overflow" in record.getMessage():
            self.count += 1


@contextlib.contextmanager
def counting_overflows(counter: _OverflowCounter) -> Iterator[_OverflowCounter]:
    """``counter`` sees fairseq's trainer notes meanwhile (at INFO: outside fairseq-train nothing configured
    logging, and the default WARNING level would drop them before any handler)."""
    logger = logging.getLogger("fairseq.trainer")
    level = logger.level
    logger.setLevel(logging.INFO)
    logger.addHandler(counter)
    try:
        yield counter
    finally:
        logger.removeHandler(counter)
        logger.setLevel(level)


def _is_oom(e: BaseException) -> bool:
    return "out of memory" in str(e).lower()


def reset_peak_memory(device: str) -> None:
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        return
    try:  # Linux: "5" resets the process's peak RSS (VmHWM) to its current RSS
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
    except OSError:
        pass


def peak_memory(device: str) -> Optional[int]:
    """Bytes: the peak allocated on CUDA since :func:`reset_peak_memory`, the peak RSS on the CPU."""
    import torch

    if device == "cuda":
        torch.cuda.synchronize()
        return int(torch.cuda.max_memory_allocated())
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import resource

    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024


def synchronize(device: str) -> None:
    if device == "cuda":
        import torch

        torch.cuda.synchronize()


class Run:
    """One ``fairseq-train`` configuration, built in this process (``args``: everything after DATA)."""

    def __init__(self, data, args: List[str], device: str):
        import numpy as np
        import torch
        from fairseq import metrics, options, tasks, utils
        from fairseq.dataclass import utils as dataclass_utils
        from fairseq.trainer import Trainer

        import seed_fairseq

        seed_fairseq.register()  # the plugin and the fairseq fixes

        self.device = device
        ns = options.parse_args_and_arch(options.get_training_parser(), parse_argv(data, args))
        with warnings.catch_warnings():  # hydra's deprecation notices on every config build
            warnings.simplefilter("ignore")
            # read from the module at call time: the fixed converter (--bf16 stays off the TPU,
            # fairseq_patches/bf16_device.py) whatever was imported first
            cfg = dataclass_utils.convert_namespace_to_omegaconf(ns)
        if cfg.common.tpu:
            raise Unsupported("--bf16 asks for a TPU here: torch_xla is installed (fairseq 0.12 reads --bf16 as --tpu)")
        metrics.reset()
        np.random.seed(cfg.common.seed)
        utils.set_torch_seed(cfg.common.seed)
        self.cfg = cfg
        self.task = tasks.setup_task(cfg.task)
        model = self.task.build_model(cfg.model)
        criterion = self.task.build_criterion(cfg.criterion)
        self.trainer = Trainer(cfg, self.task, model, criterion)
        self.epoch_itr = self.trainer.get_train_iterator(epoch=1, load_dataset=True)
        self.trainer.lr_step(self.epoch_itr.epoch)
        self.trainer.begin_epoch(self.epoch_itr.epoch)
        self.itr = self.epoch_itr.next_epoch_itr(shuffle=True)
        self.pad = self.task.source_dictionary.pad()
        self.tokens = 0  # non-padding tokens the encoder received (every sentence_encoder input, once)
        # this update's inputs: a checkpointed call (CPDAE's first view) runs again in backward on the same
        # tensor, a cost but not more tokens (held, so that an id is not reused within the update)
        self._inputs: list = []
        encoder = self.trainer.model.encoder.sentence_encoder
        encoder.register_forward_pre_hook(self._count_tokens, with_kwargs=True)
        self.overflows = _OverflowCounter()
        self.torch = torch
        self.metrics = metrics
        self.cuda_peak = 0  # CUDA: the largest peak fairseq's trainer reset during this run's updates
        self._reset_peak = torch.cuda.reset_peak_memory_stats

    def _count_tokens(self, module, args, kwargs):
        src = args[0] if args else kwargs["src_tokens"]
        if module.training and not any(src is seen for seen in self._inputs):
            self._inputs.append(src)
            self.tokens += int(src.ne(self.pad).sum())

    def next_sample(self) -> dict:
        """The next batch of the task's own iterator (a new epoch when one ends)."""
        while True:
            for sample in self.itr:
                if sample:
                    return sample
            self.epoch_itr = self.trainer.get_train_iterator(epoch=self.epoch_itr.next_epoch_idx, load_dataset=False)
            self.trainer.begin_epoch(self.epoch_itr.epoch)
            self.itr = self.epoch_itr.next_epoch_itr(shuffle=True)

    def sample_of(self, blocks: int) -> dict:
        """One batch of exactly ``blocks`` blocks (the batch search's probe)."""
        itr = self.task.get_batch_iterator(
            dataset=self.task.dataset(self.cfg.dataset.train_subset),
            max_sentences=blocks,
            max_positions=self.task.max_positions(),
            required_batch_size_multiple=1,
            seed=self.cfg.common.seed,
            epoch=1,
            disable_iterator_cache=True,  # not the run's cached iterator of --batch-size batches
        ).next_epoch_itr(shuffle=False)
        for sample in itr:  # batch_by_size may put a short batch (the last blocks) first
            if sample and sample["nsentences"] == blocks:
                return sample
        raise ValueError(f"{self.cfg.task.data}: the data set has fewer than {blocks} blocks of this length")

    def step(self, sample: dict, raise_oom: bool = False) -> Dict[str, float]:
        """One update; its logged values (``loss``, ``gnorm``, ``loss_scale`` ...) and ``seconds``."""
        cuda = self.torch.cuda
        reset = cuda.reset_peak_memory_stats
        if self.device == "cuda":  # fairseq's trainer resets the peak after every update (its gb_free): keep it
            cuda.reset_peak_memory_stats = self._keep_peak
        synchronize(self.device)
        self._inputs.clear()
        start = time.perf_counter()
        try:
            with counting_overflows(self.overflows), self.metrics.aggregate(new_root=True) as agg:
                out = self.trainer.train_step([sample], raise_oom=raise_oom)
            synchronize(self.device)
        finally:
            cuda.reset_peak_memory_stats = reset
            self._inputs.clear()
        values = {k: float(v) for k, v in agg.get_smoothed_values().items() if _is_number(v)}
        values.update({k: float(v) for k, v in (out or {}).items() if _is_number(v)})
        values["seconds"] = time.perf_counter() - start
        scaler = getattr(getattr(self.trainer.optimizer, "scaler", None), "loss_scale", None)
        if scaler is not None:
            values["loss_scale"] = float(scaler)
        return values

    def _keep_peak(self, *args, **kwargs) -> None:
        self.cuda_peak = max(self.cuda_peak, int(self.torch.cuda.max_memory_allocated()))
        self._reset_peak(*args, **kwargs)

    def counted_step(self, sample: dict) -> Dict[str, float]:
        """:meth:`step` under ``compare/flops.py``'s counter: its values, plus ``flops`` and the encoder's
        ``tokens`` of the update."""
        from torch.utils.flop_counter import FlopCounterMode

        before = self.tokens
        with FlopCounterMode(display=False) as counter:
            values = self.step(sample)
        return dict(values, flops=float(counter.get_total_flops()), tokens=float(self.tokens - before))

    def close(self) -> None:
        del self.trainer
        gc.collect()
        if self.device == "cuda":
            self.torch.cuda.empty_cache()


def _is_number(v) -> bool:
    try:
        float(v)
        return True
    except (TypeError, ValueError):
        return False


def save_generator(data, args: List[str], device: str, path: Path) -> Path:
    """SimLM's frozen generator: a masked LM after one update, saved by fairseq's trainer (its weights
    do not matter for speed, memory or finiteness; docs/objectives/simlm.md says how to train one)."""
    run = Run(data, args, device)
    try:
        run.step(run.next_sample())
        run.trainer.consolidate_optimizer()  # as fairseq's checkpoint_utils.save_checkpoint does first
        run.trainer.save_checkpoint(str(path), {})
    finally:
        run.close()
    return path


# ---------------------------------------------------------------------------
# what the check does with runs
# ---------------------------------------------------------------------------


def fits(data, args: List[str], device: str) -> Callable[[int], bool]:
    """The batch search's predicate for one configuration: one update of ``blocks`` blocks runs without
    running out of memory (one probe run reused; the caller closes it with ``fits.close()``)."""
    state = {}
    timings: Dict = {}  # "build": seconds to build the run; blocks: seconds of the update that fitted

    def probe(blocks: int) -> bool:
        if "run" not in state:
            start = time.perf_counter()
            state["run"] = Run(data, args, device)
            timings["build"] = time.perf_counter() - start
        run = state["run"]
        try:
            timings[blocks] = run.step(run.sample_of(blocks), raise_oom=True)["seconds"]
            return True
        except RuntimeError as e:  # torch.cuda.OutOfMemoryError is one
            if not _is_oom(e):
                raise
            run.trainer.zero_grad()
            gc.collect()
            if device == "cuda":
                run.torch.cuda.empty_cache()
            return False

    def close():
        if "run" in state:
            state.pop("run").close()

    probe.close = close
    probe.timings = timings
    return probe


def train(
    data,
    args: List[str],
    device: str,
    updates: int,
    batch: int,
    until: Optional[float] = None,
    minimum: int = 3,
    warmup: int = 1,
    profile: Optional[Tuple[int, int]] = None,
) -> TrainingResult:
    """``updates`` updates of one configuration (``args`` hold its --batch-size): the first step counts
    the FLOPs (not timed: it also warms the device up), the others are timed, and the speed is measured
    on those after ``warmup`` more (``training.py``).  An update is a step
    fairseq applied: an fp16 step that overflowed changed no weight (fairseq skips it, halves the loss
    scale and does not count it in ``num_updates``), so it is not one; up to :data:`OVERFLOW_RETRIES`
    such steps are taken on top (``TrainingResult.steps`` holds all).  ``until``: a ``time.monotonic()``
    after which no step starts once ``minimum`` updates ran (the run's share of the time budget;
    ``stopped_early`` then says so).  ``profile``: (updates, warm-up) of the kernel profile taken after
    them (``kernels.py``), not among the measured ones nor the losses."""
    run = Run(data, args, device)
    result = TrainingResult(batch=batch, updates=0, warmup=warmup)
    try:
        reset_peak_memory(device)
        run.cuda_peak = 0
        while result.updates < updates and result.steps < updates + OVERFLOW_RETRIES:
            if until is not None and result.updates >= minimum and time.monotonic() >= until:
                result.stopped_early = True
                break
            sample = run.next_sample()
            overflows, before = run.overflows.count, run.tokens
            counted = result.steps == 0
            if counted:
                values = run.counted_step(sample)
                result.flops_per_token = values["flops"] / max(1.0, values["tokens"])
                result.tokens_per_update = values["tokens"]
            else:
                values = run.step(sample)
            result.steps += 1
            if "loss_scale" in values:
                result.loss_scales.append(values["loss_scale"])
            if "loss" not in values and run.overflows.count > overflows:
                continue  # an fp16 overflow: fairseq skipped the update and logged no loss
            result.updates += 1
            result.losses.append(values.get("loss", float("nan")))
            result.gnorms.append(values.get("gnorm", float("nan")))
            if not counted:
                result.timed.append((float(run.tokens - before), values["seconds"]))
        result.peak_memory = max(run.cuda_peak, peak_memory(device) or 0) or None
        result.overflows = run.overflows.count
        if profile and result.stopped_early:
            result.profile = {"status": "not run", "detail": "not run: the run's share of the time budget ended"}
        elif profile:
            result.profile = _profile(run, *profile)
    finally:
        run.close()
    return result


def _profile(run: Run, updates: int, warmup: int) -> Dict:
    """The kernel profile of ``run``, or why there is none: a failure of the profiler is reported in the
    profile, the training's own results stand; the deadline reached during it ends the profile alone."""
    from .kernels import profile_updates

    try:
        return profile_updates(run, updates, warmup)
    except OutOfTime as e:
        return {"status": "not run", "detail": f"not run: {e}"}
    except Exception as e:  # noqa: BLE001  (the profile's failure is not the training's)
        logging.getLogger(__name__).exception("the kernel profile failed")
        return {"status": "error", "detail": f"{type(e).__name__}: {str(e).strip()[:300]}"}


def one_batch(data, args: List[str], device: str) -> Dict[str, float]:
    """loss and gnorm of the first update of ``args`` (the fixed batch of the precision check)."""
    run = Run(data, args, device)
    try:
        sample = run.next_sample()
        for _ in range(OVERFLOW_RETRIES):  # an fp16 overflow changes no weight: the same batch again, scale halved
            values = run.step(sample)
            if "loss" in values:
                break
    finally:
        run.close()
    return {"loss": values.get("loss", float("nan")), "gnorm": values.get("gnorm", float("nan"))}
