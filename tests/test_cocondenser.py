"""coCondenser (``cocondenser_pretrain``): documents cut into spans (literal spans per
--sample-break-mode, documents too short), two spans per document drawn from (seed, epoch, index)
(literal picks, uniform, the real pipeline, exact resume across an epoch), the contrast against a
hand-computed InfoNCE, and the negatives gathered from every worker: 2 gloo processes with 3
documents each give the loss and gradients of one process with the 6 (and do not without the
gather, or with a gather whose gradients stay local)."""

import numpy as np
import pytest
import torch
from helpers import check
from objectives import BY_NAME
from test_contract import SGD_NO_STEP, build, records, train_cmd

from seed_fairseq.pretrain.checkpoint import load_torch_file
from seed_fairseq.pretrain.data.document_spans import FixedSpanPairs, SpanPairs, document_spans

COCONDENSER = BY_NAME["cocondenser"]
NO_DROPOUT = ("--dropout", "0", "--attention-dropout", "0")

# lines of 5 and 3 tokens | 9, 2 | an empty document | 14 | 3 | 4, 4, 4 (a size-1 item: the empty line)
SIZES = np.array([5, 3, 1, 9, 2, 1, 1, 14, 1, 3, 1, 4, 4, 4])


@pytest.mark.parametrize(
    "mode, spans, documents",
    [
        # whole lines up to 6 tokens, a longer line first cut in near-equal pieces (9 -> 5 + 4, 14 -> 5 + 5 + 4)
        ("complete", [[0, 5], [5, 8], [9, 14], [14, 20], [22, 27], [27, 32], [32, 36], [41, 45], [45, 49], [49, 53]],
         [0, 0, 1, 1, 3, 3, 3, 5, 5, 5]),
        # runs of 6 tokens within each document
        ("none", [[0, 6], [6, 8], [9, 15], [15, 20], [22, 28], [28, 34], [34, 36], [41, 47], [47, 53]],
         [0, 0, 1, 1, 3, 3, 3, 5, 5]),
        # one line a span
        ("eos", [[0, 5], [5, 8], [9, 14], [14, 18], [18, 20], [22, 27], [27, 32], [32, 36], [41, 45], [45, 49],
                 [49, 53]], [0, 0, 1, 1, 1, 3, 3, 3, 5, 5, 5]),
    ],
)  # fmt: skip
def test_literal_spans_never_cross_a_document(mode, spans, documents):
    got, doc = document_spans(SIZES, mode, 6)
    assert got.tolist() == spans and doc.tolist() == documents  # document 4 (3 tokens, one span): dropped
    same, _ = document_spans(SIZES, "complete_doc" if mode == "complete" else mode, 6)
    assert same.tolist() == spans


def test_documents_too_short_for_two_spans():
    sizes = np.concatenate([SIZES, [1, 2, 1, 6]])  # + a document of 2 tokens, one of 6
    dropped, doc = document_spans(sizes, "complete", 6)
    assert sorted(set(doc.tolist())) == [0, 1, 3, 5]
    halves, doc = document_spans(sizes, "complete", 6, "halves")
    # 3 tokens (37-40) and 2 tokens (54-56) are too short for halves; 6 tokens (57-63) give 3 + 3
    assert halves.tolist() == [*dropped.tolist(), [57, 60], [60, 63]] and doc.tolist()[-2:] == [7, 7]
    assert len(document_spans(np.array([4, 1, 3]), "complete", 6)[0]) == 0
    # a lone </s> is no span: a 7-token document in runs of 6 gives one span, not two
    assert document_spans(np.array([7]), "none", 6)[0].tolist() == []


def test_literal_picks_of_seed_epoch_and_index():
    spans, doc = document_spans(SIZES, "complete", 6)
    pairs = SpanPairs(spans, doc, seed=1)
    assert pairs.count.tolist() == [2, 2, 3, 3] and pairs.lengths.tolist() == [5, 3, 5, 6, 5, 5, 4, 4, 4, 4]
    picks = {e: [p.tolist() for p in pairs.picks(e, np.arange(4))] for e in (1, 2, 3)}
    assert picks == {  # the longer span first (document 1: span 3, 6 tokens)
        1: [[0, 3, 4, 7], [1, 2, 6, 9]],
        2: [[0, 3, 5, 8], [1, 2, 6, 7]],
        3: [[0, 3, 5, 8], [1, 2, 4, 9]],
    }
    assert [p.tolist() for p in pairs.picks(2, [3, 0])] == [[8, 0], [7, 1]]  # per index, not per batch
    other = SpanPairs(spans, doc, seed=2)
    assert any(not np.array_equal(a, b) for a, b in zip(other.picks(1, np.arange(4)), pairs.picks(1, np.arange(4))))
    fixed = FixedSpanPairs(spans, doc)
    assert len(fixed) == 4 and [p.tolist() for p in fixed.picks(5, np.arange(4))] == [[0, 3, 4, 7], [1, 2, 5, 8]]


