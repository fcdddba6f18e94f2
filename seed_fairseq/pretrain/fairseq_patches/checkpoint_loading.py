"""Checkpoint loading that runs no code (fix 1).

torch >= 2.6 loads with ``weights_only=True`` by default, which refuses the
``argparse.Namespace`` that fairseq checkpoints hold: fairseq could no longer
resume from its own ``checkpoint_last.pt``.  The full unpickler instead would
run whatever a checkpoint from elsewhere pickled.

- ``fairseq.checkpoint_utils.torch``: fairseq's ``checkpoint_utils`` (every
  checkpoint file fairseq reads: ``--restore-file``, ``--finetune-from-model``,
  restarts, ``load_model_ensemble``) sees a ``torch`` whose ``load`` is
  ``checkpoint.load_torch_file``: ``weights_only`` with the allowlist of the
  types fairseq checkpoints hold; a file needing anything else is refused in
  one line naming the type.
- ``fairseq.checkpoint_utils.load_checkpoint``: ``fairseq-train
  --trust-checkpoint`` (a task option) allows the full unpickler for the
  checkpoints its run loads: the decision is taken around fairseq's
  ``load_checkpoint`` from the run's own task config, never from a checkpoint's.
  The same replacement gives fairseq the config of ``restarts.resume_config``: a
  run with checkpoints of its own resumes from them, never from
  ``--finetune-from-model`` (fix 4).
- ``fairseq.distributed.utils.torch``: ``distributed.utils`` unpickles what
  rank 0 of the run's own process group broadcasts (the checkpoint it loaded as
  above): the full unpickler there.

Every other ``torch.load`` in the process keeps torch's default.
"""

import types
from typing import Callable

import torch

from ._common import mark


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
    """``torch.load`` of fairseq's ``checkpoint_utils``: see the module docstring."""
    from ..checkpoint import load_torch_file

    return load_torch_file(f, map_location=map_location)


def _broadcast_load(f, map_location=None):
    # distributed.utils unpickles what rank 0 of this run's own process group
    # torch.save'd (broadcast_object): objects in memory, e.g. a checkpoint rank 0
    # loaded through _checkpoint_file_load, whose config is an OmegaConf object
    # by then.  Not a file from elsewhere: the full unpickler.
    return torch.load(f, map_location=map_location, weights_only=False)  # trusted: our own rank 0's bytes


def _load_checkpoint_with_run_trust(cfg, trainer, **passthrough_args):
    """fairseq's ``load_checkpoint`` under the ``--trust-checkpoint`` of the run's own task."""
    from ..checkpoint import trusting
    from .restarts import resume_config

    with trusting(bool(getattr(getattr(trainer.task, "cfg", None), "trust_checkpoint", False))):
        return _original_load_checkpoint(resume_config(cfg, trainer), trainer, **passthrough_args)


_original_load_checkpoint = None


def _install_torch_load(module, load: Callable) -> None:
    if not isinstance(module.torch, _TorchWithLoad):
        module.torch = mark(_TorchWithLoad(load), __name__)


def install_checkpoint_file_load() -> None:
    from fairseq import checkpoint_utils

    _install_torch_load(checkpoint_utils, _checkpoint_file_load)


def install_broadcast_load() -> None:
    from fairseq.distributed import utils as distributed_utils

    _install_torch_load(distributed_utils, _broadcast_load)


def install_run_trust() -> None:
    global _original_load_checkpoint
    from fairseq import checkpoint_utils

    if checkpoint_utils.load_checkpoint is not _load_checkpoint_with_run_trust:
        _original_load_checkpoint = checkpoint_utils.load_checkpoint
        checkpoint_utils.load_checkpoint = _load_checkpoint_with_run_trust


mark(_load_checkpoint_with_run_trust, __name__)
