"""examples/retrieval: search, metrics, significance, BM25, data errors, fine-tuning end to end."""

import json
import math
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from seed_fairseq.base import derived_set
from seed_fairseq.base.derived_set import write_beir
from seed_fairseq.base.retrieval_data import DataFormatError, load_data
from seed_fairseq.encoders.retrieval.bm25 import BM25
from seed_fairseq.encoders.retrieval.index import build_index, search
from seed_fairseq.encoders.retrieval.metrics import (
    compare,
    evaluate,
    per_query,
    permutation_test,
    read_trec_run,
    write_trec_run,
)

REPO = Path(__file__).resolve().parents[1]

DEMO_CORPUS = REPO / "examples" / "data" / "demo_corpus.txt"
RETRIEVAL = REPO / "examples" / "retrieval"


def run_cli(script, *args, timeout=300):
    env = {
        "OMP_NUM_THREADS": "1",
        "PYTHONWARNINGS": "ignore",
        "PATH": "/usr/bin:/bin",
        "HF_HUB_OFFLINE": "1",
        "TRANSFORMERS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        # the package of this checkout, not whichever one is installed in editable mode
        "PYTHONPATH": str(REPO),
    }
    return subprocess.run(
        [sys.executable, str(RETRIEVAL / script), *map(str, args)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
        cwd=str(REPO),
    )


def last_json(proc):
    assert proc.returncode == 0, f"STDOUT:\n{proc.stdout[-3000:]}\nSTDERR:\n{proc.stderr[-5000:]}"
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ---------------------------------------------------------------------------
# faiss
# ---------------------------------------------------------------------------


def test_flat_index_equals_numpy_brute_force():
    rng = np.random.default_rng(0)
    docs = rng.standard_normal((700, 24)).astype(np.float32)
    queries = rng.standard_normal((31, 24)).astype(np.float32)
    k = 17
    scores, ids = search(build_index(docs, "flat"), queries, k)
    full = queries @ docs.T
    ref_ids = np.argsort(-full, axis=1, kind="stable")[:, :k]
    ref_scores = np.take_along_axis(full, ref_ids, axis=1)
    np.testing.assert_array_equal(ids, ref_ids)
    np.testing.assert_allclose(scores, ref_scores, rtol=1e-5, atol=1e-5)


def test_approximate_indexes():
    rng = np.random.default_rng(1)
    docs = rng.standard_normal((2000, 16)).astype(np.float32)
    queries = docs[:50] + 0.01 * rng.standard_normal((50, 16)).astype(np.float32)
    exact = search(build_index(docs, "flat"), queries, 10)[1]
    # IVF probing every list is exhaustive, so it must be exact
    ivf = search(build_index(docs, "ivf", nlist=8, nprobe=8), queries, 10)[1]
    np.testing.assert_array_equal(ivf, exact)
    hnsw = search(build_index(docs, "hnsw", ef_search=256), queries, 1)[1]
    assert np.mean(hnsw[:, 0] == exact[:, 0]) >= 0.9
    pq_scores, pq_ids = search(build_index(docs, "ivfpq", nlist=8, pq_m=4, nprobe=8), queries, 10)
    assert pq_ids.shape == (50, 10) and (pq_ids >= 0).all()
    # k above the corpus size is capped instead of returning -1 ids
    assert search(build_index(docs[:5], "flat"), queries, 10)[1].shape == (50, 5)


# ---------------------------------------------------------------------------
# metrics and significance
# ---------------------------------------------------------------------------


def test_metrics_match_hand_computed_values():
    qrels = {"q1": {"d1": 1, "d2": 1, "d9": 0}, "q2": {"d3": 1}, "q3": {"d4": 1}, "q4": {"d5": 0}}
    run = {
        # relevant at ranks 2 and 4
        "q1": {"d0": 4.0, "d1": 3.0, "d9": 2.5, "d2": 2.0, "d7": 1.0},
        # relevant at rank 12: outside every @10 cut, inside @100
        "q2": {f"x{i}": 100.0 - i for i in range(11)} | {"d3": 50.0},
        # q3 retrieved nothing: counts as 0, not left out
    }
    m = evaluate(qrels, run)
    rr = (1 / 2 + 1 / 12 * 0 + 0) / 3
    ndcg_q1 = (1 / math.log2(3) + 1 / math.log2(5)) / (1 + 1 / math.log2(3))
    assert m["MRR@10"] == pytest.approx(rr)
    assert m["nDCG@10"] == pytest.approx(ndcg_q1 / 3)
    assert m["R@100"] == pytest.approx((1 + 1 + 0) / 3)
    assert m["R@1000"] == pytest.approx(2 / 3)
    pq = per_query(qrels, run, ["MRR@10"])["MRR@10"]
    assert pq == pytest.approx({"q1": 0.5, "q2": 0.0, "q3": 0.0})  # q4 has no relevant doc


def test_trec_run_roundtrip_and_errors(tmp_path):
    run = {"q1": {"d1": 2.0, "d2": 3.5}, "q2": {"d3": -1.0}}
    path = write_trec_run(run, tmp_path / "r.trec", tag="t")
    lines = path.read_text().splitlines()
    assert lines[0] == "q1 Q0 d2 1 3.500000 t" and lines[1] == "q1 Q0 d1 2 2.000000 t"
    assert read_trec_run(path) == run
    bad = tmp_path / "bad.trec"
    bad.write_text("q1 Q0 d1 1 1.0 t\nq1 Q0 d2 2 x t\n")
    with pytest.raises(DataFormatError, match=r"bad\.trec:2: score 'x'"):
        read_trec_run(bad)


def test_permutation_test():
    rng = np.random.default_rng(0)
    a = rng.random(60)
    assert permutation_test(a, a) == 1.0
    # clearly better on every query
    assert permutation_test(a + 0.2, a) < 0.001
    # exact enumeration, n=5, all differences positive: only the all-plus and
    # all-minus sign patterns reach |mean|, so p = 2/32
    assert permutation_test([1, 2, 3, 4, 5], [0, 0, 0, 0, 0]) == pytest.approx(2 / 32)
    qrels = {f"q{i}": {"d": 1} for i in range(20)}
    good = {f"q{i}": {"d": 1.0} for i in range(20)}
    bad = {f"q{i}": {"x": 1.0, "d": 0.5} for i in range(20)}
    p = compare(qrels, good, bad)
    assert p["MRR@10"] < 0.001 and p["R@100"] == 1.0


# ---------------------------------------------------------------------------
# BM25
# ---------------------------------------------------------------------------


def test_bm25_ranks_the_obvious_passage_first():
    corpus = {
        "cook": "Bread is baked from flour, water, yeast and salt in a hot oven.",
        "space": "The telescope observed a distant galaxy full of young stars.",
        "sport": "The marathon runner finished the race in under three hours.",
        "music": "The orchestra played a symphony with violins and a large choir.",
    }
    run = BM25(corpus).retrieve({"q": "which galaxy did the telescope see", "z": "qwerty"}, k=10)
    assert max(run["q"], key=run["q"].get) == "space"
    assert list(run["q"]) == ["space"]  # documents sharing no term are not listed
    assert run["z"] == {}


def test_bm25_cli_on_beir_folder(tmp_path):
    folder = write_beir(
        tmp_path / "b",
        {"a": "red apples", "b": "green pears", "c": "blue sky"},
        {"q1": "red apple", "q2": "the sky"},
        {"test": {"q1": {"a": 1}, "q2": {"c": 1}}},
    )
    out = last_json(run_cli("bm25.py", "--data", folder, "--split", "test", "--run", tmp_path / "bm25.trec"))
    assert out["MRR@10"] == pytest.approx(1.0) and out["num_queries"] == 2
    assert set(read_trec_run(tmp_path / "bm25.trec")["q2"]) == {"c"}


# ---------------------------------------------------------------------------
# data formats
# ---------------------------------------------------------------------------


def _beir(tmp_path, corpus=None, queries=None, qrels=None):
    d = tmp_path / "beir"
    (d / "qrels").mkdir(parents=True)
    (d / "corpus.jsonl").write_bytes(
        corpus
        if isinstance(corpus, bytes)
        else (
            corpus or ('{"_id": "d1", "title": "Apples", "text": "red fruit"}\n{"_id": "d2", "text": "green fruit"}\n')
        ).encode()
    )
    (d / "queries.jsonl").write_text(queries or '{"_id": "q1", "text": "red"}\n{"_id": "q2", "text": "x"}\n')
    (d / "qrels" / "test.tsv").write_text(qrels or "query-id\tcorpus-id\tscore\nq1\td1\t1\n")
    return d


def _msmarco(tmp_path, collection=None, queries=None, qrels=None):
    d = tmp_path / "marco"
    d.mkdir()
    (d / "collection.tsv").write_text(collection or "0\tfirst passage\n1\tsecond passage\n")
    (d / "queries.dev.small.tsv").write_text(queries or "7\twhat is first\n8\tsecond?\n")
    (d / "qrels.dev.small.tsv").write_text(qrels or "7\t0\t0\t1\n8 0 1 1\n")
    return d


def test_well_formed_inputs_load(tmp_path):
    b = load_data(_beir(tmp_path), "test")
    assert b.corpus == {"d1": "Apples red fruit", "d2": "green fruit"}
    assert b.queries == {"q1": "red"} and b.qrels == {"q1": {"d1": 1}}
    m = load_data(_msmarco(tmp_path), "dev.small")
    assert m.corpus["1"] == "second passage" and m.qrels == {"7": {"0": 1}, "8": {"1": 1}}
    assert m.query_ids() == ["7", "8"]


BEIR_CASES = [
    ({"corpus": '{"_id": "d1", "text": "a"}\n{"_id": "d2", "text": "b"\n'}, r"corpus\.jsonl:2: invalid JSON"),
    ({"corpus": '{"_id": "d1", "text": "a"}\n\n{"text": "b"}\n'}, r"corpus\.jsonl:3: missing field '_id'"),
    (
        {"corpus": '{"_id": "d1", "text": "a"}\n{"_id": "d1", "text": "b"}\n'},
        r"corpus\.jsonl:2: duplicate document id 'd1' \(first on line 1\)",
    ),
    ({"corpus": '{"_id": "d1", "text": 3}\n'}, r"corpus\.jsonl:1: field 'text' must be a string"),
    ({"corpus": b'{"_id": "d1", "text": "a"}\n{"_id": "d2", "text": "\xff"}\n'}, r"corpus\.jsonl:2: not valid UTF-8"),
    ({"queries": '["q1", "red"]\n'}, r"queries\.jsonl:1: expected a JSON object"),
    ({"qrels": "query-id\tcorpus-id\tscore\nq1\td1\t1\nq1\td2\n"}, r"test\.tsv:3: expected 3 columns"),
    ({"qrels": "q1\td1\t1\nq1\td2\thigh\n"}, r"test\.tsv:2: relevance 'high' is not an integer"),
    ({"qrels": "q1\td1\tyes\n"}, r"test\.tsv:1: relevance 'yes' is not an integer"),
    ({"qrels": "query-id\tcorpus-id\tscore\nq1\td1\t1\nq9\td1\t1\n"}, r"test\.tsv:3: query id 'q9' is not in"),
]


@pytest.mark.parametrize("files,message", BEIR_CASES)
def test_malformed_beir(tmp_path, files, message):
    with pytest.raises(DataFormatError, match=message):
        load_data(_beir(tmp_path, **files), "test")


MSMARCO_CASES = [
    ({"collection": "0\tfirst passage\n1 second passage\n"}, r"collection\.tsv:2: expected 2 tab-separated columns"),
    ({"collection": "0\ta\n\t b\n"}, r"collection\.tsv:2: empty passage id"),
    ({"queries": "7\twhat\n7\tagain\n"}, r"queries\.dev\.small\.tsv:2: duplicate query id '7'"),
    ({"qrels": "7\t0\t0\t1\n8\t1\n"}, r"qrels\.dev\.small\.tsv:2: expected 3 columns"),
]


@pytest.mark.parametrize("files,message", MSMARCO_CASES)
def test_malformed_msmarco(tmp_path, files, message):
    with pytest.raises(DataFormatError, match=message):
        load_data(_msmarco(tmp_path, **files), "dev.small")


def test_cli_reports_file_and_line(tmp_path):
    d = _msmarco(tmp_path, collection="0\tok\n1\tok\nbroken line\n")
    proc = run_cli("bm25.py", "--data", d, "--split", "dev.small")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"error: {d / 'collection.tsv'}:3: expected 2 tab-separated columns (passage id, text), found 1"
    )
    proc = run_cli(
        "evaluate.py", "--model", tmp_path / "unused", "--data", _beir(tmp_path, qrels="q1\td1\n"), "--split", "test"
    )
    assert proc.returncode == 2 and "test.tsv:1: expected 3 columns" in proc.stderr.splitlines()[-1]


