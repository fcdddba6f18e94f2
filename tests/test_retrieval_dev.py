"""--retrieval-dev: zero-shot retrieval of a labelled dev set at every validation, and the
starting model's scores at update 0 (issue 23, item 3).

In process: the dev score is the exported model's zero-shot evaluation (export + sentence-
transformers + faiss + ir_measures) and a hand-made ranking's known numbers; text becomes the
ids the data was built with (HF tokenizer and sentencepiece builds); the start scores survive
a resume and are refused for another dev set; every worker logs the same keys; bad folders
are one ConfigurationError before training.  Through ``fairseq-train`` (slow): a continued
import logs the update-0 line and ``dev_ndcg10`` with ``_vs_start``, keeps checkpoint_best.pt
by ``--best-checkpoint-metric dev_ndcg10``, and a rerun continues with the recorded start.
"""

import json
import logging
import shlex
import shutil
import sys

import pytest
import torch
from helpers import DEMO_CORPUS, check, fairseq_train, load_driver, parse_argv, run
from hf_models import ODD_STRINGS, save_bert

from seed_fairseq.pretrain.checkpoint import load_torch_file

TOKENS = 48
BEST_VS_START = ("--best-checkpoint-metric", "probe_mrr10_vs_start")
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def write_dev(folder, n_queries=24, extra_docs=10):
    """A BEIR folder from the demo corpus: a paragraph's first 6 words are a query, the rest its
    one relevant document; ``extra_docs`` other documents, the last judged not relevant (0) for
    the first query."""
    from seed_fairseq.base.derived_set import write_beir

    paragraphs = [p for p in DEMO_CORPUS.read_text(encoding="utf-8").splitlines() if len(p.split()) >= 14]
    corpus, queries, qrels = {}, {}, {}
    for i, p in enumerate(paragraphs[: n_queries + extra_docs]):
        words = p.split()
        corpus[f"d{i}"] = " ".join(words[6:])
        if i < n_queries:
            queries[f"q{i}"] = " ".join(words[:6])
            qrels[f"q{i}"] = {f"d{i}": 1}
    qrels["q0"][f"d{len(corpus) - 1}"] = 0
    return write_beir(folder, corpus, queries, {"dev": qrels})


@pytest.fixture(scope="module")
def bert(tmp_path_factory):
    """(import folder, data built with its tokenizer, dev folder)"""
    from preprocess.build import build
    from seed_fairseq.encoders.hf.import_ import import_model

    root = tmp_path_factory.mktemp("retrieval_dev")
    imp = import_model(save_bert(root / "hf"), root / "import")
    data = build(root / "data", text=[DEMO_CORPUS], tokenizer=str(imp), workers=1, valid_docs=4, test_docs=2)
    return imp, data, write_dev(root / "dev")


def setup(imp, data, *extra):
    """Task and model of a continued import (the import's weights loaded), as fairseq-train parses them."""
    from fairseq import checkpoint_utils, options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = ["--task", "seed_pretrain", "--criterion", "seed_pretrain"]
    args += ["--arch", "seed_encoder_tiny", *shlex.split((imp / "model_args.txt").read_text())]
    args += ["--tokens-per-sample", str(TOKENS), "--sample-break-mode", "none", "--cpu", *extra]
    args = parse_argv(data, args)
    cfg = convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), args))
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    state = checkpoint_utils.load_checkpoint_to_cpu(str(imp / "checkpoint.pt"))
    model.load_state_dict(dict(state["model"]), strict=True, model_cfg=cfg.model)
    task.load_dataset("valid")
    return task, model.eval()


def dev_scores(task, model):
    from seed_fairseq.pretrain import diagnostics, retrieval_dev

    with torch.no_grad():
        total = diagnostics.totals([task.retrieval_logs(model)])
    return {**diagnostics.probe_score(total), **retrieval_dev.means(total)}


