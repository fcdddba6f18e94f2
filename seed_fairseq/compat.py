"""Two narrow fixes that make stock fairseq 0.12 usable on current PyTorch / CPU.

Both are applied when the plugin is imported (``--user-dir seed_fairseq`` does
that before fairseq reads a checkpoint or starts distributed training) and are
idempotent.

1. Checkpoint loading that runs no code.  torch >= 2.6 loads with
   ``weights_only=True`` by default, which refuses the ``argparse.Namespace``
   that fairseq checkpoints hold: fairseq could no longer resume from its own
   ``checkpoint_last.pt``.  The full unpickler instead would run whatever a
   checkpoint from elsewhere pickled.  fairseq's ``checkpoint_utils`` (every
   checkpoint file fairseq reads: ``--restore-file``, ``--finetune-from-model``,
   restarts, ``load_model_ensemble``) sees a ``torch`` whose ``load`` is
   ``checkpoint.load_torch_file``: ``weights_only`` with the allowlist of the
   types fairseq checkpoints hold; a file needing anything else is refused in
   one line naming the type.  ``fairseq-train --trust-checkpoint`` (a task
   option) allows the full unpickler for the checkpoints its run loads: the
   decision is taken around fairseq's ``load_checkpoint`` from the run's own
   task config, never from a checkpoint's.  ``distributed.utils`` unpickles
   what rank 0 of the run's own process group broadcasts (the checkpoint it
   loaded as above): the full unpickler there.  Every other ``torch.load`` in
   the process keeps torch's default.

2. ``torchrun`` on CPU.  fairseq computes ``device_id = rank %
   torch.cuda.device_count()``, a ZeroDivisionError without a GPU, and keeps
   the NCCL backend.  On a machine without CUDA we use device 0 and the gloo
   backend instead, which makes multi-process data-parallel training testable
   on CPU (use ``--ddp-backend legacy_ddp`` there; PyTorch's DDP wrapper in
   fairseq passes CUDA ``device_ids``).

3. Atomic checkpoints.  fairseq writes the first checkpoint of a save under a
   temporary name but then copies it onto ``checkpoint_last.pt`` (and
   ``checkpoint_best.pt`` ...) in place: a kill during that copy leaves a
   truncated ``checkpoint_last.pt`` and the same command no longer restarts.
   Every checkpoint name is now written to a temporary file in the same folder,
   fsync'ed and renamed.

4. Restarts that always work.  When ``fairseq-train`` resumes from its default
   ``checkpoint_last.pt`` and that file is missing or unreadable while other
   checkpoints of the run exist (or one of them is newer), it resumes from the
   newest readable one and says so.  An explicit ``--restore-file`` that does
   not exist is an error (fairseq would silently train from scratch).  Before
   any weight is loaded the task checks the checkpoint against the data
   (``check_checkpoint``: dictionary size and identity), so the last line of a
   refused restore names the true cause.

5. A watchdog for ``torchrun`` workers: when the launcher is killed (even with
   SIGKILL) its workers notice that their parent is gone and stop, instead of
   training on and writing checkpoints nobody waits for.

6. A clean exit.  fairseq prefetches batches in a daemon thread
   (``iterators.BackgroundConsumer``, ``--data-buffer-size``).  When training
   stops (``--max-update``) that thread is often still building the next
   batch inside torch's C++ code with the GIL released; at interpreter
   shutdown Python ends such a thread with ``pthread_exit``, whose forced
   unwinding through a ``noexcept`` C++ frame calls ``std::terminate``: the
   process aborts with "terminate called without an active exception" AFTER
   training finished and the checkpoint was written (exit code 134; 3 of 20
   single-process runs on a loaded 2-core machine, and the "flaky" 2-worker
   torchrun test).  The consumer now checks a stop flag before each batch, and
   an ``atexit`` handler sets it, drains the queue and joins the thread before
   shutdown begins.  The process group is also destroyed when
   ``distributed_main`` returns, instead of during shutdown.
   ``benchmarks/launch_stress.py`` counts failures of repeated launches.

7. One run per save-dir.  The process that writes the checkpoints takes the
   save-dir's lock (``savedir.py``) before it reads the first checkpoint and
   holds it until it exits; a second ``fairseq-train`` into the same folder
   stops with one ``error:`` line instead of overwriting the first one's
   checkpoints.  A killed run's lock dies with it.  Under the lock, the
   staging files of checkpoint writes a killed run left are removed.  A run
   with ``--no-save`` writes nothing there: it neither locks nor cleans.

8. One line for what the user can fix.  ``fairseq-train``'s ``main`` is
   wrapped (it is looked up when ``cli_main`` calls it, after ``--user-dir``
   was imported): the plugin's refusals (``ConfigurationError``,
   ``CheckpointError``) and a full disk, quota, file-size limit, read-only or
   forbidden folder (an ``OSError`` naming its file) end the run with
   ``error: FILE: problem`` on stderr and exit status 2, not a traceback.
   torch's writer reports a failed write as a ``RuntimeError`` without the
   cause; checkpoint writes recover the ``OSError`` (``checkpoint.save_atomic``)
   and are not retried for these causes.
"""

