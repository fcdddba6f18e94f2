"""The frictions a new user met (issue 23, item 6), one test each: progress lines with
``--no-progress``, evaluation's sequence length from the data, export of an import without
``--data``, one line count in preprocessing, quiet CPU runs, no debris after SIGTERM."""

import json
import logging
import os
import re
import signal
from pathlib import Path

import pytest
from helpers import load_driver
from test_retrieval import make_tiny_model

export_cli = load_driver("examples/export_to_hf.py")
evaluate_cli = load_driver("examples/retrieval/evaluate.py")
finetune_cli = load_driver("examples/retrieval/finetune.py")

FRUITS = "apple pear plum grape melon lemon".split()


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny_model_frictions"))


def beir(root, split="train"):
    d = Path(root) / "beir"
    (d / "qrels").mkdir(parents=True)
    (d / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": f"d{i}", "text": f"the {w} is a sweet fruit"}) + "\n" for i, w in enumerate(FRUITS))
    )
    (d / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": f"q{i}", "text": f"sweet {w}"}) + "\n" for i, w in enumerate(FRUITS))
    )
    (d / "qrels" / f"{split}.tsv").write_text("".join(f"q{i}\td{i}\t1\n" for i in range(len(FRUITS))))
    return d


def test_finetune_prints_progress_lines_without_the_progress_bar(tiny_model, tmp_path, capsys):
    data, out = beir(tmp_path), tmp_path / "ft"
    argv = ["--model", str(tiny_model), "--data", str(data), "--out", str(out), "--no-progress", "--device", "cpu"]
    assert finetune_cli.main([*argv, "--train-batch-size", "2", "--epochs", "2"]) == 0
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.startswith("[train] ")]
    # the first and the last step at least (and one every 30 s between them)
    assert len(lines) >= 2, err
    pattern = r"\[train\] step (\d+)/6 loss \d+\.\d{4} \d+\.\d\d steps/s elapsed \S+ ETA \S+"
    steps = [int(re.fullmatch(pattern, line).group(1)) for line in lines]
    assert steps[0] == 1 and steps[-1] == 6, lines
    assert "Iteration" not in err  # the bar itself stays off


def test_evaluation_prints_the_length_it_cuts_at_and_why(tiny_model, tmp_path, capsys):
    data = beir(tmp_path, split="test")
    argv = ["--model", str(tiny_model), "--data", str(data), "--device", "cpu"]
    assert evaluate_cli.main(argv) == 0
    err = capsys.readouterr().err
    assert "note: texts are cut at 64 tokens (the model's max_seq_length; --max-seq-length N changes it)" in err
    corpus = re.search(r"note: corpus: 6 texts, longest (\d+) tokens, 0 cut at the 64-token limit", err)
    assert corpus and 5 < int(corpus.group(1)) < 20, err
    assert evaluate_cli.main([*argv, "--max-seq-length", "4"]) == 0
    err = capsys.readouterr().err
    assert "note: texts are cut at 4 tokens (--max-seq-length)" in err
    assert "note: corpus: 6 texts, longest 4+ tokens, 6 cut at the 4-token limit" in err, err


def test_an_import_exports_without_data(tmp_path, capsys):
    from hf_models import save_bert

    from seed_fairseq.encoders.hf.import_ import import_model

    source, imported, exported = save_bert(tmp_path / "bert"), tmp_path / "imported", tmp_path / "exported"
    import_model(source, imported)
    # the export compares itself with fairseq (token ids and outputs to --atol) before it writes anything
    assert export_cli.main(["--checkpoint", str(imported / "checkpoint.pt"), "--out", str(exported)]) == 0
    assert f"note: --data {imported} (the checkpoint's folder)" in capsys.readouterr().err
    assert (exported / "seed_fairseq_export.json").is_file()
    from transformers import AutoTokenizer

    text = "Tokenizers differ on odd strings: naïve café"
    assert AutoTokenizer.from_pretrained(str(exported))(text) == AutoTokenizer.from_pretrained(str(source))(text)
    # a checkpoint whose folder is not a data folder still needs --data, said in one line
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "checkpoint.pt").write_bytes((imported / "checkpoint.pt").read_bytes())
    with pytest.raises(SystemExit) as e:
        export_cli.main(["--checkpoint", str(tmp_path / "elsewhere" / "checkpoint.pt"), "--out", str(exported)])
    assert e.value.code == 2 and "--data is needed" in capsys.readouterr().err


def test_preprocessing_logs_one_line_count(tmp_path, caplog):
    from helpers import DEMO_CORPUS, build_data_bin

    with caplog.at_level(logging.INFO, logger="preprocess"):
        build_data_bin(DEMO_CORPUS, tmp_path / "data-bin", vocab_size=400)
    log = caplog.text
    extracted = int(re.search(r"extract: \d+ documents, \d+ paragraphs -> (\d+) lines", log).group(1))
    encoded = int(re.search(r"encode: \d+ of (\d+) lines were longer than", log).group(1))
    assert encoded == extracted, log
    sample = re.search(r"training sentencepiece BPE \(400 pieces\) on (\d+) train lines \(of (\d+);", log)
    assert sample and int(sample.group(1)) <= int(sample.group(2)) < extracted, log