@pytest.fixture
def fresh_metrics():
    """fairseq's meters as fairseq-train starts them (and put back afterwards)."""
    from fairseq import metrics

    metrics.reset()
    yield metrics
    metrics.reset()


# ---------------------------------------------------------------------------
# the score: the exported model's evaluation, and a ranking known by hand
# ---------------------------------------------------------------------------


def test_dev_score_is_the_exported_models_zero_shot_evaluation(bert, tmp_path):
    """The starting model's dev scores = examples/retrieval/evaluate.py's of its export, on the subset."""
    from seed_fairseq.base.retrieval_data import load_data
    from seed_fairseq.encoders.hf.export import export
    from seed_fairseq.encoders.retrieval.evaluate import evaluate_model
    from seed_fairseq.encoders.retrieval.search import load_model

    imp, data, dev = bert
    task, model = setup(imp, data, "--retrieval-dev", str(dev), "--retrieval-dev-docs", "30")
    ours = dev_scores(task, model)
    chosen = task.retrieval_dev
    assert len(chosen.qids) == 24 and len(chosen.doc_ids) == 30 and chosen.judged_docs == 25  # q0 judges 2

    full = load_data(dev, "dev")
    full.corpus = {d: full.corpus[d] for d in chosen.doc_ids}
    st = load_model(str(export(imp / "checkpoint.pt", data, tmp_path / "hf")), device="cpu", max_seq_length=TOKENS)
    theirs, _ = evaluate_model(st, full, k=100, show_progress=False)
    assert ours["dev_ndcg10"] == pytest.approx(theirs["nDCG@10"], abs=1e-6)
    assert ours["dev_mrr10"] == pytest.approx(theirs["MRR@10"], abs=1e-6)
    assert ours["dev_recall100"] == pytest.approx(theirs["R@100"], abs=1e-6)
    assert 0 < ours["dev_ndcg10"] < 1  # a real ranking, not a degenerate one


class BagOfTokens(torch.nn.Module):
    """[CLS] = the token counts of the sequence (specials and padding left out)."""

    def __init__(self):
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1))  # the device

    def encode(self, tokens):
        counts = torch.zeros(tokens.size(0), 16)
        counts.scatter_add_(1, tokens, torch.ones_like(tokens, dtype=torch.float))
        counts[:, :4] = 0
        return counts.unsqueeze(1), {}

    @staticmethod
    def sentence_embedding(features, tokens):
        return features[:, 0, :]


def test_scores_of_a_ranking_known_by_hand():
    """q1's relevant document ranks 1st, q2's 2nd (behind a document sharing its token twice)."""
    from seed_fairseq.pretrain import retrieval_dev

    def ids(*tokens):
        return torch.tensor([0, *tokens, 2])

    dev = retrieval_dev.DevSet(
        qids=["q1", "q2"],
        queries=[ids(5), ids(6)],
        doc_ids=["d1", "d2", "d3"],
        docs=[ids(5, 7), ids(6, 7, 8), ids(6, 6)],
        qrels={"q1": {"d1": 1}, "q2": {"d2": 1}},
        judged_docs=2,
        identity="",
    )
    assert retrieval_dev.run(BagOfTokens(), dev, pad=1) == {
        "q1": {"d1": 1.0, "d2": 0.0, "d3": 0.0},
        "q2": {"d3": 2.0, "d2": 1.0, "d1": 0.0},
    }
    scores = retrieval_dev.scores(BagOfTokens(), dev, pad=1)
    assert scores == pytest.approx({"dev_ndcg10": (1 + 1 / 1.5849625007) / 2, "dev_mrr10": 0.75, "dev_recall100": 1})


