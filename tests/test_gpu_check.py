"""scripts/gpu_check.sh: the batch search, the report's arithmetic, the one line without CUDA, and the
dry run (the GPU checks' code path on the CPU at tiny shape) passing every check."""

import json
import sys

import pytest
from helpers import REPO, run

from seed_fairseq.workflows.gpucheck import cli, report
from seed_fairseq.workflows.gpucheck.profile import device_family, peak_tflops
from seed_fairseq.workflows.gpucheck.search import largest_batch

SCRIPT = REPO / "scripts" / "gpu_check.sh"


def _plugin_objectives():
    """The objectives gpu_check trains, in its order: the plugin's own (registry order), then fairseq's
    masked_lm (an objective of a test's --user-dir registered in this process is not fairseq-train's)."""
    from fairseq.tasks import TASK_REGISTRY

    import seed_fairseq  # noqa: F401  (registers the plugin)
    from seed_fairseq.pretrain.tasks.registry import registered_objectives

    own = [d.name for d in registered_objectives() if TASK_REGISTRY[d.task].__module__.startswith("seed_fairseq.")]
    return own + ["masked_lm"]


OBJECTIVE_NAMES = _plugin_objectives()
assert {"seed", "seed_full", "mlm_only", "retromae", "dupmae", "simlm", "cpdae", "bowpred"} <= set(OBJECTIVE_NAMES)


def fits_below(limit, calls=None):
    def fits(batch):
        if calls is not None:
            calls.append(batch)
        return batch <= limit

    return fits


def test_largest_batch_doubles_then_bisects():
    assert largest_batch(fits_below(37), start=8, limit=256, probes=7) == (
        36,
        [(8, True), (16, True), (32, True), (64, False), (48, False), (40, False), (36, True)],
    )
    # with probes to spare it finds the exact size
    assert largest_batch(fits_below(37), start=8, limit=256, probes=20)[0] == 37


def test_largest_batch_edges():
    assert largest_batch(fits_below(1000), start=8, limit=24, probes=7) == (24, [(8, True), (16, True), (24, True)])
    # the first size does not fit: smaller ones are tried
    assert largest_batch(fits_below(3), start=8, limit=256, probes=7) == (
        3,
        [(8, False), (4, False), (2, True), (3, True)],
    )
    assert largest_batch(fits_below(0), start=1, limit=4, probes=3) == (0, [(1, False)])
    calls = []
    largest_batch(fits_below(100, calls), start=8, limit=256, probes=2)
    assert calls == [8, 16]  # never more probes than allowed
    with pytest.raises(ValueError):
        largest_batch(fits_below(3), start=0, limit=4, probes=3)


def test_peaks_by_device_name():
    assert device_family("NVIDIA H100 80GB HBM3") == "H100"
    assert device_family("NVIDIA H200") == "H200"
    assert device_family("Tesla V100-SXM2-32GB") == "V100"
    assert device_family("NVIDIA A100-SXM4-40GB") == "A100"
    assert device_family("NVIDIA GeForce RTX 4090") is None
    assert peak_tflops("NVIDIA H100 80GB HBM3", "bf16") == 989.4
    assert peak_tflops("Tesla V100-SXM2-32GB", "fp16") == 125.0
    assert peak_tflops("Tesla V100-SXM2-32GB", "bf16") is None
    assert peak_tflops("NVIDIA GeForce RTX 4090", "fp16") is None
    assert peak_tflops("NVIDIA GeForce RTX 4090", "fp16", override=165.0) == 165.0


