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

    import seed_fairseq  # noqa: F401  (registers the plugin)
    from seed_fairseq.pretrain.tasks.registry import plugin_objectives

    own = [d.name for d in plugin_objectives()]
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
    # the first step counts FLOPs; the overflowed one (no optimizer step: quicker) is not timed; of the 5
    # updates timed, the first warms up and the speed is measured on the other 4
    assert t.timed == [(10.0, 0.5)] * 5 and t.measured == [(10.0, 0.5)] * 4
    assert t.tokens == 40 and t.seconds == 2.0 and t.words_per_second == 20.0
    assert t.flops_per_token == 100.0 and t.mfu(1e-12) == pytest.approx(100.0 * 20.0 / 1.0)
    # losses that do not fall, or a NaN, are what the check fails on
    assert runs.TrainingResult(4, 3, losses=[5.0, 5.0, 5.1]).problems(3) == ["loss not falling"]
    assert runs.TrainingResult(4, 3, losses=[5.0, float("nan"), 4.0]).problems(3) == ["non-finite loss"]


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


# ---- issue 44: the kernel profile and a steady words/s ---------------------------------------------


def test_kernel_classes_of_literal_names():
    """Kernels as CUDA names them and CPU ops as aten names them, with the ops and ranges they ran in
    (innermost first): the class the report sums them into."""
    from seed_fairseq.workflows.gpucheck.kernels import classify

    linear = [("aten::mm", [[384, 32], [32, 32]]), ("aten::linear", [[384, 32], [32, 32]]), ("forward", [])]
    head = [("aten::mm", [[58, 32], [32, 502]]), ("aten::linear", [[58, 32], [502, 32]]), ("forward", [])]
    cuda = [  # (kernel, the ops and ranges around it, its class)
        # GEMMs: cuBLAS's, CUTLASS's and Hopper's (sm90 xmma, nvjet) names
        ("ampere_sgemm_128x64_tn", tuple(linear), "gemm"),
        ("sm90_xmma_gemm_f16f16_f16f32_f32_tn_n_tilesize128x128x64_warpgroupsize1x1x1_execute_segment", (), "gemm"),
        ("nvjet_hsh_128x256_64x4_2x1_v_bz_coopB_NNT", (), "gemm"),
        # the same GEMM kernel projecting onto the 502-piece vocabulary: the vocabulary's
        ("ampere_sgemm_128x64_tn", tuple(head), "vocabulary"),
        # attention: fused kernels by their names (flash's name holds "cutlass" too)
        (
            "void pytorch_flash::flash_fwd_kernel<Flash_fwd_kernel_traits<64, 128, 128, 4, false, false, "
            "cutlass::half_t> >(Flash_fwd_params)",
            (),
            "attention",
        ),
        ("flash_fwd_kernel", (), "attention"),
        (
            "fmha_cutlassF_f16_aligned_64x64_rf_sm80(PyTorchMemEffAttention::AttentionKernel<cutlass::half_t, "
            "cutlass::arch::Sm80, true, 64, 64, 64, true, true>::Params)",
            (),
            "attention",
        ),
        # a GEMM of two batched operands (scores, weighted values), and a softmax inside an attention module
        (
            "ampere_fp16_s16816gemm_fp16_128x128_ldg8_f2f_stages_32x5_nn",
            (("aten::bmm", [[96, 512, 64], [96, 64, 512]]), ("aten::matmul", [])),
            "attention",
        ),
        (
            "void (anonymous namespace)::softmax_warp_forward<c10::Half, c10::Half, float, 9, false, false>",
            (("aten::_softmax", [[8, 12, 512, 512]]), ("gpu_check.attention", [])),
            "attention",
        ),
        # ... but its projections stay GEMMs
        (
            "ampere_sgemm_128x64_tn",
            (("aten::addmm", [[768], [4096, 768], [768, 768]]), ("aten::linear", []), ("gpu_check.attention", [])),
            "gemm",
        ),
        # element-wise and normalisation
        ("vectorized_elementwise_kernel", (), "elementwise"),
        (
            "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&,"
            " at::native::GeluType)::{lambda()#2}, at::detail::Array<char*, 2> >(int, at::detail::Array<char*, 2>)",
            (("aten::gelu", [[4096, 3072]]),),
            "elementwise",
        ),
        ("layer_norm_kernel", (), "elementwise"),
        ("void at::native::(anonymous namespace)::vectorized_layer_norm_kernel<c10::Half, float>", (), "elementwise"),
        # the optimizer and the gradient norm: by the ranges fairseq's trainer opens, or a foreach kernel's name
        ("multi_tensor_apply_kernel", (), "optimizer"),
        ("multi_tensor_apply_kernel<TensorListMetadata<1>, LpNormFunctor<float, 2>, float*, int>", (), "gradient_norm"),
        (
            "vectorized_elementwise_kernel",
            (("aten::mul_", [[768]]), ("Optimizer.step#Adam.step", []), ("optimizer", [])),
            "optimizer",
        ),
        ("vectorized_elementwise_kernel", (("aten::mul_", [[768]]), ("clip-grads", [])), "gradient_norm"),
        # the vocabulary's losses: by shape; by name where no shape is known; a contrastive loss is not one
        (
            "void (anonymous namespace)::cunn_SoftMaxForward<4, c10::Half, float, c10::Half, "
            "LogSoftMaxForwardEpilogue>",
            (("aten::_log_softmax", [[20480, 32768], [], []]), ("aten::log_softmax", [])),
            "vocabulary",
        ),
        ("nll_loss_forward_reduce_cuda_kernel_2d", (), "vocabulary"),
        ("nll_loss_forward_reduce_cuda_kernel_2d", (("aten::nll_loss_nd", [[8, 8], [8]]),), "elementwise"),
        # copies and fills of memory, and what no rule knows
        ("Memcpy HtoD (Pageable -> Device)", (), "other"),
        ("Memset (Device)", (), "other"),
        ("ncclDevKernel_AllReduce_Sum_f32_RING_LL", (), "other"),
    ]
    for name, context, expected in cuda:
        vocab = {32768} if "32768" in str(context) else {502}
        assert classify(name, context, vocab) == expected, name

    def cpu(name, shapes=(), *around):
        return classify(name, [(name, list(shapes)), *around], {502})

    assert cpu("aten::mm", [[384, 32], [32, 32]], ("aten::matmul", []), ("aten::linear", [])) == "gemm"
    assert cpu("aten::addmm", [[502], [58, 32], [32, 502]], ("aten::linear", [])) == "vocabulary"
    assert cpu("aten::_log_softmax", [[58, 502], [], []]) == "vocabulary"
    assert cpu("aten::_log_softmax", [[8, 8], [], []]) == "elementwise"  # in-batch negatives: 8 texts
    assert cpu("aten::copy_", [[58, 502]], ("_ChunkedLinearCrossEntropy", [])) == "vocabulary"
    assert cpu("aten::native_layer_norm", [[8, 48, 32], [], [32], [32], []]) == "elementwise"
    assert cpu("aten::gelu", [[48, 8, 37], []]) == "elementwise"
    assert cpu("aten::_scaled_dot_product_flash_attention_for_cpu") == "attention"
    sdpa = ("aten::_scaled_dot_product_attention_math", [])
    assert cpu("aten::bernoulli_", [[8, 2, 48, 48]], sdpa) == "attention"  # attention's dropout
    assert cpu("aten::bmm", [[16, 48, 16], [16, 16, 48]], ("aten::matmul", []), sdpa) == "attention"
    # a backward op in its forward op's context (kernels.py puts the forward frames after the node's)
    backward = [("SafeSoftmaxBackward0", [[8, 2, 48, 48]]), ("aten::_safe_softmax", [[8, 2, 48, 48]]), sdpa]
    assert cpu("aten::_softmax_backward_data", [[8, 2, 48, 48], [8, 2, 48, 48]], *backward) == "attention"
    assert cpu("aten::addcdiv_", [[502, 32]], ("Optimizer.step#Adam.step", []), ("optimizer", [])) == "optimizer"
    assert cpu("aten::linalg_vector_norm", [[502, 32]], ("clip-grads", [])) == "gradient_norm"


