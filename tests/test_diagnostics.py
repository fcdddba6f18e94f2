"""Pre-training diagnostics at validation (seed_fairseq/diagnostics.py)."""

import json
import sys

import pytest
import torch
from helpers import DEMO_CORPUS, REPO, USER_DIR, check, cli
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
    args = options.parse_args_and_arch(parser, [str(data), "--user-dir", USER_DIR, *MODEL, "--cpu", *extra])
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
    from seed_fairseq.diagnostics import pairwise_cosine_sum

    cls = torch.tensor([[1.0, 0.0], [0.0, 2.0], [3.0, 3.0]])
    total, pairs = pairwise_cosine_sum(cls)
    assert pairs == 3
    assert total == pytest.approx(0.0 + 2**-0.5 + 2**-0.5)


def test_probe_halves_and_ranks():
    from seed_fairseq.diagnostics import halves, retrieval_probe

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
        def cls_vector(features):
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
        [cli("fairseq-train"), data, "--user-dir", USER_DIR, *MODEL, "--batch-size", "4"]
        + ["--optimizer", "adam", "--lr", "1e-3", "--lr-scheduler", "fixed", "--max-update", str(max_update)]
        + ["--log-format", "json", "--log-interval", "1", "--save-dir", save_dir, "--cpu", "--seed", "3"]
        + ["--num-workers", "0", "--no-epoch-checkpoints", "--no-save", *extra]
    )


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


def test_trained_decoder_takes_bits_from_cls(data):
    """Trained on one batch until the decoder can tell its four sequences apart: it can only
    do that through [CLS], so rotating [CLS] must cost bits (the diagnostic is > 0)."""
    torch.manual_seed(SEED)  # the initial weights, whatever ran before in this process
    task, model, criterion = build(data, "--dropout", "0", "--attention-dropout", "0")
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