def test_projection_of_the_paper_run():
    """1M updates x 256 x 512 tokens = 1.31072e11 tokens: at 1e5 tokens/s per GPU on 8 GPUs,
    1.31072e11 / 8e5 / 3600 = 45.511 h; at 1 GFLOP/token on 100 TFLOP/s at 40% MFU,
    1.31072e20 / (8 x 1e14 x 0.4) / 3600 = 113.778 h."""
    p = report.projection(flops_per_token=1e9, words_per_second=1e5, peak_tflops=100.0)
    assert p["flops_per_update"] == pytest.approx(1e9 * 256 * 512)
    row = p["gpus"]["8"]
    assert row["measured_hours"] == pytest.approx(45.5111, rel=1e-4)
    assert row["measured_gpu_hours"] == pytest.approx(8 * 45.5111, rel=1e-4)
    assert row["estimated_hours"] == pytest.approx(113.7778, rel=1e-4)
    assert p["gpus"]["64"]["estimated_gpu_hours"] == pytest.approx(8 * 113.7778, rel=1e-4)
    assert report.projection(1e9, None, None)["gpus"]["8"] == {}


def test_a_failed_check_is_exit_status_1_and_in_the_report(tmp_path, monkeypatch):
    """The report lists the failed check and the command exits 1 (the checks themselves stubbed)."""

    class Stub(cli.GpuCheck):
        def prepare(self):
            self.start = 0.0

        def run(self):
            self.add(report.Check("train seed fp32", report.PASS, "ok"))
            self.add(report.Check("faiss", report.FAIL, "faiss scores differ by 0.5 > 1e-3"))
            return report.build(self.p, self.checks, self.objectives, 1.0)

    monkeypatch.setattr(cli, "GpuCheck", Stub)
    assert cli.main(["--dry-run", "--out", str(tmp_path / "out")]) == 1
    rep = json.loads((tmp_path / "out" / report.JSON_NAME).read_text())
    assert rep["passed"] is False and rep["failed"] == ["faiss"]
    md = (tmp_path / "out" / report.MARKDOWN_NAME).read_text()
    assert md.startswith("# gpu_check: FAILED") and "| faiss | fail | faiss scores differ by 0.5 > 1e-3 |" in md


def test_data_given_with_data_is_trained_on_where_it_is_and_reported(tmp_path, monkeypatch, demo_data_bin):
    """--data DIR (the device bundle's Wikipedia build): no data set is built, every run reads DIR, and
    the report states DIR's vocabulary and the text it came from (the checks themselves stubbed)."""
    seen = {}

    class Stub(cli.GpuCheck):
        def run(self):
            seen.update(data=self.data, vocab=self.p.vocab_size)
            self.add(report.Check("generator", report.PASS, "ok"))
            return self.write_report()

    monkeypatch.setattr(cli, "GpuCheck", Stub)
    out = tmp_path / "out"
    assert cli.main(["--dry-run", "--out", str(out), "--data", str(demo_data_bin)]) == 0
    assert seen == {"data": demo_data_bin, "vocab": 500}
    assert not (out / "data-bin").exists()
    rep = json.loads((out / report.JSON_NAME).read_text())
    assert rep["profile"]["vocab_size"] == 500
    data = rep["data"]
    assert data["given"] is True and data["folder"] == str(demo_data_bin) and data["vocab_size"] == 500
    assert [(s["kind"], s["file"]) for s in data["sources"]] == [("text", "demo_corpus.txt")]
    assert data["train_tokens"] > 0
    md = (out / report.MARKDOWN_NAME).read_text()
    assert f"Data: a 500-piece vocabulary, {data['train_tokens']:,} training tokens; the --data folder " in md
    assert f"from text demo_corpus.txt (sha256 {data['sources'][0]['sha256'][:12]})." in md