def test_host_gaps_of_literal_intervals():
    """Inside two updates (0-100 and 200-300 us) the device ran 10-50 (two kernels overlapping), 90-120 and
    150-210 (across the windows' edges) and 250-260: it idled 100 - 40 - 10 = 50 in the first and
    100 - 10 - 10 = 80 in the second."""
    from seed_fairseq.workflows.gpucheck.kernels import covered, host_gaps

    assert covered([(0.0, 1.0), (0.5, 2.0), (3.0, 4.0), (3.5, 3.7)]) == 3.0
    assert covered([]) == 0.0
    intervals = [(10.0, 30.0), (20.0, 50.0), (90.0, 120.0), (150.0, 210.0), (250.0, 260.0), (400.0, 500.0)]
    assert host_gaps([(0.0, 100.0), (200.0, 300.0)], intervals) == 130.0
    assert host_gaps([(0.0, 100.0)], []) == 100.0
    assert host_gaps([(0.0, 100.0)], [(-5.0, 105.0)]) == 0.0


class Raw:
    """One event as torch.profiler's raw results hold it (``_KinetoEvent``), times in microseconds."""

    def __init__(self, name, start, end, thread=1, corr=0, linked=0, seq=-1, fwd=0, shapes=(), device="CPU"):
        self._v = (name, start, end, thread, corr, linked, seq, fwd, list(shapes), f"DeviceType.{device}")

    def name(self):
        return self._v[0]

    def start_ns(self):
        return int(self._v[1] * 1000)

    def duration_ns(self):
        return int((self._v[2] - self._v[1]) * 1000)

    def start_thread_id(self):
        return self._v[3]

    end_thread_id = start_thread_id

    def correlation_id(self):
        return self._v[4]

    def linked_correlation_id(self):
        return self._v[5]

    def sequence_nr(self):
        return self._v[6]

    def fwd_thread_id(self):
        return self._v[7]

    def shapes(self):
        return self._v[8]

    def device_type(self):
        return self._v[9]

    def activity_type(self):
        kinds = {"gpu_user_annotation": "gpu_user_annotation", "Memcpy": "gpu_memcpy", "Stream Sync": "cuda_sync"}
        device = "kernel" if self._v[9] == "DeviceType.CUDA" else "cpu_op"
        return next((kind for start, kind in kinds.items() if self._v[0].startswith(start)), device)