def test_subsample_is_deterministic_and_nested():
    ids = [f"q{i}" for i in range(100)]
    ten = derived_set.subsample(ids, 0.1, seed=3)
    assert len(ten) == 10 and ten == derived_set.subsample(list(reversed(ids))[::-1], 0.1, seed=3)
    assert set(ten) <= set(derived_set.subsample(ids, 0.5, seed=3))
    assert set(ten) != set(derived_set.subsample(ids, 0.1, seed=4))
    assert derived_set.subsample(ids, 1.0, seed=0) == ids


def test_derived_retrieval_set(tmp_path):
    stats = derived_set.derive_retrieval_set(DEMO_CORPUS, tmp_path / "ds", seed=1)
    splits = {s: load_data(tmp_path / "ds", s) for s in ("train", "dev", "test")}
    assert stats.passages == len(splits["test"].corpus) and stats.documents == 80
    docs_of = {s: {q.split("p")[0] for q in d.query_ids()} for s, d in splits.items()}
    assert not (docs_of["train"] & docs_of["test"]) and not (docs_of["dev"] & docs_of["test"])
    for d in splits.values():
        for q in d.query_ids():
            (pos,) = d.positives(q)
            assert d.queries[q] not in d.corpus[pos] and len(d.queries[q]) > 10
            assert pos.startswith(derived_set.query_document(q) + "p")  # the document the query came from
    assert sum(stats.queries.values()) > 250


