"""Pre-training diagnostics at validation (seed_fairseq/pretrain/diagnostics.py)."""

import json
import sys

import pytest
import torch
from helpers import DEMO_CORPUS, REPO, check, fairseq_train, parse_argv
from objectives import TINY_ENCODER


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    out = tmp_path_factory.mktemp("diag") / "data-bin"
    check(
        [sys.executable, "-m", "preprocess.build", "--text", DEMO_CORPUS, "--out", out, "--vocab-size", "397"]
        + ["--workers", "1", "--valid-docs", "4", "--test-docs", "2"],
        cwd=REPO,
    )
    return out


MODEL = ["--task", "seed_pretrain", "--criterion", "seed_pretrain", "--arch", "seed_encoder_tiny"]
MODEL += [*TINY_ENCODER, "--decoder-layers", "2", "--tokens-per-sample", "48"]
MODEL += ["--sample-break-mode", "none"]


def build(data, *extra):
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(parser, parse_argv(data, [*MODEL, "--cpu", *extra]))
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    return task, task.build_model(cfg.model), task.build_criterion(cfg.criterion)


def valid_logs(task, model, criterion, n_batches=3):
    task.load_dataset("valid")
    itr = task.get_batch_iterator(task.dataset("valid"), max_sentences=4, seed=1).next_epoch_itr(shuffle=False)
    model.eval()
    task.begin_valid_epoch(1, model)
    logs = []
    with torch.no_grad():
        for _, sample in zip(range(n_batches), itr):
            logs.append(task.valid_step(sample, model, criterion)[2])
    return logs


def test_rotated_cls_changes_nothing_when_the_decoder_ignores_it(data):
    task, model, criterion = build(data)
    with torch.no_grad():  # the decoder's cross-attention outputs zero: [CLS] cannot reach it
        for layer in model.weak_decoder.layers:
            layer.encoder_attn.out_proj.weight.zero_()
            layer.encoder_attn.out_proj.bias.zero_()
    logs = valid_logs(task, model, criterion)
    assert [log["diag_dec_cls_sum"] for log in logs] == [0.0, 0.0, 0.0]  # exactly
    assert all(log["diag_dec_cls_units"] > 0 for log in logs)


def test_anisotropy_is_the_mean_pairwise_cosine():
    from seed_fairseq.pretrain.diagnostics import pairwise_cosine_sum

    cls = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 3.0]])
    total, pairs = pairwise_cosine_sum(cls)
    assert pairs == 3
    assert total == pytest.approx(0.0 + 2**-0.5 + 2**-0.5)


def test_probe_halves_and_ranks():
    from seed_fairseq.pretrain.diagnostics import halves, retrieval_probe

    q, p = halves(torch.tensor([0, 11, 12, 13, 14, 15, 2, 1, 1]), bos=0, eos=2, pad=1)
    assert q.tolist() == [0, 11, 12] and p.tolist() == [0, 13, 14, 15]

    class BagOfTokens(torch.nn.Module):
        """[CLS] vector = counts of each token id (a query matches its own passage's
        first token only when told to)."""

        def __init__(self):
            super().__init__()
            self.w = torch.nn.Parameter(torch.zeros(1))

        def encode(self, tokens):
            onehot = torch.nn.functional.one_hot(tokens, 40).float()
            onehot[..., :4] = 0
            return onehot.sum(1, keepdim=True), {}

        @staticmethod
        def sentence_embedding(features, tokens):
            return features[:, 0]

    # block i: tokens (10+i, 20+i | 20+i, 30) -> query {10+i, 20+i}, passage {20+i, 30}: rank 1 each
    blocks = [torch.tensor([0, 10 + i, 20 + i, 20 + i, 30, 2]) for i in range(5)]
    out = retrieval_probe(BagOfTokens(), blocks, size=4, bos=0, eos=2, pad=1)
    assert out == {"diag_probe_rr_sum": 4.0, "diag_probe_queries": 4, "diag_probe_runs": 1}
    # queries that share nothing with their passage: every passage ties at 0 -> rank 4 (pessimistic)
    blocks = [torch.tensor([0, 10 + i, 11 + i, 30 + i, 35 + i, 2]) for i in range(4)]
    out = retrieval_probe(BagOfTokens(), blocks, size=4, bos=0, eos=2, pad=1)
    assert out["diag_probe_rr_sum"] == pytest.approx(4 * 0.25)


