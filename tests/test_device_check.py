"""scripts/device_check.sh's gpu_check part in CI: the dry run (the GPU checks' code path on the CPU at
tiny shape, every check passing) as the lent machine runs it, under a time budget, with what comes back
in OUT within the device tool's limits (at most 8 files, no folder).  The install part is the opt-in
rehearsal (tests/test_device_rehearsal.py)."""

import json
import os
import subprocess
import sys

import pytest
from helpers import REPO, run
from test_gpu_check import OBJECTIVE_NAMES

from seed_fairseq.workflows.gpucheck import report

SCRIPT = REPO / "scripts" / "device_check.sh"
EXPECTED_CHECKS = (
    ["generator"]
    + [f"{kind} {name}" for name in OBJECTIVE_NAMES for kind in ("train", "bf16 vs fp32")]
    + ["data parallel", "HF export", "encode bf16", "faiss"]
)


def device_check(out, work, *args, python=sys.executable, **env):
    env = {"PYTHON": str(python), "MKL_NUM_THREADS": "1", "DEVICE_WORK": str(work), **env}
    return run(["bash", SCRIPT, "--dry-run", "--no-install", "--out", out, *args], env=env, cwd=REPO)


def test_bad_options_are_one_error_line(tmp_path):
    for args, says in (
        (["--seconds", "5"], "--seconds 5: a whole number, 60 or more"),
        (["--frobnicate"], "--frobnicate: unknown option"),
    ):
        proc = device_check(tmp_path / "out", tmp_path / "work", *args)
        assert proc.returncode == 2 and proc.stderr.strip().startswith("error: "), proc.stderr
        assert says in proc.stderr and len(proc.stderr.strip().splitlines()) == 1
    proc = run(["bash", SCRIPT, "--dry-run"], env={"OUT": ""}, cwd=REPO)
    assert proc.returncode == 2 and "no --out DIR and no $OUT" in proc.stderr
    # the H200's second call (docs/gpu_runs/2026-11-27-h200-second): 300 s could not hold the install
    proc = run(["bash", SCRIPT, "--seconds", "300", "--out", tmp_path / "short"], cwd=REPO)
    assert proc.returncode == 2 and "--seconds 300: at least 420 with the install" in proc.stderr, proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1 and not (tmp_path / "short").exists()


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
    assert sorted(rep["objectives"]) == sorted(OBJECTIVE_NAMES)
    for name, entry in rep["objectives"].items():
        t = entry["training"]["bf16"]  # fairseq's mixed-precision trainer, on the CPU
        assert t["batch"] == 8 and t["search"] == [[2, True], [4, True], [8, True]], name
        # the budget leaves room for every update the dry run plans
        assert t["updates"] == t["updates_planned"] == 6 and not t["stopped_early"], name
        assert len(t["losses"]) == 6 and t["losses"][-1] < t["losses"][0], name
        assert t["overflows"] == 0 and t["peak_memory"] > 0 and t["words_per_second"] > 0, name
        assert t["flops_per_token"] > 0 and 0 < t["mfu"] < 1, name
        assert t["memory_vs_masked_lm"] > 0, name
        # the encoder's input tokens, each once: CPDAE's first view, recomputed in backward, is not a third
        views = 2 if name == "cpdae" else 1
        assert 0 < t["tokens_per_update"] <= t["batch"] * 48 * views, name
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
    log = (out / "gpu_check.log").read_text()
    assert json.loads([line for line in log.splitlines() if line.startswith("{")][-1])["passed"] is True
    assert os.path.isfile(work / "work" / "hf" / "config.json")
