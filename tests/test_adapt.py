"""The domain-adaptation command (examples/adapt.py, seed_fairseq.workflows.adapt), issue 23 item 4.

Slow: the whole flow through the real command line on the demo corpus with a tiny BERT
saved without MLM head as a sentence-transformers model with mean pooling and Normalize
(all-MiniLM-L6-v2's representation, which pre-training and every evaluation keep): import, data with its tokenizer,
fairseq-train continued with SEED from the import (encoder frozen while the new heads
warm up), the checkpoint chosen on the derived dev split, export, zero-shot and
fine-tuned evaluation of the original and the adapted model, the report; a rerun that
does nothing; a changed fine-tuning option that redoes only the fine-tuning and the report.
Fast: the checkpoint choice when the starting model scored best, the dev set reaching
fairseq-train, bad input.
"""

import json
import shutil
import sys

import pytest
import torch
from helpers import DEMO_CORPUS, REPO, check
from hf_models import save_sentence_model

from seed_fairseq.workflows.adapt import cli
from seed_fairseq.workflows.adapt.pipeline import Adaptation
from seed_fairseq.workflows.kit.corpus import corpus_documents

ADAPT = REPO / "examples" / "adapt.py"
# a handful of updates: 2 validations (and the starting model's score), 1 update with the encoder frozen
TINY = ["--objective", "seed", "--updates", "4", "--batch-size", "8", "--validate-every", "2", "--probe-size", "16",
        "--resamples", "100", "--ft-batch-size", "8"]  # fmt: skip


def _training_queries(root):
    """A BEIR folder with a train split: the queries derived from 8 documents of the demo corpus."""
    from seed_fairseq.base.derived_set import derive_retrieval_set

    text = root / "train_docs.txt"
    text.write_text("\n\n".join("\n".join(d) for d in corpus_documents(DEMO_CORPUS)[:8]) + "\n")
    derive_retrieval_set(text, root / "train_queries", seed=1, dev_fraction=0.1, test_fraction=0.1)
    return root / "train_queries"


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """A tiny BERT saved without MLM head, as sentence-embedding models are, with mean pooling and
    Normalize (all-MiniLM-L6-v2's representation)."""
    return save_sentence_model(tmp_path_factory.mktemp("adapt_bert") / "bert", "mean", normalize=True)


@pytest.fixture(scope="module")
def flow(tmp_path_factory, bert):
    root = tmp_path_factory.mktemp("adapt")
    out = root / "out"
    args = ["--model", bert, "--corpus", DEMO_CORPUS, "--out", out, "--train-queries", _training_queries(root), *TINY]
    proc = check([sys.executable, ADAPT, *args], cwd=str(REPO), timeout=600)
    return {"out": out, "args": args, "stdout": proc.stdout}


def _stamps(out):
    return {p: p.stat().st_mtime_ns for p in out.rglob("*") if p.is_file()}


def _ran(stderr):
    return [line.split("] ", 1)[1].split(":")[0] for line in stderr.splitlines() if line.endswith(": running")]


