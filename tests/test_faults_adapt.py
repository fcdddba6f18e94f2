"""One line, exit 2, before anything is written (issue 32 items 3, 4, 6, 11, 14): adapt
(examples/adapt.py), the adaptation study and the comparison refuse, with ``--out`` left
uncreated and in well under a minute (nothing is trained):

* item 3: ``--k`` below the cutoff of a metric the tool reports (R@100 of a run of 5);
* item 4: a ``--retrieval-dev`` whose ``test`` split exists but is malformed (it used to be
  "no test split", and the report was computed on the dev split that chose the checkpoint);
* item 6: an ``--out`` inside ``--model``, ``--retrieval-dev``, ``--train-queries``, ``--init``
  or ``--retrieval-data`` (its fingerprint changed on every run), or an input inside ``--out``;
* item 11: an ``--out`` inside a file, with ``:`` in its path, in a folder that cannot be written;
* item 14: a model folder without weights or tokenizer, or whose tokenizer does not fit its
  embedding; ``--gpu`` without CUDA; study ``--seeds`` of 2**32 or more; an ``--fairseq-args``
  that sets a value the tool plans (``--max-update 2``).  ``--fairseq-args "--fp16"`` (the form
  the docs print) is accepted.
"""

import os
import shutil
from pathlib import Path

import pytest
import torch
from helpers import DEMO_CORPUS
from hf_models import roberta_tokenizer, save_bert
from objectives import TINY_ENCODER

from seed_fairseq.base.derived_set import derive_retrieval_set
from seed_fairseq.encoders.retrieval.evaluate import evaluate_model
from seed_fairseq.encoders.retrieval.metrics import check_depth, measured_at
from seed_fairseq.workflows.adapt import cli as adapt_cli
from seed_fairseq.workflows.adapt import study
from seed_fairseq.workflows.compare import cli as compare_cli
from seed_fairseq.workflows.kit.checks import glue_option_values

COMPARE = ["--objectives", "seed", "--vocab-size", "400", "--valid-docs", "4", "--updates", "4", "--warmup", "1",
           "--encoder-args", " ".join(TINY_ENCODER), "--tokens-per-sample", "32", "--batch-size", "8",
           "--validate-every", "2", "--probe-size", "16", "--max-seq-length", "32", "--k", "100",
           "--cos-lengths", "16,32"]  # fmt: skip


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    return save_bert(tmp_path_factory.mktemp("faults_bert") / "bert", with_head=False)


@pytest.fixture(scope="module")
def beir(tmp_path_factory):
    root = tmp_path_factory.mktemp("faults_beir")
    derive_retrieval_set(DEMO_CORPUS, root / "beir", seed=1)
    return root / "beir"


def adapt(out, bert, *extra):
    return adapt_cli.main(["--model", str(bert), "--corpus", str(DEMO_CORPUS), "--objective", "seed", "--out",
                           str(out), *map(str, extra)])  # fmt: skip


def adaptation_study(out, bert, *extra):
    return study.main(["--model", str(bert), "--corpus", str(DEMO_CORPUS), "--objectives", "seed", "--out", str(out),
                       *map(str, extra)])  # fmt: skip


def compare(out, *extra):
    return compare_cli.main(["--out", str(out), "--corpus", str(DEMO_CORPUS), *COMPARE, *map(str, extra)])


TOOLS = {
    "adapt": lambda out, bert, *extra: adapt(out, bert, *extra),
    "study": lambda out, bert, *extra: adaptation_study(out, bert, *extra),
    "compare": lambda out, bert, *extra: compare(out, *extra),
}


def refused(capsys, code, out, *words):
    """Exit 2, one ``error:`` line holding ``words``, ``out`` not created."""
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1, err
    assert all(w in errors[0] for w in words), errors
    assert not Path(out).exists(), f"{out} was created"
    return errors[0]


