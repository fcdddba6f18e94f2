"""``--optimizer torch_adam`` (``seed_fairseq/pretrain/optim/torch_adam.py``, issue 44 items 2 and 3) and the
multi-tensor gradient norm (``fairseq_patches/grad_norm.py``).

- the update equals fairseq's ``adam`` parameter by parameter over 20 updates: fp32, fairseq's fp16
  wrapper (flat fp32 master weights) and its bf16 wrapper (unflattened), with the encoder-lr parameter
  groups, ``--update-freq 2`` (two gradients accumulated per update), clipping and weight decay, through
  fairseq's own build paths (``optim.build_optimizer``, ``FP16Optimizer.build_optimizer``); without
  the eps adjustment the same comparison fails by far;
- through fairseq's ``Trainer`` (fp32 and bf16, groups, two batches per update): the same weights;
- save/resume is exact (bitwise), and a state of fairseq's ``adam`` resumes with ``torch_adam`` and back;
- the gradient norm equals fairseq's own per-tensor computation, clipping, non-finite norms and
  ``max_norm = 0`` included, in one ``_foreach_norm``;
- through fairseq-train (slow): the same losses as ``adam`` in fp32, an exact resume, and runs of
  ``adam`` resumed by ``torch_adam`` and back.

Tolerance of the comparisons with fairseq's ``adam``: |a - b| <= 1e-5 x max(|p|, lr) per weight.
The two compute the same formula in another order in float32 (torch: ``lerp`` for the first moment, the
decay as one multiply, eps folded into the bias correction; fairseq: multiply-add, ``p + p * -lr*wd``):
each update adds a few roundings of 2^-24 relative to the weight, or to the update (~lr) for a weight near
zero; 20 updates stay below 1e-5 (measured: ~3e-6).  Without the eps adjustment the difference is ~1e-3.
"""

import io
import json
import math
import shutil

import numpy as np
import pytest
import torch
from helpers import check, parse_argv, train_cmd

import seed_fairseq

seed_fairseq.register()

from fairseq import optim, options  # noqa: E402
from fairseq.dataclass.utils import convert_namespace_to_omegaconf  # noqa: E402
from fairseq.optim.adam import FairseqAdam, FairseqAdamConfig  # noqa: E402
from fairseq.optim.fp16_optimizer import FP16Optimizer  # noqa: E402

from seed_fairseq.pretrain.fairseq_patches import grad_norm, optimizer_switch  # noqa: E402
from seed_fairseq.pretrain.fairseq_patches.optimizer_groups import GROUP_KEY, split_groups  # noqa: E402
from seed_fairseq.pretrain.optim import torch_adam  # noqa: E402
from seed_fairseq.pretrain.optim.torch_adam import FairseqAdamW, TorchAdam, TorchAdamConfig  # noqa: E402

TOL = 1e-5
LR = 1e-3
UPDATES = 20
# odd sizes: a "layer" (37 x 32 and its bias), a vocabulary-like matrix, a head's bias, a scalar
SHAPES = [(37, 32), (37,), (301, 32), (32,), (1,)]
LABELS = ["encoder.layer0", "encoder.layer0", "encoder.embeddings", "heads", "heads"]
FACTORS = {"encoder.layer0": 0.5, "encoder.embeddings": 0.25, "heads": 1.0}  # each group's own rate
ADAM_OPTIONS = ["--adam-betas", "(0.9,0.98)", "--adam-eps", "1e-6", "--weight-decay", "0.01"]
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}


def cfg_for(name, precision, *extra):
    """fairseq's config of an optimizer, as fairseq-train builds it (the data folder is not read)."""
    argv = ["/no-data", "--task", "masked_lm", "--arch", "roberta_base", "--cpu", "--optimizer", name]
    argv += ["--lr", str(LR), *ADAM_OPTIONS, "--update-freq", "2", "--clip-norm", "1.0", *extra]
    argv += {"fp32": [], "fp16": ["--fp16"], "bf16": ["--bf16"]}[precision]
    return convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))


def initial_params(dtype):
    g = torch.Generator().manual_seed(7)
    return [torch.nn.Parameter(torch.randn(s, generator=g).to(dtype)) for s in SHAPES]


