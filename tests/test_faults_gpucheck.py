"""gpu_check's faults (issue 32, items 9 and 12; issue 35's time budget).

Item 9: Ctrl-C during the data-parallel check left two torchrun workers waiting in rendezvous.
gpu_check's children now run as the comparison's do (``compare.interrupt.run_child``): a process
group of their own, stopped whole when gpu_check is interrupted.

Item 12: the data preparation (non-UTF-8 ``--corpus``, ``--vocab-size`` out of range, a full disk)
gave tracebacks with exit 1, the status of a failed check; ``--peak-tflops nan`` was accepted and
the JSON held NaN.  Now: one ``error:`` line and exit 2 (before anything is written where the input
alone decides), finite numbers only, and a JSON that strict readers accept.

The budget: a check left without time is "not run" (exit 3), never "fail".
"""

import json
import math
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import REPO

from seed_fairseq.workflows.gpucheck import budget as budget_mod
from seed_fairseq.workflows.gpucheck import cli, report
from seed_fairseq.workflows.gpucheck.profile import dry_run_profile
from seed_fairseq.workflows.kit.argv import DEFAULT_OPTIMIZER


def one_error_line(capsys, code, expected_code=2):
    """The one ``error:`` line (gpu_check's progress lines, ``[gpu_check HH:MM:SS] ...``, aside)."""
    err = [line for line in capsys.readouterr().err.strip().splitlines() if not line.startswith("[gpu_check ")]
    assert code == expected_code, err
    assert len(err) == 1 and err[0].startswith("error: "), err
    return err[0]


# ---- item 12: bad numbers and data that cannot be built -----------------------------------------


@pytest.mark.parametrize(
    "option, value, says",
    [
        ("--peak-tflops", "nan", "nan: must be a finite number above 0"),
        ("--peak-tflops", "inf", "inf: must be a finite number above 0"),
        ("--peak-tflops", "-3", "-3: must be a finite number above 0"),
        ("--budget-seconds", "nan", "nan: must be a finite number above 0"),
        ("--vocab-size", "0", "0: out of range"),
        ("--vocab-size", str(2**31), f"{2**31}: out of range"),
        ("--updates", "2", "2: out of range"),
    ],
)
def test_bad_numbers_are_one_error_line_before_anything(tmp_path, capsys, option, value, says):
    out = tmp_path / "out"
    with pytest.raises(SystemExit) as e:
        cli.main(["--dry-run", "--out", str(out), option, value])
    line = one_error_line(capsys, e.value.code)
    assert option in line and says in line, line
    assert not out.exists()


@pytest.mark.parametrize("case", ["inside a file", "colon", "read-only", "corpus inside"])
def test_out_paths_it_cannot_use_are_one_error_line_before_anything(tmp_path, capsys, case):
    """Issue 32 item 11: the --out check every tool shares (fileio.check_out_path / check_apart)."""
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("One sentence here.\n\nAnother one there.\n", encoding="utf-8")
    if case == "inside a file":
        out, says = corpus / "out", "is not a folder"
    elif case == "colon":
        out, says = tmp_path / "a:b", "contains ':'"
    elif case == "read-only":
        if os.geteuid() == 0:
            pytest.skip("root writes into read-only folders")
        ro = tmp_path / "ro"
        ro.mkdir(mode=0o555)
        out, says = ro / "out", "cannot be written"
    else:
        out, says = tmp_path, "--corpus"
    before = sorted(p.name for p in tmp_path.iterdir())
    line = one_error_line(capsys, cli.main(["--dry-run", "--out", str(out), "--corpus", str(corpus)]))
    assert says in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == before


def fake_build(folder, vocab=500, shards=1, missing=()):
    """A folder as preprocess.build leaves it, as far as --data's check reads it (its record, its files)."""
    from preprocess.record import RECORD_FORMAT

    folder.mkdir(parents=True)
    outputs = ["dict.txt", "preprocess.json", "spm.model", "train.bin", "train.idx"]
    for name in outputs[:1] + outputs[2:]:
        if name not in missing:
            (folder / name).write_bytes(b"x\n")
    record = {"format": RECORD_FORMAT, "outputs": outputs, "shards": shards, "sentencepiece": {"vocab_size": vocab}}
    (folder / "preprocess.json").write_text(json.dumps(record))
    return folder