def test_a_cuda_profile_from_literal_events():
    """One update of 1000 us: each kernel classified in the context of the op that launched it (the
    backward softmax in its forward's attention module, through the autograd sequence number), a copy
    that is no launch, a kernel no op launched; the device busy 415 us of 1000."""
    from seed_fairseq.workflows.gpucheck.kernels import summarize

    def kernel(name, start, end, linked):
        return Raw(name, start, end, thread=7, linked=linked, device="CUDA")

    events = [
        Raw("gpu_check.update", 0, 1000, corr=1),
        Raw("forward", 0, 400, corr=2),
        Raw("aten::linear", 10, 100, corr=10, seq=5, shapes=[[8, 32], [32, 32], [32]]),
        Raw("aten::addmm", 20, 90, corr=11, shapes=[[32], [8, 32], [32, 32]]),
        Raw("cudaLaunchKernel", 25, 28, linked=11),  # the runtime's call: not an op of the tree
        Raw("gpu_check.attention", 100, 200, corr=3),
        Raw("aten::_softmax", 110, 190, corr=13, seq=8, shapes=[[8, 2, 48, 48], [], []]),
        Raw("aten::linear", 200, 300, corr=14, seq=9, shapes=[[8, 32], [502, 32]]),
        Raw("aten::mm", 210, 290, corr=15, shapes=[[8, 32], [32, 502]]),
        Raw("backward", 400, 640, corr=4),
        # autograd's thread: the softmax's gradient, its forward on thread 1 with sequence number 8
        Raw("SoftmaxBackward0", 500, 560, thread=2, corr=22, seq=8, fwd=1),
        Raw("aten::_softmax_backward_data", 505, 555, thread=2, corr=23, shapes=[[8, 2, 48, 48]] * 2),
        Raw("clip-grads", 650, 700, corr=5),
        Raw("aten::_foreach_norm", 655, 695, corr=31),
        Raw("optimizer", 700, 900, corr=6),
        Raw("aten::_fused_adam_", 710, 890, corr=30),
        kernel("ampere_sgemm_32x32_tn", 30, 80, 11),
        kernel("void (anonymous namespace)::softmax_warp_forward<float, float, float, 6, false, false>", 120, 180, 13),
        kernel("ampere_sgemm_64x64_nn", 220, 280, 15),
        kernel("Memcpy DtoD (Device -> Device)", 290, 295, 15),
        kernel("void (anonymous namespace)::softmax_warp_backward<float, float, float, 6, false, false>", 510, 550, 23),
        kernel("multi_tensor_apply_kernel<TensorListMetadata<1>, LpNormFunctor<float, 2>, float*, int>", 660, 690, 31),
        kernel("multi_tensor_apply_kernel<TensorListMetadata<4>, FusedAdamMathFunctor<float, 4>>", 720, 880, 30),
        kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 950, 960, 99),
        # the device's copy of a range, and a wait: no work of the device's
        kernel("gpu_user_annotation", 0, 1000, 0),
        kernel("Stream Sync", 960, 1000, 0),
    ]
    got = summarize(events, 1, {502}, "cuda")
    assert got["status"] == "ok" and got["activity"] == "CUDA kernels" and got["updates"] == 1
    shares = {k: round(v["share"], 6) for k, v in got["classes"].items()}
    assert shares == {
        "gemm": 0.05,
        "attention": 0.1,  # the forward softmax (60 us) in the module's range, its backward (40) by its forward
        "vocabulary": 0.065,  # the head's GEMM and its copy
        "elementwise": 0.0,
        "optimizer": 0.16,
        "gradient_norm": 0.03,
        "other": 0.01,  # the kernel no op launched
        "host_gaps": 0.585,
    }
    assert sum(v["share"] for v in got["classes"].values()) == pytest.approx(1.0)
    assert got["launches_per_update"] == 7  # the copy is no kernel
    assert got["window_seconds"] == pytest.approx(1e-3) and got["busy_seconds"] == pytest.approx(415e-6)
    assert [(k["class"], k["calls"]) for k in got["top"][:2]] == [("optimizer", 1), ("attention", 1)]
    assert got["top"][0]["seconds"] == pytest.approx(160e-6)
    # no kernel recorded (CUPTI unavailable): no profile is made up
    none = summarize([e for e in events if "CUDA" not in e.device_type()], 1, {502}, "cuda")
    assert none["status"] == "error" and "CUPTI" in none["detail"]


