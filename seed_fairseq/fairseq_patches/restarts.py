"""Restarts that always work (fix 4).

``fairseq.trainer.Trainer.load_checkpoint`` is wrapped:

- first the save-dir is taken (``save_dir_lock``, fix 7);
- when ``fairseq-train`` resumes from its default ``checkpoint_last.pt`` and
  that file is missing or unreadable while other checkpoints of the run exist
  (or one of them is newer), it resumes from the newest readable one and says
  so.  An explicit ``--restore-file`` that does not exist is an error (fairseq
  would silently train from scratch);
- before any weight is loaded the task checks the checkpoint against the data
  (``check_checkpoint``: dictionary size and identity), so the last line of a
  refused restore names the true cause;
- fairseq replaces any error of model loading by "please ensure that the
  architectures match": the plugin's own ``CheckpointError`` behind it is
  raised instead.
"""

import functools
import os

from ._common import logger, mark
from .save_dir_lock import take_save_dir


def _resolve_restore_file(trainer, filename):
    """The checkpoint a (re)start should load; see the module docstring."""
    from ..checkpoint import CheckpointError, newest_readable_checkpoint, peek_checkpoint

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


def install() -> None:
    from fairseq.trainer import Trainer

    if getattr(Trainer.load_checkpoint, "_seed_fairseq_guard", False):
        return
    original = Trainer.load_checkpoint

    @functools.wraps(original)
    def load_checkpoint(self, filename, *args, **kwargs):
        from ..checkpoint import CheckpointError, peek_checkpoint

        take_save_dir(self)
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
    Trainer.load_checkpoint = mark(load_checkpoint, __name__)
