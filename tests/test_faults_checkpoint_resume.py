"""A rerun resumes the run's own newest readable checkpoint, also when the run starts from
``--finetune-from-model`` (issue 32, item 7).

fairseq loads the start model whenever ``checkpoint_last.pt`` is missing: after a full disk
that cost ``checkpoint_last.pt``, the rerun of adapt (or of any ``--init`` stage) trained from
update 0 again and overwrote the checkpoints that survived.  In process, through fairseq's own
``checkpoint_utils.save_checkpoint`` / ``load_checkpoint`` and ``Trainer`` (the calls
fairseq-train makes), on a tiny model.
"""

import hashlib

import pytest
import torch
from helpers import TINY_MODEL_ARGS, parse_argv


def build(data, save_dir, start):
    """cfg, Trainer of fairseq-train's command ``--finetune-from-model START --save-dir SAVE_DIR``."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    ns = options.parse_args_and_arch(
        options.get_training_parser(),
        parse_argv(
            data,
            ["--task", "seed_pretrain", "--criterion", "seed_pretrain"]
            + [*TINY_MODEL_ARGS, "--tokens-per-sample", "32", "--batch-size", "4", "--cpu", "--seed", "1"]
            + ["--optimizer", "adam", "--lr", "1e-3", "--lr-scheduler", "fixed", "--num-workers", "0"]
            + ["--save-dir", str(save_dir), "--save-interval-updates", "2", "--no-epoch-checkpoints"]
            + ["--finetune-from-model", str(start), "--disable-validation"],
        ),
    )
    cfg = convert_namespace_to_omegaconf(ns)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    return cfg, Trainer(cfg, task, model, task.build_criterion(cfg.criterion))


def sha(path):
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture(scope="module")
def interrupted(demo_data_bin, tmp_path_factory):
    """(data, save-dir, start model, state after 2 updates): the run got to update 2 (checkpoint_1_2.pt
    and checkpoint_last.pt written by fairseq's own save), then checkpoint_last.pt was lost."""
    from fairseq import checkpoint_utils

    tmp_path = tmp_path_factory.mktemp("interrupted")
    start, save = tmp_path / "start.pt", tmp_path / "save"
    cfg, trainer = build(demo_data_bin, tmp_path / "other", start)
    trainer.consolidate_optimizer()  # what fairseq's save_checkpoint does first
    trainer.save_checkpoint(str(start), {"train_iterator": {"epoch": 1, "iterations_in_epoch": 0, "version": 2}})
    cfg, trainer = build(demo_data_bin, save, start)
    _, epoch_itr = checkpoint_utils.load_checkpoint(cfg.checkpoint, trainer)  # a first launch: from start.pt
    assert trainer.get_num_updates() == 0
    itr = epoch_itr.next_epoch_itr(shuffle=True)
    for _ in range(2):
        trainer.train_step([next(itr)])
    checkpoint_utils.save_checkpoint(cfg.checkpoint, trainer, epoch_itr, None)
    assert sorted(p.name for p in save.glob("*.pt")) == ["checkpoint_1_2.pt", "checkpoint_last.pt"]
    (save / "checkpoint_last.pt").unlink()  # the full disk
    weights = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    return demo_data_bin, save, start, weights


@pytest.fixture
def run_dir(interrupted, tmp_path):
    """``interrupted`` with a save-dir of the test's own (each test takes its lock and may damage it)."""
    import shutil

    data, save, start, weights = interrupted
    shutil.copytree(save, tmp_path / "save", ignore=shutil.ignore_patterns(".*"))
    return data, tmp_path / "save", start, weights


def test_rerun_resumes_the_runs_own_checkpoint_not_the_start_model(run_dir, caplog):
    from fairseq import checkpoint_utils

    data, save, start, weights = run_dir
    kept = sha(save / "checkpoint_1_2.pt")
    cfg, trainer = build(data, save, start)
    _, epoch_itr = checkpoint_utils.load_checkpoint(cfg.checkpoint, trainer)
    assert trainer.get_num_updates() == 2  # not 0: the start model is where the run began, not where it is
    assert epoch_itr.iterations_in_epoch == 2  # the data position too
    assert trainer.optimizer.optimizer.state, "the optimizer state of update 2"
    for key, value in trainer.model.state_dict().items():
        assert torch.equal(value, weights[key]), key
    assert f"resuming from {save}/checkpoint_1_2.pt, not starting from --finetune-from-model {start}" in caplog.text
    assert sha(save / "checkpoint_1_2.pt") == kept


def test_unreadable_checkpoints_are_refused_not_overwritten(run_dir):
    from fairseq import checkpoint_utils

    from seed_fairseq.pretrain.checkpoint import CheckpointError

    data, save, start, _ = run_dir
    with open(save / "checkpoint_1_2.pt", "r+b") as f:
        f.truncate(1000)
    cfg, trainer = build(data, save, start)
    with pytest.raises(CheckpointError, match=r"no readable checkpoint to resume from .*checkpoint_1_2\.pt"):
        checkpoint_utils.load_checkpoint(cfg.checkpoint, trainer)
    assert (save / "checkpoint_1_2.pt").stat().st_size == 1000
