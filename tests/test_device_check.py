"""scripts/device_check.sh's gpu_check part in CI: the dry run (the GPU checks' code path on the CPU at
tiny shape, every check passing) as the lent machine runs it, under a time budget, with what comes back
in OUT within the device tool's limits (at most 8 files, no folder).  The install part is the opt-in
rehearsal (tests/test_device_rehearsal.py).

Issue 43: a signal (Ctrl-C, SIGTERM, SIGHUP) to device_check.sh or device_bundle.sh stops the whole tree
under it, copies what exists and exits 128 + N; --seconds is decimal with a maximum; a missing --bundle
is refused before --out is made; the default venv and scratch folder are in this user's own folder."""

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import REPO, run
from test_faults_compare import _children, _gone_within, _stat, _wait_for
from test_faults_gpucheck import DRIVER, FAKE_TRAIN
from test_gpu_check import OBJECTIVE_NAMES

from seed_fairseq.pretrain.tasks.registry import registered_objectives
from seed_fairseq.workflows.gpucheck import kernels, report
from seed_fairseq.workflows.gpucheck.profile import REFERENCE, REFERENCE_OPTIMIZER
from seed_fairseq.workflows.kit.argv import DEFAULT_OPTIMIZER

FACTORS = {d.name: d.texts_per_update_factor for d in registered_objectives()}

SCRIPT = REPO / "scripts" / "device_check.sh"
BUNDLE_SCRIPT = REPO / "scripts" / "device_bundle.sh"
SIGNALS = [signal.SIGINT, signal.SIGTERM, signal.SIGHUP]
# masked_lm with fairseq's adam, when the default optimizer is another: trained, not compared (same first update)
REFERENCE_RUNS = [REFERENCE] if DEFAULT_OPTIMIZER != REFERENCE_OPTIMIZER else []
EXPECTED_CHECKS = (
    ["generator"]
    + [f"{kind} {name}" for name in OBJECTIVE_NAMES for kind in ("train", "bf16 vs fp32")]
    + [f"train {name}" for name in REFERENCE_RUNS]
    + ["data parallel", "HF export", "encode bf16", "faiss"]
)


def device_check(out, work, *args, python=sys.executable, **env):
    env = {"PYTHON": str(python), "MKL_NUM_THREADS": "1", "DEVICE_WORK": str(work), **env}
    return run(["bash", SCRIPT, "--dry-run", "--no-install", "--out", out, *args], env=env, cwd=REPO)


def one_error_line_and_nothing_written(proc, says, out):
    assert proc.returncode == 2 and proc.stderr.strip().startswith("error: "), proc.stderr
    assert says in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, proc.stderr
    assert not out.exists()


def test_bad_options_are_one_error_line_before_anything(tmp_path):
    out, python = tmp_path / "out", recorder(tmp_path)  # should a bad option pass, no real gpu_check runs
    for args, says in (
        (["--seconds", "5"], "--seconds 5: a whole number from 60 to 3600 (with --dry-run)"),
        (["--seconds", "3601"], "--seconds 3601: a whole number from 60 to 3600"),
        # bash arithmetic wraps at 2^63: 2^64 + 480 would have been read as 480
        (["--seconds", "18446744073709552096"], "--seconds 18446744073709552096: a whole number from 60"),
        (["--data", tmp_path / "no-data"], "no-data: --data: no such folder"),
        (["--frobnicate"], "--frobnicate: unknown option"),
    ):
        one_error_line_and_nothing_written(device_check(out, tmp_path / "work", *args, python=python), says, out)
    proc = run(["bash", SCRIPT, "--dry-run"], env={"OUT": ""}, cwd=REPO)
    assert proc.returncode == 2 and "no --out DIR and no $OUT" in proc.stderr
    env = {"TMPDIR": str(tmp_path), "PYTHON": str(python)}  # the default scratch folder, should a case get there
    # the lent machine stops a command at 600 s: a longer run could never use its budget
    proc = run(["bash", SCRIPT, "--no-install", "--seconds", "571", "--out", out], env=env, cwd=REPO)
    one_error_line_and_nothing_written(proc, "--seconds 571: a whole number from 60 to 570 (the device tool", out)
    # the H200's second call (docs/gpu_runs/2026-11-27-h200-second): 300 s could not hold the install
    proc = run(["bash", SCRIPT, "--seconds", "300", "--out", out], env=env, cwd=REPO)
    one_error_line_and_nothing_written(proc, "--seconds 300: at least 420 with the install", out)
    # a bundle that is not there: refused before --out is made
    proc = run(["bash", SCRIPT, "--bundle", tmp_path / "no-bundle", "--out", out], env=env, cwd=REPO)
    one_error_line_and_nothing_written(proc, "no-bundle: no device bundle", out)


