"""CPDAE (``cpdae_pretrain``): the JS divergence, the contrastive loss gathered over gloo
workers against one process on the concatenated batch, the two masked views, every
loss term against a hand-written reference, CPDAE', half precision and bad input.
What every objective guarantees (bottleneck, split, resume, heads, export) is in
test_contract.py (entry ``cpdae`` in objectives.py)."""

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import run
from objectives import BY_NAME
from scipy.spatial.distance import jensenshannon
from test_contract import POOLINGS, build, check_bottleneck, train_cmd

from seed_fairseq.pretrain.criterions.cpdae_pretrain import dense_similarity, js_similarity, word_distributions
from seed_fairseq.pretrain.modules import js_divergence as jsd
from seed_fairseq.pretrain.modules.contrastive import info_nce_sum
from seed_fairseq.pretrain.tasks.batching import DUMMY_BATCH

CPDAE = BY_NAME["cpdae"]
LN2 = math.log(2)


def _distributions(n, v, seed, zeros=0):
    g = torch.Generator().manual_seed(seed)
    p = torch.rand(n, v, generator=g) ** 3  # skewed, like word distributions
    if zeros:
        p[:, :zeros] = 0
    return p / p.sum(-1, keepdim=True)


def _batch(task, n, split="valid", seed=1):
    task.load_dataset(split)
    itr = task.get_batch_iterator(task.dataset(split), max_sentences=n, seed=seed).next_epoch_itr(shuffle=False)
    return next(itr)


# ---------------------------------------------------------------------------
# registration
# ---------------------------------------------------------------------------


def test_registered_names_are_ours():
    import fairseq.criterions as C
    import fairseq.models as M
    import fairseq.tasks as T

    from seed_fairseq.pretrain.criterions.cpdae_pretrain import CpdaePretrainCriterion
    from seed_fairseq.pretrain.models.cpdae import CpdaeModel
    from seed_fairseq.pretrain.tasks.cpdae_pretrain import CpdaePretrainTask

    assert T.TASK_REGISTRY["cpdae_pretrain"] is CpdaePretrainTask
    assert C.CRITERION_REGISTRY["cpdae_pretrain"] is CpdaePretrainCriterion
    assert M.MODEL_REGISTRY["cpdae"] is CpdaeModel
    for arch in ("cpdae_base", "cpdae_tiny"):
        assert M.ARCH_MODEL_REGISTRY[arch] is CpdaeModel and M.ARCH_MODEL_NAME_REGISTRY[arch] == "cpdae"


# ---------------------------------------------------------------------------
# Jensen-Shannon divergence
# ---------------------------------------------------------------------------