def gradient(update, micro):
    """A fixed stream: per tensor, a random direction times a scale from 1e-6 (at Adam's eps) to 1.
    The heads' two tensors get gradients at eps's scale, where the bias correction of eps shows, and
    the first gets none on odd updates (fp32: skipped, so the group holds two step counts; the wrappers
    make it zero)."""
    g = torch.Generator().manual_seed(1000 * update + micro)
    out = []
    for i, s in enumerate(SHAPES):
        scale = 10.0 ** -int(torch.randint(0, 7, (1,), generator=g)) if i < 3 else 1e-6
        out.append(None if (i == 3 and update % 2) else torch.randn(s, generator=g) * scale)
    return out


def build(name, precision, groups, monkeypatch, *extra):
    """fairseq's optimizer ``name`` over fresh parameters, as the Trainer builds it (and cuts it into
    the encoder-lr groups, ``optimizer_groups.split_groups``, with their own rates)."""
    cfg = cfg_for(name, precision, *extra)
    params = initial_params(DTYPES[precision])
    if precision == "fp32":
        opt = optim.build_optimizer(cfg.optimizer, params)
    else:
        # fairseq's flat fp32 master asks torch.cuda.current_device() for its device key; on the CPU
        # the parameters' device index is None, which is the key fairseq's own syncs then look up
        monkeypatch.setattr(torch.cuda, "current_device", lambda: None)
        opt = FP16Optimizer.build_optimizer(cfg, params)
    if groups:
        split_groups(opt, {id(p): label for p, label in zip(params, LABELS)})
        for group in opt.param_groups:
            group["lr"] = LR * FACTORS[group[GROUP_KEY]]
    return opt, params


def train(opt, params, updates, start=0):
    """What the Trainer does with the optimizer: backward twice (--update-freq 2), the average,
    the norm and clipping, the step."""
    for u in range(start, start + updates):
        for micro in range(2):
            loss = sum((p.float() * g).sum() for p, g in zip(params, gradient(u, micro)) if g is not None)
            opt.backward(loss)
        opt.multiply_grads(0.5)
        opt.clip_grad_norm(1.0)
        opt.step()
        opt.zero_grad()


def masters(opt, params):
    """The fp32 weights the optimizer updates (the wrappers' master copies)."""
    held = getattr(opt, "fp32_params", None)
    if held is None:
        return list(params)
    return list(held.values()) if isinstance(held, dict) else list(held)


def excess(got, want, tol=TOL, floor=LR):
    """max over weights of |a - b| - tol x max(|a|, |b|, floor): <= 0 when every weight is within tolerance."""
    worst = -math.inf
    for a, b in zip(got, want):
        a, b = a.detach().float(), b.detach().float()
        bound = tol * torch.clamp_min(torch.maximum(a.abs(), b.abs()), floor)
        worst = max(worst, float(((a - b).abs() - bound).max()))
    return worst


# fp16: the flat master (one tensor: no groups), and unflattened with the groups (the Trainer turns
# flattening off for them: optimizer_groups); bf16: fairseq never flattens
CASES = {
    "fp32": ("fp32", True, ()),
    "fp16-flat": ("fp16", False, ()),
    "fp16-groups": ("fp16", True, ("--fp16-no-flatten-grads",)),
    "bf16": ("bf16", True, ()),
}


@pytest.mark.parametrize("precision, groups, extra", CASES.values(), ids=CASES.keys())
def test_twenty_updates_equal_fairseqs_adam(precision, groups, extra, monkeypatch):
    ref, ref_params = build("adam", precision, groups, monkeypatch, *extra)
    new, new_params = build("torch_adam", precision, groups, monkeypatch, *extra)
    inner = new.optimizer if precision == "fp32" else new.fp32_optimizer.optimizer
    assert isinstance(inner, FairseqAdamW) and inner.kernel == "fused"  # torch has a CPU fused AdamW
    assert len(new.param_groups) == (3 if groups else 1)
    if precision == "fp16":
        assert new.has_flat_params == (not groups)  # the flat master: one tensor
    train(ref, ref_params, UPDATES)
    train(new, new_params, UPDATES)
    assert excess(masters(new, new_params), masters(ref, ref_params)) <= 0
    # the model's own fp16/bf16 weights: the masters rounded; a master 1 ulp apart may round apart
    dtype = DTYPES[precision]
    if precision != "fp32":
        assert excess(new_params, ref_params, tol=torch.finfo(dtype).eps, floor=0) <= 0
    assert all(p.dtype == dtype for p in new_params)
    # and they moved: the comparison is not between two untouched copies
    assert excess(new_params, initial_params(dtype), tol=1e-3) > 0


