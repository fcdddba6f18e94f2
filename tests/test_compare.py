"""The comparison of the objectives (seed_fairseq.workflows.compare, examples/compare_objectives.py).

Fast: aggregation over seeds and the paired permutation test on hand-made
numbers, the objective table (identical encoder and budget, CPDAE's half
batch), the FLOP counter's identical-budget check on real data, the corpus
converter, bad flags.  Slow: the whole pipeline through the real command line on
a tiny configuration (every objective, one seed), its outputs, and a rerun that
redoes nothing.
"""

import json
import math
import sys
from dataclasses import replace

import pytest
from helpers import DEMO_CORPUS, REPO, check, load_driver
from objectives import TINY_ENCODER

from seed_fairseq.base.derived_set import query_document
from seed_fairseq.base.retrieval_data import load_data
from seed_fairseq.encoders.retrieval.metrics import per_query, read_trec_run
from seed_fairseq.workflows.compare import cli
from seed_fairseq.workflows.kit.objectives import OBJECTIVES, ORDER, PretrainSettings, objective_args, parse_objectives
from seed_fairseq.workflows.kit.stats import aggregate_seeds, document_p, mean_std, paired_p, seed_mean_per_query

TINY_ENC = " ".join(TINY_ENCODER)


# ---------------------------------------------------------------------------
# aggregation over seeds and the paired test, on hand-made numbers
# ---------------------------------------------------------------------------


def test_mean_std_over_seeds():
    agg = mean_std([0.2, 0.4, 0.9])
    assert agg["n"] == 3
    assert agg["mean"] == pytest.approx(0.5)
    # sample standard deviation: sqrt((0.09 + 0.01 + 0.16) / 2)
    assert agg["std"] == pytest.approx(math.sqrt(0.13))
    assert mean_std([0.7]) == {"mean": 0.7, "std": 0.0, "n": 1}
    assert mean_std([]) == {"mean": None, "std": None, "n": 0}


def test_aggregate_seeds_per_metric():
    per_seed = [{"MRR@10": 0.1, "R@100": 0.5}, {"MRR@10": 0.3, "R@100": 0.7}]
    agg = aggregate_seeds(per_seed)
    assert agg["MRR@10"]["mean"] == pytest.approx(0.2)
    assert agg["MRR@10"]["std"] == pytest.approx(math.sqrt(0.02))
    assert agg["R@100"]["mean"] == pytest.approx(0.6)
    with pytest.raises(ValueError, match="seed #1"):
        aggregate_seeds([{"MRR@10": 0.1}, {"R@100": 0.2}])


def test_seed_mean_per_query():
    assert seed_mean_per_query([{"q1": 1.0, "q2": 0.0}, {"q1": 0.0, "q2": 0.5}]) == {"q1": 0.5, "q2": 0.25}
    with pytest.raises(ValueError, match="other queries"):
        seed_mean_per_query([{"q1": 1.0}, {"q2": 1.0}])


def test_paired_test_averages_seeds_first():
    """A's per-query values averaged over its two seeds are (0.5, 1, 1), B's are 0: the
    differences (0.5, 1, 1) have 2^3 sign patterns, of which only all-plus and all-minus
    reach |mean| = 2.5/3, so p = 2/8 exactly (the unit of the test is the query, not the
    (seed, query) pair)."""
    a = [{"q1": 1.0, "q2": 1.0, "q3": 1.0}, {"q1": 0.0, "q2": 1.0, "q3": 1.0}]
    b = [{"q1": 0.0, "q2": 0.0, "q3": 0.0}, {"q1": 0.0, "q2": 0.0, "q3": 0.0}]
    assert paired_p(a, b) == pytest.approx(0.25)
    assert paired_p(a, a) == pytest.approx(1.0)
    # q1's seeds cancel: differences (0, 1, 1) -> patterns with |sum| >= 2: (+,+) and (-,-) for each
    # sign of the zero -> 4 of 8
    c = [{"q1": 1.0, "q2": 1.0, "q3": 1.0}, {"q1": -1.0, "q2": 1.0, "q3": 1.0}]
    assert paired_p(c, b) == pytest.approx(0.5)
    with pytest.raises(ValueError, match="different queries"):
        paired_p(a, [{"q1": 0.0, "q2": 0.0}, {"q1": 0.0, "q2": 0.0}])


