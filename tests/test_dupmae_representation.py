"""DupMAE's retrieval representation (paper, Eq. 10-12): sparse entries at their vocabulary
indices, the Eq. 12 score, exact combined search, the head files, the export of a DupMAE
checkpoint, and fine-tuning / evaluation with the representation through the CLIs."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import REPO, check, fairseq_train
from objectives import TINY_ENCODER

from seed_fairseq.base.derived_set import write_beir
from seed_fairseq.base.retrieval_data import DataFormatError, load_data
from seed_fairseq.encoders.dupmae import retriever as rd
from seed_fairseq.encoders.dupmae.head import (
    CONFIG_FILE,
    WEIGHTS_FILE,
    DupMAEHead,
    HeadFileError,
    cls_projection_from_vectors,
    load_head,
)
from seed_fairseq.pretrain.checkpoint import load_torch_file

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
SPECIAL = [0, 1, 2, 3, 40]  # <s> <pad> </s> <unk> ... <mask>


def random_sparse(g, n, vocab, k, empty=()):
    """Top-k of random vectors (negative values included), at their indices; rows in ``empty`` have none."""
    mu = g.normal(size=(n, vocab))
    mu[:, SPECIAL] = -np.inf
    idx = np.argsort(-mu, axis=1)[:, :k]
    vals = np.take_along_axis(mu, idx, 1) - 1.0  # some entries negative
    vals[list(empty)] = 0.0
    return rd.sparse_rows(vals, idx, vocab), idx, vals


def test_eq12_score_is_dense_dot_plus_sparse_dot_over_shared_indices():
    g = np.random.default_rng(0)
    qd, dd = g.normal(size=(4, 7)), g.normal(size=(9, 7))
    qs, qi, qv = random_sparse(g, 4, 41, 6)
    ds, di, dv = random_sparse(g, 9, 41, 6)
    got = rd.eq12_scores(qd, qs, dd, ds)
    for a in range(4):
        for b in range(9):
            shared = set(qi[a]) & set(di[b])
            want = qd[a] @ dd[b] + sum(qv[a][list(qi[a]).index(i)] * dv[b][list(di[b]).index(i)] for i in shared)
            assert got[a, b] == pytest.approx(want, abs=1e-5)
    # the known wrong shortcut -- top-k values without their indices -- is another score
    assert not np.allclose(got, qd @ dd.T + qv @ dv.T)


@pytest.mark.parametrize("k", [1, 4, 17, 53, 200])
def test_combined_search_equals_exhaustive_scoring(k):
    g = np.random.default_rng(k)
    n_docs, vocab = 53, 41
    dd = g.normal(size=(n_docs, 7)).astype(np.float32)
    ds, _, _ = random_sparse(g, n_docs, vocab, 5, empty=(3, 8))
    qd = g.normal(size=(11, 7)).astype(np.float32)
    qs, _, _ = random_sparse(g, 11, vocab, 5, empty=(2,))
    qs = qs.tolil()
    qs[5] = qs[5] * 30.0  # a sparse part that dominates: the dense list alone misleads
    qs = qs.tocsr()
    dd[:5] *= 0.01  # ... and documents with tiny dense scores
    scores, ids = rd.HybridIndex(dd, ds).search(qd, qs, k)
    brute = rd.eq12_scores(qd, qs, dd, ds)
    kk = min(k, n_docs)
    assert ids.shape == (11, kk)
    for r in range(11):
        order = np.lexsort((np.arange(n_docs), -brute[r]))[:kk]
        assert ids[r].tolist() == order.tolist(), r
        np.testing.assert_allclose(scores[r], brute[r, order], rtol=1e-6, atol=1e-6)


def test_combined_search_reads_deeper_until_the_bound_holds(monkeypatch):
    """20 documents with a high dense score only, 20 with a high sparse score only, 10 with both
    moderately high (the true top) and 150 others: at the first depth both lists are filled by the
    one-sided documents and the bound fails; one deeper read finds the top, short of exhaustive."""
    g = np.random.default_rng(1)
    n_docs, vocab = 200, 41
    dense = np.zeros((n_docs, 2), np.float32)
    dense[:, 0] = -1.0
    dense[:20, 0], dense[40:50, 0] = 10.0, 7.0
    values = np.zeros((n_docs, 1))
    values[20:40], values[40:50] = 10.0, 7.0
    dense[:, 1] = g.normal(scale=0.01, size=n_docs)  # no ties
    ds = rd.sparse_rows(values, np.full((n_docs, 1), 9), vocab)
    qd = np.array([[1.0, 1.0]], np.float32)
    qs = rd.sparse_rows(np.ones((1, 1)), np.array([[9]]), vocab)
    calls = []
    real_search = rd.search
    monkeypatch.setattr(rd, "search", lambda index, q, depth: calls.append(depth) or real_search(index, q, depth))
    scores, ids = rd.HybridIndex(dense, ds).search(qd, qs, 3)
    brute = rd.eq12_scores(qd, qs, dense, ds)[0]
    assert ids[0].tolist() == np.argsort(-brute)[:3].tolist() and set(ids[0]) <= set(range(40, 50))
    assert calls == [19, 76]


def test_sparse_entries_are_kept_at_their_vocabulary_indices():
    torch.manual_seed(0)
    head = DupMAEHead(8, 41, 5, 6, SPECIAL)
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.5)
    tokens = torch.randint(4, 40, (3, 9))
    tokens[:, 0] = 0
    tokens[:, 5] = 2
    tokens[1, 7:] = 1
    tokens[2, 1:] = torch.tensor([2, 1, 1, 1, 1, 1, 1, 1])  # no ordinary token
    mask = tokens.ne(1).long()
    emb = torch.randn(3, 9, 8)
    out = head({"token_embeddings": emb, "attention_mask": mask, "input_ids": tokens})

    hidden = head.layer_norm(F.gelu(head.dense(emb)))
    logits = hidden @ head.weight.t() + head.bias
    pool = mask.bool() & ~torch.isin(tokens, torch.tensor(SPECIAL))
    mu = logits.masked_fill(~pool.unsqueeze(-1), float("-inf")).amax(1)
    want = mu.masked_fill(torch.isin(torch.arange(41), torch.tensor(SPECIAL)), float("-inf")).topk(6).indices
    assert torch.equal(out["dupmae_indices"][:2], want[:2])
    torch.testing.assert_close(out["dupmae_values"][:2], mu[:2].gather(1, want[:2]))
    assert not torch.isin(out["dupmae_indices"], torch.tensor(SPECIAL)).any()
    assert torch.all(out["dupmae_values"][2] == 0)  # no ordinary token: no sparse part
    torch.testing.assert_close(out["dupmae_dense"], emb[:, 0] @ head.cls_projection.weight.t())
    # the training embedding: [h_hat ; mu_hat scattered over the vocabulary], dot = Eq. 12
    sparse = out["sentence_embedding"][:, 5:]
    assert sparse.shape == (3, 41)
    for b in range(2):
        nz = sparse[b].nonzero().flatten()
        assert set(nz.tolist()) == set(want[b].tolist())
        torch.testing.assert_close(sparse[b, want[b]], mu[b, want[b]])
    e = out["sentence_embedding"].detach().numpy()
    s = rd.sparse_rows(out["dupmae_values"].detach().numpy(), out["dupmae_indices"].numpy(), 41)
    np.testing.assert_allclose(e @ e.T, rd.eq12_scores(out["dupmae_dense"].detach().numpy(), s, e[:, :5], s), atol=1e-4)


def test_head_trains_in_bfloat16_and_under_autocast():
    """Fine-tuning may run the head under autocast (CUDA AMP) or in half precision: finite
    outputs, gradients of the parameters' own dtypes."""
    torch.manual_seed(0)
    ids = torch.randint(4, 40, (3, 9))
    mask = torch.ones(3, 9, dtype=torch.long)
    for dtype, autocast in ((torch.float32, True), (torch.bfloat16, False)):
        head = DupMAEHead(8, 41, 5, 6, SPECIAL).to(dtype)
        emb = torch.randn(3, 9, 8, dtype=dtype, requires_grad=True)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            out = head({"token_embeddings": emb, "attention_mask": mask, "input_ids": ids})
            loss = out["sentence_embedding"].float().pow(2).sum()
        loss.backward()
        assert torch.isfinite(loss) and torch.isfinite(emb.grad.float()).all()
        assert emb.grad.dtype == dtype and head.weight.grad.dtype == dtype and head.bias.grad.dtype == dtype