def test_the_docs_say_what_max_line_pieces_to_pass_for_other_block_sizes():
    from helpers import REPO

    warm_start = (REPO / "docs" / "hf.md").read_text().split("## Continue pre-training")[1].split("\n## ")[0]
    for page in (warm_start, (REPO / "docs" / "preprocessing.md").read_text()):
        assert "--max-line-pieces 126" in page and "--tokens-per-sample" in page


HYDRA_AND_AUTOCAST = [  # the messages a CPU fairseq-train printed on stderr (before the filters)
    (UserWarning, "hydra.experimental.initialize() is no longer experimental. Use hydra.initialize()"),
    (UserWarning, "\nThe version_base parameter is not specified.\nPlease specify a compatability version level"),
    (UserWarning, "hydra.experimental.compose() is no longer experimental. Use hydra.compose()"),
    (UserWarning, "In 'config': Usage of deprecated keyword in package header '# @package _group_'.\nSee https:"),
    (UserWarning, "\n'config' is validated against ConfigStore schema with the same name.\nThis behavior is"),
    (UserWarning, "\nThe strict flag in the compose API is deprecated.\nSee https://hydra.cc/docs/1.2/"),
    (UserWarning, "'pin_memory' argument is set as true but no accelerator is found, then device pinned memory"),
    (FutureWarning, "`torch.cuda.amp.autocast(args...)` is deprecated. Please use `torch.amp.autocast('cuda'"),
]


def test_known_harmless_warnings_are_filtered_and_only_those(monkeypatch):
    import warnings

    from seed_fairseq.pretrain.fairseq_patches import quiet_warnings

    monkeypatch.setattr(quiet_warnings.sys, "warnoptions", [])
    monkeypatch.setattr(quiet_warnings, "_installed", False)
    with warnings.catch_warnings(record=True) as shown:  # the filters are undone on leaving
        warnings.resetwarnings()  # not pytest.ini's filters (the same messages): only the plugin's
        warnings.simplefilter("always")
        quiet_warnings.install()
        for category, message in HYDRA_AND_AUTOCAST:
            warnings.warn(message, category, stacklevel=1)
        assert not shown, [str(w.message) for w in shown]
        warnings.warn("hydra: a new problem", UserWarning, stacklevel=1)  # same library, another message
        warnings.warn("`torch.cuda.amp.autocast(args...)` is deprecated", UserWarning, stacklevel=1)  # another category
        assert len(shown) == 2
    # the user's own -W / PYTHONWARNINGS choice wins: nothing is installed then
    monkeypatch.setattr(quiet_warnings.sys, "warnoptions", ["default"])
    monkeypatch.setattr(quiet_warnings, "_installed", False)
    with warnings.catch_warnings():
        before = list(warnings.filters)
        quiet_warnings.install()
        assert warnings.filters == before


@pytest.mark.slow
def test_a_cpu_training_run_has_a_quiet_stderr(tmp_path):
    from helpers import DEMO_CORPUS, build_data_bin, check, train_cmd

    build_data_bin(DEMO_CORPUS, tmp_path / "data-bin", vocab_size=400)
    # PYTHONWARNINGS empty: the run's own filters (helpers.run sets "ignore" for every other test)
    proc = check(train_cmd(tmp_path / "data-bin", tmp_path / "ckpt", max_update=2), env={"PYTHONWARNINGS": ""})
    assert "Warning" not in proc.stderr, proc.stderr


@pytest.mark.parametrize("signum, exception", [(signal.SIGTERM, SystemExit), (signal.SIGINT, KeyboardInterrupt)])
@pytest.mark.parametrize("moment", ["made", "removed"])
def test_a_signal_while_staging_is_made_or_removed_leaves_nothing(tmp_path, monkeypatch, signum, exception, moment):
    """Any tool's staging folder (``fileio.staged_dir``): a real SIGTERM to finetune.py hit the
    moment after ``mkdir`` 2 times out of 5 and left an empty ``.ft.tmp-*`` folder."""
    import shutil

    from seed_fairseq.base.fileio import ownership, staged_dir

    def signalled(real, before):
        def call(*args, **kwargs):
            if before:
                signal.raise_signal(signum)  # Python runs the handler here, before the call
            result = real(*args, **kwargs)
            if not before:
                signal.raise_signal(signum)  # here, right after it
            return result

        return call

    if moment == "made":
        monkeypatch.setattr(ownership, "temp_dir_beside", signalled(ownership.temp_dir_beside, before=False))
    out = tmp_path / "deep" / "ft"
    with pytest.raises(exception) as e:
        with staged_dir(out, "tool.json", "tool.py", replace=False) as (staging, record):
            if moment == "removed":  # the body was interrupted; a second signal during the cleanup
                monkeypatch.setattr(ownership.shutil, "rmtree", signalled(shutil.rmtree, before=True))
                raise exception(143) if exception is SystemExit else exception()
            record["x"] = 1
    assert exception is KeyboardInterrupt or e.value.code == 128 + signal.SIGTERM
    assert os.listdir(out.parent) == []
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