class TinyRun:
    """Stands in for ``runs.Run``: a 32 -> 500 projection with its cross-entropy, the gradient norm and an
    SGD step in the ranges fairseq's trainer opens."""

    device = "cpu"

    def __init__(self):
        import torch

        torch.manual_seed(0)
        self.torch, self.head = torch, torch.nn.Linear(32, 500)
        self.opt = torch.optim.SGD(self.head.parameters(), lr=0.1)
        self.task = type("Task", (), {"source_dictionary": list(range(500))})()
        self.trainer = type("Trainer", (), {"model": torch.nn.Module()})()

    def next_sample(self):
        return self.torch.randn(64, 32), self.torch.randint(0, 500, (64,))

    def step(self, sample):
        from torch.profiler import record_function

        x, target = sample
        self.torch.nn.functional.cross_entropy(self.head(x), target).backward()
        with record_function("clip-grads"):
            self.torch.nn.utils.clip_grad_norm_(self.head.parameters(), 1.0)
        with record_function("optimizer"):
            self.opt.step()
        self.opt.zero_grad()


def test_a_cpu_profile_of_real_updates():
    """torch.profiler around 2 updates of a stand-in run on the CPU (the dry run's path): the projection
    onto the 500 pieces and its loss, the norm and the optimizer are found; the shares sum to 1."""
    from seed_fairseq.workflows.gpucheck import kernels

    got = kernels.profile_updates(TinyRun(), updates=2, warmup=1)
    assert got["status"] == "ok" and got["activity"] == "CPU aten ops (self time)" and got["updates"] == 2
    assert set(got["classes"]) == set(kernels.CLASSES)
    assert sum(v["share"] for v in got["classes"].values()) == pytest.approx(1.0)
    for key in ("vocabulary", "optimizer", "gradient_norm", "host_gaps"):
        assert got["classes"][key]["share"] > 0, key
    assert got["classes"]["attention"]["share"] == 0
    assert 0 < len(got["top"]) <= kernels.TOP and got["launches_per_update"] > 5
    assert ("aten::addmm", "vocabulary") in [(k["name"], k["class"]) for k in got["top"]]
    assert got["cost_seconds"] >= got["summing_seconds"] > 0


