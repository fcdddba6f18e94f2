"""Fault injection inside ``fairseq-train --user-dir seed_fairseq``: two runs into one
save-dir, a killed run's lock and staging files, a full disk and a file-size limit while
writing a checkpoint, configurations that leave validation (or a batch) empty or a block
longer than the model, truncated data files, a DATA path with ':', and options out of their
range (every objective's weights alike).  Each refusal is one ``error:`` line before training;
the cheap ones are checked in-process."""

import dataclasses
import errno
import os
import re
import resource
import shutil
import subprocess
import sys

import pytest
import torch
from conftest import build_task_model
from helpers import run, train_cmd
from objectives import BY_NAME, OBJECTIVES
from test_contract import build, needs
from test_contract import train_cmd as objective_train_cmd

from seed_fairseq.base.errors import ConfigurationError
from seed_fairseq.pretrain import fairseq_patches, savedir
from seed_fairseq.pretrain.criterions.cpdae_pretrain import check_two_texts_per_batch
from seed_fairseq.pretrain.diagnostics import probe_pairs


def _stderr_lines(proc):
    return [line for line in proc.stderr.splitlines() if line.strip()]


# ---------------------------------------------------------------------------
# the save-dir lock
# ---------------------------------------------------------------------------


# another process holding a save-dir's lock the way savedir.lock_save_dir takes it (without
# importing the plugin, which costs seconds): a POSIX record lock, the holder's pid in the file
HOLD_LOCK = r"""
import fcntl, os, socket, sys, time
fd = os.open(sys.argv[1], os.O_RDWR | os.O_CREAT)
fcntl.lockf(fd, fcntl.LOCK_EX | (fcntl.LOCK_NB if sys.argv[2] == "try" else 0))
os.pwrite(fd, f"{os.getpid()} {socket.gethostname()}\n".encode(), 0)
print("locked", flush=True)
time.sleep(600)
"""


def _hold_lock(save_dir, mode="wait"):
    """A process that holds ``save_dir``'s lock (until killed), or None when it cannot get it (``mode`` "try")."""
    os.makedirs(save_dir, exist_ok=True)
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_LOCK, str(savedir.lock_path(save_dir)), mode],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    if proc.stdout.readline().strip() != "locked":
        proc.wait()
        return None
    return proc


def _kill(proc):
    proc.kill()  # SIGKILL: the kernel releases the lock
    proc.wait()


def test_a_held_save_dir_is_refused_and_a_killed_holder_releases_it(tmp_path):
    holder = _hold_lock(tmp_path)
    try:
        with pytest.raises(ConfigurationError) as refused:
            savedir.lock_save_dir(tmp_path)
        assert str(refused.value).startswith(
            f"{tmp_path}: another fairseq-train is writing this folder (pid {holder.pid})"
        )
        savedir.lock_save_dir(tmp_path, "-shard1")  # another checkpoint suffix: another lock
    finally:
        _kill(holder)
    savedir.lock_save_dir(tmp_path)  # a restart is not blocked by a stale lock
    savedir.lock_save_dir(tmp_path)  # and taking it again in the same process is a no-op
    assert _hold_lock(tmp_path, "try") is None  # held: another process cannot take it


def test_only_staging_files_of_checkpoints_are_removed(tmp_path):
    debris = [".checkpoint_last.pt.tmp-a1b2_c3d", ".checkpoint_1_4.pt.tmp-zzzzzzzz", ".checkpoint7.pt.tmp-00000000"]
    kept = [
        "notes.txt",
        ".checkpoint_last.pt.tmp-short",  # not tempfile's 8 characters
        ".checkpoint_last.pt.tmp-a1b2c3d4.bak",
        ".dict.txt.tmp-a1b2c3d4",  # not a checkpoint's
        ".checkpoint_last-shard1.pt.tmp-a1b2c3d4",  # another suffix's
        "checkpoint_last.pt",
    ]
    for name in debris + kept:
        (tmp_path / name).write_bytes(b"x")
    os.mkdir(tmp_path / ".checkpoint_best.pt.tmp-dir12345")  # only regular files
    os.symlink(tmp_path / "notes.txt", tmp_path / ".checkpoint_best.pt.tmp-link1234")
    removed = savedir.remove_staging_debris(tmp_path)
    assert sorted(p.name for p in removed) == sorted(debris)
    left = {p.name for p in tmp_path.iterdir()}
    assert left == set(kept) | {".checkpoint_best.pt.tmp-dir12345", ".checkpoint_best.pt.tmp-link1234"}