@pytest.mark.parametrize(
    "case, says",
    [
        ("missing", "no such folder: --data takes the --out of python -m preprocess.build"),
        ("a file", "not a folder: --data takes the --out of python -m preprocess.build"),
        ("not a build", "no preprocess.json of a finished build: --data takes the --out of python -m preprocess"),
        ("incomplete copy", "train.bin: listed in preprocess.json but missing: an incomplete copy of the build"),
        ("shards", "a build of 2 shards: gpu_check reads one (build with --shards 1)"),
        ("inside --out", "--data: is inside --out"),
        ("holds --out", "--out is inside --data"),
        ("--vocab-size", "--vocab-size 300: --data"),
    ],
)
def test_a_bad_data_folder_is_one_error_line_before_anything(tmp_path, capsys, case, says):
    """--data is an input: a folder that is not a finished one-shard build of preprocess.build (with every
    file its record lists), or one inside --out (or holding it), is refused before anything is written."""
    out, data, extra = tmp_path / "out", tmp_path / "data", []
    if case == "a file":
        data.write_text("not a build\n")
    elif case == "not a build":
        data.mkdir()
        (data / "notes.txt").write_text("mine\n")
    elif case == "incomplete copy":
        fake_build(data, missing=("train.bin",))
    elif case == "shards":
        fake_build(data, shards=2)
    elif case == "inside --out":
        data = fake_build(out / "data")
    elif case == "holds --out":
        out = fake_build(data) / "out"
    elif case == "--vocab-size":
        fake_build(data, vocab=500)
        extra = ["--vocab-size", "300"]
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    line = one_error_line(capsys, cli.main(["--dry-run", "--out", str(out), "--data", str(data), *extra]))
    assert says in line, line
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_a_corpus_that_is_not_utf8_is_one_error_line_before_anything(tmp_path, capsys):
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("Une tasse de café.\n\nDeux.\n".encode("latin-1"))
    out = tmp_path / "out"
    line = one_error_line(capsys, cli.main(["--dry-run", "--out", str(out), "--corpus", str(bad)]))
    assert line.startswith(f"error: {bad}: line 1: not valid UTF-8"), line
    assert not out.exists()


def test_a_vocabulary_the_text_cannot_give_is_one_error_line(tmp_path, capsys):
    """Only sentencepiece knows the bounds of this text: the refusal comes from the data set's build,
    still as one line and exit 2 (not the traceback and exit 1 of a failed check)."""
    out = tmp_path / "out"
    line = one_error_line(capsys, cli.main(["--dry-run", "--out", str(out), "--vocab-size", "5"]))
    assert "--vocab-size 5 is too small" in line, line
    assert not (out / report.JSON_NAME).exists()


@pytest.mark.slow
def test_a_full_disk_while_building_the_data_is_one_error_line(tmp_path):
    """A real write error: the file-size limit (``ulimit -f``; CPython ignores SIGXFSZ, so writes fail
    with EFBIG as they fail with ENOSPC on a full disk)."""
    out = tmp_path / "out"
    proc = subprocess.run(
        [
            "bash",
            "-c",
            'ulimit -f 64 && exec "$@"',
            "limited",
            sys.executable,
            "-m",
            "seed_fairseq.workflows.gpucheck",
            "--dry-run",
            "--out",
            str(out),
        ],  # fmt: skip
        capture_output=True,
        text=True,
        cwd=REPO,
        env=dict(os.environ, OMP_NUM_THREADS="1"),
        timeout=300,
    )
    err = [line for line in proc.stderr.splitlines() if not line.startswith("[gpu_check ")]
    assert proc.returncode == 2, proc.stderr[-3000:]
    assert len(err) == 1 and err[0].startswith(f"error: {out}") and "file too large" in err[0], err


def test_the_json_report_holds_no_nan(tmp_path):
    """A non-finite loss or MFU is recorded as null: strict JSON readers reject NaN and Infinity."""
    checks = [report.Check("train seed fp16", report.FAIL, "non-finite loss", {"loss": float("nan")})]
    objectives = {"seed": {"training": {"fp16": {"losses": [9.0, float("nan")], "mfu": float("inf"), "batch": 8}}}}
    report.write(tmp_path, report.build(dry_run_profile(), checks, objectives, 1.0))

    def refuse(constant):
        raise ValueError(f"{constant} in the JSON")

    got = json.loads((tmp_path / report.JSON_NAME).read_text(), parse_constant=refuse)
    assert got["objectives"]["seed"]["training"]["fp16"]["losses"] == [9.0, None]
    assert got["objectives"]["seed"]["training"]["fp16"]["mfu"] is None
    assert got["checks"][0]["values"]["loss"] is None


# ---- the budget: out of time is "not run", not "fail" --------------------------------------------