def test_short_kernel_names():
    from seed_fairseq.workflows.gpucheck.kernels import short_name

    long = (
        "void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
        "at::native::GeluType)::{lambda()#2}, at::detail::Array<char*, 2> >(int, at::detail::Array<char*, 2>)"
    )
    assert short_name(long, 200) == (
        "at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
        "at::native::GeluType)::{lambda()#2}, at::detail::Array<char*, 2> >"
    )
    assert short_name(long, 20) == "at::native::vecto..."
    assert short_name("aten::mm") == "aten::mm" and short_name("Memcpy HtoD (Pageable -> Device)") == "Memcpy HtoD"


def test_words_per_second_after_warm_up_and_its_halves():
    from seed_fairseq.workflows.gpucheck.training import TrainingResult

    t = TrainingResult(8, 7, warmup=2, timed=[(100.0, 1.0), (100.0, 0.6)] + [(100.0, 0.5)] * 3 + [(100.0, 0.52)])
    assert t.measured == [(100.0, 0.5)] * 3 + [(100.0, 0.52)]
    assert t.words_per_second == pytest.approx(400 / 2.02)
    assert t.halves() == pytest.approx((200.0, 200 / 1.02))
    assert t.speed_spread == pytest.approx((200 - 200 / 1.02) / ((200 + 200 / 1.02) / 2))
    assert t.speed_stable and t.speed_note() == ""
    slow = TrainingResult(8, 7, warmup=2, timed=[(100.0, 1.0)] * 2 + [(100.0, 0.5)] * 2 + [(100.0, 0.6)] * 2)
    assert not slow.speed_stable and slow.speed_note() == " (unstable: its halves differ by 18.2%)"
    # a run cut to the minimum by the time budget: the speed of what there is, and it says so
    short = TrainingResult(8, 3, warmup=2, timed=[(100.0, 1.0), (100.0, 0.5)])
    assert short.measured == [(100.0, 1.0), (100.0, 0.5)] and not short.speed_stable
    assert "too few to call it steady" in short.speed_note()
    assert TrainingResult(8, 1).halves() is None and TrainingResult(8, 1).speed_spread is None


def test_masked_lm_with_fairseq_adam_is_the_reference_of_another_default(monkeypatch):
    """With a default optimizer other than fairseq's adam (kit/argv.py's DEFAULT_OPTIMIZER), masked_lm runs
    once more with --optimizer adam, marked as the reference; with adam the default, once."""
    from seed_fairseq.workflows.gpucheck import profile
    from seed_fairseq.workflows.gpucheck.profile import REFERENCE, dry_run_profile, setups

    p = dry_run_profile()
    assert profile.DEFAULT_OPTIMIZER == "torch_adam"  # kit/argv.py's
    found = {s.name: s for s in setups(p, "generator.pt")}
    ref = found[REFERENCE]
    assert REFERENCE == "masked_lm_adam" and ref.args == found["masked_lm"].args and ref.optimizer == "adam"
    assert ref.label == "masked_lm, fairseq's adam (reference)"
    args = p.run_args(list(ref.args), "bf16", 8, 6, optimizer=ref.optimizer)
    assert args[args.index("--optimizer") + 1] == "adam" and args.count("--optimizer") == 1
    default = p.run_args(list(found["seed"].args), "bf16", 8, 6)
    assert default[default.index("--optimizer") + 1] == "torch_adam"
    monkeypatch.setattr(profile, "DEFAULT_OPTIMIZER", "adam")
    assert REFERENCE not in [s.name for s in setups(p, "generator.pt")]
    md = report.markdown(
        report.build(p, [], {REFERENCE: {"training": {"bf16": {"optimizer": "adam", "batch": 8}}}}, 1.0)
    )
    assert "| masked_lm_adam | bf16 | fairseq's adam (reference) | 8 |" in md