def test_the_subset_keeps_every_judged_document_and_is_deterministic(bert):
    from seed_fairseq.base.retrieval_data import load_data
    from seed_fairseq.pretrain import retrieval_dev

    data = load_data(bert[2], "dev")
    qids, docs, judged = retrieval_dev.select(data, 5, 8)
    assert len(qids) == 5 and len(docs) == 8 and judged == len({d for q in qids for d in data.qrels[q]})
    assert all(d in docs for q in qids for d in data.qrels[q])  # every judged document, whatever the cap
    assert retrieval_dev.select(data, 5, 8) == (qids, docs, judged)
    reordered = load_data(bert[2], "dev")
    reordered.corpus = dict(reversed(list(reordered.corpus.items())))
    assert set(retrieval_dev.select(reordered, 5, 8)[1]) == set(docs)  # the choice does not follow file order
    judged_docs = {d for q in qids for d in data.qrels[q]}
    assert retrieval_dev.select(data, 5, 2)[1] == [d for d in data.corpus if d in judged_docs]
    assert retrieval_dev.select(data, 0, 0)[:2] == (data.query_ids(), list(data.corpus))


# ---------------------------------------------------------------------------
# text -> the data's own ids
# ---------------------------------------------------------------------------


def test_text_becomes_the_ids_of_an_hf_tokenizer_build(bert):
    """What the exported tokenizer gives (truncation at the block length), in the dictionary's ids."""
    from seed_fairseq.base.vocabulary.text_ids import for_data_folder
    from seed_fairseq.base.vocabulary.tokenizer import TOKENIZER_DIR, load_fast_tokenizer, vocab_from_tokenizer

    imp, data, _ = bert
    task, _ = setup(imp, data)
    tok = load_fast_tokenizer(data / TOKENIZER_DIR)
    to_fairseq = vocab_from_tokenizer(tok).hf_to_fairseq
    texts = ODD_STRINGS + [" ".join(ODD_STRINGS) * 5]
    expected = [[to_fairseq[i] for i in tok(t, truncation=True, max_length=TOKENS)["input_ids"]] for t in texts]
    assert for_data_folder(data, task.source_dictionary.symbols)(texts, TOKENS) == expected


def test_text_becomes_the_ids_of_a_sentencepiece_build(demo_data_bin):
    """The export's reference encoding (normalisation, pieces, XLM-R ids, cut keeping </s>)."""
    import json as json_

    import sentencepiece as spm
    from fairseq.data import Dictionary

    from seed_fairseq.base.vocabulary.text_ids import for_data_folder
    from seed_fairseq.encoders.hf.tokenizer import fairseq_encode

    dictionary = Dictionary.load(str(demo_data_bin / "dict.txt"))
    dictionary.add_symbol("<mask>")
    sp = spm.SentencePieceProcessor(model_file=str(demo_data_bin / "spm.model"))
    record = json_.loads((demo_data_bin / "preprocess.json").read_text())["normalization"]
    texts = ODD_STRINGS + ["UPPER  \u2028case\x07 " * 20]
    ids = for_data_folder(demo_data_bin, dictionary.symbols)(texts, 32)
    assert ids == [fairseq_encode(t, sp, dictionary, record, max_length=32) for t in texts]


# ---------------------------------------------------------------------------
# the start scores: computed once, kept by a resumed run, carried to every validation
# ---------------------------------------------------------------------------