def test_the_comparison_fails_without_the_eps_adjustment(monkeypatch):
    """torch's AdamW as it is (eps added after the bias correction): far outside the tolerance."""
    ref, ref_params = build("adam", "fp32", True, monkeypatch)
    monkeypatch.setattr(torch_adam, "fairseq_eps", lambda eps, beta2, step: eps)
    new, new_params = build("torch_adam", "fp32", True, monkeypatch)
    train(ref, ref_params, UPDATES)
    train(new, new_params, UPDATES)
    assert excess(new_params, ref_params) > 10 * TOL  # ~1e-3


def test_the_foreach_kernel_takes_the_same_step():
    """Where torch has no fused kernel: the multi-tensor one, the same numbers."""
    a, b = initial_params(torch.float32), initial_params(torch.float32)
    fused = FairseqAdamW(a, lr=LR, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01, kernel="fused")
    foreach = FairseqAdamW(b, lr=LR, betas=(0.9, 0.98), eps=1e-6, weight_decay=0.01, kernel="foreach")
    for u in range(UPDATES):
        for opt, params in ((fused, a), (foreach, b)):
            for p, g in zip(params, gradient(u, 0)):
                p.grad = g
            opt.step()
    assert excess(a, b) <= 0


def test_the_options_are_fairseqs_adams():
    ours, theirs = TorchAdamConfig(), FairseqAdamConfig()
    for name in ("adam_betas", "adam_eps", "weight_decay"):
        assert getattr(ours, name) == getattr(theirs, name), name
    params = initial_params(torch.float32)
    new = optim.build_optimizer(cfg_for("torch_adam", "fp32").optimizer, params)
    ref = optim.build_optimizer(cfg_for("adam", "fp32").optimizer, initial_params(torch.float32))
    assert isinstance(new, TorchAdam) and isinstance(ref, FairseqAdam)
    assert new.optimizer_config == ref.optimizer_config == {
        "lr": LR, "betas": (0.9, 0.98), "eps": 1e-6, "weight_decay": 0.01
    }  # fmt: skip
    assert new.supports_flat_params and not new.supports_memory_efficient_fp16


# ---------------------------------------------------------------------------
# save and resume
# ---------------------------------------------------------------------------


def through_a_file(state):
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=True)  # what the plugin's checkpoint loading allows