def test_document_test_takes_whole_documents():
    """Five queries that all favour A, four of them from one document: over the queries only the
    all-plus and all-minus of 2^5 sign patterns reach |sum| = 5 (p = 2/32); over the documents
    (sums 4 and 1) 2 of the 4 patterns do (p = 1/2): two documents are not five pieces of evidence."""
    a = [{"q0p0": 1.0, "q0p1": 1.0, "q0p2": 1.0, "q0p3": 1.0, "q7p0": 1.0}]
    b = [{q: 0.0 for q in a[0]}]
    assert paired_p(a, b) == pytest.approx(2 / 32)
    assert document_p(a, b) == pytest.approx(0.5)
    # seeds are averaged first, as in paired_p: q7p0's seeds cancel, the documents' sums are (4, 0),
    # and every pattern reaches |4|: one document's evidence alone gives p = 1
    a2 = [a[0], {**a[0], "q7p0": -1.0}]
    assert document_p(a2, b) == pytest.approx(1.0)
    assert paired_p(a2, b) == pytest.approx(4 / 32)
    assert document_p(a, a) == pytest.approx(1.0)
    assert document_p([{"q0p0": 1.0, "q0p1": 0.0}], [{"q0p0": 0.0, "q0p1": 0.0}]) is None  # one document
    assert document_p([{"q1": 1.0, "q2": 0.0}], [{"q1": 0.0, "q2": 0.0}]) is None  # not a derived set
    with pytest.raises(ValueError, match="different queries"):
        document_p(a, [{"q0p0": 0.0}])


def test_query_document_reads_the_derived_ids():
    assert query_document("q12p3") == "d12"
    assert [query_document(q) for q in ("q12", "q12p3x", "xq1p2", "d1p2", "")] == [None] * 5


# ---------------------------------------------------------------------------
# the objective table: one encoder, one budget
# ---------------------------------------------------------------------------


def _settings(batch=8):
    return PretrainSettings(TINY_ENC.split(), 64, batch, 2, 10, 1, 1e-3, 5, 16)


def _value(args, flag):
    return args[args.index(flag) + 1]


SHARED_FLAGS = (
    "--encoder-layers",
    "--encoder-embed-dim",
    "--encoder-ffn-embed-dim",
    "--encoder-attention-heads",
    "--tokens-per-sample",
    "--update-freq",
    "--max-update",
    "--lr",
    "--warmup-updates",
    "--seed",
)


def test_every_objective_gets_the_same_encoder_and_schedule():
    s = _settings()
    runs = {o: objective_args(OBJECTIVES[o], s, 3, generator="gen.pt") for o in ORDER}
    for name, args in runs.items():
        for flag in SHARED_FLAGS:
            assert _value(args, flag) == _value(runs["mlm"], flag), (name, flag)
        # texts per update x views = the same sequences through the encoder (CPDAE's two views: half the texts)
        views = round(1 / OBJECTIVES[name].texts_per_update_factor)
        assert int(_value(args, "--batch-size")) * views == 8, name
    assert _value(runs["cpdae"], "--batch-size") == "4"
    assert _value(runs["simlm"], "--generator-path") == "gen.pt"
    assert "--generator-path" not in runs["seed"]
    assert _value(runs["full"], "--decoder-attention-window") == "full"
    assert _value(runs["mlm"], "--mlm-weight") == "1.0"
    with pytest.raises(ValueError, match="even --batch-size"):
        objective_args(OBJECTIVES["cpdae"], _settings(batch=7), 1)