def test_picks_are_uniform_over_the_pairs():
    spans = np.stack([np.arange(5) * 10, np.arange(5) * 10 + 4], 1)  # one document of 5 equal spans
    pairs = SpanPairs(spans, np.zeros(5, dtype=np.int64), seed=7)
    a, b = zip(*(pairs.picks(e, [0]) for e in range(1, 4001)))
    a, b = np.concatenate(a), np.concatenate(b)
    assert bool((a != b).all())
    counts = np.bincount(np.minimum(a, b) * 5 + np.maximum(a, b), minlength=25)[[1, 2, 3, 4, 7, 8, 9, 13, 14, 19]]
    chi2 = float(((counts - 400.0) ** 2 / 400.0).sum())
    assert chi2 < 27.9, counts  # 9 degrees of freedom, p = 0.001
    assert abs(float((a < b).mean()) - 0.5) < 0.04  # equal lengths: either order


def _unmasked(src, target, pad):
    return torch.where(target.ne(pad), target, src)


def test_each_row_is_a_different_span_of_its_document(contract_data):
    task, _, _ = build(COCONDENSER, contract_data, "--sample-break-mode", "complete")
    task.load_dataset("train")
    pad = task.source_dictionary.pad()
    dataset = task.dataset("train")
    view_2, every_span = task.span_views["train"]
    pairs, blocks = view_2.pairs, view_2.blocks
    assert len(every_span) == len(blocks) > len(pairs) == len(dataset) == 74  # the 74 training documents
    chosen = {}
    for epoch in (1, 2):
        dataset.set_epoch(epoch)
        sample = dataset.collater([dataset[i] for i in range(6)])
        net = sample["net_input"]
        rows_1 = _unmasked(net["src_tokens"], sample["target"], pad)
        rows_2 = _unmasked(net["src_tokens_2"], sample["target_2"], pad)
        for i in range(6):
            a, b = (int(p[0]) for p in pairs.picks(epoch, [i]))
            assert a != b and pairs.first[i] <= min(a, b) and max(a, b) < pairs.first[i] + pairs.count[i]
            for row, span in ((rows_1[i], a), (rows_2[i], b)):
                tokens = row[row.ne(pad)]
                assert torch.equal(tokens, torch.cat([torch.tensor([0]), blocks[span]]))
            assert dataset.size(i) == len(blocks[a]) + 1 == int(net["src_tokens"][i].ne(pad).sum())
        chosen[epoch] = [pairs.picks(epoch, [i]) for i in range(6)]
    assert chosen[1] != chosen[2]  # a new pair every epoch