def recorder(tmp_path):
    """A stand-in Python (gpu_check among its calls) that records its arguments in tmp_path/calls.txt."""
    python = tmp_path / "python"
    python.write_text(f'#!/bin/sh\necho "$*" >> {tmp_path / "calls.txt"}\n')
    python.chmod(0o755)
    return python


def gpu_check_call(tmp_path):
    lines = (tmp_path / "calls.txt").read_text().splitlines()
    return [line for line in lines if "-m seed_fairseq.workflows.gpucheck" in line][-1].split()


def test_seconds_are_decimal(tmp_path):
    """0100 is 100 s (bash arithmetic read it as octal 64, and 08 or 09 not at all): gpu_check's budget is
    what is left of them less the 20 s kept for the report."""
    proc = device_check(tmp_path / "out", tmp_path / "work", "--seconds", "0100", python=recorder(tmp_path))
    assert proc.returncode == 0, proc.stderr
    call = gpu_check_call(tmp_path)
    assert 70 < int(call[call.index("--budget-seconds") + 1]) <= 80, call


def test_the_default_scratch_folder_is_this_users_own(tmp_path):
    """The venv and gpu_check's scratch folder default to this user's folder of mode 0700 in $TMPDIR (or /tmp),
    made by the first run and reused by the next; a path someone else made there first (a link, a folder
    others may write in) is refused before anything runs from it or is written."""
    python, out = recorder(tmp_path), tmp_path / "out"
    own = tmp_path / "tmp" / f"seed-fairseq-device-{os.getuid()}"
    own.parent.mkdir()
    env = {"PYTHON": str(python), "TMPDIR": str(own.parent), "DEVICE_VENV": "", "DEVICE_WORK": ""}
    for _ in range(2):  # made, then reused (a second call on the warm machine runs the first one's venv)
        proc = run(["bash", SCRIPT, "--dry-run", "--no-install", "--out", out], env=env, cwd=REPO)
        assert proc.returncode == 0, proc.stderr
        call = gpu_check_call(tmp_path)
        assert call[call.index("--out") + 1] == str(own / "work"), call
        assert own.is_dir() and not own.is_symlink() and own.stat().st_mode & 0o777 == 0o700
    # planted: a link to someone's folder with a venv whose python would run in the install, or a folder
    # others may write in
    theirs = tmp_path / "theirs"
    (theirs / "venv" / "bin").mkdir(parents=True)
    planted = theirs / "venv" / "bin" / "python"
    planted.write_text(f"#!/bin/sh\ntouch {tmp_path / 'ran'}\n")
    planted.chmod(0o755)
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    for plant in ("link", "mode 0777"):
        if own.is_symlink():
            own.unlink()
        else:
            own.rmdir()
        if plant == "link":
            own.symlink_to(theirs)
        else:
            own.mkdir()
            own.chmod(0o777)
        out = tmp_path / f"out-{plant.split()[0]}"
        proc = run(["bash", SCRIPT, "--dry-run", "--bundle", bundle, "--seconds", "420", "--out", out], env=env,
                   cwd=REPO)  # fmt: skip
        one_error_line_and_nothing_written(proc, f"{own}: not a folder of this user's with mode 0700", out)
        assert not (tmp_path / "ran").exists()