def test_bad_dimensions_name_the_option():
    with pytest.raises(ValueError, match=r"--dupmae-dim 9 is larger than the encoder's hidden size 8"):
        DupMAEHead(8, 41, 9, 6, SPECIAL)
    with pytest.raises(ValueError, match=r"--dupmae-top-k 37 is larger than the vocabulary: 41 entries, 36"):
        DupMAEHead(8, 41, 5, 37, SPECIAL)
    DupMAEHead(8, 41, 8, 36, SPECIAL)  # d' = d and every selectable entry are fine


def test_head_files_round_trip_and_name_what_is_wrong(tmp_path):
    torch.manual_seed(1)
    head = DupMAEHead(8, 41, 5, 6, SPECIAL, cls_projection="test")
    for p in head.parameters():
        torch.nn.init.normal_(p)
    with pytest.raises(HeadFileError, match=f"{tmp_path / CONFIG_FILE}: not found"):
        load_head(tmp_path)
    head.save(tmp_path)
    back = load_head(tmp_path)
    assert back.head_config == head.head_config
    for k, v in head.state_dict().items():
        assert torch.equal(back.state_dict()[k], v), k
    (tmp_path / WEIGHTS_FILE).rename(tmp_path / "moved")
    with pytest.raises(HeadFileError, match=f"{tmp_path / WEIGHTS_FILE}: not found"):
        load_head(tmp_path)
    (tmp_path / "moved").rename(tmp_path / WEIGHTS_FILE)
    cfg = json.loads((tmp_path / CONFIG_FILE).read_text())
    (tmp_path / CONFIG_FILE).write_text(json.dumps(dict(cfg, vocab_size=42)))
    with pytest.raises(HeadFileError, match=f"{tmp_path / WEIGHTS_FILE}: weight has shape"):
        load_head(tmp_path)