def test_flops_stage_does_not_depend_on_the_schedule_length():
    """A new --updates (or warm-up) keeps the counted FLOPs per update: the stage is not redone."""
    from seed_fairseq.workflows.compare.objectives import per_update_args

    short, long = (
        per_update_args(objective_args(OBJECTIVES["seed"], replace(_settings(), updates=u, warmup=u // 10), 1))
        for u in (10, 500)
    )
    assert short == long and "--max-update" not in short and "--warmup-updates" not in short
    assert _value(short, "--batch-size") == "8" and "--lr" in short  # what an update computes stays


def test_parse_objectives():
    assert parse_objectives("simlm, mlm") == ["simlm", "mlm"]
    for bad, msg in (("seed,bert", "unknown bert"), ("", "none given"), ("seed,seed", "twice")):
        with pytest.raises(ValueError, match=msg):
            parse_objectives(bad)


def test_flops_identical_encoder_budget(demo_data_bin):
    """The counted encoder FLOPs per update are the same for every objective (CPDAE: half
    the texts, two views each), while the whole update's differ by the objective's heads."""
    from seed_fairseq.workflows.measure.flops import count_update_flops

    s = PretrainSettings(TINY_ENC.split(), 48, 8, 1, 10, 1, 1e-3, 0, 0)
    counts = {o: count_update_flops(demo_data_bin, objective_args(OBJECTIVES[o], s, 1), batches=3)
              for o in ("mlm", "seed", "cpdae")}  # fmt: skip
    assert counts["seed"]["encoder_per_update"] == pytest.approx(counts["mlm"]["encoder_per_update"], rel=1e-9)
    assert counts["cpdae"]["tokens_per_update"] == pytest.approx(counts["mlm"]["tokens_per_update"], rel=1e-9)
    assert counts["cpdae"]["encoder_per_update"] == pytest.approx(counts["mlm"]["encoder_per_update"], rel=0.15)
    # the decoder costs: SEED's 3 layers and vocabulary projection at every position
    assert counts["seed"]["per_update"] > 1.5 * counts["mlm"]["per_update"]
    assert counts["mlm"]["per_update"] > counts["mlm"]["encoder_per_update"]


# ---------------------------------------------------------------------------
# the corpus converter
# ---------------------------------------------------------------------------

RST = """.. SPDX-License-Identifier: GPL-2.0

==========
Page title
==========

:Author: Someone <a@b.c>

The ``kmalloc()`` function allocates memory; see :ref:`the allocator guide <mm-guide>` and
`the website <https://example.org>`_ for **more** details.

Example::

    ptr = kmalloc(size, GFP_KERNEL);

.. note::

   This is a note that is long enough to be kept if it were not a directive body.

- A bullet item that is long enough to count as a paragraph of prose, surely.

+-------+-------+
| a     | b     |
+-------+-------+

Section
-------
The first paragraph under a title, which is long enough to be kept as prose text.
"""


def test_rst_to_text_keeps_prose_only(tmp_path):
    conv = load_driver("examples/data/rst_to_text.py")
    assert conv.paragraphs(RST) == [
        "The kmalloc() function allocates memory; see the allocator guide and the website for more details.",
        "A bullet item that is long enough to count as a paragraph of prose, surely.",
        "The first paragraph under a title, which is long enough to be kept as prose text.",
    ]
    src = tmp_path / "src"
    (src / "b").mkdir(parents=True)
    (src / "translations").mkdir()
    (src / "b" / "two.rst.txt").write_text(RST)
    (src / "a.rst.txt").write_text(RST)
    (src / "translations" / "x.rst.txt").write_text(RST)
    (src / "short.rst.txt").write_text("Too short.\n")
    assert conv.main([str(src), "--out", str(tmp_path / "c.txt")]) == 0
    doc = "\n".join(conv.paragraphs(RST)) + "\n"
    # a.rst.txt and b/two.rst.txt in sorted order; not the translation, not the one-paragraph file
    assert (tmp_path / "c.txt").read_text() == doc + "\n" + doc


# ---------------------------------------------------------------------------
# bad flags: one error line, nothing created
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "flags,named",
    [
        (["--objectives", "seed,bert"], "bert"),
        (["--corpus", "no-such-corpus.txt"], "no-such-corpus.txt"),
        (["--init", "no-such-model"], "no-such-model"),
        (["--batch-size", "7"], "--batch-size 7"),
        (["--fractions", "0.1,0"], "--fractions"),
        (["--warmup", "50", "--updates", "10"], "--warmup"),
        (["--loss", "triplet", "--negatives", "none"], "negatives"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else v,
)
def test_bad_flags_are_refused_before_anything_is_written(tmp_path, capsys, monkeypatch, flags, named):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "out"
    assert cli.main(["--out", str(out), *flags]) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and named in errors[0], err
    assert not out.exists()


# ---------------------------------------------------------------------------
# the whole pipeline, tiny
# ---------------------------------------------------------------------------

TINY_RUN = [
    "--vocab-size", "400", "--valid-docs", "4", "--updates", "4", "--warmup", "1", "--encoder-args", TINY_ENC,
    "--generator-args",
    "--encoder-layers 1 --encoder-embed-dim 16 --encoder-ffn-embed-dim 23 --encoder-attention-heads 2",
    "--generator-updates", "2", "--tokens-per-sample", "48", "--batch-size", "8", "--validate-every", "2",
    "--probe-size", "16", "--ft-epochs", "1", "--fractions", "0.3,1", "--cos-lengths", "16,32,64",
    "--cos-pairs", "8", "--resamples", "50", "--max-seq-length", "48", "--k", "100",
]  # fmt: skip


@pytest.mark.slow
def test_quick_pipeline_end_to_end(tmp_path):
    out = tmp_path / "cmp"
    cmd = [
        sys.executable,
        REPO / "examples" / "compare_objectives.py",
        "--out",
        out,
        "--corpus",
        DEMO_CORPUS,
        *TINY_RUN,
    ]
    check(cmd, cwd=str(REPO), timeout=900)
    md = (out / "results.md").read_text()
    data = json.loads((out / "results.json").read_text())
    labels = [OBJECTIVES[o].label for o in ORDER]
    # every objective in every table; DupMAE twice (its own representation and its pooled vector alone)
    for label in labels:
        assert md.count(f"| {label}") >= 4, label
    assert "| DupMAE (dense+sparse) |" in md and "| DupMAE (dense only) |" in md
    assert "compare_objectives.py --out" in md and "BM25 (bm25s)" in md
    # every objective of the default set; DupMAE with both of its representations
    expected = [m for o in ORDER for m in (["dupmae+dupmae", "dupmae+own"] if o == "dupmae" else [o])]
    assert sorted(data["models"]) == sorted(expected) and {"seed", "cpdae", "bowpred"} <= set(expected)
    for key, m in data["models"].items():
        for part in ("zero_shot", "finetuned"):
            assert set(m[part]) == {"MRR@10", "R@100", "nDCG@10"}, (key, part)
            assert all(0.0 <= v["mean"] <= 1.0 and v["n"] == 1 for v in m[part].values())
        assert set(m["few_shot"]) == {"30", "100"}
        assert set(m["cls_cosine"]) == {"16", "32"}  # 64 is beyond the model's 48 positions: skipped
        if key != "mlm":
            assert set(m["p_vs_mlm"]["finetuned"]) == {"MRR@10", "R@100", "nDCG@10"}
            assert set(m["p_vs_mlm_documents"]["finetuned"]) == {"MRR@10", "R@100", "nDCG@10"}
    # the derived set's test over documents: kit.stats.document_p of the runs, in results.json and results.md
    qrels = load_data(out / "retrieval", "test").qrels
    runs = {o: per_query(qrels, read_trec_run(out / "eval" / o / "s1" / "own.zeroshot.trec"), ["MRR@10"])["MRR@10"]
            for o in ("seed", "mlm")}  # fmt: skip
    assert data["models"]["seed"]["p_vs_mlm_documents"]["zero_shot"]["MRR@10"] == document_p(
        [runs["seed"]], [runs["mlm"]], 50, 1
    )  # TINY_RUN's --resamples, the first seed
    assert "| MRR@10 | p | p (documents) |" in md and "p (documents): the same test over the held-out documents" in md
    for o in ORDER:
        od = data["objectives"][o]
        assert od["flops"]["total"] > 0 and od["pretrain_seconds"]["mean"] > 0
        assert "cls_cosine" in od["diagnostics"] and "probe_mrr10" in od["diagnostics"]
    assert data["objectives"]["cpdae"]["batch_size"] == 4
    for bottleneck in ("seed", "full", "retromae", "dupmae", "simlm"):
        assert "dec_cls_bits_seq" in data["objectives"][bottleneck]["diagnostics"], bottleneck
    assert data["generator"]["flops"]["total"] > 0
    for png in ("metrics.png", "few_shot.png", "cls_cosine.png", "diagnostics.png"):
        assert (out / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n", png

    # a rerun redoes nothing (every stage's fingerprint unchanged) and reports the same numbers
    def stamps():
        return {p: p.stat().st_mtime_ns for d in ("pretrain", "eval") for p in (out / d).rglob("*.*") if p.is_file()}

    before = stamps()
    check(cmd, cwd=str(REPO), timeout=300)
    assert stamps() == before
    again = json.loads((out / "results.json").read_text())
    assert again["models"] == data["models"]
    # the old name runs the same command
    proc = check([sys.executable, REPO / "examples" / "reproduce_small.py", *cmd[2:]], cwd=str(REPO), timeout=300)
    assert "| MLM only |" in proc.stdout