def test_start_scores_survive_a_resume_and_give_vs_start(bert, fresh_metrics, caplog, monkeypatch):
    imp, data, dev = bert
    opts = ("--retrieval-dev", str(dev), "--retrieval-probe-size", "8")
    first, model = setup(imp, data, *opts)
    with caplog.at_level(logging.INFO):
        first.begin_epoch(1, model)
        first.begin_epoch(2, model)  # once per process
    lines = [r.getMessage() for r in caplog.records if "retrieval at update 0" in r.getMessage()]
    assert len(lines) == 1 and lines[0].startswith("retrieval at update 0 (the starting model): probe_mrr10 ")
    start = dict(first.retrieval_start)
    assert set(start) == {"probe_mrr10", "dev_ndcg10", "dev_mrr10", "dev_recall100"} and model.training is False
    saved = first.get_checkpoint_dict()["SeedPretrainTask"]

    # the same run continued (fairseq restored 5 updates): the recorded start, nothing recomputed
    resumed, model = setup(imp, data, *opts)
    resumed.set_checkpoint_dict(saved)
    fresh_metrics.log_scalar("num_updates", 5, weight=0)
    monkeypatch.setattr(type(resumed), "retrieval_logs", lambda *a: pytest.fail("recomputed"))
    caplog.clear()
    with caplog.at_level(logging.INFO):
        resumed.begin_epoch(1, model)
    assert resumed.retrieval_start == start
    assert "retrieval at update 0 (the starting model, recorded in the checkpoint): probe_mrr10" in caplog.text
    monkeypatch.undo()

    # a validation carries the start: <score>_vs_start = now - start
    with torch.no_grad():
        weight = model.encoder.sentence_encoder.layers[-1].fc1.weight  # the model moved
        weight.add_(torch.randn(weight.shape, generator=torch.Generator().manual_seed(0)))
        logs = resumed.retrieval_logs(model)
    with fresh_metrics.aggregate(new_root=True) as agg:
        resumed.reduce_metrics([{**logs, "ntokens": 1, "nsentences": 1}], criterion=NoTerms())
    values = agg.get_smoothed_values()
    for name in start:
        assert values[f"{name}_vs_start"] == pytest.approx(values[name] - start[name], abs=1e-4)
    assert any(values[f"{name}_vs_start"] != 0 for name in start)

    # another dev subset: its start is not this run's; the probe's still is
    other, model = setup(imp, data, *opts, "--retrieval-dev-queries", "10")
    other.set_checkpoint_dict(saved)
    caplog.clear()
    with caplog.at_level(logging.INFO):
        other.begin_epoch(1, model)
    assert other.retrieval_start == {"probe_mrr10": start["probe_mrr10"]}
    assert "no score of the starting model for dev_ndcg10, dev_mrr10, dev_recall100" in caplog.text


class NoTerms:
    """A criterion without terms of its own (the task's reduce_metrics calls its class's)."""

    @staticmethod
    def reduce_metrics(logging_outputs):
        pass


def test_a_run_that_starts_scores_its_own_model(bert, fresh_metrics):
    """--finetune-from-model / --reset-optimizer: fairseq restores no updates, so a start recorded
    in the loaded checkpoint (another run's) is not taken: the model loaded now is scored."""
    imp, data, dev = bert
    task, model = setup(imp, data, "--retrieval-dev", str(dev))
    task.set_checkpoint_dict(
        {"retrieval_start": {"scores": {"dev_ndcg10": 0.99}, "dev_identity": task.retrieval_dev.identity}}
    )
    task.begin_epoch(1, model)
    assert task.retrieval_start == pytest.approx(dev_scores(task, model))


def test_every_worker_logs_the_same_keys(bert, monkeypatch):
    """fairseq sums the workers' logging outputs key by key (one all-reduce of a flat buffer):
    the workers that do not score give the same keys, zero, and the sum is the first worker's."""
    from seed_fairseq.pretrain import diagnostics
    from seed_fairseq.pretrain.tasks import validation

    imp, data, dev = bert
    task, model = setup(imp, data, "--retrieval-dev", str(dev), "--retrieval-probe-size", "8")
    task.retrieval_start = {"probe_mrr10": 0.5}
    utils = validation.distributed_utils
    monkeypatch.setattr(utils, "get_data_parallel_world_size", lambda: 2)
    logs = {}
    for rank in (0, 1):
        monkeypatch.setattr(utils, "get_data_parallel_rank", lambda r=rank: r)
        with torch.no_grad():
            logs[rank] = task.retrieval_logs(model)
    assert list(logs[1]) == list(logs[0]) and not any(logs[1].values())
    assert logs[0][diagnostics.PROBE_KEYS[2]] == 1 and logs[0][diagnostics.START + "probe_mrr10_runs"] == 1