def test_the_bundles_data_set_is_passed_to_gpu_check(tmp_path):
    """The bundle's data/ (device_bundle.sh: the Wikipedia sample's build, 32,768 pieces) goes to gpu_check
    as --data, and the summary says so; a bundle without it leaves gpu_check to build the demo corpus.
    gpu_check itself is a stand-in here that records its arguments."""
    calls = tmp_path / "calls.txt"
    python = tmp_path / "python"
    python.write_text('#!/bin/sh\necho "$*" >> "$CALLS"\n')
    python.chmod(0o755)
    bundle = tmp_path / "bundle"
    (bundle / "data").mkdir(parents=True)
    (bundle / "data" / "preprocess.json").write_text('{\n  "config": {\n    "vocab_size": 32768\n  }\n}\n')
    for name, has_data in (("with", True), ("without", False)):
        out = tmp_path / name
        where = bundle if has_data else tmp_path / "no-bundle"
        extra = ["--", "--objectives", "simlm,cpdae"] if has_data else []
        proc = device_check(out, tmp_path / "work", "--bundle", where, *extra, python=python, CALLS=str(calls))
        assert proc.returncode == 0, proc.stderr
        lines = calls.read_text().splitlines()
        gpu_check = [line for line in lines if "-m seed_fairseq.workflows.gpucheck" in line][-1]
        summary = (out / "device_check.txt").read_text()
        if has_data:
            assert f"--data {bundle}/data --out" in gpu_check, gpu_check
            assert gpu_check.endswith("--objectives simlm,cpdae"), gpu_check  # after `--`: gpu_check's own
            assert f"data: {bundle}/data (32768 pieces; gpu_check --data checks it)" in summary, summary
        else:
            assert "--data" not in gpu_check, gpu_check
            assert "data: none in" in summary and "gpu_check builds the demo corpus" in summary, summary


def test_one_thread_per_process_in_the_dry_run_only(tmp_path):
    """The GPU machine's CPU runs the export's numeric check: all its cores there (one thread cost the H200's
    first run over 80 s of its budget); the dry run on a shared CI machine keeps one."""
    python = tmp_path / "python"
    python.write_text('#!/bin/sh\necho "threads=${OMP_NUM_THREADS:-all}"\n')
    python.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if k != "OMP_NUM_THREADS"}
    for args, says in ((["--dry-run"], "threads=1"), (["--out", "x"], "threads=all")):
        proc = subprocess.run(["bash", REPO / "scripts" / "gpu_check.sh", *args], env=dict(env, PYTHON=str(python)),
                              capture_output=True, text=True, cwd=tmp_path)  # fmt: skip
        assert proc.stdout.strip() == says, (args, proc.stdout, proc.stderr)