def _dense_reference(vectors, temperature=1.0):
    """The paper's L_co by hand: every span an anchor, the other span of its document the positive,
    every other span a candidate (spans ordered [first spans; second spans])."""
    v = vectors.double().numpy()
    n = len(v)
    sim = v @ v.T / temperature
    total = 0.0
    for i in range(n):
        others = [k for k in range(n) if k != i]
        total -= sim[i, (i + n // 2) % n] - np.log(np.sum(np.exp(sim[i, others])))
    return total


@pytest.mark.parametrize("temperature", [1.0, 0.5])
def test_contrast_equals_a_hand_computed_info_nce(contract_data, temperature):
    task, model, criterion = build(COCONDENSER, contract_data, *NO_DROPOUT, "--contrast-temperature", str(temperature))
    task.load_dataset("train")
    sample = next(task.get_batch_iterator(task.dataset("train"), max_sentences=5, seed=1).next_epoch_itr(shuffle=False))
    model.eval()
    with torch.no_grad():
        terms = criterion.compute_terms(model, sample)
        first, _ = model(sample["net_input"]["src_tokens"], features_only=True)
        second, _ = model(sample["net_input"]["src_tokens_2"], features_only=True)
    vectors = torch.cat([first[:, 0], second[:, 0]])  # the late [CLS] of every span: [first; second]
    assert float(terms["co"].loss) == pytest.approx(_dense_reference(vectors, temperature), rel=1e-5)
    assert task.term_counts(sample)["co"] == 10


def test_one_document_has_no_negatives_and_batch_size_one_is_refused(contract_data):
    task, model, criterion = build(COCONDENSER, contract_data)
    task.load_dataset("train")
    sample = next(task.get_batch_iterator(task.dataset("train"), max_sentences=1, seed=1).next_epoch_itr(shuffle=False))
    model.train()
    assert "co" not in criterion.compute_terms(model, sample) and int(task.term_counts(sample)["co"]) == 0
    with pytest.raises(ValueError, match="--batch-size 1 on a single worker"):
        build(COCONDENSER, contract_data, "--batch-size", "1")
    build(COCONDENSER, contract_data, "--batch-size", "1", "--contrastive-weight", "0")


def test_mlm_units_spans_is_the_papers_literal_sum_per_span(contract_data):
    task, model, criterion = build(COCONDENSER, contract_data, *NO_DROPOUT, "--mlm-units", "spans")
    task.load_dataset("train")
    sample = next(task.get_batch_iterator(task.dataset("train"), max_sentences=3, seed=1).next_epoch_itr(shuffle=False))
    model.eval()
    with torch.no_grad():
        _, _, log = criterion(model, sample)
    assert log["mlm_ntokens"] == log["head_ntokens"] == log["co_ntokens"] == 6
    assert "mlm_correct" not in log and "head_correct" not in log and "co_correct" in log


# ---------------------------------------------------------------------------
# the negatives of every worker: 2 gloo processes x 3 documents == 1 process x 6
# ---------------------------------------------------------------------------

DOCS = list(range(6))
SHARDS = (DOCS[:3], DOCS[3:])
GATHERS = ("gathered", "local", "local_gradients")  # the shared gather, none, one without its backward


def _local_gradients_gather(x, group):
    """A gather whose gradients stay on this worker (the candidates received are constants)."""
    import torch.distributed as dist

    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.detach().contiguous(), group=group)
    parts[dist.get_rank(group)] = x
    return torch.cat(parts), x.size(0) * dist.get_rank(group)


def _loss_and_grads(criterion, model, sample):
    model.zero_grad()
    loss, _, log = criterion(model, sample)
    loss.backward()
    return float(loss.detach()), {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}, log


def _gloo_worker(rank, world, init_file, data, out_dir):
    import torch.distributed as dist

    from seed_fairseq.pretrain.criterions import condenser_pretrain
    from seed_fairseq.pretrain.modules import contrastive

    dist.init_process_group("gloo", init_method=f"file://{init_file}", rank=rank, world_size=world)
    try:
        task, model, criterion = build(COCONDENSER, data, *NO_DROPOUT)
        model.load_state_dict(torch.load(f"{out_dir}/weights.pt"))
        task.load_dataset("train")
        dataset = task.dataset("train")
        sample = dataset.collater([dataset[i] for i in SHARDS[rank]])
        model.train()
        for gather in GATHERS:
            if gather == "local":
                condenser_pretrain.data_parallel_group = lambda: None
            elif gather == "local_gradients":
                condenser_pretrain.data_parallel_group = contrastive.data_parallel_group
                contrastive.gather_with_grad = _local_gradients_gather
            loss, grads, log = _loss_and_grads(criterion, model, sample)
            for g in grads.values():  # what fairseq makes of the workers' gradients: their sum
                dist.all_reduce(g)
            result = {"loss": loss, "grads": grads, "co_correct": log.get("co_correct")}
            torch.save(result, f"{out_dir}/{gather}_{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def one_and_two_workers(contract_data, tmp_path_factory):
    import torch.multiprocessing as mp

    out = tmp_path_factory.mktemp("cocondenser_gloo")
    task, model, criterion = build(COCONDENSER, contract_data, *NO_DROPOUT)
    torch.save(model.state_dict(), out / "weights.pt")
    task.load_dataset("train")
    dataset = task.dataset("train")
    model.train()
    one = _loss_and_grads(criterion, model, dataset.collater([dataset[i] for i in DOCS]))
    mp.spawn(_gloo_worker, args=(2, out / "rendezvous", contract_data, out), nprocs=2, join=True)
    two = {g: [torch.load(out / f"{g}_{r}.pt") for r in range(2)] for g in GATHERS}
    return one, two


def _max_difference(a, b):
    return max(float((a[n] - b[n]).abs().max()) for n in a)


def test_two_workers_give_the_loss_and_gradients_of_one_with_their_batches(one_and_two_workers):
    """Tolerance: 1e-5 relative on the loss, 1e-4 relative + 1e-6 absolute on every gradient (float32
    summation order: padding widths and reductions differ between the splits)."""
    (loss, grads, log), two = one_and_two_workers
    workers = two["gathered"]
    assert sum(w["loss"] for w in workers) == pytest.approx(loss, rel=1e-5)
    assert sum(w["co_correct"] for w in workers) == log["co_correct"]
    assert len(grads) == len(workers[0]["grads"]) > 30
    for w in workers:  # each worker ends with the whole batch's gradient
        for name, g in grads.items():
            torch.testing.assert_close(w["grads"][name], g, rtol=1e-4, atol=1e-6, msg=name)


def test_without_the_gather_the_test_above_fails(one_and_two_workers):
    """The negative controls: contrasting each worker's own spans changes the loss; a gather whose
    gradients stay local keeps the loss but loses the other workers' gradients."""
    (loss, grads, _), two = one_and_two_workers
    local, local_gradients = two["local"], two["local_gradients"]
    assert abs(sum(w["loss"] for w in local) - loss) > 1e-2
    assert sum(w["loss"] for w in local_gradients) == pytest.approx(loss, rel=1e-5)
    assert _max_difference(local_gradients[0]["grads"], grads) > 1e-4
    assert _max_difference(two["gathered"][0]["grads"], grads) < 1e-5


# ---------------------------------------------------------------------------
# exact resume across an epoch boundary (new pairs and new batches every epoch)
# ---------------------------------------------------------------------------


@pytest.mark.slow
def test_resume_at_an_epoch_boundary_picks_the_same_spans(contract_data, tmp_path):
    """74 documents in batches of 8: 9 updates an epoch.  Stopped after epoch 1 and resumed, epoch 2
    logs exactly what the straight run logged."""

    def train(save, max_epoch):
        cmd = train_cmd(COCONDENSER, contract_data, save, "--max-epoch", str(max_epoch), max_update=30, batch_size=8)
        return records(check(cmd))

    straight = {int(r["num_updates"]): r for r in train(tmp_path / "straight", 2)}
    train(tmp_path / "resumed", 1)
    resumed = train(tmp_path / "resumed", 2)
    assert [int(r["num_updates"]) for r in resumed] == list(range(10, 19)) and max(straight) == 18
    keys = ["loss", "gnorm", "lr", "ntokens"] + [f"{t}_{k}" for t in COCONDENSER.terms for k in ("loss", "ntokens")]
    for r in resumed:
        for key in keys:
            assert r[key] == straight[int(r["num_updates"])][key], (r["num_updates"], key)
    assert straight[10]["mlm_ntokens"] != straight[1]["mlm_ntokens"] or straight[10]["loss"] != straight[1]["loss"]


@pytest.mark.slow
def test_stage_2_continues_stage_1_with_its_head(contract_data, tmp_path):
    """The papers' two stages (docs/objectives/condenser.md): coCondenser from a Condenser checkpoint
    takes its head too (an update at learning rate 0 leaves the weights as loaded)."""
    check(train_cmd(BY_NAME["condenser"], contract_data, tmp_path / "stage1", max_update=2))
    stage_1 = load_torch_file(tmp_path / "stage1" / "checkpoint_last.pt")["model"]
    start = ("--finetune-from-model", str(tmp_path / "stage1" / "checkpoint_last.pt"))
    proc = check(train_cmd(COCONDENSER, contract_data, tmp_path / "stage2", *start, max_update=1, optim=SGD_NO_STEP))
    assert "keeping the freshly initialised" not in proc.stderr + proc.stdout
    stage_2 = load_torch_file(tmp_path / "stage2" / "checkpoint_last.pt")["model"]
    head = [k for k in stage_1 if k.startswith("condenser_head.")]
    assert len(head) > 10 and set(stage_2) == set(stage_1)
    for key in stage_1:
        assert torch.equal(stage_2[key], stage_1[key]), key
