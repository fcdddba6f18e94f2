"""One run per save-dir (fix 7).

The process that writes the checkpoints takes the save-dir's lock
(``seed_fairseq/pretrain/savedir.py``) before it reads the first checkpoint and holds it
until it exits; a second ``fairseq-train`` into the same folder stops with one
``error:`` line instead of overwriting the first one's checkpoints.  A killed
run's lock dies with it.  Under the lock, the staging files of checkpoint
writes a killed run left are removed.  A run with ``--no-save`` writes nothing
there: it neither locks nor cleans.

Called first by ``restarts``' replacement of ``Trainer.load_checkpoint``; it
replaces no fairseq attribute of its own.
"""


def take_save_dir(trainer) -> None:
    """Lock ``trainer``'s save-dir, then remove a killed run's staging files (see the module docstring)."""
    from ..savedir import lock_save_dir, remove_staging_debris

    ckpt_cfg = trainer.cfg.checkpoint
    if ckpt_cfg.no_save or "://" in str(ckpt_cfg.save_dir) or not trainer.should_save_checkpoint_on_current_rank:
        return
    lock_save_dir(ckpt_cfg.save_dir, trainer.checkpoint_suffix)
    remove_staging_debris(ckpt_cfg.save_dir, trainer.checkpoint_suffix)
