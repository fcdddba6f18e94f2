"""A rerun resumes the run's own newest readable checkpoint, also when the run starts from
``--finetune-from-model`` (issue 32, item 7); a continued run trains the vector its checkpoint
records, or records the switch (issue 43, D).

fairseq loads the start model whenever ``checkpoint_last.pt`` is missing: after a full disk
that cost ``checkpoint_last.pt``, the rerun of adapt (or of any ``--init`` stage) trained from
update 0 again and overwrote the checkpoints that survived.  In process, through fairseq's own
``checkpoint_utils.save_checkpoint`` / ``load_checkpoint`` and ``Trainer`` (the calls
fairseq-train makes), on a tiny model.
"""

import hashlib

import pytest
import torch
from helpers import REPO, TINY_MODEL_ARGS, check, parse_argv, run, train_cmd
from objectives import BY_NAME, OBJECTIVES

from seed_fairseq.pretrain.checkpoint import CheckpointError, load_torch_file, peek_checkpoint
from seed_fairseq.pretrain.checkpoint_records import REPRESENTATION_CHANGES
from seed_fairseq.pretrain.tasks.identity import POSITIONS_KEY


def build(data, save_dir, start, *extra):
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
            + ["--finetune-from-model", str(start), "--disable-validation", *extra],
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


# ---------------------------------------------------------------------------
# the vector a continued run trains (issue 43, D)
# ---------------------------------------------------------------------------

MEAN_COSINE = ["--bottleneck-pooling", "mean", "--retrieval-similarity", "cosine", "--retrieval-max-length", "24"]
MEAN_COSINE_RECORD = {
    "bottleneck_pooling": "mean",
    "retrieval_similarity": "cosine",
    "bottleneck_unnormalized": False,
    "retrieval_max_length": 24,
    "retrieval_raw_vectors": False,
}
PAPERS_RECORD = {
    "bottleneck_pooling": "cls",
    "retrieval_similarity": "dot",
    "bottleneck_unnormalized": False,
    "retrieval_max_length": 0,
    "retrieval_raw_vectors": False,
}
ASKED = (
    "but this run asks for --bottleneck-pooling cls --retrieval-similarity dot --retrieval-max-length 0: continuing it "
    "so would switch the objective and what the export writes; pass the checkpoint's options, or "
    "--allow-representation-change to switch (recorded in the checkpoints)"
)
TRAINED = "trained with --bottleneck-pooling mean --retrieval-similarity cosine --retrieval-max-length 24, "


def task_of(obj, data, *extra):
    """The task of ``obj``'s fairseq-train command (the kit's builder) plus ``extra``, set up by fairseq
    (no model: the check reads the checkpoint and the task's options; SimLM's generator is not read)."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = obj.args(**{fixture: "generator.pt" for _, fixture in obj.needs})
    ns = options.parse_args_and_arch(
        options.get_training_parser(), parse_argv(data, [*args, "--tokens-per-sample", "48", "--cpu", *extra])
    )
    return tasks.setup_task(convert_namespace_to_omegaconf(ns).task)


def recorded(task, updates=7, positions=48) -> dict:
    """What a checkpoint of ``task``'s run records after ``updates`` updates (its config, task state, positions)."""
    table = torch.zeros(positions + task.source_dictionary.pad() + 1, 4)
    return {
        "cfg": {"task": task.cfg},
        "model": {POSITIONS_KEY: table},
        "optimizer_history": [{"num_updates": updates}],
        "task_state": task.state_dict(),
    }


@pytest.mark.parametrize("obj", OBJECTIVES, ids=[o.name for o in OBJECTIVES])
def test_a_continued_run_keeps_the_checkpoints_vector_or_records_the_switch(obj, demo_data_bin):
    """Every objective: a checkpoint of a mean/cosine run continued with cls/dot is refused naming both
    settings; --allow-representation-change switches and records it, and later continuations keep the record."""
    ckpt = "run/checkpoint_last.pt"
    state = recorded(task_of(obj, demo_data_bin, *MEAN_COSINE))
    same = task_of(obj, demo_data_bin, *MEAN_COSINE)
    same.check_continuation(state, ckpt)
    assert REPRESENTATION_CHANGES not in same.state_dict()
    with pytest.raises(CheckpointError) as refused:
        task_of(obj, demo_data_bin).check_continuation(state, ckpt)
    assert str(refused.value) == f"{ckpt}: {TRAINED}{ASKED}"
    switched = task_of(obj, demo_data_bin, "--allow-representation-change")
    switched.check_continuation(state, ckpt)
    record = [{"update": 7, "checkpoint": ckpt, "from": MEAN_COSINE_RECORD, "to": PAPERS_RECORD}]
    assert switched.state_dict()[REPRESENTATION_CHANGES] == record
    later = task_of(obj, demo_data_bin)  # the switched run's own checkpoint, resumed unchanged
    later.check_continuation(recorded(switched, updates=9), ckpt)
    assert later.state_dict()[REPRESENTATION_CHANGES] == record


