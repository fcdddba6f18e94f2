"""Faults of the comparison driver (examples/compare_objectives.py, seed_fairseq.workflows.compare).

* A signal to the driver stops its children: SIGINT/SIGTERM/SIGHUP stop the
  running tool with its process group and exit 128 + the signal with one line;
  SIGKILL of the driver (uncatchable) makes the child get SIGTERM from the
  kernel.  A tree of sleeping processes stands for fairseq-train in the fast
  tests; the slow one kills the real driver during the real fairseq-train.
* Short documents: the held-out set is sized in blocks (a batch that fairseq's
  --required-batch-size-multiple keeps, and --probe-size), not in documents; a
  corpus that cannot give them is refused before the data stage or by it,
  before any training.
* --train-split/--test-split, the --init model's positions, --max-seq-length and
  --cos-lengths are checked before the first stage, with --out untouched.
"""

import fcntl
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from helpers import DEMO_CORPUS, REPO
from objectives import TINY_ENCODER

from seed_fairseq.base.derived_set import split_sentences
from seed_fairseq.workflows.compare import cli
from seed_fairseq.workflows.compare.pipeline import Comparison
from seed_fairseq.workflows.compare.plan import COMPARISON
from seed_fairseq.workflows.kit.folder import StageError
from seed_fairseq.workflows.kit.heldout import count_blocks, first_batch_blocks
from seed_fairseq.workflows.kit.interrupt import GRACE_SECONDS

TINY_ENC = " ".join(TINY_ENCODER)
TINY = [
    "--objectives", "mlm", "--vocab-size", "400", "--tokens-per-sample", "48", "--batch-size", "8",
    "--probe-size", "16", "--validate-every", "2", "--encoder-args", TINY_ENC, "--max-seq-length", "48",
    "--cos-lengths", "16,32", "--updates", "4", "--warmup", "1", "--ft-epochs", "1", "--fractions", "1",
]  # fmt: skip


# ---------------------------------------------------------------------------
# helpers: processes seen through /proc
# ---------------------------------------------------------------------------


def _stat(pid: int):
    """(state, ppid) of a live process, None when it is gone (a zombie counts as gone)."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    state, ppid = text[text.rindex(")") + 2 :].split()[:2]
    return None if state in "ZX" else (state, int(ppid))


def _children(pid: int, name: str = ""):
    out = []
    for d in Path("/proc").iterdir():
        if d.name.isdigit() and (_stat(int(d.name)) or (None, None))[1] == pid:
            try:
                cmdline = (d / "cmdline").read_bytes().decode(errors="replace")
            except OSError:
                continue
            if name in cmdline:
                out.append(int(d.name))
    return out


def _wait_for(predicate, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


def _gone_within(pids, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if all(_stat(p) is None for p in pids):
            return True
        time.sleep(0.05)
    return False


# ---------------------------------------------------------------------------
# signals: a stand-in child tree under interrupt.run_child (fast)
# ---------------------------------------------------------------------------

# The driver's machinery with a child that starts a worker of its own and sleeps: the
# interrupt module is loaded from its file (it imports nothing of the package), so the
# stand-in driver starts in a fraction of a second instead of importing fairseq.
DRIVER = """
import importlib.util, os, sys
spec = importlib.util.spec_from_file_location("interrupt", sys.argv[1])
m = importlib.util.module_from_spec(spec)
spec.loader.exec_module(m)
tree = [sys.executable, "-c", "import subprocess, sys, time; "
        "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)']); "
        "print(w.pid, flush=True); time.sleep(120)"]
with m.handle_interrupts():
    try:
        m.run_child(tree, sys.stdout, dict(os.environ))
    except m.Interrupted as e:
        print("interrupted", flush=True)
        sys.exit(e.exit_code)