from . import plugin  # noqa: F401  (registration first: see seed_fairseq/__init__.py)

# isort: split
import atexit
import errno
import functools
import logging
import os
import queue
import signal
import sys
import threading
import time
import types
import weakref
from typing import Callable, Optional

import torch

logger = logging.getLogger(__name__)


class _TorchWithLoad(types.ModuleType):
    """A stand-in for the ``torch`` module inside one fairseq module.

    Attribute access is forwarded to the real module; only ``load`` differs.
    """

    def __init__(self, load: Callable):
        super().__init__("torch")
        self.load = load

    def __getattr__(self, name):
        return getattr(torch, name)


def _checkpoint_file_load(f, map_location=None):
    """``torch.load`` of fairseq's ``checkpoint_utils``: point 1 of the module docstring."""
    from .checkpoint import load_torch_file

    return load_torch_file(f, map_location=map_location)


def _broadcast_load(f, map_location=None):
    # distributed.utils unpickles what rank 0 of this run's own process group
    # torch.save'd (broadcast_object): objects in memory, e.g. a checkpoint rank 0
    # loaded through _checkpoint_file_load, whose config is an OmegaConf object
    # by then.  Not a file from elsewhere: the full unpickler.
    return torch.load(f, map_location=map_location, weights_only=False)


def _load_checkpoint_with_run_trust(cfg, trainer, **passthrough_args):
    """fairseq's ``load_checkpoint`` under the ``--trust-checkpoint`` of the run's own task."""
    from .checkpoint import trusting

    with trusting(bool(getattr(getattr(trainer.task, "cfg", None), "trust_checkpoint", False))):
        return _original_load_checkpoint(cfg, trainer, **passthrough_args)


_original_load_checkpoint = None


def _install_safe_checkpoint_loading():
    global _original_load_checkpoint
    from fairseq import checkpoint_utils
    from fairseq.distributed import utils as distributed_utils

    for module, load in ((checkpoint_utils, _checkpoint_file_load), (distributed_utils, _broadcast_load)):
        if not isinstance(module.torch, _TorchWithLoad):
            module.torch = _TorchWithLoad(load)
    if checkpoint_utils.load_checkpoint is not _load_checkpoint_with_run_trust:
        _original_load_checkpoint = checkpoint_utils.load_checkpoint
        checkpoint_utils.load_checkpoint = _load_checkpoint_with_run_trust


def _cpu_safe_torch_distributed_launch_init(cfg):
    """fairseq's ``_infer_torch_distributed_launch_init`` without the CUDA assumption."""
    cfg.distributed_init_method = "env://"
    cfg.distributed_world_size = int(os.environ["WORLD_SIZE"])
    cfg.distributed_rank = int(os.environ["RANK"])
    if torch.cuda.is_available() and torch.cuda.device_count() > 0:
        cfg.device_id = cfg.distributed_rank % torch.cuda.device_count()
    else:
        # No GPU: every process uses "device" 0 (the CPU) and NCCL cannot work.
        cfg.device_id = 0
        if cfg.distributed_backend == "nccl":
            logger.info("no CUDA device: using the gloo backend instead of nccl")
            cfg.distributed_backend = "gloo"
    # processes are created by torchrun / torch.distributed.launch
    cfg.distributed_no_spawn = True
    start_launcher_watchdog()


WATCHDOG_INTERVAL = 2.0  # seconds between checks that the launcher is alive
_watchdog_started = False


def start_launcher_watchdog(interval: float = WATCHDOG_INTERVAL) -> None:
    """Stop this worker when the process that launched it (torchrun) is gone.

    A killed parent's children are re-parented, so ``os.getppid()`` changes;
    the worker then terminates itself (SIGTERM, SIGKILL after a grace period).
    Checkpoints are written atomically, so stopping at any point is safe.
    """
    global _watchdog_started
    if _watchdog_started:
        return
    _watchdog_started = True
    parent = os.getppid()

    def watch():
        while True:
            time.sleep(interval)
            if os.getppid() != parent:
                logger.error(f"the launcher (pid {parent}) is gone: stopping worker {os.getpid()}")
                os.kill(os.getpid(), signal.SIGTERM)
                time.sleep(10 * interval)
                os.kill(os.getpid(), signal.SIGKILL)

    threading.Thread(target=watch, name="seed_fairseq-launcher-watchdog", daemon=True).start()


