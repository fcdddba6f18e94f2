"""The adaptation study (examples/adaptation_study.py, seed_fairseq.workflows.adapt.study), issue 23 item 5.

Slow: the real command line on the demo corpus with a tiny BERT saved without MLM head as a
sentence-transformers model with mean pooling and Normalize (its representation kept throughout):
two objectives (one needs SimLM's generator, trained once for every cell) x two arms x two
seeds; each arm's options reach fairseq-train; the report's numbers are the runs' own; a
rerun does nothing.  Fast: the table's verdicts from literal numbers, bad input.
"""

import json
import sys

import pytest
from helpers import DEMO_CORPUS, REPO, check
from hf_models import save_sentence_model

from seed_fairseq.base.retrieval_data import load_data
from seed_fairseq.encoders.retrieval.metrics import evaluate, per_query, read_trec_run
from seed_fairseq.workflows.adapt import study
from seed_fairseq.workflows.adapt.study_report import summary, table
from seed_fairseq.workflows.kit.stats import document_p

STUDY = REPO / "examples" / "adaptation_study.py"
TINY = ["--objectives", "seed,simlm", "--arms", "none,safeguarded", "--seeds", "1,2", "--updates", "4",
        "--batch-size", "8", "--resamples", "100", "--ft-batch-size", "8"]  # fmt: skip


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return save_sentence_model(tmp_path_factory.mktemp("study_bert") / "bert", "mean", normalize=True)


@pytest.fixture(scope="module")
def run(tmp_path_factory, bert):
    out = tmp_path_factory.mktemp("study") / "out"
    args = ["--model", bert, "--corpus", DEMO_CORPUS, "--out", out, *TINY]
    proc = check([sys.executable, STUDY, *args], cwd=str(REPO), timeout=900)
    return {"out": out, "args": args, "proc": proc}


def _cfg_line(log: str) -> str:
    return next(line for line in log.splitlines() if "fairseq_cli.train | {'_name'" in line)


@pytest.mark.slow
def test_every_cell_is_trained_with_its_arm_and_seed_and_reported(run):
    out = run["out"]
    cells = sorted(p.name for p in (out / "cells").iterdir())
    assert cells == sorted(f"{o}-{a}-s{s}" for o in ("seed", "simlm") for a in ("none", "safeguarded") for s in (1, 2))
    for name in cells:
        cfg = _cfg_line((out / "cells" / name / "pretrain" / "train.log").read_text())
        arm, seed = name.split("-")[1], name.rsplit("-s", 1)[1]
        # the model has no MLM head: the safeguarded arm freezes the encoder for 25% of 4 updates
        frozen, scale = ("1", "0.1") if arm == "safeguarded" else ("0", "1.0")
        assert f"'freeze_encoder_updates': {frozen}," in cfg and f"'encoder_lr_scale': {scale}," in cfg, name
        assert f"'seed': {seed}," in cfg and "'disable_validation': True" in cfg, name
        # every cell trains the model's own vector (mean pooling, cosine: model_args.txt of the import)
        assert "'bottleneck_pooling': mean, 'retrieval_similarity': cosine," in cfg, name  # (enum values)
    # SimLM's generator was trained once, for every SimLM cell
    assert run["proc"].stderr.count("generator: running") == 1
    gen = str(out / "generator" / "checkpoint_last.pt")
    assert all(gen in _cfg_line((out / "cells" / c / "pretrain" / "train.log").read_text())
               for c in cells if c.startswith("simlm"))  # fmt: skip
    # the seeds reach training: the two seeds of one cell are different models
    a, b = ((out / "cells" / f"seed-none-s{s}" / "eval" / "zeroshot" / "run.trec").read_text() for s in (1, 2))
    assert a != b


