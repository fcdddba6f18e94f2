"""The fixes the plugin makes to stock fairseq 0.12: one module per fix, :data:`PATCHES` is the index.

The plugin applies them when it registers (``plugin.py`` calls :func:`apply`;
``--user-dir seed_fairseq`` does that before fairseq reads a checkpoint or
starts distributed training); :func:`apply` is idempotent.  Importing this
package changes nothing and imports no fairseq: every fix imports fairseq
inside its ``install`` function, so no module here needs the plugin first.

1. ``checkpoint_loading``: checkpoint loading that runs no code (torch >= 2.6
   refuses fairseq's checkpoints; the full unpickler would run anything).
2. ``torchrun_cpu``: ``torchrun`` on CPU (no ZeroDivisionError, gloo).
3. ``atomic_checkpoints``: every checkpoint name is written atomically.
4. ``restarts``: restarts that always work, refused restores named by cause.
5. ``launcher_watchdog``: ``torchrun`` workers stop when the launcher is gone.
6. ``clean_exit``: no abort at shutdown from fairseq's prefetching thread.
7. ``save_dir_lock``: one run per save-dir, a killed run's debris removed.
8. ``user_errors``: ``error: FILE: problem`` and status 2, not a traceback.
9. ``optimizer_groups``: parameter groups with their own learning rate (the encoder's
   schedule of continued pre-training, ``tasks/encoder_lr.py``); with ``optimizer_switch``,
   a run of fairseq's ``adam`` resumed with ``torch_adam`` and back.
10. ``bf16_device``: ``--bf16`` on the CUDA device (or ``--cpu``) when there is no TPU
   (fairseq 0.12 reads ``--bf16`` as ``--tpu``).
11. ``quiet_warnings``: the known-harmless hydra/torch/autocast warnings of a CPU run
   filtered by message and category (no fairseq attribute: not in the table).
12. ``grad_norm``: the gradient norm of every update in one multi-tensor kernel
   (``torch._foreach_norm``) instead of one ``torch.norm`` per gradient without apex.
13. ``master_grads``: ``--bf16``'s unflattened fp32 master gradients zeroed in one
   multi-tensor kernel, not one ``zero_()`` per tensor.

Not applied at run time: ``lazy_metrics`` edits the installed fairseq once, at install
(``scripts/setup_env.sh``), so that ``fairseq-train`` does not import scikit-learn at start.

Every fairseq attribute replaced is one row of :data:`PATCHES`;
``tests/test_fairseq_patches.py`` checks that each target still exists in the
installed fairseq (with what its replacement relies on) and that ``apply()``
changes no fairseq attribute the table does not list.  Beyond the table:
``fairseq.distributed_utils`` is the same module object as
``fairseq.distributed.utils``; ``fairseq_cli.train:main`` is also wrapped as
``__main__.main`` under ``python -m fairseq_cli.train``; ``clean_exit``
registers one ``atexit`` handler.  Log lines keep the logger name
``seed_fairseq.compat``.
"""

from dataclasses import dataclass
from typing import Callable, Tuple

from ...base.errors import ENVIRONMENT_ERRNOS
from . import (
    atomic_checkpoints,
    bf16_device,
    checkpoint_loading,
    clean_exit,
    grad_norm,
    master_grads,
    optimizer_groups,
    quiet_warnings,
    restarts,
    torchrun_cpu,
    user_errors,
)
from ._common import MARK
from .launcher_watchdog import WATCHDOG_INTERVAL, start_launcher_watchdog
from .user_errors import one_line_errors, user_error_line

# fnmatch pattern of the fairseq versions (``fairseq.__version__``) the patches
# are written against: fairseq 0.12.2 (Python < 3.11) and fairseq-fixed
# 0.12.3.1 (the same ``fairseq`` module, importable on Python >= 3.11).
FAIRSEQ_0_12 = "0.12.*"


@dataclass(frozen=True)
class Patch:
    """One fairseq attribute the plugin replaces."""

    module: str  # the fairseq module
    attribute: str  # the attribute replaced in it; ``Class.name`` for a class attribute
    why: str  # one line; the module of ``install`` says the rest
    install: Callable[[], None]  # installs the replacement, idempotent
    # names of the fairseq module (before patching) the replacement relies on,
    # ``name(p1, p2)`` when it relies on the leading parameters of a callable
    relies_on: Tuple[str, ...] = ()
    fairseq: str = FAIRSEQ_0_12

    @property
    def target(self) -> str:
        return f"{self.module}:{self.attribute}"