# ---------------------------------------------------------------------------
# a full disk while writing a checkpoint
# ---------------------------------------------------------------------------


def test_full_disk_is_one_line_and_leaves_the_old_checkpoint(tmp_path, monkeypatch, capsys):
    from fairseq import checkpoint_utils

    from seed_fairseq.pretrain import checkpoint_files

    target = tmp_path / "checkpoint_last.pt"
    target.write_bytes(b"old")
    calls = []

    def full_disk(obj, f):
        calls.append(1)
        f.write(b"partial")
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(checkpoint_files.torch, "save", full_disk)
    save = fairseq_patches.one_line_errors(lambda: checkpoint_utils.torch_persistent_save({"model": {}}, str(target)))
    with pytest.raises(SystemExit) as exited:
        save()
    assert exited.value.code == 2 and len(calls) == 1  # not retried
    assert capsys.readouterr().err == (
        f"error: {target}: No space left on device; fix this and rerun the same command to resume\n"
    )
    assert target.read_bytes() == b"old" and os.listdir(tmp_path) == ["checkpoint_last.pt"]


def test_errors_that_are_not_the_users_keep_their_traceback():
    def bug():
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        fairseq_patches.one_line_errors(bug)()
    with pytest.raises(FileNotFoundError):  # an OSError, but not of the machine's state
        fairseq_patches.one_line_errors(lambda: open("/nonexistent/x"))()


def test_fairseq_train_without_a_batch_size_is_one_line(demo_data_bin, tmp_path):
    """fairseq checks this option with an ``assert``: one line and status 2, not its traceback."""
    cmd = train_cmd(demo_data_bin, tmp_path / "ckpt", max_update=1)
    i = cmd.index("--batch-size")
    proc = run(cmd[:i] + cmd[i + 2 :])
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert proc.stderr.strip().splitlines()[-1] == (
        "error: --batch-size: fairseq-train needs a batch size: pass --batch-size N or --max-tokens N"
    )
    assert "Traceback" not in proc.stderr


@pytest.mark.slow
def test_second_run_file_size_limit_and_debris_through_fairseq_train(demo_data_bin, tmp_path):
    """The real CLI: a second run into a locked save-dir stops with one line; once the holder
    is killed, the rerun removes a killed write's staging file and then meets a file-size
    limit (EFBIG: torch's writer would say "unexpected pos") at its first checkpoint."""
    save = tmp_path / "ckpt"
    holder = _hold_lock(save)
    try:
        proc = run(train_cmd(demo_data_bin, save, max_update=1, batch_size=4))
    finally:
        _kill(holder)
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert _stderr_lines(proc) == [
        f"error: {save}: another fairseq-train is writing this folder (pid {holder.pid}); "
        "wait for it to end, stop it, or choose another --save-dir"
    ]
    (save / ".checkpoint_last.pt.tmp-k1ll3d00").write_bytes(b"x" * 1000)
    (save / "notes.txt").write_text("the user's")
    limit = 200_000  # a checkpoint of the tiny model is about 800 KB
    proc = subprocess.run(
        [str(c) for c in train_cmd(demo_data_bin, save, max_update=1, batch_size=4)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1"),
        preexec_fn=lambda: resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit)),
        timeout=600,
    )
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert _stderr_lines(proc) == [
        f"error: {save}/checkpoint_last.pt: File too large (the file-size limit: ulimit -f); "
        "fix this and rerun the same command to resume"
    ]
    assert "train_inner" in proc.stdout  # it trained, then failed to save
    assert sorted(p.name for p in save.iterdir()) == [".fairseq-train.lock", "notes.txt"]


# ---------------------------------------------------------------------------
# refused before training: empty validation, the probe, positions, CPDAE's batches
# ---------------------------------------------------------------------------


def _valid_iterator(task, multiple):
    """What fairseq's Trainer.get_valid_iterator asks of the task."""
    return task.get_batch_iterator(
        task.dataset("valid"),
        max_sentences=8,
        required_batch_size_multiple=multiple,
        seed=1,
        epoch=1,
        disable_iterator_cache=True,  # a new setting each call
    )


