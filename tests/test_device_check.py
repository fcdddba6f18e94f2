"""scripts/device_check.sh's gpu_check part in CI: the dry run (the GPU checks' code path on the CPU at
tiny shape, every check passing) as the lent machine runs it, under a time budget, with what comes back
in OUT within the device tool's limits (at most 8 files, no folder).  The install part is the opt-in
rehearsal (tests/test_device_rehearsal.py)."""

import json
import os
import sys

import pytest
from helpers import REPO, run
from test_gpu_check import OBJECTIVE_NAMES

from seed_fairseq.gpucheck import report

SCRIPT = REPO / "scripts" / "device_check.sh"
EXPECTED_CHECKS = (
    ["generator"]
    + [f"{kind} {name}" for name in OBJECTIVE_NAMES for kind in ("train", "bf16 vs fp32")]
    + ["data parallel", "HF export", "encode bf16", "faiss"]
)


def device_check(out, work, *args):
    env = {"PYTHON": sys.executable, "MKL_NUM_THREADS": "1", "DEVICE_WORK": str(work)}
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


@pytest.mark.slow
def test_dry_run_passes_every_check_within_the_budget(tmp_path):
    out, work = tmp_path / "out", tmp_path / "work"
    proc = device_check(out, work, "--seconds", "420")
    summary = (out / "device_check.txt").read_text()
    assert proc.returncode == 0, f"{summary}\n{proc.stderr[-3000:]}\n{(out / 'gpu_check.log').read_text()[-6000:]}"
    # what the device tool brings back: at most 8 files, none in a folder
    files = sorted(p.name for p in out.iterdir())
    assert all((out / f).is_file() for f in files) and len(files) <= 8, files
    assert files == ["device_check.txt", "gpu_check.json", "gpu_check.log", "gpu_check.md", "nvidia-smi.txt",
                     "versions.txt"]  # fmt: skip
    assert "install: skipped (--no-install)" in summary and "gpu_check: exit 0" in summary
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
    md = (out / report.MARKDOWN_NAME).read_text()
    assert md.startswith("# gpu_check: PASSED (dry run on the CPU)")
    for name in EXPECTED_CHECKS:
        assert f"| {name}" in md
    assert "## The paper's run (1,000,000 updates x 256 x 512 tokens), projected" in md
    log = (out / "gpu_check.log").read_text()
    assert json.loads([line for line in log.splitlines() if line.startswith("{")][-1])["passed"] is True
    assert os.path.isfile(work / "work" / "hf" / "config.json")