"""


def _start_tree(tmp_path):
    script = tmp_path / "driver.py"
    script.write_text(DRIVER)
    interrupt_py = REPO / "seed_fairseq" / "workflows" / "kit" / "interrupt.py"
    driver = subprocess.Popen([sys.executable, script, interrupt_py], stdout=subprocess.PIPE, text=True)
    worker = int(driver.stdout.readline())  # the child is running and has started its worker
    (child,) = _children(driver.pid)
    return driver, child, worker


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_signal_stops_the_child_and_its_workers(tmp_path, sig):
    driver, child, worker = _start_tree(tmp_path)
    try:
        driver.send_signal(sig)
        out, _ = driver.communicate(timeout=15)
        assert driver.returncode == 128 + sig, out
        assert out.strip().endswith("interrupted")
        # the child and the worker in its process group are gone when the driver exits
        assert _stat(child) is None and _gone_within([worker], 1.0)
    finally:
        driver.kill()
        for pid in (child, worker):
            if _stat(pid):
                os.kill(pid, signal.SIGKILL)


def test_sigkill_of_the_driver_stops_the_child(tmp_path):
    """SIGKILL cannot be caught: the child asked the kernel for SIGTERM when its parent dies."""
    driver, child, worker = _start_tree(tmp_path)
    try:
        driver.kill()
        driver.wait(5)
        assert _gone_within([child], 5.0), "the child outlived its killed driver"
    finally:
        for pid in (child, worker):
            if _stat(pid):
                os.kill(pid, signal.SIGKILL)


# ---------------------------------------------------------------------------
# signals: the real driver during the real fairseq-train (slow)
# ---------------------------------------------------------------------------


def _compare_cmd(out):
    return [sys.executable, str(REPO / "examples" / "compare_objectives.py"), "--out", str(out),
            "--corpus", str(DEMO_CORPUS), *TINY, "--updates", "500"]  # fmt: skip


@pytest.mark.slow
def test_killed_driver_leaves_no_trainer_and_the_rerun_can_start(tmp_path):
    """SIGTERM during pre-training: fairseq-train is gone when the driver exits (soon: SIGTERM stops it,
    no SIGKILL needed) and the folder's lock is free for the rerun.  SIGKILL of the driver: the stand-in above
    (the same run_child; that fairseq-train stops on SIGTERM is what this test shows)."""
    out, log = tmp_path / "cmp", tmp_path / "driver.log"
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    with open(log, "w") as f:  # a file, not a pipe: the driver's log must not fill a pipe nobody reads yet
        driver = subprocess.Popen(_compare_cmd(out), stdout=subprocess.DEVNULL, stderr=f, env=env)
    trainer = None
    try:
        (trainer,) = _wait_for(lambda: _children(driver.pid, "fairseq-train"), 240, "fairseq-train to start")
        t0 = time.monotonic()
        driver.send_signal(signal.SIGTERM)
        driver.wait(30)
        err = log.read_text()
        assert driver.returncode == 143, err[-3000:]
        assert time.monotonic() - t0 < GRACE_SECONDS, "fairseq-train needed SIGKILL"
        assert err.strip().splitlines()[-1] == "interrupted (SIGTERM); rerun the same command to resume"
        assert _stat(trainer) is None, "fairseq-train outlived the driver"
        fd = os.open(out / ".lock", os.O_RDWR)  # the rerun gets the folder
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        finally:
            os.close(fd)
    finally:
        driver.kill()
        if trainer and _stat(trainer):
            os.kill(trainer, signal.SIGKILL)


# ---------------------------------------------------------------------------
# short documents: validation sized in blocks
# ---------------------------------------------------------------------------


def test_first_batch_blocks_is_fairseqs_rule():
    """The fewest validation blocks fairseq's batch_by_size keeps a batch of, for every batch size and multiple."""
    from fairseq.data import data_utils

    for multiple in range(1, 10):
        for batch in range(1, 20):
            kept = [
                sum(map(len, data_utils.batch_by_size(
                    np.arange(n), None, max_sentences=batch, required_batch_size_multiple=multiple,
                    num_tokens_vec=np.full(n, 10),
                )))
                for n in range(1, 30)
            ]  # fmt: skip
            assert kept.index(next(k for k in kept if k)) + 1 == first_batch_blocks(batch, multiple), (batch, multiple)


def _short_doc_corpus(path: Path, docs: int) -> Path:
    """The demo corpus as one-sentence documents (like package descriptions: one short paragraph each)."""
    sentences = [s for p in DEMO_CORPUS.read_text().splitlines() for s in split_sentences(p)]
    path.write_text("\n\n".join(sentences[:docs]) + "\n", encoding="utf-8")
    return path


def _beir(tmp_path, splits=("train", "test")) -> Path:
    """A BEIR folder with one judged query in each of ``splits``."""
    d = tmp_path / "beir"
    (d / "qrels").mkdir(parents=True)
    (d / "corpus.jsonl").write_text(json.dumps({"_id": "d1", "text": "a passage"}) + "\n")
    (d / "queries.jsonl").write_text(json.dumps({"_id": "q1", "text": "a query"}) + "\n")
    for split in splits:
        (d / "qrels" / f"{split}.tsv").write_text("q1\td1\t1\n")
    return d


def _plan(tmp_path, corpus, *flags):
    # one-sentence documents give the derived retrieval set no query: a retrieval folder is given
    argv = ["--out", str(tmp_path / "out"), "--corpus", str(corpus), "--retrieval-data", str(_beir(tmp_path))]
    return cli.build_plan(cli.parser().parse_args([*argv, *TINY, *flags]), [], "compare_objectives.py")