@pytest.mark.slow
def test_dry_run_passes_every_check_within_the_budget(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    # no bundle: gpu_check builds its data from the demo corpus (a bundle's data/ would be passed as --data)
    proc = device_check(out, work, "--seconds", "420", "--bundle", tmp_path / "no-bundle")
    summary = (out / "device_check.txt").read_text()
    assert proc.returncode == 0, f"{summary}\n{proc.stderr[-3000:]}\n{(out / 'gpu_check.log').read_text()[-6000:]}"
    # what the device tool brings back: at most 8 files, none in a folder
    files = sorted(p.name for p in out.iterdir())
    assert all((out / f).is_file() for f in files) and len(files) <= 8, files
    assert files == ["device_check.txt", "gpu_check.json", "gpu_check.log", "gpu_check.md", "nvidia-smi.txt",
                     "versions.txt"]  # fmt: skip
    assert "install: skipped (--no-install)" in summary and "gpu_check: exit 0" in summary
    assert "data: none in" in summary and "Data: a 500-piece vocabulary" in summary, summary
    rep = json.loads((out / report.JSON_NAME).read_text())
    assert rep["dry_run"] is True and rep["device"] == "cpu" and rep["passed"] is True and rep["failed"] == []
    assert rep["not_run"] == [] and 0 < rep["budget_seconds"] <= 400
    names = [c["name"].replace(" bf16", "", 1) if c["name"].startswith("train ") else c["name"] for c in rep["checks"]]
    assert names == EXPECTED_CHECKS
    assert {c["status"] for c in rep["checks"]} == {"pass"}
    # the data-parallel check really ran 2 gloo processes
    dp = next(c for c in rep["checks"] if c["name"] == "data parallel")
    assert "2 processes (gloo)" in dp["detail"]
    assert sorted(rep["objectives"]) == sorted(OBJECTIVE_NAMES + REFERENCE_RUNS)
    for name, entry in rep["objectives"].items():
        t = entry["training"]["bf16"]  # fairseq's mixed-precision trainer, on the CPU
        # the reference is masked_lm's model: it starts where masked_lm's search ended
        search = [[8, True]] if name in REFERENCE_RUNS else [[2, True], [4, True], [8, True]]
        assert t["batch"] == 8 and t["search"] == search, name
        optimizer = REFERENCE_OPTIMIZER if name in REFERENCE_RUNS else DEFAULT_OPTIMIZER
        assert t["optimizer"] == optimizer, name
        # words/s: after the counted update and 1 of warm-up, on 4 (two halves of 2)
        assert t["measured_updates"] == 4 and t["warmup_updates"] == 1 and len(t["words_per_second_halves"]) == 2
        # the budget leaves room for every update the dry run plans
        assert t["updates"] == t["updates_planned"] == 6 and not t["stopped_early"], name
        assert len(t["losses"]) == 6 and t["losses"][-1] < t["losses"][0], name
        assert t["overflows"] == 0 and t["peak_memory"] > 0 and t["words_per_second"] > 0, name
        assert t["flops_per_token"] > 0 and 0 < t["mfu"] < 1, name
        assert t["memory_vs_masked_lm"] > 0, name
        # the encoder's input tokens, each once: two views of a text (CPDAE's, coCondenser's spans) count
        # twice, CPDAE's first view, recomputed in backward, is not a third
        views = round(1 / FACTORS.get(name, 1.0))  # the fairseq references: one view
        assert 0 < t["tokens_per_update"] <= t["batch"] * 48 * views, name
        if name in REFERENCE_RUNS:
            assert "fixed_batch" not in entry, name
            continue
        fixed = entry["fixed_batch"]["bf16"]
        assert fixed["bands"] == [3e-2, 1.5e-1], name
        assert fixed["relative_difference"]["loss"] <= 3e-2 and fixed["relative_difference"]["gnorm"] <= 1.5e-1, name
        assert entry["projection"]["gpus"]["8"]["measured_hours"] > 0, name
    assert rep["objectives"]["masked_lm"]["training"]["bf16"]["speed_vs_masked_lm"] == 1.0
    assert rep["encoding"]["bf16"]["docs_per_second"] > 0
    # the data set it built, and what the report says of it
    data = rep["data"]
    assert data["given"] is False and data["vocab_size"] == rep["profile"]["vocab_size"] == 500, data
    assert [(s["kind"], s["file"]) for s in data["sources"]] == [("text", "demo_corpus.txt")] and data["copies"] == 1
    md = (out / report.MARKDOWN_NAME).read_text()
    assert md.startswith("# gpu_check: PASSED (dry run on the CPU)")
    for name in EXPECTED_CHECKS:
        assert f"| {name}" in md
    assert "## The paper's run (1,000,000 updates x 256 x 512 tokens), projected" in md
    # the kernel profile of every run, in both files (issue 44): the CPU's aten ops in the dry run
    section = rep["kernel_profile"]
    assert section["title"] == "Kernel profile" and set(section["classes"]) == set(kernels.CLASSES)
    profiles = {r["objective"]: r for r in section["runs"]}
    assert sorted(profiles) == sorted(OBJECTIVE_NAMES + REFERENCE_RUNS)
    assert "## Kernel profile" in md and "profiled: CPU aten ops (self time)" in md
    for name, r in profiles.items():
        assert r["precision"] == "bf16" and r["status"] == "ok" and r["activity"] == "CPU aten ops (self time)", r
        assert r["updates"] == 2 and r["launches_per_update"] > 100 and len(r["top"]) == kernels.TOP, name
        assert sum(c["share"] for c in r["classes"].values()) == pytest.approx(1.0), name
        for key in ("gemm", "attention", "vocabulary", "elementwise", "optimizer", "gradient_norm", "host_gaps"):
            assert r["classes"][key]["share"] > 0, (name, key)
        optimizer = f"fairseq's {REFERENCE_OPTIMIZER} (reference)" if name in REFERENCE_RUNS else DEFAULT_OPTIMIZER
        assert f"| {name} | bf16 | {optimizer} | 2 | " in md, name
        assert f"### {name} bf16 ({optimizer}): the 15 kernels with the most time" in md, name
    log = (out / "gpu_check.log").read_text()
    assert json.loads([line for line in log.splitlines() if line.startswith("{")][-1])["passed"] is True
    assert os.path.isfile(work / "work" / "hf" / "config.json")


# ---- issue 43: a signal stops the whole tree ---------------------------------------------------------

# Stands in for a Python: says 3.12 (device_bundle.sh asks) and ends every other call at once, but for the
# one whose arguments hold $STAGE (a maker, the install's first step): that one records its pid, runs a
# child that records its own and waits (pip, a worker), and should it ever go on, replaces the bundle.
STAND_IN = """#!/bin/bash
[ "$1" = -c ] && { echo 3.12; exit 0; }
case "$*" in *"$STAGE"*) ;; *) exit 0 ;; esac
echo $$ > "$PIDS/maker"
bash -c 'echo $$ > "$PIDS/child"; exec sleep 600'
echo replaced > "$BUNDLE/keep.txt"
"""


def stand_in(tmp_path, stage):
    python, pids, bundle = tmp_path / "python", tmp_path / "pids", tmp_path / "bundle"
    python.write_text(STAND_IN)
    python.chmod(0o755)
    pids.mkdir()
    bundle.mkdir()
    (bundle / "keep.txt").write_text("old\n")
    return python, {"PYTHON": str(python), "STAGE": stage, "PIDS": str(pids), "BUNDLE": str(bundle)}


def start(cmd, tmp_path, **env):
    """``cmd`` in a session of its own, its output in files (a process it leaves holds no pipe of the test's)."""
    with open(tmp_path / "stdout.txt", "w") as out, open(tmp_path / "stderr.txt", "w") as err:
        return subprocess.Popen([str(c) for c in cmd], cwd=REPO, stdout=out, stderr=err, start_new_session=True,
                                env=dict(os.environ, OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", **env))  # fmt: skip


def interrupt_when(ready, proc, sig):
    """``sig`` once ``ready()``, as Ctrl-C sends it (to the terminal's foreground process group) or ``kill``
    (to the process); then the exit status (None: still running after 60 s) and the command lines of the
    processes that were under ``proc`` at the signal and outlived it (killed here, once listed)."""
    _wait_for(lambda: ready() or proc.poll() is not None, 120, "the step to start")
    assert proc.poll() is None, f"ended before the signal: exit {proc.returncode}"
    tree, todo = [], [proc.pid]
    while todo:
        kids = _children(todo.pop())
        tree, todo = tree + kids, todo + kids
    if sig == signal.SIGINT:
        os.killpg(proc.pid, sig)
    else:
        proc.send_signal(sig)
    try:
        code = proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        code = None
        proc.kill()
        proc.wait()
    _gone_within(tree, 2.0)
    left = {}
    for pid in tree:
        try:
            if _stat(pid):
                left[pid] = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                os.kill(pid, signal.SIGKILL)
        except OSError:  # gone meanwhile (ProcessLookupError is one)
            left.pop(pid, None)
    return code, left


@pytest.mark.slow
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_signal_during_gpu_check_stops_the_whole_tree(tmp_path, sig):
    """gpu_check's data-parallel check (test_faults_gpucheck's driver: a stand-in trainer, two torchrun workers
    waiting) under device_check.sh: Ctrl-C (which `timeout`'s own process group never saw), SIGTERM or SIGHUP
    stops timeout, gpu_check, torchrun and the workers, the report gpu_check wrote on the way out is copied
    and device_check.txt says "interrupted"."""
    fake, driver, wrapper = tmp_path / "fake_train.py", tmp_path / "driver.py", tmp_path / "python"
    fake.write_text(f"#!{sys.executable}\n{FAKE_TRAIN}")
    fake.chmod(0o755)
    driver.write_text(DRIVER)
    # gpu_check.sh runs `$PYTHON -m seed_fairseq.workflows.gpucheck ... --out WORK ...`: the driver on WORK;
    # the machine's facts (the other calls) end at once
    wrapper.write_text(
        '#!/bin/bash\ncase "$*" in *gpucheck*) ;; *) exit 0 ;; esac\n'
        f'while [ "$1" != --out ]; do shift; done\nexec {sys.executable} {driver} {fake} "$2"\n'
    )
    wrapper.chmod(0o755)
    out, work = tmp_path / "out", tmp_path / "work"
    proc = start(["bash", SCRIPT, "--dry-run", "--no-install", "--seconds", "120", "--out", out], tmp_path,
                 PYTHON=str(wrapper), DEVICE_WORK=str(work))  # fmt: skip
    workers = work / "work" / "data-parallel"
    code, left = interrupt_when(lambda: len(list(workers.glob("worker-*.pid"))) >= 2, proc, sig)
    summary = (out / "device_check.txt").read_text()
    assert code == 128 + sig, f"exit {code}\n{summary}{(tmp_path / 'stderr.txt').read_text()[-2000:]}"
    assert not left, f"left running: {left}"
    assert f"device_check: interrupted ({sig.name}) during gpu_check" in summary, summary
    rep = json.loads((out / report.JSON_NAME).read_text())
    assert [(c["name"], c["status"]) for c in rep["checks"]] == [("data parallel", "not run"), ("HF export", "not run")]
    assert f"interrupted ({sig.name})" in rep["checks"][0]["detail"], rep["checks"]
    assert "report: gpu_check: INCOMPLETE" in summary and (out / report.MARKDOWN_NAME).is_file(), summary


@pytest.mark.slow
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_signal_during_the_install_stops_it(tmp_path, sig):
    """setup_env.sh's first step (wheelhouse.py check, a stand-in that waits with a child) under device_check.sh:
    the signal stops the install's whole tree; no report (gpu_check never ran), the summary says where."""
    _, env = stand_in(tmp_path, "wheelhouse.py check")
    out = tmp_path / "out"
    proc = start(["bash", SCRIPT, "--dry-run", "--bundle", env["BUNDLE"], "--seconds", "420", "--out", out], tmp_path,
                 DEVICE_VENV=str(tmp_path / "venv"), DEVICE_WORK=str(tmp_path / "work"), **env)  # fmt: skip
    code, left = interrupt_when((tmp_path / "pids" / "child").exists, proc, sig)
    summary = (out / "device_check.txt").read_text()
    assert code == 128 + sig and not left, (code, left, summary)
    assert f"device_check: interrupted ({sig.name}) during the install" in summary, summary
    assert not (out / report.JSON_NAME).exists() and (out / "install.log").is_file()


@pytest.mark.slow
@pytest.mark.parametrize("stage", ["preprocess.build", "wheelhouse.py make"])
@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_signal_stops_device_bundles_maker_and_leaves_the_bundle(tmp_path, sig, stage):
    """device_bundle.sh's makers (stand-ins that wait with a child, then would replace the bundle): the signal
    stops the maker's whole tree, so nothing replaces the existing bundle afterwards; exit 128 + N."""
    python, env = stand_in(tmp_path, stage)
    sample = tmp_path / "sample.xml.bz2"  # the data set's build runs when the sample is there
    sample.write_bytes(b"")
    bundle = tmp_path / "bundle"
    proc = start(["bash", BUNDLE_SCRIPT, "--wiki", sample, bundle], tmp_path, PYTHON312=str(python), **env)
    code, left = interrupt_when((tmp_path / "pids" / "child").exists, proc, sig)
    err = (tmp_path / "stderr.txt").read_text()
    assert code == 128 + sig and not left, (code, left, err)
    assert f"device_bundle: interrupted ({sig.name}): the maker is stopped" in err, err
    assert [p.name for p in bundle.iterdir()] == ["keep.txt"] and (bundle / "keep.txt").read_text() == "old\n"
