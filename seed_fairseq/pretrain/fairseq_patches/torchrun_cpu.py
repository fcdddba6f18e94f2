"""``torchrun`` on CPU (fix 2).

fairseq's ``distributed.utils._infer_torch_distributed_launch_init`` computes
``device_id = rank % torch.cuda.device_count()``, a ZeroDivisionError without
a GPU, and keeps the NCCL backend.  On a machine without CUDA its replacement
uses device 0 and the gloo backend instead, which makes multi-process
data-parallel training testable on CPU (use ``--ddp-backend legacy_ddp`` there;
PyTorch's DDP wrapper in fairseq passes CUDA ``device_ids``).  It also starts
the launcher watchdog of every ``torchrun`` worker (``launcher_watchdog``, fix 5).
"""

import os

import torch

from ._common import logger, mark
from .launcher_watchdog import start_launcher_watchdog


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


def install() -> None:
    from fairseq.distributed import utils as distributed_utils

    distributed_utils._infer_torch_distributed_launch_init = _cpu_safe_torch_distributed_launch_init


mark(_cpu_safe_torch_distributed_launch_init, __name__)