PATCHES: Tuple[Patch, ...] = (
    Patch(
        "fairseq.checkpoint_utils",
        "torch",
        "torch >= 2.6 refuses fairseq's checkpoints; the allowlisted weights_only load instead of any unpickling",
        checkpoint_loading.install_checkpoint_file_load,
        ("torch.load", "load_checkpoint_to_cpu(path)"),
    ),
    Patch(
        "fairseq.distributed.utils",
        "torch",
        "what rank 0 of the run's own process group broadcasts: the full unpickler",
        checkpoint_loading.install_broadcast_load,
        ("torch.load", "_broadcast_object_slow"),
    ),
    Patch(
        "fairseq.checkpoint_utils",
        "load_checkpoint",
        "--trust-checkpoint decided from the run's own task config, never from a checkpoint's; a run with "
        "checkpoints of its own resumes from them, not from --finetune-from-model (restarts.resume_config)",
        checkpoint_loading.install_run_trust,
        ("load_checkpoint(cfg, trainer)",),
    ),
    Patch(
        "fairseq.distributed.utils",
        "_infer_torch_distributed_launch_init",
        "torchrun without CUDA: device 0 and gloo instead of a ZeroDivisionError; starts the launcher watchdog",
        torchrun_cpu.install,
        ("_infer_torch_distributed_launch_init(cfg)",),
    ),
    Patch(
        "fairseq.checkpoint_utils",
        "PathManager",
        "copies onto checkpoint_last.pt / _best.pt written to a temporary file, fsync'ed and renamed",
        atomic_checkpoints.install_atomic_copy,
        ("PathManager.copy(src_path, dst_path, overwrite)",),
    ),
    Patch(
        "fairseq.checkpoint_utils",
        "torch_persistent_save",
        "checkpoint files written atomically, the OSError behind torch's RuntimeError recovered",
        atomic_checkpoints.install_atomic_save,
        ("torch_persistent_save(obj, filename, async_write)",),
    ),
    Patch(
        "fairseq.trainer",
        "Trainer.load_checkpoint",
        "save-dir lock, restart from the newest readable checkpoint, data check before loading",
        restarts.install,
        (
            "Trainer.load_checkpoint(self, filename)",
            "Trainer.checkpoint_suffix",
            "Trainer.should_save_checkpoint_on_current_rank",
        ),
    ),
    Patch(
        "fairseq.distributed.utils",
        "distributed_main",
        "the process group destroyed when training returns, not during interpreter shutdown",
        clean_exit.install_teardown,
        ("distributed_main(i, main, cfg, kwargs)",),
    ),
    Patch(
        "fairseq.data.iterators",
        "BackgroundConsumer.run",
        "the prefetching thread stopped and joined at exit instead of aborting the process (exit 134)",
        clean_exit.install_stoppable_consumers,
        ("BackgroundConsumer.run(self)", "BackgroundConsumer(queue, source, max_len, cuda_device)", "_sentinel"),
    ),
    Patch(
        "fairseq.trainer",
        "Trainer._build_optimizer",
        "the optimizer's one parameter group split by the task's labels, so that groups get their own rates; "
        "a checkpoint of adam accepted by torch_adam and back (optimizer_switch)",
        optimizer_groups.install,
        (
            "Trainer._build_optimizer(self)",
            "optim.FairseqOptimizer.set_lr(self, lr)",
            "optim.FP16Optimizer.build_fp32_params(args, params, flatten)",
        ),
    ),
    Patch(
        "fairseq.dataclass.utils",
        "convert_namespace_to_omegaconf",
        "--bf16 without torch_xla trains on the CUDA device (or --cpu) instead of asking for a TPU",
        bf16_device.install,
        ("convert_namespace_to_omegaconf(args)",),
    ),
    Patch(
        "fairseq_cli.train",
        "convert_namespace_to_omegaconf",
        "the same, for fairseq-train, which imported the function by name",
        bf16_device.install,
        ("convert_namespace_to_omegaconf(args)",),
    ),
    Patch(
        "fairseq.utils",
        "clip_grad_norm_",
        "the gradient norm in one multi-tensor kernel (torch._foreach_norm), not one torch.norm per gradient",
        grad_norm.install,
        ("clip_grad_norm_(params, max_norm, aggregate_norm_fn)",),
    ),
    Patch(
        "fairseq.optim.fp16_optimizer",
        "_FP16OptimizerMixin.zero_grad",
        "--bf16's unflattened fp32 master gradients zeroed by one _foreach_zero_, not one zero_() per tensor",
        master_grads.install,
        ("_FP16OptimizerMixin.zero_grad(self)", "_FP16OptimizerMixin.has_flat_params"),
    ),
    Patch(
        "fairseq_cli.train",
        "main",
        "the user's errors as one 'error: FILE: problem' line and status 2; also __main__.main under -m",
        user_errors.install,
        ("main(cfg)",),
    ),
)


def apply() -> None:
    """Install every patch of :data:`PATCHES`, in order, and the warning filters (idempotent)."""
    quiet_warnings.install()
    done = []
    for patch in PATCHES:
        if patch.install not in done:
            patch.install()
            done.append(patch.install)


__all__ = [
    "ENVIRONMENT_ERRNOS",
    "FAIRSEQ_0_12",
    "MARK",
    "PATCHES",
    "Patch",
    "WATCHDOG_INTERVAL",
    "apply",
    "one_line_errors",
    "start_launcher_watchdog",
    "user_error_line",
]