def test_an_output_folder_of_someone_else_is_refused(tmp_path, capsys):
    theirs = tmp_path / "theirs"
    theirs.mkdir()
    (theirs / "notes.txt").write_text("mine")
    assert cli.main(["--dry-run", "--out", str(theirs)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {theirs}: folder is not empty")
    assert sorted(p.name for p in theirs.iterdir()) == ["notes.txt"]


def test_a_missing_corpus_is_one_error_line(tmp_path, capsys):
    missing = tmp_path / "nope.txt"
    assert cli.main(["--dry-run", "--out", str(tmp_path / "out"), "--corpus", str(missing)]) == 2
    assert capsys.readouterr().err.strip() == f"error: {missing}: corpus not found (pass --corpus FILE)"
    assert not (tmp_path / "out").exists()


def _script(*args, **env):
    return run(["bash", SCRIPT, *args], env={"PYTHON": sys.executable, "MKL_NUM_THREADS": "1", **env}, cwd=REPO)


@pytest.mark.slow
def test_without_cuda_one_line_and_exit_0(tmp_path):
    proc = _script("--out", tmp_path / "out", CUDA_VISIBLE_DEVICES="")
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("gpu_check: no CUDA device on this machine"), proc.stdout
    assert "--dry-run" in lines[0]
    assert not (tmp_path / "out").exists()  # nothing written


class FakeRun:
    """Stands in for ``runs.Run`` on a device: an update of more than ``room`` blocks runs out of memory,
    and the updates listed in ``overflow`` overflow (fairseq then logs no loss)."""

    made = []

    def __init__(self, data, args, device, room=12, overflow=()):
        self.room, self.overflow, self.calls, self.tokens, self.cuda_peak = room, set(overflow), 0, 0, 0
        self.overflows = type("Counter", (), {"count": 0})()
        self.trainer = type("T", (), {"zero_grad": lambda self: None})()
        FakeRun.made.append(self)

    def sample_of(self, blocks):
        return {"blocks": blocks}

    def next_sample(self):
        return {"blocks": 4}

    def step(self, sample, raise_oom=False):
        if sample["blocks"] > self.room:
            raise RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB")
        self.calls += 1
        self.tokens += 10
        if self.calls in self.overflow:
            self.overflows.count += 1
            return {"seconds": 0.5, "loss_scale": 64.0}
        return {"seconds": 0.5, "loss": 10.0 - self.calls, "gnorm": 1.0, "loss_scale": 128.0}

    def counted_step(self, sample):
        return dict(self.step(sample), flops=1000.0, tokens=10.0)

    def close(self):
        pass


def test_the_search_predicate_answers_out_of_memory_with_false(monkeypatch):
    from seed_fairseq.workflows.gpucheck import runs

    monkeypatch.setattr(runs, "Run", FakeRun)
    probe = runs.fits("data", [], "cpu")
    assert largest_batch(probe, start=8, limit=256, probes=7)[0] == 12
    probe.close()
    FakeRun.made.clear()
    # any other error is not "does not fit": it is raised
    monkeypatch.setattr(FakeRun, "sample_of", lambda self, blocks: {"blocks": "x"})
    with pytest.raises(TypeError):
        runs.fits("data", [], "cpu")(8)


def test_an_overflowed_step_is_not_an_update_and_not_a_nan_loss(monkeypatch):
    from seed_fairseq.workflows.gpucheck import runs

    monkeypatch.setattr(runs, "Run", lambda data, args, device: FakeRun(data, args, device, overflow={2}))
    t = runs.train("data", [], "cpu", updates=6, batch=4)
    # fairseq skips an overflowed step (no weight changes, num_updates unchanged): 6 updates take 7 steps
    assert t.updates == 6 and t.steps == 7 and t.overflows == 1
    assert t.losses == [9.0, 7.0, 6.0, 5.0, 4.0, 3.0]
    assert t.loss_scales == [128.0, 64.0, 128.0, 128.0, 128.0, 128.0, 128.0]
    assert t.finite and t.falling and t.problems(6) == []
    assert t.tokens == 60 and t.seconds == 3.0 and t.words_per_second == 20.0  # the first step is not timed
    assert t.flops_per_token == 100.0 and t.mfu(1e-12) == pytest.approx(100.0 * 20.0 / 1.0)
    # losses that do not fall, or a NaN, are what the check fails on
    assert runs.Training(4, 3, losses=[5.0, 5.0, 5.1]).problems(3) == ["loss not falling"]
    assert runs.Training(4, 3, losses=[5.0, float("nan"), 4.0]).problems(3) == ["non-finite loss"]


def test_fp16_settling_its_loss_scale_passes_a_scale_that_never_settles_fails(monkeypatch):
    """The lent H200's first run (docs/gpu_runs/2026-11-27-h200): fairseq's masked_lm (its loss summed over
    ~20k masked tokens) overflowed its first 2 steps at fp16's initial scale; 3 steps were counted as 3
    updates, 1 applied, and the check failed as "loss not falling"."""
    from seed_fairseq.workflows.gpucheck import runs

    monkeypatch.setattr(runs, "Run", lambda data, args, device: FakeRun(data, args, device, overflow={1, 2}))
    t = runs.train("data", [], "cpu", updates=3, batch=4)
    assert (t.updates, t.steps, t.overflows, t.losses) == (3, 5, 2, [7.0, 6.0, 5.0])
    assert t.problems(3) == []
    every = set(range(1, 100))
    monkeypatch.setattr(runs, "Run", lambda data, args, device: FakeRun(data, args, device, overflow=every))
    t = runs.train("data", [], "cpu", updates=3, batch=4)
    assert (t.updates, t.steps, t.overflows) == (0, 3 + runs.OVERFLOW_RETRIES, 3 + runs.OVERFLOW_RETRIES)
    assert t.problems(3) == ["no loss", "only 0 of 3 updates applied in 11 steps (11 overflowed)"]


def test_fairseq_overflow_notes_are_counted():
    import logging

    from seed_fairseq.workflows.gpucheck.runs import _OverflowCounter, counting_overflows

    logger = logging.getLogger("fairseq.trainer")  # fairseq/trainer.py's logger, not configured here
    level = logger.level
    with counting_overflows(_OverflowCounter()) as counter:
        # fairseq 0.12's note at INFO (trainer.py, train_step: "except OverflowError")
        logger.info("NOTE: gradient overflow detected, ignoring gradient, setting loss scale to: 64.0")
        logger.info("NOTE: your device does NOT support faster training with --fp16 or --amp")
    logger.info("NOTE: gradient overflow detected, ignoring gradient")  # after: not counted
    assert counter.count == 1
    assert logger.level == level and counter not in logger.handlers


def test_bf16_with_torch_xla_is_skipped_as_a_tpu_run(tmp_path, monkeypatch):
    """With torch_xla installed, fairseq 0.12's --bf16 means a TPU: the run is refused before anything
    is built (without it, the fix keeps bf16 on the device: tests/test_bf16.py)."""
    from seed_fairseq.pretrain.fairseq_patches import bf16_device
    from seed_fairseq.workflows.gpucheck.runs import Run, Unsupported

    monkeypatch.setattr(bf16_device, "xla_available", lambda: True)
    args = ["--task", "masked_lm", "--criterion", "masked_lm", "--arch", "roberta_base", "--bf16"]
    with pytest.raises(Unsupported, match="torch_xla is installed"):
        Run(tmp_path, args, "cuda")


def test_an_unknown_objective_is_one_error_line(tmp_path, capsys):
    assert cli.main(["--dry-run", "--out", str(tmp_path / "out"), "--objectives", "seed,bert"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("error: --objectives: unknown bert; choose from seed,seed_full,") and "\n" not in err
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "name, bf16, precisions, skipped",
    [
        ("Tesla V100-SXM2-32GB", False, ("fp16",), ["bf16"]),
        ("NVIDIA H100 80GB HBM3", True, ("fp16", "bf16"), []),
    ],
)
def test_the_cuda_profile(monkeypatch, name, bf16, precisions, skipped):
    """What a GPU run checks, on a V100 (no bf16 units) and an H100."""
    import torch

    from seed_fairseq.workflows.gpucheck.profile import cuda_profile

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i=0: name)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: bf16)
    p = cuda_profile(updates=30)
    assert (p.device, p.backend, p.tiny, p.tokens_per_sample, p.gpus) == ("cuda", "nccl", False, 512, 2)
    assert p.precisions == precisions and sorted(p.skipped_precisions) == skipped
    assert p.precision_flags("fp16") == ["--fp16"] and p.encoder_args() == []
    assert p.peak("fp16") == peak_tflops(name, "fp16") > 100
