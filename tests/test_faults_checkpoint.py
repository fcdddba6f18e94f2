"""Fault injection around checkpoints: killed writes, damaged files, foreign
dictionaries, permissions and orphaned workers.  Every test here failed on the
code before the reliability fixes."""

import os
import signal
import subprocess
import sys
import time

import pytest
import torch
from helpers import DEMO_CORPUS, build_data_bin, check, cli, run, train_cmd

from seed_fairseq.pretrain.checkpoint import load_torch_file

pytestmark = pytest.mark.slow

SAVE_EVERY = ["--save-interval-updates", "4", "--tokens-per-sample", "64"]


def _records(text):
    import json

    return [
        json.loads(line.split("| train_inner | ", 1)[1]) for line in text.splitlines() if "| train_inner | " in line
    ]


def _last_line(text):
    return [line for line in text.splitlines() if line.strip()][-1]


@pytest.fixture(scope="module")
def two_vocabularies(tmp_path_factory):
    """Two data folders whose dict.txt have the same size but other pieces."""
    root = tmp_path_factory.mktemp("vocab")
    docs = DEMO_CORPUS.read_text(encoding="utf-8").split("\n\n")
    halves = []
    for name, part in (("a", docs[: len(docs) // 2]), ("b", docs[len(docs) // 2 :])):
        text = root / f"{name}.txt"
        text.write_text("\n\n".join(part), encoding="utf-8")
        halves.append(build_data_bin(text, root / name, vocab_size=400))
    a, b = halves
    assert len((a / "dict.txt").read_text().splitlines()) == len((b / "dict.txt").read_text().splitlines())
    assert (a / "dict.txt").read_text() != (b / "dict.txt").read_text()
    return a, b


@pytest.fixture(scope="module")
def trained_on_a(two_vocabularies, tmp_path_factory):
    a, _ = two_vocabularies
    save = tmp_path_factory.mktemp("ckpt_a")
    check(train_cmd(a, save, max_update=4, batch_size=4))
    return save / "checkpoint_last.pt"


# ---------------------------------------------------------------------------
# dictionary identity
# ---------------------------------------------------------------------------


def test_restore_onto_a_same_size_foreign_dictionary_is_refused(two_vocabularies, trained_on_a, tmp_path):
    _, b = two_vocabularies
    restore = ["--restore-file", trained_on_a, "--reset-dataloader", "--reset-optimizer"]
    proc = run(train_cmd(b, tmp_path / "x", *restore, max_update=6, batch_size=4))
    assert proc.returncode != 0
    last = _last_line(proc.stderr)
    assert f"{trained_on_a}: trained with a different dictionary than {b}/dict.txt" in last, last
    assert "--allow-dictionary-change" in last
    assert not _records(proc.stderr + proc.stdout)
    # a deliberate change trains on, and says so
    proc = check(train_cmd(b, tmp_path / "y", *restore, "--allow-dictionary-change", max_update=6, batch_size=4))
    assert "continuing because of --allow-dictionary-change" in proc.stderr + proc.stdout


def test_checkpoint_of_the_old_format_is_checked_through_its_data_folder(two_vocabularies, trained_on_a, tmp_path):
    """Checkpoints written before the identity was recorded name their data folder."""
    _, b = two_vocabularies
    state = load_torch_file(trained_on_a)
    state["task_state"] = {}
    old = tmp_path / "old.pt"
    torch.save(state, old)
    proc = run(
        train_cmd(
            b,
            tmp_path / "x",
            "--restore-file",
            old,
            "--reset-dataloader",
            "--reset-optimizer",
            max_update=6,
            batch_size=4,
        )
    )
    assert proc.returncode != 0 and "trained with a different dictionary" in _last_line(proc.stderr)


def test_drop_decoder_refuses_a_foreign_dictionary(two_vocabularies, trained_on_a, tmp_path):
    a, b = two_vocabularies
    proc = run([cli("seed-drop-decoder"), trained_on_a, tmp_path / "enc.pt", "--data", b])
    assert proc.returncode == 2, proc.stderr[-2000:]
    assert _last_line(proc.stderr).startswith(f"error: {trained_on_a}: trained with a different dictionary")
    assert not (tmp_path / "enc.pt").exists() and os.listdir(tmp_path) == []
    check([cli("seed-drop-decoder"), trained_on_a, tmp_path / "enc.pt", "--data", a])
    # the encoder-only checkpoint carries the identity on
    assert torch.load(tmp_path / "enc.pt", weights_only=True)["task_state"]["dictionary_sha256"]


def test_size_mismatch_last_line_is_the_true_cause(trained_on_a, tmp_path):
    data = tmp_path / "other"
    data.mkdir()
    (data / "dict.txt").write_text("".join(f"x{i} 1\n" for i in range(50)))
    proc = run(
        train_cmd(
            data,
            tmp_path / "ckpt",
            "--restore-file",
            trained_on_a,
            "--reset-optimizer",
            "--reset-dataloader",
            max_update=1,
        )
    )
    assert proc.returncode != 0
    last = _last_line(proc.stderr)
    assert "dictionary size mismatch" in last and "architectures match" not in proc.stderr, last


def test_missing_restore_file_is_an_error_not_a_fresh_start(two_vocabularies, tmp_path):
    a, _ = two_vocabularies
    proc = run(train_cmd(a, tmp_path / "ckpt", "--restore-file", tmp_path / "typo.pt", max_update=2))
    assert proc.returncode != 0
    assert f"{tmp_path}/typo.pt: --restore-file not found" in _last_line(proc.stderr)
    assert not _records(proc.stderr + proc.stdout)


# ---------------------------------------------------------------------------
# killed and damaged checkpoint writes
# ---------------------------------------------------------------------------

# fairseq-train whose process dies (like a kill) in the middle of writing checkpoint_last.pt
DIE_WHILE_WRITING_LAST = r"""
import os, shutil, sys
_copy = shutil.copyfileobj
def copy_and_die(fsrc, fdst, length=0):
    if "checkpoint_last" in str(getattr(fdst, "name", "")):
        fdst.write(fsrc.read(4096)); fdst.flush()
        os._exit(9)
    return _copy(fsrc, fdst, length)
shutil.copyfileobj = copy_and_die
sys.argv = ["fairseq-train"] + sys.argv[1:]
from fairseq_cli.train import cli_main
cli_main()
"""


@pytest.fixture(scope="module")
def straight(two_vocabularies, tmp_path_factory):
    a, _ = two_vocabularies
    save = tmp_path_factory.mktemp("straight")
    proc = check(train_cmd(a, save, *SAVE_EVERY, max_update=8, batch_size=4))
    return {int(r["num_updates"]): r for r in _records(proc.stderr + proc.stdout)}


def _same_losses(resumed, straight, updates):
    assert [int(r["num_updates"]) for r in resumed] == list(updates)
    for r in resumed:
        for key in ("loss", "mlm_loss", "dec_loss", "gnorm"):
            assert r[key] == straight[int(r["num_updates"])][key], (r["num_updates"], key)


def test_kill_while_writing_checkpoint_last_then_rerun_resumes_exactly(two_vocabularies, straight, tmp_path):
    a, _ = two_vocabularies
    cmd = train_cmd(a, tmp_path, *SAVE_EVERY, max_update=8, batch_size=4)
    died = run([sys.executable, "-c", DIE_WHILE_WRITING_LAST, *cmd[1:]])
    assert died.returncode == 9
    # the first save got as far as checkpoint_1_4.pt; no truncated checkpoint_last.pt
    assert (tmp_path / "checkpoint_1_4.pt").is_file() and not (tmp_path / "checkpoint_last.pt").exists()
    proc = check(cmd)  # the same command again
    log = proc.stderr + proc.stdout
    assert f"restarting from {tmp_path}/checkpoint_1_4.pt" in log
    _same_losses(_records(log), straight, range(5, 9))


def test_damaged_checkpoint_last_falls_back_to_the_newest_readable(two_vocabularies, straight, tmp_path):
    a, _ = two_vocabularies
    check(train_cmd(a, tmp_path, *SAVE_EVERY, max_update=4, batch_size=4))
    for size in (0, 1000):  # empty (what fairseq's in-place copy left) and truncated
        with open(tmp_path / "checkpoint_last.pt", "r+b") as f:
            f.truncate(size)
        proc = check(train_cmd(a, tmp_path, *SAVE_EVERY, max_update=8, batch_size=4))
        log = proc.stderr + proc.stdout
        assert f"restarting from {tmp_path}/checkpoint_1_4.pt" in log, log[-3000:]
        assert "checkpoint_last.pt" in log.split("restarting from", 1)[1].splitlines()[0]
        _same_losses(_records(log), straight, range(5, 9))
        for p in tmp_path.glob("checkpoint_1_8.pt"):
            p.unlink()  # the next round starts from update 4 again


def test_only_checkpoint_damaged_is_a_clear_error(two_vocabularies, tmp_path):
    a, _ = two_vocabularies
    (tmp_path / "checkpoint_last.pt").write_bytes(b"")
    proc = run(train_cmd(a, tmp_path, max_update=2))
    assert proc.returncode != 0
    assert f"{tmp_path}/checkpoint_last.pt: checkpoint file is empty" in _last_line(proc.stderr)


def test_failed_copy_leaves_the_old_checkpoint_whole(tmp_path, monkeypatch):
    """In-process: the atomic copy fails half-way; the target keeps its old bytes."""
    import shutil

    from fairseq import checkpoint_utils

    import seed_fairseq  # noqa: F401  (installs the atomic PathManager)

    src, dst = tmp_path / "new.pt", tmp_path / "checkpoint_last.pt"
    src.write_bytes(b"n" * 100_000)
    dst.write_bytes(b"old")

    def half_then_fail(fsrc, fdst, length=0):
        fdst.write(fsrc.read(10))
        raise OSError("disk full")

    monkeypatch.setattr(shutil, "copyfileobj", half_then_fail)
    with pytest.raises(OSError, match="disk full"):
        checkpoint_utils.PathManager.copy(str(src), str(dst), overwrite=True)
    assert dst.read_bytes() == b"old"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint_last.pt", "new.pt"]


# ---------------------------------------------------------------------------
# permissions: the umask decides, as for any file the user creates
# ---------------------------------------------------------------------------


def _with_umask(mask):
    return lambda: os.umask(mask)


def test_outputs_respect_the_umask(trained_on_a, two_vocabularies, tmp_path):
    a, _ = two_vocabularies
    out = tmp_path / "enc.pt"
    proc = subprocess.run(
        [cli("seed-drop-decoder"), str(trained_on_a), str(out), "--data", str(a)],
        capture_output=True,
        text=True,
        preexec_fn=_with_umask(0o007),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert oct(os.stat(out).st_mode & 0o777) == oct(0o660)
    # fairseq-train's checkpoints too
    save = tmp_path / "ckpt"
    proc = subprocess.run(
        [str(c) for c in train_cmd(a, save, max_update=1, batch_size=4)],
        capture_output=True,
        text=True,
        preexec_fn=_with_umask(0o027),
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert oct(os.stat(save / "checkpoint_last.pt").st_mode & 0o777) == oct(0o640)


def test_drop_decoder_replaces_only_its_own_output(trained_on_a, two_vocabularies, tmp_path):
    a, _ = two_vocabularies
    mine = tmp_path / "notes.pt"
    mine.write_text("the user's file")
    proc = run([cli("seed-drop-decoder"), trained_on_a, mine, "--data", a])
    assert proc.returncode == 2
    assert (
        _last_line(proc.stderr) == f"error: {mine}: exists and was not written by seed-drop-heads; "
        "refusing to replace it"
    )
    assert mine.read_text() == "the user's file"
    out = tmp_path / "enc.pt"
    check([cli("seed-drop-decoder"), trained_on_a, out, "--data", a])
    check([cli("seed-drop-decoder"), trained_on_a, out, "--data", a])  # rerun unchanged: fine
    proc = run([cli("seed-drop-decoder"), trained_on_a, tmp_path, "--data", a])
    assert proc.returncode == 2 and "is a folder" in proc.stderr


# ---------------------------------------------------------------------------
# orphaned torchrun workers stop
# ---------------------------------------------------------------------------


def _children(pid):
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == pid:
                kids.append(int(entry))
    return kids


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_workers_stop_when_torchrun_is_killed(two_vocabularies, tmp_path):
    a, _ = two_vocabularies
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(port),
        *train_cmd(a, tmp_path, max_update=100000, batch_size=2),
        "--distributed-world-size",
        "2",
        "--ddp-backend",
        "legacy_ddp",
    ]
    log = open(tmp_path / "log.txt", "w")
    env = dict(os.environ, OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore")
    launcher = subprocess.Popen([str(c) for c in cmd], stdout=log, stderr=subprocess.STDOUT, env=env)
    workers = []
    try:
        deadline = time.time() + 300
        while "train_inner" not in (tmp_path / "log.txt").read_text() and time.time() < deadline:
            assert launcher.poll() is None, (tmp_path / "log.txt").read_text()[-3000:]
            time.sleep(1)
        workers = _children(launcher.pid)
        assert len(workers) == 2, workers
        launcher.send_signal(signal.SIGKILL)
        launcher.wait()
        deadline = time.time() + 60
        while any(_alive(w) for w in workers) and time.time() < deadline:
            time.sleep(0.5)
        assert not any(_alive(w) for w in workers), "workers kept running after torchrun was killed"
    finally:
        for w in workers + [launcher.pid]:
            try:
                os.kill(w, signal.SIGKILL)
            except OSError:
                pass
        log.close()


def test_log_interval_without_masked_tokens_does_not_crash():
    """A batch with no masked token (short blocks, small batch) crashed every worker."""
    from fairseq import metrics

    from seed_fairseq.pretrain.criterions.seed_pretrain import SeedPretrainCriterion

    log = {
        "loss": 1.0,
        "mlm_loss_sum": 0.0,
        "dec_loss_sum": 5.0,
        "mlm_ntokens": 0,
        "dec_ntokens": 7,
        "mlm_correct": 0,
        "dec_correct": 1,
        "ntokens": 8,
        "nsentences": 1,
        "mlm_weight": 0.5,
        "dec_weight": 0.5,
        "nlogs": 1,
    }
    name = "test_interval_without_masked_tokens"
    with metrics.aggregate(name):
        SeedPretrainCriterion.reduce_metrics([dict(log, mlm_loss_sum=3.0, mlm_ntokens=2)])
    metrics.reset_meters(name)  # a new log interval, as fairseq does after every logged update
    with metrics.aggregate(name):
        SeedPretrainCriterion.reduce_metrics([log])
    values = metrics.get_smoothed_values(name)
    assert values["dec_loss"] > 0 and values["mlm_ppl"] != values["mlm_ppl"]  # nan


EXIT_WHILE_PREFETCHING = r"""
import sys, torch
import seed_fairseq  # noqa: F401
from fairseq.data import iterators
torch.set_num_threads(1)


class Source:  # builds every batch in C++ with the GIL released, like a collater
    def __len__(self):
        return 100

    def __iter__(self):
        a = torch.ones(1500, 1500)
        while True:
            yield a @ a


itr = iterators.BufferedIterator(1, Source())
next(itr)  # training stops (--max-update) while the prefetching thread builds the next batch
"""


def test_exit_while_prefetching_does_not_abort():
    """Without the plugin's clean exit this aborts ("terminate called without an
    active exception", exit code 134) every time, after the work is done."""
    for _ in range(3):
        proc = run([sys.executable, "-c", EXIT_WHILE_PREFETCHING], timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        assert "terminate called" not in proc.stderr


def test_drop_heads_file_size_limit_is_one_line(tmp_path, capsys):
    """torch.save reports a failed write as RuntimeError("unexpected pos"); the tool
    recovers the OSError: one line naming OUT, exit 2, nothing left (real EFBIG)."""
    import errno
    import resource

    from helpers import REPO

    from seed_fairseq.encoders.drop_heads import main

    fixture = REPO / "tests" / "fixtures" / "seed_fairseq_0.1"
    out = tmp_path / "out" / "encoder.pt"
    out.parent.mkdir()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, hard))  # the encoder checkpoint is larger
    try:
        code = main([str(fixture / "checkpoint_1_3.pt"), str(out), "--data", str(fixture / "data-bin")])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err[-3000:]
    assert errors[0].startswith(f"error: {out}: {os.strerror(errno.EFBIG)}"), errors[0]
    assert list(out.parent.iterdir()) == []
