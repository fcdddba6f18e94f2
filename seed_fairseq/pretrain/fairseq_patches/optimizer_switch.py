"""A run of fairseq's ``adam`` resumed with ``torch_adam``, and back (part of fix 9's ``_build_optimizer``).

fairseq records the optimizer's class name with every checkpoint
(``optimizer_history[-1]["optimizer_name"]``) and, when it resumes, asserts that the
optimizer it has just built has the same name ("Optimizer does not match; please reset the
optimizer").  ``torch_adam`` (``pretrain/optim/torch_adam.py``) computes ``adam``'s update and
saves ``adam``'s state format (an int step, ``exp_avg``, ``exp_avg_sq`` per parameter), so the
two resume each other's runs with their moments: an interrupted run of the workflows, started
before their default became ``torch_adam``, continues instead of failing at its restart.  In
``--fp16``/``--bf16`` runs fairseq records its wrapper's name (``FP16Optimizer``) whatever the
optimizer inside, so the check passes there anyway; the state is the same either way.

fairseq's ``Trainer.load_checkpoint`` sets the run's history from the checkpoint, builds the
optimizer (``Trainer._build_optimizer``, whose replacement in ``optimizer_groups`` calls
:func:`accept_switch`), then compares the names: :func:`accept_switch` renames the last entry of
the history to the optimizer just built when the two are one of :data:`SAME_STATE`, keeping the
saved name as ``resumed_from_optimizer`` in that entry (later checkpoints carry it).  Any other
pair meets fairseq's own check.
"""

from ._common import logger

# pairs of fairseq optimizer classes (the names fairseq records) that load each other's state
SAME_STATE = (frozenset({"FairseqAdam", "TorchAdam"}),)
SAVED_AS = "resumed_from_optimizer"


def accept_switch(trainer) -> None:
    """Rename the last entry of ``trainer``'s history (a checkpoint being resumed) to the optimizer
    just built when the checkpoint's optimizer saves the same state (see the module's docstring)."""
    history = getattr(trainer, "_optim_history", None)
    if not history or "optimizer_name" not in history[-1]:
        return
    saved, built = history[-1]["optimizer_name"], type(trainer._optimizer).__name__
    if saved == built or frozenset({saved, built}) not in SAME_STATE:
        return
    logger.info(f"resuming a run of {saved} with {built}: the same update and state (its moments and steps carry on)")
    trainer._optim_history = [*history[:-1], {**history[-1], "optimizer_name": built, SAVED_AS: saved}]