def test_cls_projection_is_identity_or_the_best_rank_d_prime_map():
    g = np.random.default_rng(0)
    vectors = g.normal(size=(50, 6)) + 3.0  # anisotropic, like [CLS] vectors
    assert np.array_equal(cls_projection_from_vectors(vectors, 6), np.eye(6))
    w = cls_projection_from_vectors(vectors, 3)
    np.testing.assert_allclose(w @ w.T, np.eye(3), atol=1e-12)  # orthonormal rows
    gram = vectors @ vectors.T
    err = np.linalg.norm(vectors @ w.T @ w @ vectors.T - gram)
    for seed in range(5):  # no other orthogonal rank-3 projection preserves the dot products better
        q, _ = np.linalg.qr(np.random.default_rng(seed).normal(size=(6, 3)))
        assert err < np.linalg.norm(vectors @ q @ q.T @ vectors.T - gram)
    assert np.array_equal(w, cls_projection_from_vectors(vectors.copy(), 3))


# ---------------------------------------------------------------------------
# export of DupMAE / RetroMAE checkpoints, and the retrieval CLIs
# ---------------------------------------------------------------------------


def pretrain(data, save_dir, task):
    check(
        fairseq_train(
            data,
            "--task", task, "--criterion", task, "--arch", task.replace("_pretrain", "_tiny"),
            *TINY_ENCODER, "--decoder-ffn-embed-dim", "23", "--tokens-per-sample", "48", "--batch-size", "8",
            "--optimizer", "adam", "--lr", "1e-3", "--lr-scheduler", "fixed", "--max-update", "3",
            "--cpu", "--seed", "3", "--num-workers", "0", "--no-epoch-checkpoints", "--disable-validation",
            save_dir=save_dir,
        )
    )  # fmt: skip
    return save_dir / "checkpoint_last.pt"


def export(ckpt, data, out, *extra):
    return subprocess.run(
        [sys.executable, REPO / "examples" / "export_to_hf.py", "--checkpoint", ckpt, "--data", data, "--out", out]
        + list(extra),
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", **OFFLINE),
        timeout=600,
    )


def retrieval_cli(script, *args):
    return subprocess.run(
        [sys.executable, REPO / "examples" / "retrieval" / script, *map(str, args)],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHONPATH=str(REPO), OMP_NUM_THREADS="1", PYTHONWARNINGS="ignore", **OFFLINE),
        timeout=600,
    )


def last_json(proc):
    assert proc.returncode == 0, f"STDOUT:\n{proc.stdout[-3000:]}\nSTDERR:\n{proc.stderr[-5000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def dupmae_checkpoint(demo_data_bin, tmp_path_factory):
    return pretrain(demo_data_bin, tmp_path_factory.mktemp("dupmae_ckpt"), "dupmae_pretrain")


@pytest.fixture(scope="module")
def dupmae_export(dupmae_checkpoint, demo_data_bin, tmp_path_factory):
    out = tmp_path_factory.mktemp("dupmae_hf") / "hf"
    proc = export(dupmae_checkpoint, demo_data_bin, out, "--dupmae-dim", "16", "--dupmae-top-k", "40")
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out