def test_save_and_resume_is_exact(monkeypatch):
    straight, params = build("torch_adam", "fp32", True, monkeypatch)
    train(straight, params, UPDATES)

    first, first_params = build("torch_adam", "fp32", True, monkeypatch)
    train(first, first_params, UPDATES // 2)
    state = through_a_file(first.state_dict())
    # fairseq's adam's format: an int step per parameter (the head's bias skipped odd updates: 5 of 10)
    assert [s["step"] for s in state["state"].values()] == [10, 10, 10, 5, 10]
    assert all(g["eps"] == 1e-6 for g in state["param_groups"])  # the configured eps, not a step's

    resumed, resumed_params = build("torch_adam", "fp32", True, monkeypatch)
    with torch.no_grad():
        for p, q in zip(resumed_params, first_params):
            p.copy_(q)
    resumed.load_state_dict(state)
    train(resumed, resumed_params, UPDATES // 2, start=UPDATES // 2)
    for a, b in zip(resumed_params, params):
        assert torch.equal(a, b)


@pytest.mark.parametrize("first, then", [("adam", "torch_adam"), ("torch_adam", "adam")])
def test_a_state_of_either_resumes_with_the_other(first, then, monkeypatch):
    """10 updates of one, its state loaded into the other, 10 more: fairseq's adam's 20, within tolerance."""
    straight, params = build("adam", "fp32", True, monkeypatch)
    train(straight, params, UPDATES)
    one, one_params = build(first, "fp32", True, monkeypatch)
    train(one, one_params, UPDATES // 2)
    other, other_params = build(then, "fp32", True, monkeypatch)
    with torch.no_grad():
        for p, q in zip(other_params, one_params):
            p.copy_(q)
    other.load_state_dict(through_a_file(one.state_dict()))
    train(other, other_params, UPDATES // 2, start=UPDATES // 2)
    assert excess(other_params, params) <= 0


class History:
    def __init__(self, saved, built):
        self._optim_history = [{"optimizer_name": "FairseqNAG"}, {"optimizer_name": saved, "num_updates": 4}]
        self._optimizer = built


def test_the_checkpoints_optimizer_name_is_accepted_for_the_pair_only():
    built = TorchAdam.__new__(TorchAdam)
    trainer = History("FairseqAdam", built)
    optimizer_switch.accept_switch(trainer)
    assert trainer._optim_history[-1] == {
        "optimizer_name": "TorchAdam", "num_updates": 4, "resumed_from_optimizer": "FairseqAdam"
    }  # fmt: skip
    assert trainer._optim_history[0] == {"optimizer_name": "FairseqNAG"}
    for saved in ("FairseqSGD", "FP16Optimizer", "TorchAdam"):  # fairseq's own check stays for the others
        trainer = History(saved, built)
        optimizer_switch.accept_switch(trainer)
        assert trainer._optim_history[-1] == {"optimizer_name": saved, "num_updates": 4}
    trainer = History("TorchAdam", FairseqAdam.__new__(FairseqAdam))
    optimizer_switch.accept_switch(trainer)
    assert trainer._optim_history[-1]["optimizer_name"] == "FairseqAdam"


# ---------------------------------------------------------------------------
# the gradient norm
# ---------------------------------------------------------------------------


def grads_of(values, dtype=torch.float32, expert=()):
    params = []
    for i, v in enumerate(values):
        p = torch.nn.Parameter(torch.zeros(3 if v is None else v.shape, dtype=dtype))
        p.grad = None if v is None else v.to(dtype).clone()  # each its own: clipping is in place
        if i in expert:
            p.expert = True
        params.append(p)
    return params


def norm_cases():
    g = torch.Generator().manual_seed(3)
    many = [torch.randn(s, generator=g) * 10.0**-i for i, s in enumerate(SHAPES)]
    yield "many", many, {}
    yield "one", [many[0]], {}
    yield "some without a gradient", [many[0], None, many[2]], {}
    yield "experts", many, {"expert": (1, 3)}
    inf = [t.clone() for t in many]
    inf[2][5, 3] = math.inf
    yield "inf", inf, {}
    nan = [t.clone() for t in many]
    nan[1][0] = math.nan
    yield "nan", nan, {}
    # fp16 gradients whose norm is past fp16's range (65504): both take the norms in float32
    yield "fp16", [torch.full((301, 32), 300.0), torch.full((37,), 2.0)], {"dtype": torch.float16}


@pytest.mark.parametrize("max_norm", [0.0, 1.0, 1e9])
@pytest.mark.parametrize("case", list(norm_cases()), ids=lambda c: c[0])
def test_the_gradient_norm_and_clipping_equal_fairseqs(case, max_norm):
    from fairseq import utils

    _, values, kwargs = case
    assert getattr(utils.clip_grad_norm_, "_seed_fairseq_patch", None) == grad_norm.__name__
    fairseqs = utils.clip_grad_norm_.__wrapped__  # fairseq's own (no apex: one norm per tensor)
    ours, theirs = grads_of(values, **kwargs), grads_of(values, **kwargs)
    got = utils.clip_grad_norm_(ours, max_norm, aggregate_norm_fn=lambda n: n * 1.0)
    want = fairseqs(theirs, max_norm, aggregate_norm_fn=lambda n: n * 1.0)
    assert got.dtype == want.dtype == torch.float32
    if not math.isfinite(float(want)):
        assert math.isnan(float(got)) == math.isnan(float(want)) and (got == want or got.isnan())
    else:
        assert float(got) == pytest.approx(float(want), rel=1e-6)
    for a, b in zip(ours, theirs):
        assert (a.grad is None) == (b.grad is None)
        if a.grad is not None:
            torch.testing.assert_close(a.grad, b.grad, rtol=1e-6, atol=0, equal_nan=True)
    if max_norm == 1.0 and math.isfinite(float(want)) and float(want) > 1.0:
        assert not torch.equal(ours[0].grad, values[0].to(ours[0].grad.dtype))  # clipped: the case has teeth


def test_the_gradient_norm_is_one_multi_tensor_kernel():
    from fairseq import utils
    from torch.profiler import profile

    params = grads_of([torch.randn(s) for s in SHAPES])
    with profile() as prof:
        utils.clip_grad_norm_(params, 1.0)
    names = [e.name for e in prof.events()]
    assert names.count("aten::_foreach_norm") == 1
    with profile() as prof:
        utils.clip_grad_norm_.__wrapped__(params, 1.0)
    assert [e.name for e in prof.events()].count("aten::_foreach_norm") == 0  # fairseq's: one norm each


def test_no_gradient_at_all_is_a_zero_norm():
    from fairseq import utils

    assert float(utils.clip_grad_norm_(grads_of([None, None]), 1.0)) == 0.0
    assert float(utils.clip_grad_norm_([], 1.0)) == 0.0


@pytest.mark.parametrize("precision", ["bf16", "fp16"])
def test_the_masters_gradients_are_zeroed_as_fairseq_does_in_one_kernel(precision, monkeypatch):
    """``fairseq_patches/master_grads.py``: unflattened masters (bf16; fp16 with --fp16-no-flatten-grads,
    which has a loss scale), the same state after ``zero_grad`` as fairseq's own leaves."""
    from torch.profiler import profile

    extra = ("--fp16-no-flatten-grads",) if precision == "fp16" else ()
    states = []
    for zero_grad in ("ours", "fairseq's"):
        opt, params = build("torch_adam", precision, False, monkeypatch, *extra)
        assert not opt.has_flat_params
        train(opt, params, 2)
        for micro in range(2):
            opt.backward(sum((p.float() * g).sum() for p, g in zip(params, gradient(2, micro)) if g is not None))
        opt.clip_grad_norm(1.0)  # the masters' gradients synced from the model's: not zero
        held = [p32.grad for p32 in opt.fp32_params]
        assert any(bool(g.abs().sum()) for g in held)
        with profile() as prof:
            opt.zero_grad() if zero_grad == "ours" else type(opt).zero_grad.__wrapped__(opt)
        names = [e.name for e in prof.events()]
        assert names.count("aten::_foreach_zero_") == (1 if zero_grad == "ours" else 0)
        assert all(p.grad is None for p in params) and not opt._needs_sync
        assert all(p32.grad is g and not g.abs().sum() for p32, g in zip(opt.fp32_params, held))  # in place
        states.append(opt._multiply_factor)
    assert states[0] == states[1] == (1.0 if precision == "bf16" else 1.0 / 128)


# ---------------------------------------------------------------------------
# through fairseq's Trainer
# ---------------------------------------------------------------------------


def trainer_run(data, name, precision, updates=4):
    """fairseq's Trainer of SEED's tiny encoder with the encoder-lr groups (--layer-lr-decay), two
    batches per update; the fp32 weights (masters in bf16) and the losses."""
    from fairseq import tasks
    from fairseq.trainer import Trainer

    args = ["--task", "seed_pretrain", "--criterion", "seed_pretrain", "--arch", "seed_encoder_tiny", "--cpu"]
    args += ["--encoder-layers", "2", "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "37"]
    args += ["--encoder-attention-heads", "2", "--decoder-layers", "1", "--dropout", "0", "--attention-dropout", "0"]
    args += ["--tokens-per-sample", "48", "--optimizer", name, "--lr", str(LR), *ADAM_OPTIONS, "--batch-size", "4"]
    args += ["--layer-lr-decay", "0.8", "--update-freq", "2", "--clip-norm", "1.0", "--seed", "3"]
    args += {"fp32": [], "bf16": ["--bf16"]}[precision]
    cfg = convert_namespace_to_omegaconf(
        options.parse_args_and_arch(options.get_training_parser(), parse_argv(data, args))
    )
    torch.manual_seed(cfg.common.seed)  # fairseq-train's start: the same initial model for both optimizers
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train")
    trainer = Trainer(cfg, task, task.build_model(cfg.model), task.build_criterion(cfg.criterion))
    assert {p.dtype for p in trainer.model.parameters()} == {DTYPES[precision]}
    dataset = task.dataset("train")
    ids = np.flatnonzero(np.asarray(dataset.sizes) <= 48)
    losses = []
    for u in range(updates):
        batches = [dataset.collater([dataset[i] for i in ids[8 * u + 4 * m : 8 * u + 4 * m + 4]]) for m in range(2)]
        losses.append(float(trainer.train_step(batches)["loss"]))
    groups = len(trainer.optimizer.param_groups)
    return masters(trainer.optimizer, list(trainer.model.parameters())), losses, groups


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_through_fairseqs_trainer_the_same_weights(demo_data_bin, precision):
    ref, ref_losses, ref_groups = trainer_run(demo_data_bin, "adam", precision)
    new, new_losses, new_groups = trainer_run(demo_data_bin, "torch_adam", precision)
    assert new_groups == ref_groups > 1  # the encoder-lr groups: embeddings, 2 layers, heads
    assert new_losses == pytest.approx(ref_losses, rel=1e-5)
    # the gradients now follow the weights: the tolerance of 20 fixed-gradient updates holds for 4
    assert excess(new, ref) <= 0


# ---------------------------------------------------------------------------
# through fairseq-train (slow)
# ---------------------------------------------------------------------------

TORCH_ADAM = ["--optimizer", "torch_adam", "--adam-betas", "(0.9,0.999)", "--adam-eps", "1e-6", "--lr", "1e-3",
              "--lr-scheduler", "polynomial_decay", "--warmup-updates", "5", "--total-num-update", "200",
              "--clip-norm", "1.0", "--weight-decay", "0.01"]  # fmt: skip
ADAM = ["--optimizer", "adam", *TORCH_ADAM[2:]]
EXACT = ("--update-freq", "2", "--save-interval-updates", "2", "--dropout", "0", "--attention-dropout", "0")


def losses_of(proc):
    out = proc.stdout + proc.stderr
    return [json.loads(x.split("| train_inner | ", 1)[1])["loss"] for x in out.splitlines() if "| train_inner |" in x]


def weights(path):
    from seed_fairseq.pretrain.checkpoint import load_torch_file

    state = load_torch_file(str(path))
    return state, [v for _, v in sorted(state["model"].items())]


@pytest.mark.slow
def test_fairseq_train_matches_adam_resumes_exactly_and_switches_both_ways(demo_data_bin, tmp_path):
    def run(save, optim, max_update, restore=None):
        if restore is not None:
            save.mkdir()
            shutil.copy(restore, save / "checkpoint_last.pt")
        return check(train_cmd(demo_data_bin, save, *EXACT, max_update=max_update, tokens_per_sample=48, optim=optim))

    adam = run(tmp_path / "adam", ADAM, 4)
    mine = run(tmp_path / "torch_adam", TORCH_ADAM, 4)
    # fp32: the same loss curve (as logged), the same weights within the tolerance
    assert losses_of(mine) == losses_of(adam) and len(losses_of(adam)) == 4
    state, final = weights(tmp_path / "torch_adam" / "checkpoint_last.pt")
    _, adams = weights(tmp_path / "adam" / "checkpoint_last.pt")
    assert excess(final, adams) <= 0
    assert state["optimizer_history"][-1]["optimizer_name"] == "TorchAdam"
    assert {type(s["step"]) for s in state["last_optimizer_state"]["state"].values()} == {int}  # adam's format
    # --bf16 (fairseq's wrapper, unflattened masters, on the CPU): the fp32 losses within test_bf16.py's band
    bf16 = run(tmp_path / "bf16", [*TORCH_ADAM, "--bf16"], 4)
    assert "--bf16: bfloat16 on the CPU" in bf16.stdout + bf16.stderr
    assert all(abs(float(a) - float(b)) <= 3e-2 * abs(float(b)) for a, b in zip(losses_of(bf16), losses_of(mine)))
    assert len(losses_of(bf16)) == 4

    # torch_adam from its own update 2: exactly the straight run
    run(tmp_path / "resumed", TORCH_ADAM, 4, restore=tmp_path / "torch_adam" / "checkpoint_1_2.pt")
    resumed_state, resumed = weights(tmp_path / "resumed" / "checkpoint_last.pt")
    assert all(torch.equal(a, b) for a, b in zip(resumed, final))
    for a, b in zip(
        resumed_state["last_optimizer_state"]["state"].values(), state["last_optimizer_state"]["state"].values()
    ):
        assert (
            a["step"] == b["step"]
            and torch.equal(a["exp_avg"], b["exp_avg"])
            and torch.equal(a["exp_avg_sq"], b["exp_avg_sq"])
        )

    # a run of fairseq's adam resumed with torch_adam, and back: fairseq's adam's weights within the tolerance
    for first, then in (("adam", TORCH_ADAM), ("torch_adam", ADAM)):
        save = tmp_path / f"{first}-then"
        proc = run(save, then, 4, restore=tmp_path / first / "checkpoint_1_2.pt")
        assert "resuming a run of" in proc.stdout + proc.stderr
        switched_state, switched = weights(save / "checkpoint_last.pt")
        assert excess(switched, adams) <= 0
        assert switched_state["optimizer_history"][-1]["num_updates"] == 4
        assert any("resumed_from_optimizer" in h for h in switched_state["optimizer_history"])


def test_the_benchmark_counts_fairseqs_loop_and_the_fused_kernel():
    """``benchmarks/optimizer_step.py``'s counts (``workflows/measure/optimizer_step.py``) at a tiny odd shape."""
    from seed_fairseq.workflows.measure.optimizer_step import encoder_shapes, measure

    shapes = encoder_shapes(layers=1, hidden=32, ffn=37, vocab=301, positions=50)
    n = len(shapes)
    assert n == 4 + 16 + 5
    adam, new = measure("adam", "fp32", steps=1, shapes=shapes), measure("torch_adam", "fp32", steps=1, shapes=shapes)
    assert adam["launches"]["step"] == 8 * n  # fairseq's loop: 8 element-wise kernels per tensor
    assert new["launches"]["step"] == 2  # torch's fused AdamW, and its step counts' increment
    assert adam["launches"]["norm"] >= n > 10 > new["launches"]["norm"]  # a norm per tensor vs one _foreach_norm
    bf16 = measure("torch_adam", "bf16", steps=1, shapes=shapes)
    # the wrapper's deferred clipping (one _foreach_mul_), the two of the fused AdamW, a copy back per master
    assert bf16["master_tensors"] == n and bf16["launches"]["step"] == 1 + 2 + n
    assert all(v > 0 for v in bf16["seconds"].values())


# ---------------------------------------------------------------------------
# the workflows' commands
# ---------------------------------------------------------------------------


def test_the_workflows_write_torch_adam_and_take_adam_from_fairseq_args(tmp_path):
    from helpers import DEMO_CORPUS
    from test_faults_adapt import COMPARE

    from seed_fairseq.workflows.compare import cli as compare_cli
    from seed_fairseq.workflows.compare.pipeline import Comparison
    from seed_fairseq.workflows.kit.argv import DEFAULT_OPTIMIZER
    from seed_fairseq.workflows.kit.checks import glue_option_values
    from seed_fairseq.workflows.kit.objectives import check_fairseq_args

    def comparison_args(*fairseq_args):
        argv = ["--out", str(tmp_path / "out"), "--corpus", str(DEMO_CORPUS), *COMPARE, *fairseq_args]
        args = compare_cli.parser().parse_args(glue_option_values(argv, compare_cli.OPTION_LISTS))
        plan = compare_cli.build_plan(args, argv, "compare")  # checks --fairseq-args against the plan
        return Comparison(plan).pretrain_args("seed", 1)

    def optimizers(args):
        return [args[i + 1] for i, a in enumerate(args) if a == "--optimizer"]

    assert DEFAULT_OPTIMIZER == "torch_adam"
    assert optimizers(comparison_args()) == ["torch_adam"]
    # fairseq's own through --fairseq-args: the one optimizer of the command, the tool's options with it
    args = comparison_args("--fairseq-args", "--optimizer adam")
    assert optimizers(args) == ["adam"] and "--adam-eps" in args
    planned = comparison_args()
    check_fairseq_args(["--optimizer=torch_adam"], planned)
    with pytest.raises(ValueError, match="--optimizer sgd: the tools write adam's options"):
        check_fairseq_args(["--optimizer", "sgd"], planned)
    with pytest.raises(ValueError, match="planned by the tool"):
        check_fairseq_args(["--adam-eps", "1e-8"], planned)
    assert not (tmp_path / "out").exists()