@pytest.mark.parametrize("derived", [True, False])
def test_metrics_tests_over_documents_on_a_derived_set(tmp_path, derived):
    """Five queries, four from one document, each ranked better by A (its passage first) than by B
    (second): over the queries p = 2/32, over the documents 2 of 4 sign patterns, p = 1/2.  A set
    whose ids do not name their document (not derived) gets no test over documents."""
    qids = ["q0p0", "q0p1", "q0p2", "q0p3", "q7p0"]
    name = {q: q if derived else f"query{i}" for i, q in enumerate(qids)}
    corpus = {"x": "distractor", **{"d" + q[1:]: f"passage {q}" for q in qids}}
    write_beir(tmp_path / "ds", corpus, {name[q]: f"query {q}" for q in qids},
               {"test": {name[q]: {"d" + q[1:]: 1} for q in qids}})  # fmt: skip
    a, b = tmp_path / "a.trec", tmp_path / "b.trec"
    write_trec_run({name[q]: {"d" + q[1:]: 2.0, "x": 1.0} for q in qids}, a, tag="a")
    write_trec_run({name[q]: {"d" + q[1:]: 1.0, "x": 2.0} for q in qids}, b, tag="b")
    out = last_json(run_cli("metrics.py", "--data", tmp_path / "ds", "--run", a, "--baseline", b))
    assert out["p_value"]["nDCG@10"] == pytest.approx(2 / 32)
    if derived:
        assert out["p_value_documents"]["nDCG@10"] == pytest.approx(0.5)
        assert out["p_value_documents"]["MRR@10"] == pytest.approx(0.5)
    else:
        assert "p_value_documents" not in out