@pytest.fixture(scope="module")
def retrieval_set(tmp_path_factory):
    text = (REPO / "examples" / "data" / "demo_corpus.txt").read_text(encoding="utf-8")
    paras = [p for p in text.splitlines() if p.strip()][::8][:30]
    corpus = {f"d{i}": p for i, p in enumerate(paras)}
    queries = {f"q{i}": " ".join(p.split()[:6]) for i, p in enumerate(paras)}
    qrels = {f"q{i}": {f"d{i}": 1} for i in range(len(paras))}
    folder = tmp_path_factory.mktemp("set") / "set"
    return write_beir(folder, corpus, queries, {"train": qrels, "dev": qrels, "test": qrels})


def _fairseq_model(ckpt, data):
    from fairseq import checkpoint_utils

    import seed_fairseq  # noqa: F401

    (model,), _ = checkpoint_utils.load_model_ensemble([str(ckpt)], arg_overrides={"data": str(data)})
    return model.eval()


@pytest.mark.slow
def test_export_writes_the_representation_fairseq_computes(dupmae_export, dupmae_checkpoint, demo_data_bin):
    from seed_fairseq.encoders.retrieval.search import load_model

    record = json.loads((dupmae_export / "seed_fairseq_export.json").read_text())
    assert record["representation"] == "dupmae" and {CONFIG_FILE, WEIGHTS_FILE} <= set(record["files"])
    model = load_model(str(dupmae_export), device="cpu")  # the folder declares the representation
    head = rd.dupmae_head(model)
    assert head is not None and (head.dim, head.top_k) == (16, 40)
    assert "singular vectors" in head.head_config["cls_projection"]
    texts = ["the history of the city", "a short one", ""]
    dense, sparse = rd.encode_dupmae(model, texts, show_progress=False)
    # the same computation the plain way, on the fairseq model (its own MLM head, full logits)
    fs = _fairseq_model(dupmae_checkpoint, demo_data_bin)
    batch = model[0].tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        features, _ = fs(batch["input_ids"], features_only=True)
        logits = fs.encoder.lm_head(features)
    special = torch.tensor(head.head_config["special_ids"])
    pool = batch["attention_mask"].bool() & ~torch.isin(batch["input_ids"], special)
    for b in range(2):
        mu = logits[b][pool[b]].max(0).values
        top = mu.masked_fill(torch.isin(torch.arange(mu.numel()), special), float("-inf")).topk(40).indices
        row = sparse.getrow(b)
        assert set(row.indices.tolist()) == set(top.tolist())  # at their vocabulary ids
        np.testing.assert_allclose(row.toarray()[0, top.numpy()], mu[top].numpy(), atol=1e-4)
    assert sparse.getrow(2).nnz == 0  # the empty text has no ordinary token
    w = head.cls_projection.weight.detach()
    np.testing.assert_allclose(dense, (features[:, 0] @ w.t()).numpy(), atol=1e-4)
    # a [CLS] representation of the same folder ignores the head files
    assert rd.dupmae_head(load_model(str(dupmae_export), device="cpu", representation="cls")) is None


@pytest.mark.slow
def test_bad_export_requests_name_the_option_or_file(dupmae_checkpoint, demo_data_bin, tmp_path):
    cases = [
        (["--dupmae-dim", "33"], "--dupmae-dim 33 is larger than the encoder's hidden size 32"),
        (["--dupmae-top-k", "1000"], "--dupmae-top-k 1000 is larger than the vocabulary"),
        (["--mlm-head", "--representation", "dupmae"], "cannot be combined with --mlm-head"),
    ]
    for extra, message in cases:
        proc = export(dupmae_checkpoint, demo_data_bin, tmp_path / "out", *extra)
        assert proc.returncode == 2 and message in proc.stderr.strip().splitlines()[-1], proc.stderr[-2000:]
    state = load_torch_file(dupmae_checkpoint)
    state["model"] = {k: v for k, v in state["model"].items() if not k.startswith("encoder.lm_head.")}
    stripped = tmp_path / "no_head.pt"
    torch.save(state, stripped)
    proc = export(stripped, demo_data_bin, tmp_path / "out")
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode == 2 and f"error: {stripped}: has no vocabulary projection weights" in last, last
    assert "encoder.lm_head.weight" in last
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_retromae_exports_cls_unless_asked(demo_data_bin, tmp_path):
    ckpt = pretrain(demo_data_bin, tmp_path / "retro", "retromae_pretrain")
    assert export(ckpt, demo_data_bin, tmp_path / "cls").returncode == 0
    assert not (tmp_path / "cls" / CONFIG_FILE).exists()
    # the paper's "CLS decoding only" row: RetroMAE pre-training, DupMAE's representation
    assert export(ckpt, demo_data_bin, tmp_path / "dup", "--representation", "dupmae").returncode == 0
    assert load_head(tmp_path / "dup").dim == 32  # min(384, d): the identity
    assert torch.equal(load_head(tmp_path / "dup").cls_projection.weight, torch.eye(32))