def test_validation_that_would_be_empty_is_refused(demo_data_bin):
    task, *_ = build_task_model(demo_data_bin, tokens_per_sample=512)
    task.load_dataset("valid")
    blocks = len(task.dataset("valid"))
    assert 0 < blocks < 8  # fairseq's default multiple leaves no batch
    with pytest.raises(ConfigurationError) as refused:
        _valid_iterator(task, 8)
    assert str(refused.value) == (
        f"{demo_data_bin}/valid.bin: validation would be empty: the 'valid' split has {blocks} blocks of up to "
        "512 tokens and fairseq drops the last batch of a split whose size is not a multiple of "
        "--required-batch-size-multiple 8 (fairseq's default), which leaves no batch; hold out more documents "
        "(preprocess.build --valid-docs), pass --disable-validation, or --required-batch-size-multiple 1"
    )
    assert len(_valid_iterator(task, 1)) == 1  # the advised fix works


def test_probe_larger_than_the_validation_split_and_max_tokens_below_a_block_are_refused(demo_data_bin):
    task, *_ = build_task_model(demo_data_bin, "--retrieval-probe-size", "1000", tokens_per_sample=64)
    task.load_dataset("valid")
    with pytest.raises(ConfigurationError, match=r"--retrieval-probe-size 1000 needs 1000 validation blocks"):
        _valid_iterator(task, 1)
    d = task.source_dictionary
    pairs = len(probe_pairs(task.unmasked_blocks["valid"], 1000, d.bos(), d.eos(), d.pad()))
    task.cfg.retrieval_probe_size = pairs + 1
    with pytest.raises(ConfigurationError, match=rf"valid.bin: --retrieval-probe-size {pairs + 1} .* has {pairs}:"):
        _valid_iterator(task, 1)
    task.cfg.retrieval_probe_size = pairs
    _valid_iterator(task, 1)
    with pytest.raises(ConfigurationError, match="--max-tokens 63 is below --tokens-per-sample 64"):
        task.get_batch_iterator(task.dataset("valid"), max_tokens=63)


def test_every_model_of_the_plugin_checks_its_positions():
    from fairseq.models import MODEL_REGISTRY

    from seed_fairseq.pretrain.models.bottleneck import BottleneckEncoderModel

    ours = {name: cls for name, cls in MODEL_REGISTRY.items() if cls.__module__.startswith("seed_fairseq.")}
    assert {"seed_encoder", "simlm", "cpdae", "retromae"} <= set(ours)  # and every objective added since
    assert all(issubclass(cls, BottleneckEncoderModel) for cls in ours.values())


def test_restoring_a_model_with_fewer_positions_than_a_block_is_refused(demo_data_bin):
    """An imported model restored without the --max-positions of its model_args.txt: the
    checkpoint is refused before fairseq's "please ensure that the architectures match"."""
    from seed_fairseq.pretrain.checkpoint import CheckpointError
    from seed_fairseq.pretrain.tasks.identity import POSITIONS_KEY

    task, *_ = build_task_model(demo_data_bin, tokens_per_sample=64)
    state = {"model": {POSITIONS_KEY: torch.zeros(32 + 2, 8)}, "task_state": task.state_dict()}
    with pytest.raises(CheckpointError) as refused:
        task.check_checkpoint(state, "imported/checkpoint.pt")
    assert str(refused.value) == (
        "imported/checkpoint.pt: the model has 32 positions, fewer than --tokens-per-sample 64: "
        "use --tokens-per-sample 32 or less"
    )
    state["model"][POSITIONS_KEY] = torch.zeros(64 + 2, 8)
    task.check_checkpoint(state, "imported/checkpoint.pt")


@pytest.mark.parametrize("name", ["seed", "simlm", "cpdae", "retromae"])
def test_fewer_positions_than_a_block_is_refused(name, demo_data_bin):
    """Each model class; what an imported model's model_args.txt (--max-positions) gives too."""
    objective = next(o for o in OBJECTIVES if o.name == name)
    with pytest.raises(ConfigurationError) as refused:
        build(objective, demo_data_bin, "--max-positions", "32", fixtures={"simlm_generator": "unused.pt"})
    assert str(refused.value).startswith("--max-positions 32 is below --tokens-per-sample 48: ")


def test_cpdae_batches_of_one_text_are_refused(demo_data_bin):
    for batch_size, max_tokens, refused in (
        (1, None, "--batch-size 1 on a single worker"),
        (None, 95, "--max-tokens 95 (below two blocks of --tokens-per-sample 48"),
        (8, 60, "--max-tokens 60 (below two blocks"),
    ):
        with pytest.raises(ConfigurationError, match=re.escape(refused)):
            check_two_texts_per_batch(batch_size, max_tokens, 48)
    check_two_texts_per_batch(2, 96, 48)
    # through fairseq's options: the criterion sees --max-tokens and --tokens-per-sample
    cpdae = next(o for o in OBJECTIVES if o.name == "cpdae")
    with pytest.raises(ConfigurationError, match=re.escape("--max-tokens 95 (below two blocks")):
        build(cpdae, demo_data_bin, "--max-tokens", "95")
    build(cpdae, demo_data_bin, "--max-tokens", "95", "--contrastive-weight", "0")