# ---------------------------------------------------------------------------
# fine-tuning
# ---------------------------------------------------------------------------


def test_no_duplicate_batches():
    from sentence_transformers import InputExample

    from seed_fairseq.encoders.retrieval.training import NoDuplicateBatches

    # 12 examples share 4 negatives: a naive batch of 8 would repeat them
    ex = [InputExample(texts=[f"q{i}", f"p{i}", f"n{i % 4}"]) for i in range(12)]
    sampler = NoDuplicateBatches(ex, batch_size=8, seed=0)
    batches = list(sampler)
    assert len(batches) == len(sampler) == 1
    for b in batches:
        texts = [t for i in b for t in ex[i].texts]
        assert len(texts) == len(set(texts))
    assert len(batches[0]) == 4


def test_triplet_loss_is_the_papers_margin_loss():
    from sentence_transformers.sentence_transformer.losses import TripletLoss

    from seed_fairseq.encoders.retrieval.training import neg_dot_distance

    q, p, n = (
        torch.tensor([[1.0, 2.0], [0.5, 0.0]]),
        torch.tensor([[1.0, 0.0], [1.0, 1.0]]),
        torch.tensor([[0.0, 1.0], [-1.0, 0.0]]),
    )
    loss = TripletLoss(model=None, distance_metric=neg_dot_distance, triplet_margin=1.0)
    got = loss.compute_loss_from_embeddings([q, p, n], None)
    # relu(1 - (s(q,d+) - s(q,d-))), s = dot: (1 - (1 - 2)) = 2 and (1 - (0.5 + 0.5)) = 0
    assert got.item() == pytest.approx((2.0 + 0.0) / 2)