@pytest.mark.slow
def test_the_flow_adapts_exports_the_best_checkpoint_and_reports_before_and_after(flow):
    out = flow["out"]
    data = json.loads((out / "report.json").read_text())
    rows = data["models"]
    assert set(rows) == {"original", "adapted", "bm25", "original_ft", "adapted_ft"}
    for key, row in rows.items():
        assert set(row["metrics"]) == {"nDCG@10", "MRR@10", "R@100"}, key
        assert all(0.0 <= v <= 1.0 for v in row["metrics"].values()), key
        if key != "original":  # every other row against its reference, from per-query values
            assert 0.0 < min(row["p"].values()) and max(row["p"].values()) <= 1.0, key
            assert set(row["p_documents"]) == set(row["p"]), key  # a derived set: over its documents too
            assert 0.0 < min(row["p_documents"].values()) and max(row["p_documents"].values()) <= 1.0, key
    assert rows["adapted"]["versus"] == "original" and rows["adapted_ft"]["versus"] == "original_ft"
    md = (out / "report.md").read_text()
    for label in ("original model, zero-shot", "adapted model, zero-shot", "BM25 (bm25s)", "adapted model, fine-tuned"):
        assert f"| {label} | " in md, label
    assert "derived from 16 of the corpus's 80 documents, held out of pre-training" in md
    assert "over the held-out documents the queries come from, p = " in md
    assert flow["stdout"].startswith("# Domain adaptation")
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # the model has no MLM head: it and SEED's decoder are new, so the encoder waited a quarter of the updates
    pretrain = data["pretrain"]
    assert pretrain["new_heads"] == ["encoder.lm_head", "weak_decoder"]
    assert pretrain["freeze_encoder_updates"] == 1
    log = (out / "pretrain" / "train.log").read_text()
    assert "'freeze_encoder_updates': 1," in log and "retrieval at update 0 (the starting model)" in log
    # chosen on the dev split by fairseq (checkpoint_best.pt), which is what was exported
    selection = data["selection"]
    assert selection["metric"] == "dev_ndcg10" and set(selection["validations"]) == {"2", "4"}
    record = json.loads((out / "model" / "seed_fairseq_export.json").read_text())
    if selection["kept_start"]:
        assert record["checkpoint"] == str(out / "import" / "checkpoint.pt")
    else:
        assert record["checkpoint"] == str(out / "pretrain" / "checkpoint_best.pt")
        assert selection["value"] == max(selection["validations"].values()) > selection["start"]
    # the held-out documents (the derived set's source) were not pre-trained on
    held = {p for d in corpus_documents(out / "corpus" / "heldout.txt") for p in d}
    assert held and not held & {p for d in corpus_documents(out / "corpus" / "pretrain.txt") for p in d}

    from sentence_transformers import SentenceTransformer

    model = SentenceTransformer(str(out / "model"), device="cpu", local_files_only=True)
    assert model.encode(["a query about the rhine"]).shape == (1, 32)

    # the model's own representation throughout: pre-trained and validated on, exported with, scored in
    assert "'bottleneck_pooling': mean, 'retrieval_similarity': cosine," in log  # (enum values, unquoted)
    mean = "Transformer -> Pooling(mean) -> Normalize, cosine, max 48 tokens"  # the model's own cut throughout
    from seed_fairseq.encoders.retrieval.search import load_model
    from seed_fairseq.workflows.kit.roundtrip import describe

    assert describe(load_model(str(out / "model"), "cpu")) == mean
    # the reference is --model itself; the round trip of its import gave it back exactly, so the report
    # starts with its result; had it not, its first sentence would say so
    check = data["roundtrip"]
    assert check["exact"] and check["given"] == check["round_trip"] == mean and check["max_abs_diff"] <= 1e-5
    from seed_fairseq.workflows.adapt.report import markdown

    assert md.splitlines()[2] == "```" and "round trip (`roundtrip/`) was compared with the model as given" in md
    inexact = {**data, "roundtrip": {**check, "exact": False, "max_abs_diff": 0.01}}
    assert markdown(inexact).splitlines()[2].startswith(
        "**The import -> export round trip does not reproduce `bert` exactly**: its vectors and the re-exported "
        "model's differ by up to 0.01 on"
    )


@pytest.mark.slow
def test_the_best_checkpoint_is_what_gets_exported(flow, tmp_path):
    """When a continued checkpoint scores above the start, model/ is fairseq's checkpoint_best.pt, not
    checkpoint_last.pt.  A tiny random model's dev score does not rise in a few updates (the flow keeps
    the start), so a copy of the run gets a log in which the best checkpoint's validation beat it."""
    from seed_fairseq.pretrain.checkpoint import num_updates, peek_checkpoint

    copy = tmp_path / "out"
    shutil.copytree(flow["out"], copy, ignore=shutil.ignore_patterns(".lock"))
    argv = [str(a) for a in flow["args"]]
    argv[argv.index("--out") + 1] = str(copy)
    ad = Adaptation(cli.build_plan(cli.parser().parse_args(argv), argv, "test"))
    best = copy / "pretrain" / "checkpoint_best.pt"
    update = num_updates(peek_checkpoint(best))
    with open(copy / "pretrain" / "train.log", "a") as f:
        f.write(f'x | INFO | valid | {{"valid_dev_ndcg10": "0.9", "valid_dev_ndcg10_vs_start": "0.5", '
                f'"valid_num_updates": "{update}"}}\n')  # fmt: skip
    result = ad.stage_export({})
    assert not result["kept_start"] and result["update"] == update and result["value"] == 0.9
    record = json.loads((copy / "model" / "seed_fairseq_export.json").read_text())
    assert record["checkpoint"] == str(best)  # and the export checked its outputs equal to that checkpoint's


