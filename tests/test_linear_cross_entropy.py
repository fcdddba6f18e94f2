"""The chunked linear cross-entropy (gradients computed in forward, or recomputed in
backward) equals the plain one (full logits + F.cross_entropy), loss and gradients, in
every dtype the CPU runs; and SEED's criterion gives the same terms and gradients
through either path.

Tolerances: fp32 -- the two paths differ only in summation order (the loss is a sum
over positions, the weight gradient a sum over chunks): rtol 1e-5.  bf16 / fp16 -- the
logits are computed in the input dtype in both paths, everything after in fp32; the
chunked path accumulates the weight gradient in fp32 across chunks where the plain
one rounds one fp32-accumulated matmul to the dtype once, so the gradients agree to
about one rounding step of the dtype: rtol 1e-2 (bf16: 8 bits of mantissa) and
2e-3 (fp16: 11 bits), with an absolute floor for values near zero.
"""

import pytest
import torch
import torch.nn.functional as F
from conftest import build_task_model

from seed_fairseq.pretrain.modules.linear_cross_entropy import (
    default_chunk_size,
    linear_cross_entropy,
    plain_linear_cross_entropy,
)

TOL = {
    torch.float32: dict(rtol=1e-5, atol=1e-6),
    torch.bfloat16: dict(rtol=1e-2, atol=1e-2),
    torch.float16: dict(rtol=2e-3, atol=2e-3),
}
PAD = 1
# odd sizes: 3 x 23 positions, hidden 32, vocabulary 397
B, T, C, V = 3, 23, 32, 397