def test_what_counts_as_another_vector(demo_data_bin):
    """0.1's checkpoint records none (the papers' cls / dot); a text length is compared as the export
    cuts it; what the bottleneck reads (--bottleneck-unnormalized) only for a checkpoint that trained."""
    seed = BY_NAME["seed"]
    old = peek_checkpoint(REPO / "tests" / "fixtures" / "seed_fairseq_0.1" / "checkpoint_1_3.pt")
    task_of(seed, demo_data_bin).check_continuation(old, "old.pt")
    with pytest.raises(
        CheckpointError,
        match=r"^old.pt: trained with --bottleneck-pooling cls .* --retrieval-max-len"
        r"gth 0 \(it records none: the papers' default\), but this run asks for --bottleneck-pooling mean",
    ):
        task_of(seed, demo_data_bin, "--bottleneck-pooling", "mean").check_continuation(old, "old.pt")
    papers = recorded(task_of(seed, demo_data_bin), positions=48)
    task_of(seed, demo_data_bin, "--retrieval-max-length", "48").check_continuation(papers, "p.pt")  # the same cut
    with pytest.raises(CheckpointError, match="but this run asks for .* --retrieval-max-length 47:"):
        task_of(seed, demo_data_bin, "--retrieval-max-length", "47").check_continuation(papers, "p.pt")
    cosine = ["--retrieval-similarity", "cosine"]
    unnormalized = task_of(seed, demo_data_bin, *cosine, "--bottleneck-unnormalized")
    unnormalized.check_continuation(recorded(task_of(seed, demo_data_bin, *cosine), updates=0), "import.pt")
    with pytest.raises(CheckpointError, match="asks for .* --retrieval-max-length 0 --bottleneck-unnormalized:"):
        unnormalized.check_continuation(recorded(task_of(seed, demo_data_bin, *cosine), updates=3), "trained.pt")
    # whether the export writes a Normalize module changes the model's vectors: an import's too
    raw = recorded(task_of(seed, demo_data_bin, *cosine, "--retrieval-raw-vectors"), updates=0)
    task_of(seed, demo_data_bin, *cosine, "--retrieval-raw-vectors").check_continuation(raw, "raw.pt")
    with pytest.raises(CheckpointError, match=r"trained with .* --retrieval-raw-vectors, but this run asks for .* "
                       r"--retrieval-max-length 0: "):  # fmt: skip
        task_of(seed, demo_data_bin, *cosine).check_continuation(raw, "raw.pt")


def test_finetune_from_a_checkpoint_of_another_vector(demo_data_bin, tmp_path):
    """Through fairseq's own load_checkpoint and Trainer: --finetune-from-model of a mean/cosine checkpoint
    (an import's, 0 updates) continues with its options, is refused with others, and with
    --allow-representation-change the checkpoints the run writes record the switch."""
    from fairseq import checkpoint_utils

    start = tmp_path / "start.pt"
    cfg, trainer = build(demo_data_bin, tmp_path / "other", start, *MEAN_COSINE)
    trainer.consolidate_optimizer()
    trainer.save_checkpoint(str(start), {"train_iterator": {"epoch": 1, "iterations_in_epoch": 0, "version": 2}})
    cfg, trainer = build(demo_data_bin, tmp_path / "same", start, *MEAN_COSINE)
    checkpoint_utils.load_checkpoint(cfg.checkpoint, trainer)  # what adapt / compare --init run
    cfg, trainer = build(demo_data_bin, tmp_path / "other_vector", start)
    with pytest.raises(CheckpointError) as refused:
        checkpoint_utils.load_checkpoint(cfg.checkpoint, trainer)
    assert str(refused.value) == f"{start}: {TRAINED}{ASKED}"
    cfg, trainer = build(demo_data_bin, tmp_path / "switched", start, "--allow-representation-change")
    checkpoint_utils.load_checkpoint(cfg.checkpoint, trainer)
    trainer.consolidate_optimizer()
    trainer.save_checkpoint(str(tmp_path / "switched.pt"), {"train_iterator": {"epoch": 1, "version": 2}})
    changes = load_torch_file(tmp_path / "switched.pt")["task_state"][REPRESENTATION_CHANGES]
    assert changes == [{"update": 0, "checkpoint": str(start), "from": MEAN_COSINE_RECORD, "to": PAPERS_RECORD}]


@pytest.mark.slow
def test_resuming_with_another_vector_through_fairseq_train(demo_data_bin, tmp_path):
    """The real CLI: a mean/cosine run resumed with the default options stops with one line before
    training; with --allow-representation-change it trains on, and its checkpoint records the switch."""
    save = tmp_path / "ckpt"
    check(train_cmd(demo_data_bin, save, *MEAN_COSINE, max_update=1, batch_size=4))
    kept = sha(save / "checkpoint_last.pt")
    proc = run(train_cmd(demo_data_bin, save, max_update=2, batch_size=4))
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert [line for line in proc.stderr.splitlines() if line.strip()] == [
        f"error: {save}/checkpoint_last.pt: {TRAINED}{ASKED}"
    ]
    assert "train_inner" not in proc.stdout and sha(save / "checkpoint_last.pt") == kept
    check(train_cmd(demo_data_bin, save, "--allow-representation-change", max_update=2, batch_size=4))
    state = load_torch_file(save / "checkpoint_last.pt")
    assert state["optimizer_history"][-1]["num_updates"] == 2
    assert state["task_state"][REPRESENTATION_CHANGES] == [
        {"update": 1, "checkpoint": f"{save}/checkpoint_last.pt", "from": MEAN_COSINE_RECORD, "to": PAPERS_RECORD}
    ]