# ---------------------------------------------------------------------------
# data files
# ---------------------------------------------------------------------------


def test_truncated_split_files_name_the_file(demo_data_bin, tmp_path):
    data = shutil.copytree(demo_data_bin, tmp_path / "data")
    task, *_ = build_task_model(data, tokens_per_sample=64)
    for name, cut in (("train.bin", 2), ("valid.idx", 8)):
        path = data / name
        size = path.stat().st_size
        with open(path, "r+b") as f:
            f.truncate(size - cut)
        with pytest.raises(ConfigurationError) as refused:
            task.load_dataset(name.split(".")[0])
        assert str(refused.value) == f"{path}: truncated: {size - cut} bytes, the build record says {size}"
    # without the build record (data from fairseq-preprocess) the files' own index tells
    (data / "preprocess.json").unlink()
    with pytest.raises(ConfigurationError, match=rf"^{data}/train.bin: truncated: \d+ bytes, train.idx says \d+$"):
        task.load_dataset("train")
    with pytest.raises(ConfigurationError, match=rf"^{data}/valid.idx: truncated: \d+ bytes, its header says"):
        task.load_dataset("valid")
    (data / "test.idx").write_bytes(b"")
    with pytest.raises(ConfigurationError, match=rf"^{data}/test.idx: truncated: 0 bytes"):
        task.load_dataset("test")
    (data / "test.bin").unlink()
    with pytest.raises(ConfigurationError, match=rf"^{data}/test.bin: not found, but test.idx is"):
        task.load_dataset("test")


def test_data_path_with_a_colon_names_the_cause(demo_data_bin, tmp_path):
    from types import SimpleNamespace

    from seed_fairseq.pretrain.tasks.bottleneck_pretrain import BottleneckPretrainTask

    data = tmp_path / "runs:2024"
    data.symlink_to(demo_data_bin)
    with pytest.raises(ConfigurationError) as refused:
        BottleneckPretrainTask.load_dict(SimpleNamespace(data=str(data)))
    assert str(refused.value).startswith(f"{data}: the folder's name contains ':', which fairseq reads as a list")
    with pytest.raises(ConfigurationError) as refused:
        BottleneckPretrainTask.load_dict(SimpleNamespace(data=f"{demo_data_bin}:{tmp_path}/typo"))
    assert str(refused.value) == (
        f"{tmp_path}/typo: data folder not found (fairseq split DATA '{demo_data_bin}:{tmp_path}/typo' at ':' "
        "into 2 folders)"
    )


def test_checkpoint_write_error_recovers_the_cause_from_torch(tmp_path, monkeypatch):
    """torch.save reports a failed write as RuntimeError("unexpected pos ..."); save_atomic
    raises the OSError instead, naming the target, and leaves nothing behind."""
    from seed_fairseq.pretrain import checkpoint_files

    class SizeLimited:
        def __init__(self, path, mode):
            self.f = open(path, mode)

        def write(self, data):
            if self.f.tell() + len(data) > 50_000:
                raise OSError(errno.EFBIG, os.strerror(errno.EFBIG))
            return self.f.write(data)

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(checkpoint_files, "open", SizeLimited, raising=False)
    with pytest.raises(OSError) as failed:
        checkpoint_files.save_atomic({"w": torch.zeros(100_000)}, tmp_path / "big.pt")
    assert (failed.value.errno, failed.value.filename) == (errno.EFBIG, str(tmp_path / "big.pt"))
    assert isinstance(failed.value.__cause__.__cause__, RuntimeError)  # what torch raised
    assert os.listdir(tmp_path) == []


# ---------------------------------------------------------------------------
# option ranges: checked where fairseq-train's options become a task and a criterion (issue 43, G)
# ---------------------------------------------------------------------------


def criterion_options(obj, *suffixes):
    """The options of ``obj``'s criterion whose field names end with one of ``suffixes``."""
    from fairseq.criterions import CRITERION_DATACLASS_REGISTRY

    fields = dataclasses.fields(CRITERION_DATACLASS_REGISTRY[obj.criterion])
    return ["--" + f.name.replace("_", "-") for f in fields if f.name.endswith(suffixes)]


