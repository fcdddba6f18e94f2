"""Two narrow fixes that make stock fairseq 0.12 usable on current PyTorch / CPU.

Both are applied when the plugin is imported (``--user-dir seed_fairseq`` does
that before fairseq reads a checkpoint or starts distributed training) and are
idempotent.

1. Trusted checkpoint loading.  torch >= 2.6 loads with ``weights_only=True``
   by default; fairseq checkpoints hold ``argparse.Namespace`` objects, meter
   objects and numpy scalars, so fairseq can no longer resume from its own
   ``checkpoint_last.pt``.  We do NOT change ``torch.load`` globally: only the
   two fairseq modules that read fairseq's own checkpoints (``checkpoint_utils``
   for files, ``distributed.utils`` for the copy that rank 0 broadcasts to the
   other workers) see a ``torch`` whose ``load`` defaults to
   ``weights_only=False``.  Every other ``torch.load`` in the process keeps the
   safe default.

2. ``torchrun`` on CPU.  fairseq computes ``device_id = rank %
   torch.cuda.device_count()``, a ZeroDivisionError without a GPU, and keeps
   the NCCL backend.  On a machine without CUDA we use device 0 and the gloo
   backend instead, which makes multi-process data-parallel training testable
   on CPU (use ``--ddp-backend legacy_ddp`` there; PyTorch's DDP wrapper in
   fairseq passes CUDA ``device_ids``).
"""

import logging
import os
import types

import torch

logger = logging.getLogger(__name__)


class _TorchWithTrustedLoad(types.ModuleType):
    """A stand-in for the ``torch`` module inside fairseq's checkpoint code.

    Attribute access is forwarded to the real module; only ``load`` differs.
    """

    def __init__(self):
        super().__init__("torch")

    def __getattr__(self, name):
        return getattr(torch, name)

    @staticmethod
    def load(*args, **kwargs):
        # fairseq only reads checkpoints that fairseq itself wrote (or that the
        # user explicitly pointed it to), so they are trusted like a pickle.
        kwargs.setdefault("weights_only", False)
        return torch.load(*args, **kwargs)


def _install_trusted_checkpoint_loading():
    from fairseq import checkpoint_utils
    from fairseq.distributed import utils as distributed_utils

    for module in (checkpoint_utils, distributed_utils):
        if not isinstance(module.torch, _TorchWithTrustedLoad):
            module.torch = _TorchWithTrustedLoad()


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


def _install_cpu_distributed_launch():
    from fairseq.distributed import utils as distributed_utils

    distributed_utils._infer_torch_distributed_launch_init = (
        _cpu_safe_torch_distributed_launch_init
    )


def install():
    _install_trusted_checkpoint_loading()
    _install_cpu_distributed_launch()


install()