def test_no_diagnostics_keeps_the_requested_dev_score(bert):
    imp, data, dev = bert
    task, _ = setup(imp, data, "--retrieval-dev", str(dev), "--retrieval-probe-size", "8", "--no-diagnostics")
    assert task.retrieval_names() == ["dev_ndcg10", "dev_mrr10", "dev_recall100"]


# ---------------------------------------------------------------------------
# refused before training
# ---------------------------------------------------------------------------


def test_a_bad_dev_folder_is_refused_at_task_setup(bert, tmp_path):
    from seed_fairseq.base.errors import ConfigurationError

    imp, data, dev = bert
    missing = tmp_path / "nowhere"
    with pytest.raises(ConfigurationError, match=rf"^{missing}: data folder not found \(--retrieval-dev\)$"):
        setup(imp, data, "--retrieval-dev", str(missing))
    bad = shutil.copytree(dev, tmp_path / "bad")
    lines = (bad / "queries.jsonl").read_text().splitlines()
    (bad / "queries.jsonl").write_text("\n".join([lines[0], '{"_id": "q1", "text": ', *lines[2:]]) + "\n")
    with pytest.raises(ConfigurationError, match=r"bad/queries.jsonl:2: invalid JSON: .* \(--retrieval-dev\)$"):
        setup(imp, data, "--retrieval-dev", str(bad))
    with pytest.raises(ConfigurationError, match=r"qrels/test.tsv: file not found"):
        setup(imp, data, "--retrieval-dev", str(dev), "--retrieval-dev-split", "test")
    with pytest.raises(ConfigurationError, match=r"--retrieval-dev-docs must be >= 0"):
        setup(imp, data, "--retrieval-dev", str(dev), "--retrieval-dev-docs", "-1")
    # fairseq would fail at the first validation, after training that long
    with pytest.raises(ConfigurationError, match=r"^--best-checkpoint-metric dev_ndcg10: .* needs --retrieval-dev$"):
        setup(imp, data, "--best-checkpoint-metric", "dev_ndcg10", "--maximize-best-checkpoint-metric")
    with pytest.raises(ConfigurationError, match=r"^--best-checkpoint-metric probe_mrr10_vs_start: .* needs --retr"):
        setup(imp, data, "--retrieval-probe-size", "8", "--no-diagnostics", *BEST_VS_START)


def test_data_without_its_tokenizer_is_refused_at_task_setup(bert, tmp_path):
    from seed_fairseq.base.errors import ConfigurationError

    imp, data, dev = bert
    bare = tmp_path / "bare"
    bare.mkdir()
    for f in data.iterdir():
        if f.is_file() and f.name not in ("hf_tokenizer.json", "preprocess.json"):
            shutil.copy(f, bare / f.name)
    with pytest.raises(ConfigurationError, match=rf"^{bare}: no tokenizer to turn text into this folder's ids"):
        setup(imp, bare, "--retrieval-dev", str(dev))
    setup(imp, bare)  # without --retrieval-dev the folder trains as before
    shutil.copytree(data / "tokenizer", bare / "tokenizer")
    (bare / "hf_tokenizer.json").write_text("{", encoding="utf-8")
    with pytest.raises(ConfigurationError, match=rf"^{bare / 'hf_tokenizer.json'}: not readable"):
        setup(imp, bare, "--retrieval-dev", str(dev))


# ---------------------------------------------------------------------------
# through fairseq-train
# ---------------------------------------------------------------------------


def train_cmd(imp, data, dev, save, max_update):
    return fairseq_train(
        data,
        "--task", "seed_pretrain", "--criterion", "seed_pretrain",
        "--arch", "seed_encoder_tiny", *shlex.split((imp / "model_args.txt").read_text()),
        "--finetune-from-model", imp / "checkpoint.pt",
        "--tokens-per-sample", str(TOKENS), "--sample-break-mode", "none",
        "--batch-size", "4", "--required-batch-size-multiple", "1",
        "--optimizer", "adam", "--lr", "3e-3", "--lr-scheduler", "fixed", "--max-update", str(max_update),
        "--validate-interval-updates", "2", "--save-interval-updates", "2", "--no-epoch-checkpoints",
        "--log-format", "json", "--cpu", "--num-workers", "0", "--seed", "3",
        "--retrieval-dev", dev, "--retrieval-probe-size", "8",
        "--best-checkpoint-metric", "dev_ndcg10", "--maximize-best-checkpoint-metric",
        save_dir=save,
    )  # fmt: skip