def test_js_against_scipy_symmetric_and_zero_for_equal():
    p, q = _distributions(5, 397, 0), _distributions(3, 397, 1)
    js = jsd.pairwise_js(p, q)
    # scipy's Jensen-Shannon DISTANCE (natural log) is the square root of the divergence
    expected = torch.tensor([[jensenshannon(a.double(), b.double()) ** 2 for b in q] for a in p])
    torch.testing.assert_close(js.double(), expected, rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(jsd.js_divergence(p[:3], q), torch.diagonal(js[:3]), rtol=1e-6, atol=0)
    assert torch.equal(jsd.pairwise_js(q, p), js.t())  # exactly symmetric
    assert torch.equal(torch.diagonal(jsd.pairwise_js(p, p)), torch.zeros(5))  # exactly 0 for equal rows
    assert bool((js > 0).all()) and bool((js < LN2).all())


def test_js_of_disjoint_supports_is_log_2():
    p = torch.zeros(1, 7)
    q = torch.zeros(1, 7)
    p[0, :3] = 1 / 3
    q[0, 3:] = 1 / 4
    assert float(jsd.pairwise_js(p, q)) == pytest.approx(LN2, abs=1e-6)


def test_js_finite_in_bfloat16_with_zeros():
    p = _distributions(4, 31, 2, zeros=9).bfloat16().requires_grad_()
    q = _distributions(6, 31, 3, zeros=5).bfloat16()
    q[0] = 0
    q[0, 20] = 1  # a one-hot distribution: zeros almost everywhere
    q.requires_grad_()
    js = jsd.pairwise_js(p, q)
    assert js.dtype == torch.float32
    # (bf16 rounding leaves the rows summing to 1 +- 1%, hence the slack on the bound)
    assert bool(torch.isfinite(js).all()) and bool((js >= 0).all()) and bool((js <= LN2 * 1.01).all())
    torch.testing.assert_close(torch.diagonal(jsd.pairwise_js(p, p)), torch.zeros(4), rtol=0, atol=0)
    js.sum().backward()
    assert bool(torch.isfinite(p.grad).all()) and bool(torch.isfinite(q.grad).all())


def test_pairwise_js_gradient_and_chunks(monkeypatch):
    p = _distributions(5, 11, 4).double().requires_grad_()
    q = _distributions(7, 11, 5).double().requires_grad_()
    # the custom backward against finite differences (fp32 inside: loose tolerances)
    monkeypatch.setattr(jsd, "CHUNK_ELEMENTS", 2 * 7 * 11)  # 3 chunks of rows
    analytic = torch.autograd.grad((jsd.pairwise_js(p, q) * torch.arange(35.0).view(5, 7)).sum(), (p, q))
    # ... and against autograd through the plain broadcast formula
    broadcast = jsd.js_divergence(p[:, None, :], q[None, :, :])
    reference = torch.autograd.grad((broadcast * torch.arange(35.0).view(5, 7)).sum(), (p, q))
    for a, r in zip(analytic, reference):
        torch.testing.assert_close(a.double(), r.double(), rtol=1e-4, atol=1e-6)
    monkeypatch.setattr(jsd, "CHUNK_ELEMENTS", 1 << 22)
    one_chunk = jsd.pairwise_js(p, q)
    monkeypatch.setattr(jsd, "CHUNK_ELEMENTS", 1)
    torch.testing.assert_close(jsd.pairwise_js(p, q), one_chunk, rtol=0, atol=0)


# ---------------------------------------------------------------------------
# the contrastive loss gathered over 2 gloo workers == one process, whole batch
# ---------------------------------------------------------------------------

N_TEXTS, DIM, WORDS = 5, 6, 23
SHARDS = ([0, 1, 2], [3, 4])  # uneven on purpose


def _problem(contrast):
    """Fixed inputs of two views of N_TEXTS texts and a linear 'encoder + decoder'."""
    g = torch.Generator().manual_seed(11)
    x1 = torch.randn(N_TEXTS, DIM, generator=g)
    x2 = x1 + 0.3 * torch.randn(N_TEXTS, DIM, generator=g)
    proj = torch.nn.Linear(DIM, WORDS if contrast == "words" else 7)
    with torch.no_grad():
        proj.weight.copy_(torch.randn(proj.weight.shape, generator=g))
        proj.bias.copy_(torch.randn(proj.bias.shape, generator=g))
    return x1, x2, proj


def _views(contrast, proj, x1, x2, texts):
    out = proj(torch.cat([x1[texts], x2[texts]]))
    if contrast == "words":
        return word_distributions(out), js_similarity
    return out, dense_similarity


# (contrast, rank of the worker running a dummy batch or -1): one spawn runs them all
SCENARIOS = (("words", -1), ("cls", -1), ("words", 1))


def _gloo_worker(rank, world, init_file, out_dir):
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        for contrast, dummy_rank in SCENARIOS:
            x1, x2, proj = _problem(contrast)
            views, similarity = _views(contrast, proj, x1, x2, SHARDS[rank])
            loss, correct = info_nce_sum(views, similarity, group=dist.group.WORLD, contribute=rank != dummy_rank)
            (loss / (2 * N_TEXTS)).backward()  # the criterion divides by the GLOBAL view count
            grads = [proj.weight.grad.clone(), proj.bias.grad.clone()]
            for g in grads:  # what fairseq does with the parameter gradients: their sum over workers
                dist.all_reduce(g)
            result = {"loss": loss.detach(), "correct": correct, "grads": grads}
            torch.save(result, f"{out_dir}/{contrast}_{dummy_rank}_{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def gloo_results(tmp_path_factory):
    """Every scenario on 2 gloo workers (torch.multiprocessing): {scenario: [rank 0, rank 1]}."""
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("gloo")
    mp.spawn(_gloo_worker, args=(2, out / "rendezvous", out), nprocs=2, join=True)
    return {(c, d): [torch.load(out / f"{c}_{d}_{r}.pt") for r in range(2)] for c, d in SCENARIOS}


def _reference_loss(contrast, views):
    """InfoNCE by hand: every view an anchor, the other view of its text the positive."""
    v = views.detach().double().numpy()
    n = len(v)
    if contrast == "words":
        sim = np.array([[-(jensenshannon(a, b) ** 2) for b in v] for a in v])
    else:
        sim = v @ v.T
    total = 0.0
    for i in range(n):
        others = [k for k in range(n) if k != i]
        total -= sim[i, (i + n // 2) % n] - np.log(np.sum(np.exp(sim[i, others])))
    return total


@pytest.mark.parametrize("contrast", ["words", "cls"])
def test_gathered_loss_and_gradients_equal_one_process(contrast, gloo_results):
    results = gloo_results[contrast, -1]
    x1, x2, proj = _problem(contrast)
    views, similarity = _views(contrast, proj, x1, x2, list(range(N_TEXTS)))
    loss, correct = info_nce_sum(views, similarity)  # one process, the concatenated batch
    (loss / (2 * N_TEXTS)).backward()

    assert float(loss) == pytest.approx(_reference_loss(contrast, views), rel=1e-5)
    assert float(sum(r["loss"] for r in results)) == pytest.approx(float(loss), rel=1e-5)
    assert int(sum(r["correct"] for r in results)) == int(correct)
    for r in results:  # every worker ends with the same, whole-batch gradient
        torch.testing.assert_close(r["grads"][0], proj.weight.grad, rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(r["grads"][1], proj.bias.grad, rtol=1e-4, atol=1e-6)


def test_dummy_batch_adds_no_negatives(gloo_results):
    """A worker running fairseq's dummy batch takes part in the collectives (no hang) but
    the other worker's loss is that of its own views alone."""
    results = gloo_results["words", 1]
    x1, x2, proj = _problem("words")
    views, similarity = _views("words", proj, x1, x2, SHARDS[0])
    alone, _ = info_nce_sum(views, similarity)
    assert float(results[0]["loss"]) == pytest.approx(float(alone), rel=1e-6)


def test_task_marks_the_dummy_batch(contract_data):
    task, model, criterion = build(CPDAE, contract_data)
    sample = _batch(task, 3)
    seen = []

    def recording_criterion(model, sample):
        seen.append(sample.get(DUMMY_BATCH, False))
        return criterion(model, sample)

    class Backward:
        def backward(self, loss):
            loss.backward()

    task.train_step(sample, model, recording_criterion, Backward(), 0, ignore_grad=False)
    task.train_step(sample, model, recording_criterion, Backward(), 0, ignore_grad=True)
    assert seen == [False, True] and DUMMY_BATCH not in sample


# ---------------------------------------------------------------------------
# the two views and the loss terms against hand-written references
# ---------------------------------------------------------------------------


def _mask_pattern(target, pad):
    return "".join("x" if t != pad else "." for t in target.tolist())


def test_two_views_are_masked_independently(contract_data):
    from fairseq.data import ListDataset

    task, _, _ = build(CPDAE, contract_data)
    pad = task.source_dictionary.pad()
    texts = [torch.tensor([0, *range(10, 39)]), torch.tensor([0, *range(60, 89)])]
    blocks = ListDataset(texts, sizes=np.array([30, 30]))
    src, target = task.mask_view(blocks, seed=task.cfg.seed)  # the base task's MLM view
    extra = task.extra_inputs("train", blocks, src, target)
    src_2, target_2 = extra["net_input"]["src_tokens_2"], extra["target_2"]
    # --seed 1 (fairseq's default), 15% of 30 tokens, epoch 1: the masks written out in full
    assert [_mask_pattern(target[i], pad) for i in range(2)] == [
        "................x.x.........xx",
        "..x..x..............x.x.......",
    ]
    assert [_mask_pattern(target_2[i], pad) for i in range(2)] == [
        ".x.x.........x..x......x......",
        "................x...x.x.x..x..",
    ]
    for i, text in enumerate(texts):  # the same text behind both views
        for s, t in ((src[i], target[i]), (src_2[i], target_2[i])):
            assert torch.equal(torch.where(t.ne(pad), t, s), text)
        assert torch.equal(extra["bow_tokens"][i], text)

    # the real pipeline: same text, different masks, in every batch row
    sample = _batch(task, 5)
    net = sample["net_input"]
    for v1, t1, v2, t2, text in zip(
        net["src_tokens"], sample["target"], net["src_tokens_2"], sample["target_2"], sample["bow_tokens"]
    ):
        assert torch.equal(torch.where(t1.ne(pad), t1, v1), text)
        assert torch.equal(torch.where(t2.ne(pad), t2, v2), text)
    assert not torch.equal(sample["target"].ne(pad), sample["target_2"].ne(pad))


def test_both_views_carry_the_mlm_loss(contract_data):
    task, model, criterion = build(CPDAE, contract_data)
    sample = _batch(task, 5)
    model.eval()
    pad = task.source_dictionary.pad()
    with torch.no_grad():
        terms = criterion.compute_terms(model, sample)
        per_view = []
        for src, target in (
            (sample["net_input"]["src_tokens"], sample["target"]),
            (
                sample["net_input"]["src_tokens_2"],
                sample["target_2"],
            ),
        ):
            masked = target.ne(pad)
            logits, _ = model(src, masked_tokens=masked)  # plain RoBERTa forward, one view
            per_view.append(F.cross_entropy(logits.float(), target[masked], reduction="sum"))
    assert all(float(v) > 0 for v in per_view)
    torch.testing.assert_close(terms["mlm"].loss, per_view[0] + per_view[1], rtol=1e-5, atol=1e-4)
    counts = task.term_counts(sample)
    assert int(counts["mlm"]) == int(sample["target"].ne(pad).sum() + sample["target_2"].ne(pad).sum())
    assert int(counts["bow"]) == int(counts["cl"]) == 10


def test_bow_target_is_the_set_of_words(contract_data):
    task, _, criterion = build(CPDAE, contract_data)
    d = task.source_dictionary
    mask = d.index("<mask>")
    tokens = torch.tensor([[0, 10, 12, 10, 3, mask, 2, 1, 1], [0, 397, 4, 2, 1, 1, 1, 1, 1]])
    bag = criterion.bow_targets(tokens)
    words = criterion.word_ids.tolist()
    assert words == [i for i in range(4, len(d)) if i != mask]  # no <s> <pad> </s> <unk> <mask>
    assert [[words[j] for j in row.nonzero().flatten().tolist()] for row in bag] == [[10, 12], [4, 397]]


@pytest.mark.parametrize("reduction", ["sum", "mean"])
@pytest.mark.parametrize("contrast", ["words", "cls"])
def test_terms_equal_hand_written_references(contract_data, contrast, reduction):
    task, model, criterion = build(CPDAE, contract_data, "--contrast", contrast, "--bow-reduction", reduction)
    sample = _batch(task, 3)
    model.eval()
    with torch.no_grad():
        terms = criterion.compute_terms(model, sample)
        _, extra = model(**sample["net_input"])
    words = criterion.word_ids.tolist()
    logits = extra["bow_logits"].double()[:, words]
    texts = [set(row.tolist()) for row in sample["bow_tokens"]] * 2  # views: [view 1 of all; view 2 of all]
    bce = 0.0
    for v in range(logits.size(0)):
        y = torch.tensor([float(w in texts[v]) for w in words], dtype=torch.double)
        z = torch.sigmoid(logits[v])
        per_word = -(y * torch.log(z) + (1 - y) * torch.log(1 - z))
        bce += float(per_word.sum() if reduction == "sum" else per_word.mean())
    assert float(terms["bow"].loss) == pytest.approx(bce, rel=1e-5)
    words = torch.sigmoid(logits) / torch.sigmoid(logits).sum(-1, keepdim=True)
    views = words if contrast == "words" else extra["bottleneck"]
    assert float(terms["cl"].loss) == pytest.approx(_reference_loss(contrast, views), rel=1e-5)


@pytest.mark.parametrize("pooling", list(POOLINGS))
def test_cpdae_prime_sees_the_encoder_only_through_the_pooling(contract_data, pooling):
    """CPDAE' (--contrast cls): the contrast of the bottleneck vectors, like the word distributions, sees
    the encoder only through the pooling (the contract's check, with cls and mean)."""
    check_bottleneck(CPDAE, contract_data, pooling, extra=("--contrast", "cls"))


@pytest.mark.parametrize("contrast", ["words", "cls"])
def test_bfloat16_forward_and_backward_are_finite(contract_data, contrast):
    task, model, criterion = build(CPDAE, contract_data, "--contrast", contrast)
    sample = _batch(task, 4, split="train")
    model = model.to(torch.bfloat16).train()
    loss, _, log = criterion(model, sample)
    assert bool(torch.isfinite(loss)) and all(math.isfinite(float(log[f"{t}_loss_sum"])) for t in CPDAE.terms)
    loss.backward()
    assert all(bool(torch.isfinite(p.grad).all()) for p in model.parameters() if p.grad is not None)


# ---------------------------------------------------------------------------
# memory: view 1 recomputed in backward (models/cpdae.py) against the one-batch path
# ---------------------------------------------------------------------------


def _loss_and_grads(criterion, model, sample):
    model.zero_grad()
    loss, _, _ = criterion(model, sample)
    loss.backward()
    return loss.detach(), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def test_split_views_equal_the_one_batch_path_without_dropout(contract_data):
    """Two encoder calls (view 1 recomputed) == one (2B, T) batch: the same loss and every
    parameter's gradient up to float summation order (without dropout: the two paths draw
    their dropout masks differently)."""
    no_dropout = ("--dropout", "0", "--attention-dropout", "0")
    task, model, criterion = build(CPDAE, contract_data, *no_dropout)
    sample = _batch(task, 5, split="train")
    model.train()
    assert not model.views_in_one_batch and model.recompute_view_1  # the default
    loss, grads = _loss_and_grads(criterion, model, sample)
    _, one_batch, _ = build(CPDAE, contract_data, *no_dropout, "--cpdae-views-in-one-batch")
    assert one_batch.views_in_one_batch
    one_batch.load_state_dict(model.state_dict())
    one_batch.train()
    loss_one, grads_one = _loss_and_grads(criterion, one_batch, sample)
    torch.testing.assert_close(loss, loss_one, rtol=1e-6, atol=1e-5)
    assert grads.keys() == grads_one.keys() and len(grads) == len(list(model.parameters()))
    for name, grad in grads_one.items():
        torch.testing.assert_close(grads[name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_recomputed_view_replays_its_dropout_exactly(contract_data):
    """With dropout on, recomputing view 1 gives bitwise the loss and gradients of keeping
    its activations, and leaves the RNG where it was (an exact resume stays exact)."""
    task, model, criterion = build(CPDAE, contract_data)
    assert model.args.dropout > 0 and model.args.attention_dropout > 0
    sample = _batch(task, 5, split="train")
    model.train()
    results = {}
    for recompute in (True, False):
        model.recompute_view_1 = recompute
        torch.manual_seed(3)
        results[recompute] = (*_loss_and_grads(criterion, model, sample), torch.rand(4))
    (loss, grads, after), (loss_kept, grads_kept, after_kept) = results[True], results[False]
    assert torch.equal(loss, loss_kept) and torch.equal(after, after_kept)
    for name, grad in grads_kept.items():
        assert torch.equal(grads[name], grad), name


def _saved_bytes_and_events(criterion, model, sample):
    """Bytes autograd saves outside checkpointed regions in the forward, and the order of the
    backward: the gradient reaching each encoder call's embeddings, the recomputation."""
    events, saved, phase = [], [0], ["forward"]

    def on_embed(module, inputs, output):
        if phase[0] == "backward":
            events.append("recompute")
        elif output.requires_grad:
            call = sum(e.startswith("forward") for e in events) + 1
            events.append(f"forward {call}")
            output.register_hook(lambda grad: events.append(f"grad {call}"))

    def pack(t):
        saved[0] += t.numel() * t.element_size()
        return t

    handle = model.encoder.sentence_encoder.embed_tokens.register_forward_hook(on_embed)
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss, _, _ = criterion(model, sample)
        phase[0] = "backward"
        loss.backward()
    finally:
        handle.remove()
    return saved[0], events


def test_one_view_of_activations_is_alive_at_a_time(contract_data):
    """The forward keeps view 2's activations only (view 1's are recomputed), and the
    backward finishes view 2 before it recomputes view 1."""
    task, model, criterion = build(CPDAE, contract_data)
    sample = _batch(task, 5, split="train")
    model.train()
    split, events = _saved_bytes_and_events(criterion, model, sample)
    assert events == ["forward 1", "forward 2", "grad 2", "recompute", "grad 1"]
    model.views_in_one_batch = True
    one_batch, _ = _saved_bytes_and_events(criterion, model, sample)
    assert split < 0.6 * one_batch, (split, one_batch)


DDP_ARGS = ("--dropout", "0", "--attention-dropout", "0", "--contrastive-weight", "0")


def _two_batches(task):
    task.load_dataset("train")
    itr = task.get_batch_iterator(task.dataset("train"), max_sentences=3, seed=1).next_epoch_itr(shuffle=False)
    return [next(itr), next(itr)]


def _ddp_worker(rank, world, init_file, data, out_dir):
    import torch.distributed as dist
    from fairseq.distributed import ModuleProxyWrapper
    from torch.nn.parallel import DistributedDataParallel

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        task, model, criterion = build(CPDAE, data, *DDP_ARGS)
        ddp = ModuleProxyWrapper(DistributedDataParallel(model.train()))
        loss, _, _ = criterion(ddp, _two_batches(task)[rank])
        loss.backward()  # DDP's reducer: every gradient ready exactly once, then averaged over the workers
        torch.save({n: p.grad for n, p in model.named_parameters()}, f"{out_dir}/ddp_{rank}.pt")
    finally:
        dist.destroy_process_group()


def test_recomputed_view_trains_under_pytorch_ddp(contract_data, tmp_path):
    """torch's DistributedDataParallel (fairseq's --ddp-backend pytorch_ddp, which fairseq-train
    cannot start on the CPU) with view 1 recomputed in backward: the reducer takes every
    parameter's gradient once, and averages the workers' gradients of their own batches."""
    import torch.multiprocessing as mp

    mp.spawn(_ddp_worker, args=(2, tmp_path / "rendezvous", contract_data, tmp_path), nprocs=2, join=True)
    torch.manual_seed(0)
    task, model, criterion = build(CPDAE, contract_data, *DDP_ARGS)
    model.train()
    from seed_fairseq.pretrain.data.update_counts import UPDATE_COUNTS

    expected = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    batches = _two_batches(task)
    counts = [task.term_counts(b) for b in batches]
    for sample in batches:  # each worker's loss divides by the update's counts: both batches'
        sample[UPDATE_COUNTS] = {k: counts[0][k] + counts[1][k] for k in counts[0]}
        model.zero_grad()
        loss, _, _ = criterion(model, sample)
        loss.backward()
        for n, p in model.named_parameters():
            expected[n] += p.grad / 2
    assert any(float(g.abs().max()) > 0 for n, g in expected.items() if n.startswith("encoder.sentence_encoder.layers"))
    for rank in range(2):
        grads = torch.load(tmp_path / f"ddp_{rank}.pt")
        for name, grad in expected.items():
            torch.testing.assert_close(grads[name], grad, rtol=1e-4, atol=1e-7, msg=name)


# ---------------------------------------------------------------------------
# bad input
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--contrastive-weight", "-0.1"], "--contrastive-weight must be >= 0"),
        (["--bow-weight", "-1"], "--bow-weight must be >= 0"),
        (["--contrast-temperature", "0"], "--contrast-temperature must be > 0"),
        (["--batch-size", "1"], "--batch-size 1 on a single worker gives the contrastive loss no negatives"),
    ],
)
def test_bad_options_are_clear_errors(contract_data, extra, message):
    with pytest.raises(ValueError, match=message):
        build(CPDAE, contract_data, *extra)


def test_batch_size_one_is_fine_without_the_contrastive_term(contract_data):
    build(CPDAE, contract_data, "--batch-size", "1", "--contrastive-weight", "0")


def test_one_text_has_no_negatives_and_is_skipped(contract_data):
    """A batch holding one text (the last batch of an epoch) has no negative: its
    contrastive term is skipped, not logged as L_CL 0 with cl_acc 100."""
    task, model, criterion = build(CPDAE, contract_data)
    sample = _batch(task, 1, split="train")
    assert sample["bow_tokens"].size(0) == 1
    model.train()
    assert "cl" not in criterion.compute_terms(model, sample)
    loss, _, log = criterion(model, sample)
    assert log["cl_ntokens"] == 0 and "cl_correct" not in log and task.term_counts(sample)["cl"] == 0
    assert bool(torch.isfinite(loss))
    # info_nce_sum itself stays exactly 0 with zero gradient for one text (never NaN)
    views = torch.randn(2, 5, requires_grad=True)
    nce, correct = info_nce_sum(views, dense_similarity)
    nce.backward()
    assert float(nce) == 0.0 and int(correct) == 2 and float(views.grad.abs().max()) == 0


@pytest.mark.slow
def test_negative_lambda_on_the_command_line(contract_data, tmp_path):
    proc = run(train_cmd(CPDAE, contract_data, tmp_path, "--contrastive-weight", "-0.1", max_update=1))
    assert proc.returncode == 2
    last = [line for line in proc.stderr.strip().splitlines() if line.strip()][-1]
    assert last == "error: --contrastive-weight must be >= 0 and finite, got -0.1", proc.stderr[-3000:]