def unwritable_folder(tmp_path) -> Path:
    """A folder this process cannot create files in (root ignores permission bits: /proc/self)."""
    if os.geteuid() == 0:
        return Path("/proc/self")
    folder = tmp_path / "read-only"
    folder.mkdir()
    folder.chmod(0o555)
    return folder


# ---------------------------------------------------------------------------
# item 11: --out paths
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("tool", TOOLS)
def test_an_out_path_the_tool_cannot_use_is_one_line(tmp_path, capsys, bert, tool):
    a_file = tmp_path / "notes.txt"
    a_file.write_text("the user's")
    cases = [
        (a_file / "out", ("cannot create the folder", "is not a folder")),
        (tmp_path / "a:b" / "out", ("contains ':'", "list of data folders")),
        (unwritable_folder(tmp_path) / "out", ("cannot create the folder", "cannot be written")),
    ]
    for out, words in cases:
        refused(capsys, TOOLS[tool](out, bert), out, str(out), *words)
    assert a_file.read_text() == "the user's"


# ---------------------------------------------------------------------------
# item 6: --out and the inputs apart
# ---------------------------------------------------------------------------


def test_an_out_inside_an_input_or_an_input_inside_out_is_refused(tmp_path, capsys, bert, beir):
    out = bert / "adapted"  # the case: every run changed --model's fingerprint
    refused(capsys, adapt(out, bert), out, "--out is inside --model")
    for flag in ("--retrieval-dev", "--train-queries"):
        out = beir / "out"
        refused(capsys, adapt(out, bert, flag, beir), out, f"--out is inside {flag}")
    refused(capsys, adaptation_study(bert / "s", bert), bert / "s", "--out is inside --model")
    refused(capsys, compare(bert / "c", "--init", bert), bert / "c", "--out is inside --init")
    refused(capsys, compare(beir / "c", "--retrieval-data", beir), beir / "c", "--out is inside --retrieval-data")
    # an input inside --out (an empty folder the user made for it)
    out = tmp_path / "out"
    out.mkdir()
    corpus = out / "corpus.txt"
    shutil.copy(DEMO_CORPUS, corpus)
    code = adapt_cli.main(["--model", str(bert), "--corpus", str(corpus), "--objective", "seed", "--out", str(out)])
    err = capsys.readouterr().err
    assert code == 2 and f"error: {corpus}: --corpus: is inside --out" in err, err
    assert sorted(p.name for p in out.iterdir()) == ["corpus.txt"]


# ---------------------------------------------------------------------------
# item 3: --k and the metrics' cutoffs
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("tool", TOOLS)
def test_k_below_a_reported_cutoff_is_refused(tmp_path, capsys, bert, tool):
    out = tmp_path / "out"
    refused(capsys, TOOLS[tool](out, bert, "--k", 5), out, "--k 5 is below the cutoff of R@100", "--k 100")


def test_the_shared_evaluation_names_only_the_cutoffs_a_run_reaches():
    assert measured_at(100) == ("MRR@10", "R@100", "nDCG@10") and "R@1000" in measured_at(1000)
    check_depth(100, ("nDCG@10", "R@100"))
    with pytest.raises(ValueError, match="--eval-k 10 is below the cutoff of R@100"):
        check_depth(10, ("nDCG@10", "R@100"), "--eval-k")
    with pytest.raises(ValueError, match="--k 5 is below the cutoff of R@100"):  # before anything is encoded
        evaluate_model(None, None, k=5, names=("nDCG@10", "R@100"))


# ---------------------------------------------------------------------------
# item 4: a malformed test split is an error, not "no test split"
# ---------------------------------------------------------------------------