def test_diagnostics_add_no_gradient(data):
    task, model, criterion = build(data, "--retrieval-probe-size", "8")
    logs = valid_logs(task, model, criterion, n_batches=1)
    assert logs[0]["diag_probe_queries"] == 8
    assert all(p.grad is None for p in model.parameters())


def records(proc, kind):
    tag = f"| {kind} | "
    return [json.loads(line.split(tag, 1)[1]) for line in (proc.stderr + proc.stdout).splitlines() if tag in line]


def train(data, save_dir, *extra, max_update=6):
    return check(
        fairseq_train(
            data, *MODEL, "--batch-size", "4",
            "--optimizer", "adam", "--lr", "1e-3", "--lr-scheduler", "fixed", "--max-update", str(max_update),
            "--log-format", "json", "--log-interval", "1", "--cpu", "--seed", "3",
            "--num-workers", "0", "--no-epoch-checkpoints", "--no-save", *extra,
            save_dir=save_dir,
        )
    )  # fmt: skip


@pytest.mark.slow
def test_diagnostics_do_not_change_the_training_trajectory(data, tmp_path):
    # validation (with dropout on in training) every 2 updates, diagnostics on and off
    common = ["--validate-interval-updates", "2", "--dropout", "0.1"]
    on = train(data, tmp_path / "on", *common, "--retrieval-probe-size", "16")
    off = train(data, tmp_path / "off", *common, "--no-diagnostics")
    valid_on, valid_off = records(on, "valid"), records(off, "valid")
    assert len(valid_on) >= 3 and all("valid_dec_cls_bits" in r and "valid_probe_mrr10" in r for r in valid_on)
    assert not any("valid_cls_cosine" in r for r in valid_off)
    train_on, train_off = records(on, "train_inner"), records(off, "train_inner")
    assert len(train_on) == 6
    for a, b in zip(train_on, train_off):
        for key in ("loss", "mlm_loss", "dec_loss", "gnorm"):
            assert a[key] == b[key], (a["num_updates"], key)
    for a, b in zip(valid_on, valid_off):
        assert a["valid_loss"] == b["valid_loss"]


SEED = 0


@pytest.mark.parametrize("pooling", ["cls", "mean"])
def test_trained_decoder_takes_bits_from_cls(data, pooling):
    """Trained on one batch until the decoder can tell its four sequences apart: it can only
    do that through the bottleneck vector ([CLS], or the mean of the encoder's output), so
    rotating that vector must cost bits (the diagnostic is > 0).  Rotating position 0 of the
    encoder's output instead would cost next to nothing with mean pooling."""
    torch.manual_seed(SEED)  # the initial weights, whatever ran before in this process
    task, model, criterion = build(data, "--dropout", "0", "--attention-dropout", "0", "--bottleneck-pooling", pooling)
    task.load_dataset("valid")
    itr = task.get_batch_iterator(task.dataset("valid"), max_sentences=4, seed=1).next_epoch_itr(shuffle=False)
    sample = next(itr)
    before = task.valid_step(sample, model, criterion)[2]
    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(60):
        optimizer.zero_grad()
        criterion(model, sample)[0].backward()
        optimizer.step()
    after = task.valid_step(sample, model, criterion)[2]
    assert after["dec_loss_sum"] < before["dec_loss_sum"] / 2
    # untrained: [CLS] vectors nearly equal (cosine ~1), rotating them changes almost nothing;
    # trained: the decoder takes information from them (measured: 6e-5 -> 1.5 nats per batch)
    assert abs(before["diag_dec_cls_sum"]) < 0.05
    assert after["diag_dec_cls_sum"] > 0.2, after  # 0.1 to 2 nats over initialisations; > 0.5 for seed 0
    assert after["diag_cos_sum"] / after["diag_cos_pairs"] < 1


def _pooled(model, tokens, pooling, cosine):
    from seed_fairseq.pretrain.models.bottleneck import pool

    features, _ = model.encode(tokens)
    vectors = pool(features, tokens.eq(1), pooling).float()
    return torch.nn.functional.normalize(vectors, dim=-1) if cosine else vectors


def _probe_rr(model, pairs, pooling, cosine):
    from torch.nn.utils.rnn import pad_sequence

    q = _pooled(model, pad_sequence([a for a, _ in pairs], batch_first=True, padding_value=1), pooling, cosine)
    p = _pooled(model, pad_sequence([b for _, b in pairs], batch_first=True, padding_value=1), pooling, cosine)
    scores = q @ p.t()
    rank = (scores >= scores.diagonal().unsqueeze(1)).sum(1)
    return float(torch.where(rank <= 10, 1.0 / rank.float(), torch.zeros(len(pairs))).sum())