class Quick(cli.GpuCheck):
    """No data set, no training: two fake checks, the second one slower than the budget."""

    def prepare(self):
        self.work.mkdir(parents=True, exist_ok=True)

    def run(self):
        self.planned = ["quick", "slow", "after"]
        self.attempt("quick", lambda: report.Check("quick", report.PASS, "ok"))
        self.attempt("slow", lambda: time.sleep(30) or report.Check("slow", report.PASS, "never"))
        self.attempt("after", lambda: report.Check("after", report.PASS, "never"))
        return self.write_report()


def test_a_check_that_runs_out_of_time_is_not_run_not_failed(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(cli, "GpuCheck", Quick)
    out = tmp_path / "out"
    handler, timer = signal.getsignal(signal.SIGALRM), signal.getitimer(signal.ITIMER_REAL)[0]
    began = time.monotonic()
    code = cli.main(["--dry-run", "--out", str(out), "--budget-seconds", "2"])
    assert time.monotonic() - began < 20  # the sleeping check was stopped at the deadline
    assert code == cli.EXIT_NOT_RUN
    rep = json.loads((out / report.JSON_NAME).read_text())
    status = {c["name"]: (c["status"], c["detail"]) for c in rep["checks"]}
    assert status["quick"][0] == report.PASS
    assert status["slow"][0] == report.NOT_RUN and "ran out during slow" in status["slow"][1]
    assert status["after"][0] == report.NOT_RUN and "spent before after" in status["after"][1]
    assert rep["passed"] is False and rep["failed"] == [] and rep["not_run"] == ["slow", "after"]
    assert (out / report.MARKDOWN_NAME).read_text().startswith("# gpu_check: INCOMPLETE")
    # the alarm as it was before (pytest-timeout's, when it runs the tests): handler and what is left of it
    assert signal.getsignal(signal.SIGALRM) == handler
    assert (timer == 0) == (signal.getitimer(signal.ITIMER_REAL)[0] == 0)


def test_updates_are_fitted_to_the_share():
    fit = budget_mod.updates_that_fit
    assert fit(100.0, update=2.0, overhead=10.0, wanted=30) == 30
    assert fit(40.0, update=2.0, overhead=10.0, wanted=30) == 15
    assert fit(15.0, update=2.0, overhead=10.0, wanted=30) == 0  # fewer than 3: not run
    assert fit(math.inf, update=2.0, overhead=10.0, wanted=30) == 30
    b = budget_mod.Budget(100.0, clock=lambda: 0.0)
    assert b.share(runs_left=4, reserve=20.0) == 20.0
    assert budget_mod.Budget(None).share(4, 20.0) == math.inf


def test_each_run_takes_the_updates_its_share_holds(tmp_path, monkeypatch):
    """The planner on a stand-in device (updates of 0.5 s, measured in the batch search): a share of 10 s
    holds ~15 updates after the run's overhead and its comparison; a share too small for 3 takes 3 from
    the whole budget; a budget that cannot hold 3 is "not run"."""
    from test_gpu_check import FakeRun

    from seed_fairseq.workflows.gpucheck import runs

    monkeypatch.setattr(runs, "Run", FakeRun)

    def check(seconds):  # no kernel profile: its share of the budget is test_the_profile_gives_way_...'s
        c = cli.GpuCheck(
            dry_run_profile(), tmp_path, tmp_path / "corpus.txt", None, budget_mod.Budget(seconds), kernel_profile=False
        )
        c.p.updates = 30
        return c

    plan = check(1000.0)
    assert plan.train_objective("seed", [], "bf16", share=10.0).status == report.PASS
    t = plan.objectives["seed"]["training"]["bf16"]
    assert t["batch"] == 8  # the dry run's search: 2, 4, 8 (the stand-in fits 12)
    assert 13 <= t["updates_planned"] <= 15 and t["updates"] == t["updates_planned"], t
    small = check(1000.0)
    small.train_objective("seed", [], "bf16", share=1.0)
    assert small.objectives["seed"]["training"]["bf16"]["updates_planned"] == budget_mod.MIN_UPDATES
    with pytest.raises(budget_mod.OutOfTime, match="fewer than 3 updates"):
        check(41.0).train_objective("seed", [], "bf16", share=1.0)  # 41 s less the 40 s kept for the rest


# ---- item 9: Ctrl-C during the data-parallel check ------------------------------------------------

# stands in for fairseq-train: the 1-process run leaves a checkpoint; each torchrun worker records its
# pid and waits, as workers wait in rendezvous
FAKE_TRAIN = textwrap.dedent(
    """\
    import os, sys, time
    from pathlib import Path
    save = Path(sys.argv[sys.argv.index("--save-dir") + 1])
    if "RANK" not in os.environ:
        save.mkdir(parents=True, exist_ok=True)
        (save / "checkpoint_last.pt").write_bytes(b"")
        sys.exit(0)
    (save.parent / f"worker-{os.environ['RANK']}.pid").write_text(str(os.getpid()))
    time.sleep(600)
    """
)

DRIVER = textwrap.dedent(
    """\
    import sys
    from seed_fairseq.workflows.gpucheck import checks, cli

    checks.train_program = lambda: sys.argv[1]

    class OnlyDataParallel(cli.GpuCheck):
        def prepare(self):
            self.work.mkdir(parents=True, exist_ok=True)
            self.data.mkdir(parents=True, exist_ok=True)

        def run(self):
            self.planned = ["data parallel", "HF export"]
            self.setup_args = {"seed": []}
            self.attempt("data parallel", self.data_parallel)
            self.attempt("HF export", self.export)
            return self.write_report()

    cli.GpuCheck = OnlyDataParallel
    sys.exit(cli.main(["--dry-run", "--out", sys.argv[2]]))
    """
)


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    stat = Path(f"/proc/{pid}/stat")
    return not (stat.exists() and stat.read_text().split(") ")[-1].startswith("Z"))  # a zombie is gone


@pytest.mark.slow
def test_ctrl_c_during_the_data_parallel_check_stops_the_torchrun_workers(tmp_path):
    fake, driver, out = tmp_path / "fake_train.py", tmp_path / "driver.py", tmp_path / "out"
    fake.write_text(f"#!{sys.executable}\n{FAKE_TRAIN}")  # run as fairseq-train is: a program
    fake.chmod(0o755)
    driver.write_text(DRIVER)
    proc = subprocess.Popen(
        [sys.executable, str(driver), str(fake), str(out)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # the test's own Ctrl-C goes to the driver only, as kill -INT does
    )
    pids_dir = out / "work" / "data-parallel"
    deadline = time.monotonic() + 120
    while len(list(pids_dir.glob("worker-*.pid"))) < 2:
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "the torchrun workers never started"
        time.sleep(0.2)
    workers = [int(p.read_text()) for p in pids_dir.glob("worker-*.pid")]
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stderr[-3000:]
    assert "interrupted (SIGINT)" in stderr
    time.sleep(0.5)
    assert not [pid for pid in workers if alive(pid)], f"orphaned torchrun workers: {workers}"
    rep = json.loads((out / report.JSON_NAME).read_text())
    assert [(c["name"], c["status"]) for c in rep["checks"]] == [("data parallel", "not run"), ("HF export", "not run")]


# ---- issue 44: the kernel profile gives way to the budget, and its failure is its own -------------------


def _profiled(monkeypatch, profile=None):
    """Runs on test_gpu_check's stand-in device (updates of 0.5 s) with a stand-in kernel profile; the
    profiles taken are listed."""
    from test_gpu_check import FakeRun

    from seed_fairseq.workflows.gpucheck import kernels, runs

    taken = []

    def fake(run, updates, warmup):
        taken.append((updates, warmup))
        if profile is not None:
            return profile(run, updates, warmup)
        return {"status": "ok", "activity": "CPU aten ops (self time)", "updates": updates, "summing_seconds": 0.1}

    monkeypatch.setattr(runs, "Run", FakeRun)
    monkeypatch.setattr(kernels, "profile_updates", fake)
    return taken


def _check(tmp_path, seconds, **kw):
    c = cli.GpuCheck(dry_run_profile(), tmp_path, tmp_path / "corpus.txt", None, budget_mod.Budget(seconds), **kw)
    c.p.updates = 30
    return c


def test_the_profile_gives_way_when_the_budget_is_short(tmp_path, monkeypatch):
    """Updates of 0.5 s: the profile (1 + 2 updates under the profiler, 2x slower, and 0.2 s each to read)
    is estimated at 3.4 s. A share of 20 s holds it and a steady words/s (1 counted + 1 warm-up + 4
    measured updates); one of 7 s holds only the updates, 5 s only the minimum: "not run", the training
    check passes all the same; without a budget it is always taken."""
    taken = _profiled(monkeypatch)
    roomy = _check(tmp_path, 1000.0)
    assert roomy.train_objective("seed", [], "bf16", share=20.0).status == report.PASS
    assert taken == [(2, 1)] and roomy.kernel_profiles[-1]["status"] == "ok"
    assert roomy.kernel_profiles[-1]["objective"] == "seed" and roomy.kernel_profiles[-1]["precision"] == "bf16"
    assert roomy.summing == pytest.approx(0.05)  # the next runs' estimate: this profile's reading, per update
    for share, updates in ((7.0, 8), (5.0, 4)):  # (share - 1 s of comparison - 1.5 s of overhead) / 0.5 s
        short = _check(tmp_path, 1000.0)
        assert short.train_objective("seed", [], "bf16", share=share).status == report.PASS
        assert updates <= short.objectives["seed"]["training"]["bf16"]["updates"] <= updates + 1, share
        entry = short.kernel_profiles[-1]
        assert entry["status"] == report.NOT_RUN, share
        assert entry["detail"] == "not run: the time budget left no room for it (3.4 s estimated)", share
    assert len(taken) == 1
    unlimited = _check(tmp_path, None)
    unlimited.train_objective("seed", [], "bf16")
    assert len(taken) == 2 and unlimited.kernel_profiles[-1]["status"] == "ok"
    # the section says why, never as a failed or unrun check
    short.add(report.Check("train seed bf16", report.PASS, "ok"))
    rep = short.write_report()
    assert rep["failed"] == [] and rep["not_run"] == []
    assert rep["kernel_profile"]["title"] == "Kernel profile" and rep["kernel_profile"]["runs"] == [entry]
    md = (tmp_path / report.MARKDOWN_NAME).read_text()
    optimizer = DEFAULT_OPTIMIZER
    assert f"| seed | bf16 | {optimizer} | not run: the time budget left no room for it (3.4 s estimated) |" in md


def test_no_profile_turns_it_off(tmp_path, monkeypatch, capsys):
    taken = _profiled(monkeypatch)
    off = _check(tmp_path, None, kernel_profile=False)
    assert off.train_objective("seed", [], "bf16").status == report.PASS
    assert taken == [] and off.kernel_profiles[-1]["detail"] == "not run: --no-profile"
    seen = []

    class Stub(cli.GpuCheck):
        def prepare(self):
            self.work.mkdir(parents=True, exist_ok=True)

        def run(self):
            seen.append(self.kernel_profile)
            self.add(report.Check("generator", report.PASS, "ok"))
            return self.write_report()

    monkeypatch.setattr(cli, "GpuCheck", Stub)
    assert cli.main(["--dry-run", "--out", str(tmp_path / "a"), "--no-profile"]) == 0
    assert cli.main(["--dry-run", "--out", str(tmp_path / "b")]) == 0
    assert cli.main(["--dry-run", "--out", str(tmp_path / "c"), "--profile"]) == 0
    assert seen == [False, True, True]
    md = (tmp_path / "c" / report.MARKDOWN_NAME).read_text()
    assert "## Kernel profile" in md and "profiled: nothing (no run was profiled)" in md


def test_a_profiler_that_fails_fails_its_profile_not_the_training(tmp_path, monkeypatch):
    """The lent machine's image may have no CUPTI, or torch.profiler may break on it: the profile says so in
    the report; the training's check and its measurements stand."""

    def broken(run, updates, warmup):
        raise RuntimeError("CUPTI_ERROR_NOT_INITIALIZED: the profiler could not start")

    _profiled(monkeypatch, broken)
    c = _check(tmp_path, None)
    assert c.train_objective("seed", [], "bf16").status == report.PASS
    entry = c.kernel_profiles[-1]
    assert entry["status"] == "error"
    assert entry["detail"] == "RuntimeError: CUPTI_ERROR_NOT_INITIALIZED: the profiler could not start"
    assert c.objectives["seed"]["training"]["bf16"]["words_per_second"] > 0
    c.add(report.Check("train seed bf16", report.PASS, "ok"))
    assert c.write_report()["failed"] == []
    assert "RuntimeError: CUPTI_ERROR_NOT_INITIALIZED" in (tmp_path / report.MARKDOWN_NAME).read_text()


def test_the_kernel_profile_in_the_json_holds_no_nan(tmp_path):
    section = report.kernel_section(
        [{"objective": "seed", "precision": "fp16", "status": "ok", "classes": {"gemm": {"share": float("nan")}}}]
    )
    rep = dict(report.build(dry_run_profile(), [], {}, 1.0), kernel_profile=section)
    from seed_fairseq.base.fileio import write_json_atomic

    write_json_atomic(tmp_path / report.JSON_NAME, report.json_safe(rep))  # as report.write writes it

    def refuse(constant):
        raise ValueError(f"{constant} in the JSON")

    got = json.loads((tmp_path / report.JSON_NAME).read_text(), parse_constant=refuse)
    assert got["kernel_profile"]["runs"][0]["classes"]["gemm"]["share"] is None