def make_tiny_model(tmp_path):
    """A 1-layer, 32-wide XLM-R with a sentencepiece vocabulary trained on the demo corpus."""
    import sentencepiece as spm
    from sentence_transformers import SentenceTransformer
    from sentence_transformers.sentence_transformer.modules import Pooling, Transformer
    from transformers import XLMRobertaConfig, XLMRobertaModel, XLMRobertaTokenizer

    raw = tmp_path / "spm"
    raw.mkdir()
    (raw / "text.txt").write_text(DEMO_CORPUS.read_text(encoding="utf-8")[:40000], encoding="utf-8")
    spm.SentencePieceTrainer.train(
        input=str(raw / "text.txt"),
        model_prefix=str(raw / "sentencepiece.bpe"),
        vocab_size=400,
        model_type="unigram",
        minloglevel=2,
        num_threads=1,
    )
    tok = XLMRobertaTokenizer.from_pretrained(str(raw))
    torch.manual_seed(0)
    # BERT's 0.02 init maps every text to almost the same [CLS] vector (dot
    # products equal to 1e-5), where the contrastive gradient vanishes; a wider
    # init gives input-dependent [CLS] vectors, as a pre-trained encoder has.
    cfg = XLMRobertaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=37,
        max_position_embeddings=66,
        initializer_range=0.2,
    )
    hf = tmp_path / "hf"
    XLMRobertaModel(cfg).save_pretrained(hf)
    tok.save_pretrained(hf)
    transformer = Transformer(str(hf), max_seq_length=64)
    st = tmp_path / "tiny-st"
    SentenceTransformer(
        modules=[transformer, Pooling(transformer.get_embedding_dimension(), pooling_mode="cls")], device="cpu"
    ).save(str(st))
    return st


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny_model"))


@pytest.fixture(scope="module")
def learnable_set(tmp_path_factory):
    """40 demo paragraphs; query = the paragraph's first six words; same queries in every split.

    Train = dev = test on purpose: the test checks that the pipeline learns
    the pairs it is trained on, not generalisation.
    """
    paras = [p for p in DEMO_CORPUS.read_text(encoding="utf-8").splitlines() if p.strip()][::8][:40]
    corpus = {f"d{i}": p for i, p in enumerate(paras)}
    queries = {f"q{i}": " ".join(p.split()[:6]) for i, p in enumerate(paras)}
    qrels = {f"q{i}": {f"d{i}": 1} for i in range(len(paras))}
    return write_beir(
        tmp_path_factory.mktemp("learnable") / "set", corpus, queries, {"train": qrels, "dev": qrels, "test": qrels}
    )


def test_finetune_end_to_end_improves_mrr(tiny_model, learnable_set, tmp_path):
    before = last_json(
        run_cli(
            "evaluate.py",
            "--model",
            tiny_model,
            "--data",
            learnable_set,
            "--split",
            "test",
            "--run",
            tmp_path / "before.trec",
        )
    )
    out = tmp_path / "ft"
    ft = last_json(
        run_cli(
            "finetune.py",
            "--model",
            tiny_model,
            "--data",
            learnable_set,
            "--out",
            out,
            "--negatives",
            "bm25",
            "--epochs",
            "10",
            "--train-batch-size",
            "8",
            "--lr",
            "3e-3",
            "--eval-every",
            "10",
            "--no-progress",
        )
    )
    after = last_json(
        run_cli(
            "evaluate.py", "--model", out, "--data", learnable_set, "--split", "test", "--run", tmp_path / "after.trec"
        )
    )
    assert after["MRR@10"] > before["MRR@10"] + 0.1, (before, after)
    assert ft["steps"] == 50 and ft["train_queries"] == 40
    # the model kept its representation: [CLS] pooling compared by cosine (what sentence-transformers
    # wrote into its config), trained with cosine at sentence-transformers' scale 20, saved as its folder was:
    # without the Normalize module the tools add at load (issue 43)
    record = json.loads((out / "finetune.json").read_text())
    assert (record["similarity"], record["scale"]) == ("cosine", 20.0)
    assert [m["type"].rsplit(".", 1)[-1] for m in json.loads((out / "modules.json").read_text())] == [
        "Transformer", "Pooling"]  # fmt: skip
    curve = [json.loads(line) for line in (out / "curve.jsonl").read_text().splitlines()]
    assert [c["step"] for c in curve] == [0, 5, 10, 15, 20, 25, 30, 35, 40, 45, 50]
    assert set(curve[0]) == {"step", "round", "MRR@10", "R@100", "nDCG@10"}
    assert curve[-1]["MRR@10"] == pytest.approx(after["MRR@10"])
    assert len(read_trec_run(tmp_path / "after.trec")["q0"]) == 40