def test_anisotropy_and_probe_read_the_pooled_vector(data):
    """With --bottleneck-pooling mean --retrieval-similarity cosine, cls_cosine is over the mean-pooled
    vectors of the batch's blocks and the probe ranks by their cosine (not by [CLS] dot products)."""
    from seed_fairseq.pretrain import diagnostics

    task, model, criterion = build(
        data, "--bottleneck-pooling", "mean", "--retrieval-similarity", "cosine", "--retrieval-probe-size", "16"
    )
    logs = valid_logs(task, model, criterion, n_batches=1)[0]
    itr = task.get_batch_iterator(task.dataset("valid"), max_sentences=4, seed=1).next_epoch_itr(shuffle=False)
    with torch.no_grad():
        blocks = diagnostics.unmasked_tokens(next(itr), 1)
        cos_sum, _ = diagnostics.pairwise_cosine_sum(_pooled(model, blocks, "mean", False))
        assert logs["diag_cos_sum"] == pytest.approx(cos_sum, abs=1e-5)
        assert abs(diagnostics.pairwise_cosine_sum(_pooled(model, blocks, "cls", False))[0] - cos_sum) > 1e-3

        pairs = diagnostics.probe_pairs(task.unmasked_blocks["valid"], 16, 0, 2, 1)
        assert logs["diag_probe_rr_sum"] == pytest.approx(_probe_rr(model, pairs, "mean", True), abs=1e-6)
        assert _probe_rr(model, pairs, "cls", False) != pytest.approx(logs["diag_probe_rr_sum"], abs=1e-6)


def test_dev_scores_are_the_cosine_of_the_pooled_vectors(data):
    """--retrieval-dev ranks by the representation: mean-pooled, compared by cosine."""
    from seed_fairseq.pretrain import retrieval_dev

    task, model, _ = build(data, "--bottleneck-pooling", "mean", "--retrieval-similarity", "cosine")
    model.eval()
    task.load_dataset("valid")
    blocks = [task.unmasked_blocks["valid"][i][:n] for i, n in enumerate((9, 5, 12, 7))]
    dev = retrieval_dev.DevSet(
        qids=["q0", "q1"],
        queries=blocks[:2],
        doc_ids=["d0", "d1", "d2", "d3"],
        docs=blocks,
        qrels={"q0": {"d0": 1}, "q1": {"d1": 1}},
        judged_docs=2,
        identity="",
    )
    run = retrieval_dev.run(model, dev, pad=1)
    from torch.nn.utils.rnn import pad_sequence

    with torch.no_grad():
        q = _pooled(model, pad_sequence(blocks[:2], batch_first=True, padding_value=1), "mean", True)
        d = _pooled(model, pad_sequence(blocks, batch_first=True, padding_value=1), "mean", True)
    expected = q @ d.t()
    for i, qid in enumerate(dev.qids):
        assert run[qid]["d%d" % i] == pytest.approx(1.0, abs=1e-5)  # a query is its own document here
        for j, doc in enumerate(dev.doc_ids):
            assert run[qid][doc] == pytest.approx(float(expected[i, j]), abs=1e-5)


def test_a_start_score_of_another_pooling_is_not_taken(data):
    """A resumed run compares with the start score recorded in its checkpoint only when it was
    computed on the same representation (a record from before the options existed: [CLS], dot)."""
    cls_task, _, _ = build(data, "--retrieval-probe-size", "8")
    cls_task.retrieval_start = {"probe_mrr10": 0.5}
    saved = cls_task.get_checkpoint_dict()[type(cls_task).__name__]
    assert saved["retrieval_start"]["representation"] == ["cls", "dot"]
    old = {"retrieval_start": {k: v for k, v in saved["retrieval_start"].items() if k != "representation"}}
    for options, expected in (
        ((), {"probe_mrr10": 0.5}),
        (("--bottleneck-pooling", "mean"), {}),
        (("--retrieval-similarity", "cosine"), {}),
    ):
        task, _, _ = build(data, "--retrieval-probe-size", "8", *options)
        for record in (saved, old):
            task.set_checkpoint_dict(record)
            assert task._recorded_start == expected, (options, record)