@pytest.mark.slow
def test_evaluate_and_finetune_with_the_dupmae_representation(dupmae_export, retrieval_set, tmp_path):
    from seed_fairseq.encoders.retrieval.metrics import read_trec_run
    from seed_fairseq.encoders.retrieval.search import load_model

    last_json(
        retrieval_cli(
            "evaluate.py", "--model", dupmae_export, "--data", retrieval_set, "--split", "test", "--run", tmp_path / "b"
        )
    )
    # the run is the exhaustive Eq. 12 ranking of the encoded corpus
    model = load_model(str(dupmae_export), device="cpu")
    data = load_data(retrieval_set, "test")
    docs = list(data.corpus)
    qd, qs = rd.encode_dupmae(model, [data.queries[q] for q in data.query_ids()], show_progress=False)
    dd, ds = rd.encode_dupmae(model, [data.corpus[d] for d in docs], show_progress=False)
    brute = rd.eq12_scores(qd, qs, dd, ds)
    run = read_trec_run(tmp_path / "b")
    for r, q in enumerate(data.query_ids()):
        ranked = sorted(run[q], key=lambda d: -run[q][d])
        assert ranked[:10] == [docs[i] for i in np.lexsort((np.arange(len(docs)), -brute[r]))[:10]]
    last_json(
        retrieval_cli(
            "evaluate.py",
            "--model",
            dupmae_export,
            "--data",
            retrieval_set,
            "--split",
            "test",
            "--representation",
            "cls",
            "--run",
            tmp_path / "c",
        )
    )
    assert read_trec_run(tmp_path / "c") != run  # [CLS] dot products: another ranking
    proc = retrieval_cli(
        "evaluate.py",
        "--model",
        dupmae_export,
        "--data",
        retrieval_set,
        "--representation",
        "cls",
        "--sparse-top-k",
        "5",
    )
    assert proc.returncode == 2 and "--sparse-top-k applies to DupMAE's representation" in proc.stderr

    out = tmp_path / "ft"
    ft = last_json(
        retrieval_cli(
            "finetune.py",
            "--model",
            dupmae_export,
            "--data",
            retrieval_set,
            "--out",
            out,
            "--epochs",
            "2",
            "--train-batch-size",
            "8",
            "--lr",
            "1e-3",
            "--eval-every",
            "3",
            "--no-progress",
        )
    )
    assert json.loads((out / "finetune.json").read_text())["representation"] == "dupmae"
    trained, start = load_head(out), load_head(dupmae_export)
    assert not torch.equal(trained.cls_projection.weight, start.cls_projection.weight)  # Eq. 13 trains W_cls
    assert not torch.equal(trained.weight, start.weight)
    after = last_json(retrieval_cli("evaluate.py", "--model", out, "--data", retrieval_set, "--split", "test"))
    assert after["MRR@10"] == pytest.approx(ft["MRR@10"])  # the curve's last point is the final evaluation

    # a [CLS] folder asked for DupMAE's representation, and a DupMAE folder without its weights
    proc = retrieval_cli(
        "evaluate.py", "--model", out, "--data", retrieval_set, "--split", "test", "--sparse-top-k", "100000"
    )
    assert proc.returncode == 2 and "--sparse-top-k 100000 is larger than the vocabulary" in proc.stderr
    (out / WEIGHTS_FILE).unlink()
    proc = retrieval_cli("evaluate.py", "--model", out, "--data", retrieval_set, "--split", "test")
    assert proc.returncode == 2 and f"error: {out / WEIGHTS_FILE}: not found" in proc.stderr.strip().splitlines()[-1]
    (out / CONFIG_FILE).unlink()
    proc = retrieval_cli(
        "evaluate.py", "--model", out, "--data", retrieval_set, "--split", "test", "--representation", "dupmae"
    )
    assert proc.returncode == 2 and f"error: {out / CONFIG_FILE}: not found" in proc.stderr.strip().splitlines()[-1]


def test_a_folder_without_head_is_a_cls_folder(tmp_path):
    assert rd.folder_representation(tmp_path) == "cls"
    with pytest.raises(DataFormatError, match=f"{tmp_path / CONFIG_FILE}: not found"):
        rd.load_dupmae_model(None, tmp_path)