@pytest.mark.slow
def test_the_report_holds_the_runs_own_numbers(run):
    out = run["out"]
    data = json.loads((out / "report.json").read_text())
    qrels = load_data(out / "retrieval", "test").qrels

    def ndcg(path):
        return evaluate(qrels, read_trec_run(path))["nDCG@10"]

    z = data["zeroshot"]
    assert z["original"]["metrics"]["nDCG@10"]["mean"] == pytest.approx(ndcg(out / "eval/zeroshot-original/run.trec"))
    per_seed = [ndcg(out / f"cells/seed-safeguarded-s{s}/eval/finetune/run.trec") for s in (1, 2)]
    ref = [ndcg(out / f"eval/finetune-original-s{s}/run.trec") for s in (1, 2)]
    row = data["finetuned"]["seed/safeguarded"]
    assert row["metrics"]["nDCG@10"]["mean"] == pytest.approx(sum(per_seed) / 2)
    assert row["metrics"]["nDCG@10"]["n"] == 2
    assert row["delta"]["nDCG@10"] == pytest.approx(sum(per_seed) / 2 - sum(ref) / 2)
    for column in ("zeroshot", "finetuned"):
        assert {k for k in data[column] if "/" in k} == {f"{o}/{a}" for o in ("seed", "simlm")
                                                          for a in ("none", "safeguarded")}  # fmt: skip
        compared = [r for k, r in data[column].items() if k != "original" or column != "zeroshot"]
        assert all(0 < r["p"]["nDCG@10"] <= 1 for r in compared)
        assert all(0 < r["p_documents"]["nDCG@10"] <= 1 for r in compared)  # a derived set: over documents too
    # the test over documents is kit.stats.document_p of the runs' seed-averaged scores
    values = [per_query(qrels, read_trec_run(p), ["nDCG@10"])["nDCG@10"]
              for p in [out / f"cells/seed-safeguarded-s{s}/eval/finetune/run.trec" for s in (1, 2)]
              + [out / f"eval/finetune-original-s{s}/run.trec" for s in (1, 2)]]  # fmt: skip
    assert row["p_documents"]["nDCG@10"] == document_p(values[:2], values[2:], data["evaluation"]["resamples"])
    md = (out / "report.md").read_text()
    assert md.startswith("# Adaptation study") and "| **no continued pre-training** |" in md
    # the reference is --model itself; its import's round trip is exact, else the first sentence says so
    check = data["roundtrip"]
    assert check["exact"] and check["given"] == "Transformer -> Pooling(mean) -> Normalize, cosine, max 48 tokens"
    assert md.splitlines()[2] == "```" and "round trip (`roundtrip/`) was compared with the model as given" in md
    from seed_fairseq.workflows.adapt.study_report import markdown

    inexact = {**data, "roundtrip": {**data["roundtrip"], "exact": False, "max_abs_diff": 0.01}}
    assert markdown(inexact).splitlines()[2].startswith("**The import -> export round trip does not reproduce")
    # each arm is described with the freeze its cells were trained with (1 of 4 updates; none for `none`)
    arms = {line.split("`")[1]: line for line in md.splitlines() if line.startswith("* Arm `")}
    assert "frozen for the first update" in arms["safeguarded"] and "frozen" not in arms["none"]
    assert (out / "report.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.slow
def test_a_rerun_does_nothing(run):
    before = {p: p.stat().st_mtime_ns for p in run["out"].rglob("*") if p.is_file()}
    proc = check([sys.executable, STUDY, *run["args"]], cwd=str(REPO), timeout=300)
    assert "nothing to do" in proc.stderr
    assert {p: p.stat().st_mtime_ns for p in run["out"].rglob("*") if p.is_file()} == before


def _row(label, arm, delta, p):
    return {"label": label, "arm": arm, "objective": label.lower(),
            "metrics": {"nDCG@10": {"mean": 0.3 + delta, "std": 0.01, "n": 2}},
            "delta": {"nDCG@10": delta}, "p": {"nDCG@10": p}}  # fmt: skip


def test_the_verdicts_follow_the_sign_and_the_p_value():
    ref = {"label": "none", "metrics": {"nDCG@10": {"mean": 0.3, "std": 0.0, "n": 1}}}
    ref_ft = {**ref, "delta": {"nDCG@10": 0.1}, "p": {"nDCG@10": 0.001}}
    bm25 = {**ref, "delta": {"nDCG@10": 0.05}, "p": {"nDCG@10": 0.01}}
    rows = {"a/none": _row("A", "none", -0.05, 0.001), "b/none": _row("B", "none", 0.02, 0.01),
            "c/none": _row("C", "none", 0.04, 0.2)}  # fmt: skip
    data = {"zeroshot": {"original": ref, "bm25": bm25, **rows}, "finetuned": {"original": ref_ft, **rows}}
    lines = table(data)
    verdicts = {line.split(" | ")[0].strip("| "): line.rsplit(" | ", 1)[1].strip(" |") for line in lines[4:]}
    assert verdicts == {"A": "**hurts**", "B": "**helps**", "C": "no significant change"}
    said = summary(data)[1]
    assert "helps: B (none, +0.020); hurts: A (none, -0.050); the other 1 rows" in said


@pytest.mark.parametrize(
    "change, named",
    [
        (["--arms", "none,bogus"], "--arms"),
        (["--seeds", "1,1"], "--seeds"),
        (["--objectives", "bert"], "unknown bert"),
        (["--freeze-encoder-updates", "2"], "--freeze-encoder-updates: the study sets it per arm"),
        (["--train-queries", "."], "--retrieval-dev and --train-queries are adapt.py's"),
    ],
    ids=lambda v: " ".join(v) if isinstance(v, list) else v,
)
def test_bad_input_is_one_error_line_before_anything_is_written(tmp_path, capsys, bert, change, named):
    out = tmp_path / "out"
    assert study.main(["--model", str(bert), "--corpus", str(DEMO_CORPUS), "--out", str(out), *change]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and named in errors[0], errors
    assert not out.exists()