def _install_cpu_distributed_launch():
    from fairseq.distributed import utils as distributed_utils

    distributed_utils._infer_torch_distributed_launch_init = _cpu_safe_torch_distributed_launch_init


class _AtomicPathManager:
    """fairseq's ``PathManager`` inside ``checkpoint_utils`` with an atomic ``copy``."""

    def __init__(self, path_manager):
        self._pm = path_manager

    def __getattr__(self, name):
        return getattr(self._pm, name)

    def copy(self, src_path, dst_path, overwrite=False):
        if "://" in str(dst_path) or "://" in str(src_path):  # remote storage: fairseq's own copy
            return self._pm.copy(src_path, dst_path, overwrite)
        if os.path.exists(dst_path) and not overwrite:
            return False
        from .fileio import copy_atomic

        try:
            copy_atomic(src_path, dst_path)
        except OSError as e:
            if e.filename or e.errno is None:
                raise
            # a failed write() names no file: say which checkpoint could not be written
            raise OSError(e.errno, e.strerror, str(dst_path)) from e
        return True


# Errors of the machine that the user must fix (free space, raise a limit, fix
# permissions): reported in one line, never retried.
ENVIRONMENT_ERRNOS = frozenset({errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS, errno.EACCES, errno.EPERM})


def _atomic_torch_persistent_save(obj, filename, async_write: bool = False):
    if async_write or not isinstance(filename, (str, os.PathLike)) or "://" in str(filename):
        return _original_torch_persistent_save(obj, filename, async_write)
    from .checkpoint import save_atomic

    for attempt in range(3):  # fairseq retries transient write errors too
        try:
            save_atomic(obj, filename)
            return
        except OSError as e:
            if attempt == 2 or e.errno in ENVIRONMENT_ERRNOS:
                raise
            time.sleep(2.5)


_original_torch_persistent_save = None


def _install_atomic_checkpoint_writes():
    global _original_torch_persistent_save
    from fairseq import checkpoint_utils

    if not isinstance(checkpoint_utils.PathManager, _AtomicPathManager):
        checkpoint_utils.PathManager = _AtomicPathManager(checkpoint_utils.PathManager)
    if checkpoint_utils.torch_persistent_save is not _atomic_torch_persistent_save:
        _original_torch_persistent_save = checkpoint_utils.torch_persistent_save
        checkpoint_utils.torch_persistent_save = _atomic_torch_persistent_save


def _resolve_restore_file(trainer, filename):
    """The checkpoint a (re)start should load; see point 4 of the module docstring."""
    from .checkpoint import CheckpointError, newest_readable_checkpoint, peek_checkpoint

    ckpt_cfg = trainer.cfg.checkpoint
    suffix = trainer.checkpoint_suffix
    default = os.path.join(ckpt_cfg.save_dir, f"checkpoint_last{suffix}.pt")
    if os.path.abspath(filename) != os.path.abspath(default):
        if (
            ckpt_cfg.restore_file != "checkpoint_last.pt"
            and not os.path.isfile(filename)
            and "://" not in str(filename)
        ):
            raise CheckpointError(filename, "--restore-file not found (fairseq would silently train from scratch)")
        return filename
    best, bad = newest_readable_checkpoint(ckpt_cfg.save_dir, suffix, prefer=default)
    if best is None:
        if os.path.exists(default):  # the only checkpoint, and it is damaged
            peek_checkpoint(default)  # raises with the problem
        return filename  # a first launch
    if os.path.abspath(best) != os.path.abspath(default):
        why = f"{default} is missing" if not os.path.exists(default) else f"{best} is newer than {default}"
        for problem in bad:
            if problem.startswith(default):
                why = problem
        logger.warning(f"restarting from {best}: {why}")
    return str(best)


def _take_save_dir(trainer) -> None:
    """Point 7 of the module docstring: lock the save-dir, then remove a killed run's staging files."""
    from .savedir import lock_save_dir, remove_staging_debris

    ckpt_cfg = trainer.cfg.checkpoint
    if ckpt_cfg.no_save or "://" in str(ckpt_cfg.save_dir) or not trainer.should_save_checkpoint_on_current_rank:
        return
    lock_save_dir(ckpt_cfg.save_dir, trainer.checkpoint_suffix)
    remove_staging_debris(ckpt_cfg.save_dir, trainer.checkpoint_suffix)


def _install_checkpoint_restore_guard():
    from fairseq.trainer import Trainer

    if getattr(Trainer.load_checkpoint, "_seed_fairseq_guard", False):
        return
    original = Trainer.load_checkpoint

    @functools.wraps(original)
    def load_checkpoint(self, filename, *args, **kwargs):
        from .checkpoint import CheckpointError, peek_checkpoint

        _take_save_dir(self)
        filename = _resolve_restore_file(self, filename)
        check = getattr(self.task, "check_checkpoint", None)
        if check is not None and os.path.isfile(filename):
            check(peek_checkpoint(filename), filename)
        try:
            return original(self, filename, *args, **kwargs)
        except Exception as e:
            # fairseq replaces any error of model loading by "please ensure that
            # the architectures match": surface the plugin's own explanation
            if isinstance(e.__context__, CheckpointError):
                raise e.__context__ from None
            raise

    load_checkpoint._seed_fairseq_guard = True
    Trainer.load_checkpoint = load_checkpoint