def _valid_batches(data_bin: Path, batch_size: int) -> int:
    """Validation batches fairseq-train would get (default --required-batch-size-multiple 8)."""
    from fairseq.data import Dictionary, TokenBlockDataset, data_utils

    d = Dictionary.load(str(data_bin / "dict.txt"))
    ds = data_utils.load_indexed_dataset(str(data_bin / "valid"), d)
    blocks = TokenBlockDataset(ds, ds.sizes, 47, pad=d.pad(), eos=d.eos(), break_mode="complete")
    n = len(blocks)
    return len(data_utils.batch_by_size(np.arange(n), None, max_sentences=batch_size, required_batch_size_multiple=8,
                                        num_tokens_vec=blocks.sizes.astype(np.int64)))  # fmt: skip


def test_short_documents_get_enough_validation_blocks(tmp_path, caplog):
    """Four one-sentence documents give a handful of blocks, no validation batch of 8 at all;
    the data stage builds again with more documents until the probe's 16 blocks are there."""
    plan = _plan(tmp_path, _short_doc_corpus(tmp_path / "short.txt", 400), "--valid-docs", "2")
    assert plan.valid_blocks == 16  # max(a batch of 8 blocks, --probe-size 16)
    plan = replace(plan, valid_docs=2)  # the planned guess too small: the data stage corrects it
    COMPARISON.claim(plan.out)
    result = Comparison(plan).runner().run(stop_after="data")["data"]
    blocks = count_blocks(plan.out / "data-bin", "valid", 48)
    assert result["valid_blocks"] == blocks >= 16 and result["valid_docs"] > 2, result
    assert _valid_batches(plan.out / "data-bin", 8) >= 1
    assert (
        json.loads((plan.out / "data-bin" / "preprocess.json").read_text())["held_out"]["valid_docs"]
        == (result["valid_docs"])
    )


def test_data_stage_refuses_a_corpus_short_of_blocks(tmp_path):
    """Planning's bound lets it through (it cannot know the vocabulary); the built data
    cannot give 40 blocks from a quarter of 40 documents: one error, before any training."""
    plan = _plan(tmp_path, _short_doc_corpus(tmp_path / "short.txt", 40), "--probe-size", "40", "--valid-docs", "2")
    COMPARISON.claim(plan.out)
    with pytest.raises(StageError, match=r"too little text for the validation: 10 held-out documents give \d+ blocks"):
        Comparison(plan).runner().run(stop_after="data")


# ---------------------------------------------------------------------------
# refused before the first stage, --out untouched
# ---------------------------------------------------------------------------


def _init_folder(tmp_path, positions_rows: int) -> Path:
    d = tmp_path / "init"
    d.mkdir()
    (d / "config.json").write_text(
        json.dumps({"model_type": "roberta", "max_position_embeddings": positions_rows, "pad_token_id": 1})
    )
    return d


@pytest.mark.parametrize(
    "case,named",
    [
        ("hopeless", "too little text for the validation"),
        ("split-name", "--train-split 'training'"),
        ("no-train-queries", "has no train query"),
        ("given-split", "train.tsv"),
        ("init-positions", "the --init model has 32 positions"),
        ("max-seq-length", "--max-seq-length 64"),
        ("cos-lengths", "--cos-lengths: every length"),
    ],
)
def test_refused_before_the_first_stage(tmp_path, capsys, case, named):
    corpus = DEMO_CORPUS
    flags = {
        "hopeless": ["--probe-size", "64", "--tokens-per-sample", "128", "--max-seq-length", "128"],
        "split-name": ["--train-split", "training"],
        "no-train-queries": [],  # one-sentence documents: no paragraph of 3 sentences gives a query
        "given-split": ["--retrieval-data", str(_beir(tmp_path, splits=("test",)))],
        "init-positions": ["--init", str(_init_folder(tmp_path, 34))],  # RoBERTa: 34 rows - pad - 1 = 32 < 48
        "max-seq-length": ["--max-seq-length", "64"],
        "cos-lengths": ["--cos-lengths", "64,128"],
    }[case]
    if case in ("hopeless", "no-train-queries"):
        corpus = _short_doc_corpus(tmp_path / "short.txt", 12 if case == "hopeless" else 200)
    out = tmp_path / "out"
    t0 = time.time()
    assert cli.main(["--out", str(out), "--corpus", str(corpus), *TINY, *flags]) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and named in errors[0], errors
    assert not out.exists() and time.time() - t0 < 60