def _inputs(dtype, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(B, T, C, generator=g).to(dtype).requires_grad_()
    weight = (torch.randn(V, C, generator=g) * 0.4).to(dtype).requires_grad_()
    b = (torch.randn(V, generator=g) * 0.1).to(dtype).requires_grad_() if bias else None
    target = torch.randint(0, V, (B, T), generator=g)
    target[1, 17:] = PAD  # a padded row
    target[2, 4] = PAD  # and a pad in the middle
    # make some argmax predictions right, so that `correct` is checked on more than zeros
    with torch.no_grad():
        logits = F.linear(hidden, weight, b).float()
        right = torch.zeros(B, T, dtype=torch.bool)
        right[:, ::3] = True
        target = torch.where(right & target.ne(PAD), logits.argmax(-1), target)
    return hidden, weight, b, target


def _run(fn, hidden, weight, bias, target, scale=0.37, **kw):
    for x in (hidden, weight, bias):
        if x is not None:
            x.grad = None
    nll, correct = fn(hidden, weight, target, bias=bias, ignore_index=PAD, **kw)
    (nll * scale).backward()  # a grad_output other than 1, as the criterion's weight/count gives
    grads = [x.grad.clone() if x is not None else None for x in (hidden, weight, bias)]
    return nll.detach(), correct, grads


CHUNKED = ("chunked", "recompute")


@pytest.mark.parametrize("implementation", CHUNKED)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("chunk_size", [1, 7, 64, None])
@pytest.mark.parametrize("bias", [True, False], ids=["bias", "nobias"])
def test_chunked_equals_plain(implementation, dtype, chunk_size, bias):
    hidden, weight, b, target = _inputs(dtype, bias)
    ref = _run(plain_linear_cross_entropy, hidden, weight, b, target)
    got = _run(linear_cross_entropy, hidden, weight, b, target, chunk_size=chunk_size, implementation=implementation)
    assert got[0].dtype == torch.float32 and ref[0].dtype == torch.float32
    torch.testing.assert_close(got[0], ref[0], **TOL[dtype])
    assert int(got[1]) == int(ref[1]) and int(ref[1]) > 5
    for name, g, r in zip(("hidden", "weight", "bias"), got[2], ref[2]):
        if r is None:
            assert g is None
            continue
        assert g.dtype == dtype, name
        torch.testing.assert_close(g.float(), r.float(), **TOL[dtype], msg=name)
    # ignored positions get exactly no gradient
    assert torch.equal(got[2][0][target.eq(PAD)], torch.zeros_like(got[2][0][target.eq(PAD)]))


@pytest.mark.parametrize("implementation", CHUNKED)
def test_fp32_equals_a_hand_written_loss(implementation):
    """Against log-softmax written out: the summed NLL and the argmax count."""
    hidden, weight, b, target = _inputs(torch.float32)
    nll, correct = linear_cross_entropy(
        hidden, weight, target, bias=b, ignore_index=PAD, chunk_size=5, implementation=implementation
    )
    logits = hidden.detach().double() @ weight.detach().double().t() + b.detach().double()
    logp = logits - logits.exp().sum(-1, keepdim=True).log()
    keep = target.ne(PAD)
    expected = -logp.gather(-1, target.unsqueeze(-1)).squeeze(-1)[keep].sum()
    assert float(nll.detach()) == pytest.approx(float(expected), rel=1e-6)
    assert int(correct) == int((logits.argmax(-1).eq(target) & keep).sum())


@pytest.mark.parametrize("implementation", CHUNKED)
def test_default_ignore_index_and_all_ignored(implementation):
    hidden, weight, _, target = _inputs(torch.float32, bias=False)
    t = target.clone()
    t[0] = -100
    nll, _ = linear_cross_entropy(hidden, weight, t, implementation=implementation)
    ref, _ = plain_linear_cross_entropy(hidden, weight, t)
    torch.testing.assert_close(nll, ref)
    # nothing to predict: 0, and a backward that reaches the parameters with zero gradient
    none = torch.full_like(target, PAD)
    nll, correct = linear_cross_entropy(hidden, weight, none, ignore_index=PAD, implementation=implementation)
    assert float(nll.detach()) == 0.0 and int(correct) == 0
    nll.backward()
    assert torch.equal(weight.grad, torch.zeros_like(weight))


@pytest.mark.parametrize("implementation,passes", [("chunked", 1), ("recompute", 2)])
def test_chunks_really_bound_the_logits(monkeypatch, implementation, passes):
    """No matmul ever produces more than chunk_size rows of logits; "chunked" computes
    them once (gradients in forward), "recompute" again in backward."""
    import seed_fairseq.pretrain.modules.linear_cross_entropy as lce

    rows = []
    real = lce._chunk_logits

    def spy(h, weight, bias):
        rows.append(h.size(0))
        return real(h, weight, bias)

    monkeypatch.setattr(lce, "_chunk_logits", spy)
    hidden, weight, b, target = _inputs(torch.float32)
    nll, _ = linear_cross_entropy(
        hidden, weight, target, bias=b, ignore_index=PAD, chunk_size=10, implementation=implementation
    )
    nll.backward()
    kept = int(target.ne(PAD).sum())
    assert max(rows) == 10 and sum(rows) == passes * kept
    assert default_chunk_size(32768) == 512 and default_chunk_size(397) == 2**24 // 397


def test_no_gradient_work_without_autograd(monkeypatch):
    """Under no_grad (validation) or for inputs that need no gradient, forward computes none."""
    import seed_fairseq.pretrain.modules.linear_cross_entropy as lce

    calls = []
    monkeypatch.setattr(lce, "_accumulate", lambda *a: calls.append(1))
    hidden, weight, b, target = _inputs(torch.float32)
    with torch.no_grad():
        nll, _ = linear_cross_entropy(hidden, weight, target, bias=b, ignore_index=PAD)
    linear_cross_entropy(hidden.detach(), weight.detach(), target, ignore_index=PAD)
    assert not calls and float(nll) > 0


def test_bad_arguments_are_clear():
    hidden, weight, _, target = _inputs(torch.float32, bias=False)
    with pytest.raises(ValueError, match="implementation must be one of"):
        linear_cross_entropy(hidden, weight, target, implementation="fast")
    with pytest.raises(ValueError, match="chunk_size must be >= 1"):
        linear_cross_entropy(hidden, weight, target, chunk_size=0)
    with pytest.raises(ValueError, match="do not match"):
        linear_cross_entropy(hidden, weight, target[:, :-1])


# ---------------------------------------------------------------------------
# SEED's criterion: --vocab-loss chunked == plain (the earlier code path)
# ---------------------------------------------------------------------------


def _sample(pad, dtype_model=None):
    torch.manual_seed(3)
    src = torch.randint(4, 98, (4, 16))
    src[:, 0] = 0
    src[2, 9:] = pad
    target = torch.full_like(src, pad)
    target[:, 3] = src[:, 3]
    target[1, 7] = src[1, 7]
    return {
        "net_input": {"src_tokens": src, "src_lengths": src.ne(pad).sum(1), "prev_output_tokens": src[:, :-1]},
        "target": target,
        "dec_target": torch.where(src[:, 1:].eq(pad), pad, src[:, 1:]),
        "ntokens": int(src.ne(pad).sum()),
        "nsentences": 4,
    }


@pytest.mark.parametrize("implementation", CHUNKED)
@pytest.mark.parametrize("arch", ["seed", "mlm_only"])
def test_seed_criterion_chunked_equals_plain(odd_dict_dir, arch, implementation):
    extra = ["--dropout", "0", "--attention-dropout", "0"]
    if arch == "mlm_only":
        extra += ["--decoder-layers", "0"]
    task, model, _, _ = build_task_model(odd_dict_dir, *extra)
    _, _, plain, _ = build_task_model(odd_dict_dir, *extra, "--vocab-loss", "plain")
    _, _, chunked, _ = build_task_model(
        odd_dict_dir, *extra, "--vocab-loss", implementation, "--vocab-loss-chunk-size", "5"
    )
    sample = _sample(task.source_dictionary.pad())
    model.train()
    results = []
    for criterion in (plain, chunked):
        model.zero_grad()
        loss, _, log = criterion(model, sample)
        loss.backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append((loss.detach(), log, grads))
    (l_plain, log_plain, g_plain), (l_chunked, log_chunked, g_chunked) = results
    torch.testing.assert_close(l_chunked, l_plain, rtol=1e-6, atol=0)
    terms = ("mlm", "dec") if arch == "seed" else ("mlm",)
    for term in terms:
        assert float(log_chunked[f"{term}_loss_sum"]) == pytest.approx(float(log_plain[f"{term}_loss_sum"]), rel=1e-6)
        assert log_chunked[f"{term}_correct"] == log_plain[f"{term}_correct"]
        assert log_chunked[f"{term}_ntokens"] == log_plain[f"{term}_ntokens"] > 0
    assert g_chunked.keys() == g_plain.keys() and len(g_plain) > 10
    for name in g_plain:
        torch.testing.assert_close(g_chunked[name], g_plain[name], rtol=1e-4, atol=1e-7, msg=name)


def test_mlm_hidden_and_projection_give_the_mlm_logits(odd_dict_dir):
    _, model, _, _ = build_task_model(odd_dict_dir)
    model.eval()
    features = torch.randn(2, 9, 32)
    masked = torch.zeros(2, 9, dtype=torch.bool)
    masked[0, 2] = masked[1, 5] = masked[1, 8] = True
    weight, bias = model.mlm_projection()
    expected = model.mlm_logits(features, masked)
    assert torch.equal(F.linear(model.mlm_hidden(features, masked), weight) + bias, expected)


def test_vocab_loss_options_are_checked(odd_dict_dir):
    with pytest.raises(ValueError, match="--vocab-loss-chunk-size must be >= 0"):
        build_task_model(odd_dict_dir, "--vocab-loss-chunk-size", "-1")
    with pytest.raises(ValueError, match="needs the liger_kernel package"):
        build_task_model(odd_dict_dir, "--vocab-loss", "liger")


@pytest.mark.parametrize("implementation", CHUNKED)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_precision_accumulates_in_fp32(implementation, dtype):
    """Chunk by chunk (one position each) the weight gradient is summed in fp32 and rounded
    once: no further from the exact (float64) gradient than the plain path's single matmul."""
    hidden, weight, b, target = _inputs(dtype)
    _, _, (_, g_plain, _) = _run(plain_linear_cross_entropy, hidden, weight, b, target)
    _, _, (_, g_chunked, _) = _run(
        linear_cross_entropy, hidden, weight, b, target, chunk_size=1, implementation=implementation
    )
    h64, w64, b64 = (x.detach().double().requires_grad_() for x in (hidden, weight, b))
    _, _, (_, g_exact, _) = _run(plain_linear_cross_entropy, h64, w64, b64, target)
    err_plain = (g_plain.double() - g_exact).abs().sum()
    err_chunked = (g_chunked.double() - g_exact).abs().sum()
    assert err_chunked <= 1.1 * err_plain, (float(err_chunked), float(err_plain))