def test_a_malformed_test_split_is_an_error_naming_it(tmp_path, capsys, bert, beir):
    dev = tmp_path / "dev"
    shutil.copytree(beir, dev)
    qrels = dev / "qrels" / "test.tsv"
    qrels.write_text(qrels.read_text() + "q1\td1\tvery relevant\n")
    out = tmp_path / "out"
    refused(capsys, adapt(out, bert, "--retrieval-dev", dev), out, f"{qrels}:", "(--retrieval-dev, split test)")
    qrels.write_text("query-id\tcorpus-id\tscore\n")  # a split without a judgement
    refused(capsys, adapt(out, bert, "--retrieval-dev", dev), out, str(qrels), "split test")
    # no test split at all: the report is on dev (and says the checkpoint was chosen on it)
    qrels.unlink()
    argv = ["--model", str(bert), "--corpus", str(DEMO_CORPUS), "--objective", "seed", "--out", str(out),
            "--retrieval-dev", str(dev)]  # fmt: skip
    assert adapt_cli.build_plan(adapt_cli.parser().parse_args(argv), argv, "adapt.py").test_split == "dev"


# ---------------------------------------------------------------------------
# item 14: late refusals, now up front
# ---------------------------------------------------------------------------


def _broken_model(tmp_path, bert, case):
    folder = tmp_path / case
    shutil.copytree(bert, folder)
    if case == "no-weights":
        (folder / "model.safetensors").unlink()
    elif case == "no-tokenizer":
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (folder / name).unlink()
    else:  # another model's vocabulary: ids beyond the word embedding
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (folder / name).unlink()
        roberta_tokenizer().save_pretrained(str(folder))
    return folder


@pytest.mark.parametrize(
    "case, words",
    [("no-weights", "no model weights"), ("no-tokenizer", "tokenizer"), ("other-vocabulary", "rows")],
)
def test_a_model_folder_that_cannot_be_imported_is_refused_before_out(tmp_path, capsys, bert, case, words):
    model = _broken_model(tmp_path, bert, case)
    out = tmp_path / "out"
    line = refused(capsys, adapt(out, model), out, words, "(--model)")
    assert str(model) in line
    refused(capsys, compare(out, "--init", model), out, words, "(--init)")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
@pytest.mark.parametrize("tool", TOOLS)
def test_gpu_without_cuda_is_refused_before_out(tmp_path, capsys, bert, tool):
    out = tmp_path / "out"
    refused(capsys, TOOLS[tool](out, bert, "--gpu"), out, "--gpu", "no CUDA device")


def test_study_seeds_beyond_numpys_are_refused(tmp_path, capsys, bert):
    out = tmp_path / "out"
    refused(capsys, adaptation_study(out, bert, "--seeds", f"1,{2**32}"), out, "--seeds", "[0, 2**32)")


@pytest.mark.parametrize("tool", TOOLS)
def test_fairseq_args_may_add_options_but_not_override_planned_ones(tmp_path, capsys, bert, tool):
    out = tmp_path / "out"
    for given, named in (("--max-update 2", "--max-update"), ("--max-sentences 4", "--max-sentences"),
                         ("--seed=3", "--seed")):  # fmt: skip
        line = refused(capsys, TOOLS[tool](out, bert, "--fairseq-args", given), out, f"--fairseq-args: {named}")
        assert "planned by the tool" in line
    # the form the docs print: argparse used to take "--fp16" for an option of the tool's own
    argv = ["--out", str(out), "--corpus", str(DEMO_CORPUS), "--fairseq-args", "--fp16"]
    if tool == "compare":
        argv += COMPARE
        plan = compare_cli.build_plan(
            compare_cli.parser().parse_args(glue_option_values(argv, compare_cli.OPTION_LISTS)), argv, "c"
        )
    else:
        argv += ["--model", str(bert), "--objective" if tool == "adapt" else "--objectives", "seed"]
        parser, build = (adapt_cli.parser, adapt_cli.build_plan) if tool == "adapt" else (study.parser, study.build)
        plan = build(parser().parse_args(glue_option_values(argv, adapt_cli.OPTION_LISTS)), argv, "a")
        plan = plan[0] if isinstance(plan, tuple) else plan
    assert plan.pretrain.fairseq_args == ["--fp16"] and not out.exists()