@pytest.mark.parametrize("obj", OBJECTIVES, ids=[o.name for o in OBJECTIVES])
def test_every_objectives_weights_and_vector_length_are_checked_where_parsed(obj, contract_data, request):
    """Every loss weight of every objective (its criterion's ``*_weight`` options) must be a finite
    number >= 0, every temperature > 0, every probability and dropout in [0, 1] (the model's options
    too); ``--retrieval-max-length`` 0 or at least 3 ([CLS], a token, </s>: the export keeps 2 as
    [CLS] </s>, 1 as an IndexError) and at most the model's positions.  One line naming the option
    and the value (``error:``, exit 2)."""
    fixtures = needs(obj, request)
    weights = criterion_options(obj, "_weight", "_weight_decay_to")
    assert weights, "every objective weighs its terms"
    cases = [((option, "inf"), f"{option} must be >= 0 and finite, got inf") for option in weights]
    cases += [((weights[0], "nan"), f"{weights[0]} must be >= 0 and finite, got nan")]
    cases += [((t, "0"), f"{t} must be > 0 and finite, got 0.0") for t in criterion_options(obj, "_temperature")]
    cases += [
        (("--mask-prob", "nan"), "--mask-prob must be in [0, 1], got nan"),
        (("--attention-dropout", "inf"), "--attention-dropout must be in [0, 1], got inf"),
        *[
            (
                ("--retrieval-max-length", n),
                f"--retrieval-max-length must be 0 or >= 3 (0: the model's positions), got {n}",
            )
            for n in ("1", "2")
        ],
        (
            ("--max-positions", "64", "--retrieval-max-length", "65"),
            "--retrieval-max-length 65 is beyond the model's 64 positions (--max-positions): use 64 or less, or 0 "
            "(the model's positions)",
        ),
    ]
    for extra, line in cases:
        with pytest.raises(ConfigurationError) as refused:
            build(obj, contract_data, *extra, fixtures=fixtures)
        assert str(refused.value) == line
    task, *_ = build(obj, contract_data, "--max-positions", "64", "--retrieval-max-length", "3", weights[0], "0",
                     fixtures=fixtures)  # fmt: skip
    assert task.cfg.retrieval_max_length == 3


def test_option_ranges_name_the_option_and_the_value():
    from types import SimpleNamespace

    from seed_fairseq.pretrain.option_ranges import Range, check_ranges

    check_ranges(SimpleNamespace(span_weight=0.0, teacher_temperature=0.5, swap_prob=1.0, steps=3, name="x"))
    for cfg, line in (
        (SimpleNamespace(span_weight=float("-inf")), "--span-weight must be >= 0 and finite, got -inf"),
        (SimpleNamespace(teacher_temperature=0.0), "--teacher-temperature must be > 0 and finite, got 0.0"),
        (SimpleNamespace(swap_prob=1.5), "--swap-prob must be in [0, 1], got 1.5"),
        (SimpleNamespace(scale=float("nan")), "--scale must be a finite number, got nan"),
    ):
        with pytest.raises(ConfigurationError) as refused:
            check_ranges(cfg)
        assert str(refused.value) == line
    assert Range(0, 1, low_open=True).describe() == "in (0, 1]" and not Range(0, 1, low_open=True).holds(0)


@pytest.mark.slow
def test_out_of_range_options_through_fairseq_train(contract_data, demo_data_bin, tmp_path):
    """The real CLI: one ``error:`` line naming the option and the value, exit 2, before training (the
    save-dir stays empty)."""
    for cmd, line in (
        (
            objective_train_cmd(
                BY_NAME["bowpred"], contract_data, tmp_path / "bow", "--bow-weight-decay-to", "inf", max_update=1
            ),  # fmt: skip
            "error: --bow-weight-decay-to must be >= 0 and finite, got inf",
        ),
        (
            train_cmd(demo_data_bin, tmp_path / "length", "--retrieval-max-length", "1", max_update=1),
            "error: --retrieval-max-length must be 0 or >= 3 (0: the model's positions), got 1",
        ),
    ):
        proc = run(cmd)
        assert proc.returncode == 2, proc.stderr[-3000:]
        assert _stderr_lines(proc) == [line]
        assert "train_inner" not in proc.stdout
    assert [p for p in tmp_path.rglob("*") if p.is_file()] == []