def test_ance_rounds_triplet_and_fraction(tiny_model, learnable_set):
    from seed_fairseq.encoders.retrieval.search import load_model
    from seed_fairseq.encoders.retrieval.training import FinetuneConfig, finetune, mine_dense

    data = load_data(learnable_set, "train")
    model = load_model(tiny_model, "cpu")
    cfg = FinetuneConfig(
        negatives="ance",
        loss="triplet",
        ance_rounds=2,
        epochs=1,
        batch_size=8,
        lr=1e-3,
        train_fraction=0.5,
        show_progress=False,
        neg_top_k=5,
    )
    negs = mine_dense(model, data, data.query_ids(), 5, cfg)
    assert all(len(v) == 5 and f"d{q[1:]}" not in v for q, v in negs.items())
    summary = finetune(model, data, cfg, dev=data)
    assert summary["train_queries"] == 20 and summary["rounds"] == 2
    assert summary["steps"] == 2 * (20 // 8)
    assert [(c["round"], c["step"]) for c in summary["curve"]] == [(0, 0), (0, 2), (1, 4)]
    with pytest.raises(ValueError, match="triplet needs negatives"):
        finetune(model, data, FinetuneConfig(negatives="none", loss="triplet"))


def _kinds(model):
    return [type(m).__name__ + (f"({m.pooling_mode})" if hasattr(m, "pooling_mode") else "") for m in model]


def test_each_model_is_loaded_in_its_own_representation(tiny_model, tmp_path):
    """The default representation is what the folder declares: its sentence-transformers modules as
    written and its similarity (cosine: unit vectors, so the inner-product index ranks by cosine);
    --representation cls is the papers' [CLS] and dot product.  Fine-tuning's default MNRL scale
    follows the similarity (20 for cosine, 1 for dot), --scale overrides it."""
    import shutil

    from hf_models import save_bert, save_sentence_model
    from sentence_transformers import util

    from seed_fairseq.encoders.retrieval.search import load_model, similarity
    from seed_fairseq.encoders.retrieval.training import FinetuneConfig, make_loss

    def loaded(folder, representation=None):
        model = load_model(str(folder), "cpu", representation=representation)
        loss = make_loss(model, FinetuneConfig())
        return _kinds(model), similarity(model), loss.scale, loss.similarity_fct

    mean = save_sentence_model(tmp_path / "mean", "mean", normalize=True)
    assert loaded(mean) == (["Transformer", "Pooling(mean)", "Normalize"], "cosine", 20.0, util.cos_sim)
    assert loaded(mean, "cls") == (["Transformer", "Pooling(cls)"], "dot", 1.0, util.dot_score)
    model = load_model(str(mean), "cpu")
    assert make_loss(model, FinetuneConfig(scale=5.0)).scale == 5.0
    # a plain HuggingFace folder: the papers' [CLS] + dot, not sentence-transformers' default mean pooling
    assert loaded(save_bert(tmp_path / "bert", with_head=False)) == (["Transformer", "Pooling(cls)"], "dot", 1.0,
                                                                    util.dot_score)  # fmt: skip
    # declared cosine without Normalize: normalised at load (the index ranks by inner product)
    assert loaded(tiny_model)[:2] == (["Transformer", "Pooling(cls)", "Normalize"], "cosine")
    # ... unless this project exported it before exports recorded their similarity: [CLS] + dot then,
    # although sentence-transformers wrote "cosine" (its default) into the folder
    old = shutil.copytree(tiny_model, tmp_path / "old_export")
    (old / "seed_fairseq_export.json").write_text(json.dumps({"tool": "seed_fairseq.hf.export", "files": []}))
    assert loaded(old)[:3] == (["Transformer", "Pooling(cls)"], "dot", 1.0)
    config = old / "config_sentence_transformers.json"
    (old / "seed_fairseq_export.json").unlink()
    config.write_text(json.dumps({**json.loads(config.read_text()), "similarity_fn_name": "euclidean"}))
    with pytest.raises(DataFormatError, match="config_sentence_transformers.json: similarity_fn_name 'euclidean'"):
        load_model(str(old), "cpu")