@pytest.mark.slow
def test_a_rerun_does_nothing_and_a_change_redoes_only_what_depends_on_it(flow):
    out, args = flow["out"], flow["args"]
    before = _stamps(out)
    proc = check([sys.executable, ADAPT, *args], cwd=str(REPO), timeout=300)
    assert "nothing to do" in proc.stderr and not _ran(proc.stderr)
    assert _stamps(out) == before
    # a fine-tuning option: the two fine-tunings and the report, nothing before them
    proc = check([sys.executable, ADAPT, *args, "--ft-lr", "1e-4"], cwd=str(REPO), timeout=300)
    assert _ran(proc.stderr) == ["finetune-original", "finetune-adapted", "report"]
    after = _stamps(out)
    for kept in ("pretrain/checkpoint_best.pt", "model/model.safetensors", "eval/zeroshot-adapted/run.trec"):
        assert after[out / kept] == before[out / kept], kept
    tuned = out / "eval" / "finetune-adapted" / "run.trec"
    assert after[tuned] != before[tuned]


@pytest.mark.slow
def test_a_diverged_fine_tuning_is_one_error_line_never_a_row(flow, tmp_path, capsys, monkeypatch):
    """A fine-tuning whose loss turns NaN stops adapt with one error line naming the model (issue 43 B):
    no run of 0.0 scores, no report with a "significant" row (the study's cells run the same stage)."""
    from test_faults_hf import refused
    from test_faults_nonfinite import _diverging

    copy = tmp_path / "out"
    shutil.copytree(flow["out"], copy, ignore=shutil.ignore_patterns(".lock"))
    argv = [str(a) for a in flow["args"]]
    argv[argv.index("--out") + 1] = str(copy)
    report = (copy / "report.json").read_bytes()
    _diverging(monkeypatch)
    line = refused(capsys, cli.main([*argv, "--ft-lr", "7e-5"]), flow["args"][1], "fine-tuning diverged")
    assert "the loss is nan at step 1" in line
    assert (copy / "report.json").read_bytes() == report


# ---------------------------------------------------------------------------
# fast: the checkpoint choice, the dev set in training, bad input
# ---------------------------------------------------------------------------


def _plan(tmp_path, bert, *extra):
    argv = ["--model", str(bert), "--corpus", str(DEMO_CORPUS), "--out", str(tmp_path / "out"), *TINY, *extra]
    return cli.build_plan(cli.parser().parse_args(argv), argv, "test")


def test_the_start_is_kept_when_no_checkpoint_beat_it(tmp_path, bert):
    """fairseq's checkpoint_best.pt is the best of the continued checkpoints; when the starting model
    scored higher (``dev_ndcg10_vs_start`` < 0), the adapted model is the original."""
    ad = Adaptation(_plan(tmp_path, bert))
    ad.pretrain_dir.mkdir(parents=True)
    best = {"model": {}, "cfg": {}, "optimizer_history": [{"num_updates": 4}]}  # what fairseq's peek reads
    torch.save(best, ad.pretrain_dir / "checkpoint_best.pt")

    def validations(*rows):  # (update, dev_ndcg10, its change since the start), as fairseq-train logs them
        (ad.pretrain_dir / "train.log").write_text(
            "".join(f'x | INFO | valid | {{"valid_dev_ndcg10": "{v}", "valid_dev_ndcg10_vs_start": "{d}", '
                    f'"valid_num_updates": "{u}"}}\n' for u, v, d in rows)  # fmt: skip
        )
        return ad.choose_checkpoint()

    chosen = validations((2, 0.30, -0.10), (4, 0.35, -0.05))
    assert chosen["kept_start"] and chosen["update"] == 0 and chosen["value"] == pytest.approx(0.40)
    assert chosen["checkpoint"] == str(ad.imported / "checkpoint.pt")
    # a tie too: the checkpoint of a frozen encoder scores exactly the start
    assert validations((2, 0.40, 0.0), (4, 0.40, 0.0))["kept_start"]
    # one that beats the start is kept
    chosen = validations((2, 0.30, -0.10), (4, 0.45, 0.05))
    assert not chosen["kept_start"] and chosen["update"] == 4 and chosen["value"] == pytest.approx(0.45)