def _distributed_main_with_teardown(i, main, cfg, kwargs):
    try:
        return _original_distributed_main(i, main, cfg, kwargs)
    finally:
        # local cleanup only (no barrier: a worker that failed must not wait for the others)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            try:
                torch.distributed.destroy_process_group()
            except Exception as e:  # teardown must never hide the real outcome
                logger.warning(f"destroying the process group failed: {e!r}")


_original_distributed_main = None


def _install_distributed_teardown():
    global _original_distributed_main
    from fairseq.distributed import utils as distributed_utils

    if distributed_utils.distributed_main is not _distributed_main_with_teardown:
        _original_distributed_main = distributed_utils.distributed_main
        distributed_utils.distributed_main = _distributed_main_with_teardown


_stop_consumers = threading.Event()
_live_consumers = weakref.WeakSet()


def _stoppable_consumer_run(self):
    """fairseq's ``BackgroundConsumer.run`` with a stop flag checked before each batch."""
    from fairseq.data import iterators

    _live_consumers.add(self)
    if self.cuda_device is not None:
        torch.cuda.set_device(self.cuda_device)
    try:
        source = iter(self._source)
        while not _stop_consumers.is_set():
            try:
                item = next(source)
            except StopIteration:
                break
            self._queue.put(item)
            self.count += 1
            if self._max_len is not None and self.count >= self._max_len:
                break
        self._queue.put(iterators._sentinel)
    except Exception as e:
        self._queue.put(e)


def _join_consumers(timeout: float = 120.0):
    """At exit: stop the prefetching threads while the interpreter can still run them."""
    _stop_consumers.set()
    deadline = time.time() + timeout
    for consumer in list(_live_consumers):
        while consumer.is_alive() and time.time() < deadline:
            try:  # unblock a put() on a full queue
                while True:
                    consumer._queue.get_nowait()
            except queue.Empty:
                pass
            consumer.join(0.05)


def _install_clean_exit():
    from fairseq.data import iterators

    if iterators.BackgroundConsumer.run is not _stoppable_consumer_run:
        iterators.BackgroundConsumer.run = _stoppable_consumer_run
        atexit.register(_join_consumers)


def user_error_line(error: BaseException) -> Optional[str]:
    """``FILE: problem`` for an error the user can fix (point 8), None for anything else."""
    from .checkpoint import CheckpointError
    from .errors import ConfigurationError

    if isinstance(error, (ConfigurationError, CheckpointError)):
        return str(error).strip().splitlines()[0]
    if isinstance(error, OSError) and error.errno in ENVIRONMENT_ERRNOS and error.filename:
        hint = " (the file-size limit: ulimit -f)" if error.errno == errno.EFBIG else ""
        return f"{error.filename}: {error.strerror}{hint}; fix this and rerun the same command to resume"
    return None


def one_line_errors(main: Callable) -> Callable:
    """``main`` that reports the user's errors as ``error: FILE: problem`` and exits with status 2."""
    if getattr(main, "_seed_fairseq_one_line_errors", False):
        return main

    @functools.wraps(main)
    def wrapped(*args, **kwargs):
        try:
            return main(*args, **kwargs)
        except Exception as e:
            line = user_error_line(e)
            if line is None:
                raise
            logger.debug("refused", exc_info=True)
            print(f"error: {line}", file=sys.stderr, flush=True)
            sys.exit(2)

    wrapped._seed_fairseq_one_line_errors = True
    return wrapped


def _install_one_line_errors():
    """Wrap ``main`` of fairseq-train (point 8) when this process runs it: the module
    ``fairseq_cli.train`` (the ``fairseq-train`` command), or ``python -m fairseq_cli.train``."""
    main_module = sys.modules.get("__main__")
    for module in (sys.modules.get("fairseq_cli.train"), main_module):
        spec = getattr(module, "__spec__", None)
        if module is main_module and getattr(spec, "name", None) != "fairseq_cli.train":
            continue
        if module is not None and callable(getattr(module, "main", None)):
            module.main = one_line_errors(module.main)


def install() -> None:
    _install_safe_checkpoint_loading()
    _install_cpu_distributed_launch()
    _install_atomic_checkpoint_writes()
    _install_checkpoint_restore_guard()
    _install_distributed_teardown()
    _install_clean_exit()
    _install_one_line_errors()


install()