def valid_records(log):
    return [json.loads(line.split("| valid | ", 1)[1]) for line in log.splitlines() if "| valid | " in line]


@pytest.mark.slow
def test_continued_import_logs_the_start_and_keeps_the_best_checkpoint(bert, tmp_path):
    imp, data, dev = bert
    save = tmp_path / "save"
    proc = check(train_cmd(imp, data, dev, save, 4))
    log = proc.stdout + proc.stderr
    starts = [line for line in log.splitlines() if "retrieval at update 0 (the starting model)" in line]
    assert len(starts) == 1, log[-3000:]
    plot = load_driver("examples/plot_diagnostics.py")
    start = plot.start_row(starts[0])
    assert set(start) == {"num_updates", "start", "probe_mrr10", "dev_ndcg10", "dev_mrr10", "dev_recall100"}
    records = valid_records(log)
    assert [int(r["valid_num_updates"]) for r in records] == [2, 4]
    for r in records:
        for name in ("probe_mrr10", "dev_ndcg10", "dev_mrr10", "dev_recall100"):
            now = float(r[f"valid_{name}"])
            assert float(r[f"valid_{name}_vs_start"]) == pytest.approx(now - start[name], abs=2e-4)
    best = max(float(r["valid_dev_ndcg10"]) for r in records)
    assert float(records[-1]["valid_best_dev_ndcg10"]) == best
    kept = load_torch_file(str(save / "checkpoint_best.pt"))["extra_state"]  # the allowlisted loader
    assert kept["val_loss"] == pytest.approx(best, abs=1e-4)  # the checkpoint that retrieved best
    assert plot.read_valid(_write(tmp_path / "log.txt", log))[0] == start  # the plot's point at update 0

    # the same command again, further: the run continues with the start it recorded
    resumed = check(train_cmd(imp, data, dev, save, 6))
    log2 = resumed.stdout + resumed.stderr
    recorded = starts[0].split("): ", 1)[1]
    assert f"retrieval at update 0 (the starting model, recorded in the checkpoint): {recorded}" in log2
    assert [int(r["valid_num_updates"]) for r in valid_records(log2)] == [6]


def _write(path, text):
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.slow
def test_a_missing_dev_folder_is_one_line_before_training(bert, tmp_path):
    imp, data, _ = bert
    proc = run(train_cmd(imp, data, tmp_path / "nowhere", tmp_path / "save", 2), env=OFFLINE)
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last == f"error: {tmp_path / 'nowhere'}: data folder not found (--retrieval-dev)"
    assert "Traceback" not in proc.stderr and not list((tmp_path / "save").glob("*.pt"))


@pytest.mark.slow
def test_two_workers_validate_with_the_probe_and_the_dev_set(bert, tmp_path):
    """The first worker scores, the other adds the same keys, zero: fairseq's all-reduce of the
    validation outputs gets buffers of one size (a worker without the probe's keys made gloo fail)."""
    from test_contract import _free_port

    imp, data, dev = bert
    launcher = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
    launcher += ["--master_port", str(_free_port())]
    workers = ["--distributed-world-size", "2", "--ddp-backend", "legacy_ddp"]
    proc = check(launcher + train_cmd(imp, data, dev, tmp_path / "save", 2) + workers)
    log = proc.stdout + proc.stderr
    assert log.count("retrieval at update 0 (the starting model): probe_mrr10") == 1  # the first worker's line
    (record,) = valid_records(log)
    assert float(record["valid_probe_candidates"]) == 8 and "valid_dev_ndcg10_vs_start" in record
