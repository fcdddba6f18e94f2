"""Restarts that always work (fix 4).

``fairseq.trainer.Trainer.load_checkpoint`` is wrapped:

- first the save-dir is taken (``save_dir_lock``, fix 7);
- when ``fairseq-train`` resumes from its default ``checkpoint_last.pt`` and
  that file is missing or unreadable while other checkpoints of the run exist
  (or one of them is newer), it resumes from the newest readable one and says
  so.  A save-dir whose checkpoints are all unreadable is an error naming them,
  not a start from scratch that would overwrite them.  An explicit
  ``--restore-file`` that does not exist is an error (fairseq would silently
  train from scratch);
- ``--finetune-from-model`` (and ``--continue-once``) is where a run STARTS:
  fairseq loads it whenever ``checkpoint_last.pt`` is missing, even when the
  save-dir holds the run's own later checkpoints (a full disk that cost
  ``checkpoint_last.pt``), and the restarted run then overwrites them.
  :func:`resume_config`, called by ``checkpoint_loading``'s replacement of
  ``checkpoint_utils.load_checkpoint``, hides the start model from fairseq
  when the run has a readable checkpoint of its own: the run resumes from the
  newest one, optimizer, schedule and data position included;
- before any weight is loaded the checkpoint's entries are checked
  (``checkpoint.check_entries`` / ``check_encoder_entries``: a ``model`` that is
  no mapping of tensors, a ``cfg`` that is no mapping, no token embedding ... are one ``error:`` line,
  not a traceback) and the task checks it against the data
  (``check_checkpoint``: dictionary size and identity) and against the run's
  options (``check_continuation``: the vector it records, ``tasks/representation.py``),
  so the last line of a refused restore names the true cause;
- fairseq replaces any error of model loading by "please ensure that the
  architectures match": the plugin's own ``CheckpointError`` behind it is
  raised instead.
"""

import contextlib
import copy
import functools
import os
from typing import Any

from ._common import logger, mark
from .save_dir_lock import take_save_dir

# the checkpoint options with which fairseq starts a run elsewhere when checkpoint_last.pt is missing
START_OPTIONS = {"finetune_from_model": "--finetune-from-model", "continue_once": "--continue-once"}


def _refuse_unreadable(save_dir, bad) -> None:
    """A save-dir with checkpoints, none of them readable: a start from scratch would overwrite them."""
    from ..checkpoint import CheckpointError

    if bad:
        raise CheckpointError(
            save_dir,
            f"no readable checkpoint to resume from ({'; '.join(bad)}); a start from scratch would overwrite "
            "them: move them away to start the run over",
        )


def resume_config(cfg: Any, trainer: Any) -> Any:
    """The checkpoint config fairseq's ``load_checkpoint`` is given: ``cfg`` itself, or, for a
    run that would start from ``--finetune-from-model`` / ``--continue-once`` while its
    save-dir holds a readable checkpoint of its own, a copy without them (fairseq then
    resumes from ``checkpoint_last.pt``, which ``Trainer.load_checkpoint`` resolves to the
    newest readable checkpoint)."""
    from ..checkpoint_files import newest_readable_checkpoint

    starts = {option: getattr(cfg, key, None) for key, option in START_OPTIONS.items()}
    starts = {option: value for option, value in starts.items() if value}
    if cfg.restore_file != "checkpoint_last.pt" or not starts:
        return cfg
    suffix = trainer.checkpoint_suffix
    last = os.path.join(cfg.save_dir, f"checkpoint_last{suffix}.pt")
    if os.path.exists(last):  # fairseq resumes from it (or its newest readable neighbour)
        return cfg
    take_save_dir(trainer)  # before the run's checkpoints are read
    best, bad = newest_readable_checkpoint(cfg.save_dir, suffix)
    if best is None:
        _refuse_unreadable(cfg.save_dir, bad)
        return cfg  # a first launch: start from the model
    from omegaconf import OmegaConf, open_dict

    resumed = copy.deepcopy(cfg)
    with open_dict(resumed) if OmegaConf.is_config(resumed) else contextlib.nullcontext():
        for key in START_OPTIONS:
            if getattr(resumed, key, None) is not None:
                setattr(resumed, key, None)
    started = ", ".join(f"{option} {value}" for option, value in starts.items())
    logger.warning(f"the run has checkpoints of its own: resuming from {best}, not starting from {started}")
    return resumed


def _resolve_restore_file(trainer, filename):
    """The checkpoint a (re)start should load; see the module docstring."""
    from ..checkpoint import CheckpointError, peek_checkpoint
    from ..checkpoint_files import newest_readable_checkpoint

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
        if os.path.exists(default):  # damaged, and nothing to fall back to
            peek_checkpoint(default)  # raises with the problem
        _refuse_unreadable(ckpt_cfg.save_dir, bad)
        return filename  # a first launch
    if os.path.abspath(best) != os.path.abspath(default):
        why = f"{default} is missing" if not os.path.exists(default) else f"{best} is newer than {default}"
        for problem in bad:
            if problem.startswith(default):
                why = problem
        logger.warning(f"restarting from {best}: {why}")
    return str(best)


def install() -> None:
    from fairseq.trainer import Trainer

    if getattr(Trainer.load_checkpoint, "_seed_fairseq_guard", False):
        return
    original = Trainer.load_checkpoint

    @functools.wraps(original)
    def load_checkpoint(self, filename, *args, **kwargs):
        from ..checkpoint import CheckpointError, check_encoder_entries, peek_checkpoint

        take_save_dir(self)
        filename = _resolve_restore_file(self, filename)
        if os.path.isfile(filename):
            state = peek_checkpoint(filename)  # its entries checked (checkpoint.check_entries), whatever the task
            check_encoder_entries(state, filename)
            for hook in ("check_checkpoint", "check_continuation"):
                check = getattr(self.task, hook, None)
                if check is not None:
                    check(state, filename)
        try:
            return original(self, filename, *args, **kwargs)
        except Exception as e:
            # fairseq replaces any error of model loading by "please ensure that
            # the architectures match": surface the plugin's own explanation
            if isinstance(e.__context__, CheckpointError):
                raise e.__context__ from None
            raise

    load_checkpoint._seed_fairseq_guard = True
    Trainer.load_checkpoint = mark(load_checkpoint, __name__)