@pytest.mark.parametrize(
    "change,redone",
    [
        (["--ft-lr", "1e-4"], {"finetune-original", "finetune-adapted", "report"}),
        (["--updates", "6"], {"pretrain", "export", "zeroshot-adapted", "finetune-adapted", "report"}),
        # the round trip compares each folder at its own cut, whatever the evaluation's
        (["--max-seq-length", "32"], {"zeroshot-original", "zeroshot-adapted", "finetune-original",
                                      "finetune-adapted", "report"}),  # fmt: skip
        # another derived set and other pre-training text: everything but the import
        (["--heldout-docs", "20"], {"split", "retrieval", "data", "pretrain", "export", "roundtrip", "bm25",
                                    "zeroshot-original", "zeroshot-adapted", "finetune-original", "finetune-adapted",
                                    "report"}),  # fmt: skip
        (["--resamples", "50"], {"report"}),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else "",
)
def test_a_change_redoes_exactly_the_stages_that_depend_on_it(tmp_path, bert, change, redone):
    """The stages' fingerprints (what a rerun compares to decide), without running anything."""
    tq = _training_queries(tmp_path)
    before = Adaptation(_plan(tmp_path, bert, "--train-queries", str(tq))).runner().fingerprints
    after = Adaptation(_plan(tmp_path, bert, "--train-queries", str(tq), *change)).runner().fingerprints
    assert {k for k in before if before[k] != after[k]} == redone


def test_progress_lines_follow_the_log(tmp_path):
    """One line per new validation (with the change since the start), one per new update, none repeated."""
    from seed_fairseq.workflows.adapt.progress import TrainProgress

    log, said = tmp_path / "train.log", []
    progress = TrainProgress(log, 100, "dev_ndcg10", said.append, every=0)
    progress.poll()  # no log yet
    inner = 'x | INFO | train_inner | {{"loss": "{}", "num_updates": "{}"}}\n'
    log.write_text(inner.format(9.5, 10))
    progress.poll()
    log.write_text(log.read_text() + 'x | INFO | valid | {"valid_dev_ndcg10": "0.31", "valid_dev_ndcg10_vs_start": '
                   '"-0.02", "valid_num_updates": "20"}\n' + inner.format(8.25, 20))  # fmt: skip
    progress.poll()
    progress.poll()
    assert said == [
        "update 10/100: loss 9.500",
        "validation at update 20: dev_ndcg10 0.3100 (-0.0200 vs the starting model)",
        said[2],
    ]
    assert said[2].startswith("update 20/100: loss 8.250, ") and "left" in said[2]


def test_the_original_is_the_model_as_given(tmp_path, bert):
    """The reference rows score --model itself (an input of their stages), not a re-export of its
    import: the round trip is a check of its own (``roundtrip``), which the report reads."""
    tq = _training_queries(tmp_path)
    ad = Adaptation(_plan(tmp_path, bert, "--train-queries", str(tq)))
    assert ad._model_folder("original") == ad.plan.model and ad._model_folder("adapted") == ad.model_dir
    stages = {s.name: s for s in ad.stages()}
    for name in ("zeroshot-original", "finetune-original"):
        assert "import" not in stages[name].reads and "model" in stages[name].reads, name
    assert "model" in stages["roundtrip"].reads and "roundtrip" in stages["report"].reads
    assert "model" not in stages["zeroshot-adapted"].reads


def test_the_model_as_given_is_scored_at_its_own_cut(tmp_path, bert):
    """Without --max-seq-length every model is evaluated and fine-tuned at the text cut of the model as given
    (its sentence_bert_config.json's 48 of its 64 positions), and the report says whose cut it is."""
    from seed_fairseq.workflows.adapt.report import cut_by

    plan = _plan(tmp_path, bert)
    assert plan.max_seq_length == 48 and cut_by(plan) == "the model's own max_seq_length"
    plan = _plan(tmp_path, bert, "--max-seq-length", "32")
    assert plan.max_seq_length == 32 and cut_by(plan) == "--max-seq-length"


def test_a_round_trip_that_changes_the_cut_is_not_exact(tmp_path, bert):
    """The round trip compares each folder at its own cut: a written folder that cuts texts elsewhere than
    the model as given is not "exact", even where the two agree on shorter texts."""
    from seed_fairseq.workflows.kit.roundtrip import compare_folders

    texts = [line for line in DEMO_CORPUS.read_text(encoding="utf-8").splitlines() if line.strip()][:6]
    same = compare_folders(bert, bert, texts, "cpu")
    assert same["exact"] and same["max_seq_length"] == [48, 48] and same["given"].endswith(", max 48 tokens")
    other = tmp_path / "other"
    shutil.copytree(bert, other)
    config = json.loads((other / "sentence_bert_config.json").read_text())
    (other / "sentence_bert_config.json").write_text(json.dumps({**config, "max_seq_length": 32}))
    check = compare_folders(bert, other, texts, "cpu")
    assert not check["exact"] and check["max_seq_length"] == [48, 32], check
    assert check["round_trip"].endswith(", max 32 tokens") and check["given"] != check["round_trip"]


def test_the_dev_set_reaches_fairseq_train(tmp_path, bert):
    plan = _plan(tmp_path, bert)
    args = Adaptation(plan).selection_args()
    assert args[:4] == ["--retrieval-dev", str(plan.out / "retrieval"), "--retrieval-dev-split", "dev"]
    assert args[-3:] == ["--best-checkpoint-metric", "dev_ndcg10", "--maximize-best-checkpoint-metric"]
    probe = Adaptation(_plan(tmp_path, bert, "--best-checkpoint-metric", "probe_mrr10")).selection_args()
    assert probe == ["--best-checkpoint-metric", "probe_mrr10", "--maximize-best-checkpoint-metric"]


@pytest.mark.parametrize(
    "change,named",
    [
        (["--model", "no-such-model"], "no-such-model"),
        (["--corpus", "no-such-corpus.txt"], "no-such-corpus.txt"),
        (["--objective", "bert"], "--objective: unknown bert"),
        (["--heldout-docs", "79"], "--heldout-docs 79"),
        (["--layer-lr-decay", "1.5"], "--layer-lr-decay must be in (0, 1]"),
        (["--model", "MODEL_WITH_A_PATH_OUT"], "modules.json: module Pooling: path '../1_Pooling' leads out"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else v,
)
def test_bad_input_is_one_error_line_before_anything_is_written(tmp_path, capsys, bert, change, named):
    out = tmp_path / "out"
    if "MODEL_WITH_A_PATH_OUT" in change:  # a folder sentence-transformers would read outside of (issue 43 E)
        model = tmp_path / "model"
        shutil.copytree(bert, model)
        modules = json.loads((model / "modules.json").read_text())
        modules[1]["path"] = "../1_Pooling"
        (model / "modules.json").write_text(json.dumps(modules))
        change = ["--model", str(model)]
    argv = ["--model", str(bert), "--corpus", str(DEMO_CORPUS), "--objective", "seed", "--out", str(out), *change]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and named in errors[0], err
    assert not out.exists()


def test_a_round_trip_that_is_not_exact_is_the_reports_first_sentence():
    from seed_fairseq.workflows.kit.roundtrip import first_sentence, statement

    check = {"texts": 88, "max_abs_diff": 3e-4, "exact": False, "given": "T -> Pooling(mean), dot",
             "round_trip": "T -> Pooling(mean), dot"}  # fmt: skip
    said = first_sentence(check, "minilm")
    assert said.startswith("**The import -> export round trip does not reproduce `minilm` exactly**: its vectors and "
                           "the re-exported model's differ by up to 0.0003 on 88 texts")  # fmt: skip
    assert "NOT exact" in statement(check)
    other = {**check, "max_abs_diff": None, "round_trip": "T -> Pooling(cls), dot"}
    assert "differ in their modules or size" in first_sentence(other, "m") and "round trip: T -> Pooling(cls)" in (
        first_sentence(other, "m"))  # fmt: skip
    assert first_sentence({**check, "exact": True}, "minilm") == "" and "exact" in statement({**check, "exact": True})


def test_the_verdict_gives_the_test_over_documents_where_there_is_one():
    """A derived set's report gives p over the documents beside p over the queries; a given set's (or a
    report written before) has none, and the verdict stays the one over the queries."""
    from seed_fairseq.workflows.adapt.report import _verdict

    adapted = {"metrics": {"nDCG@10": 0.4}, "versus": "original", "p": {"nDCG@10": 0.01},
               "p_documents": {"nDCG@10": 0.2}}  # fmt: skip
    models = {"original": {"metrics": {"nDCG@10": 0.5}}, "adapted": adapted}
    assert _verdict({"models": models}) == [
        "* Zero-shot: nDCG@10 0.500 -> 0.400 (-0.100, p = 0.010; over the held-out documents the queries come from, "
        "p = 0.200): the adapted model is **worse** (two-sided paired permutation test over the queries, 0.05)."
    ]
    del adapted["p_documents"]
    assert _verdict({"models": models}) == [
        "* Zero-shot: nDCG@10 0.500 -> 0.400 (-0.100, p = 0.010): the adapted model is **worse** (two-sided paired "
        "permutation test over the queries, 0.05)."
    ]
