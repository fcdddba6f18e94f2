"""Fault injection for the file-ownership rule every tool shares (seed_fairseq/base/fileio/ownership.py).

A tool replaces or deletes exactly the files its own record lists, and nothing
through a symbolic link: a user's notes or save-dir inside ``--out`` survive
``import_from_hf.py --force``, ``export_to_hf.py --force``, ``finetune.py
--force`` and a redone comparison stage; a user's file where the new output
goes is refused with one line before anything changes; a kill half-way leaves
a folder the rerun recognises and completes; the staging debris of a killed
run is removed by the next run, and only when it is provably the tool's.
"""

import errno
import fcntl
import json
import os
import shutil
import signal
from dataclasses import replace
from pathlib import Path

import pytest
from helpers import DEMO_CORPUS, REPO, load_driver
from hf_models import save_bert
from test_retrieval import make_tiny_model

from seed_fairseq.base import fileio
from seed_fairseq.base.fileio import STAGING_MARK, OutputError, delete_listed, owned_output

FIXTURE = REPO / "tests" / "fixtures" / "seed_fairseq_0.1"
CKPT, DATA = FIXTURE / "checkpoint_1_3.pt", FIXTURE / "data-bin"
finetune_cli = load_driver("examples/retrieval/finetune.py")


def listing(folder):
    """Every path under ``folder`` with the content of its files (for 'nothing changed')."""
    folder = Path(folder)
    return {
        p.relative_to(folder).as_posix(): p.read_bytes() if p.is_file() and not p.is_symlink() else None
        for p in sorted(folder.rglob("*"))
    }


def user_files(out):
    """A user's notes and save-dir inside a tool's output folder."""
    (out / "notes.txt").write_text("my notes")
    (out / "my-run").mkdir()
    (out / "my-run" / "checkpoint_last.pt").write_bytes(b"my weights")


def assert_user_files(out):
    assert (out / "notes.txt").read_text() == "my notes"
    assert (out / "my-run" / "checkpoint_last.pt").read_bytes() == b"my weights"


def add_to_record(out, record, *rels, drop=()):
    """Make the record list more (or fewer) files, as an older output of the tool might."""
    rec = json.loads((out / record).read_text())
    rec["files"] = [f for f in rec["files"] if f not in drop] + list(rels)
    (out / record).write_text(json.dumps(rec))


def no_staging(parent):
    return [p.name for p in Path(parent).iterdir() if ".tmp-" in p.name]


# ---------------------------------------------------------------------------
# the rule itself
# ---------------------------------------------------------------------------


def test_delete_listed_never_leaves_out(tmp_path):
    out, outside = tmp_path / "out", tmp_path / "elsewhere"
    (out / "sub").mkdir(parents=True)
    outside.mkdir()
    (outside / "s.txt").write_text("not yours")
    (out / "a.txt").write_text("a")
    (out / "sub" / "b.txt").write_text("b")
    (out / "lnk").symlink_to(outside)
    (out / "file-link").symlink_to(outside / "s.txt")
    before = listing(out)
    for bad in ("lnk/s.txt", "../elsewhere/s.txt", str(outside / "s.txt"), "sub\\..\\x", ".", None):
        with pytest.raises(OutputError) as e:
            delete_listed(out, ["a.txt", "sub/b.txt", bad])  # the good entries come first
        assert e.value.path == str(out / "lnk" if bad == "lnk/s.txt" else out), e.value
        assert listing(out) == before and (outside / "s.txt").read_text() == "not yours"
    # a listed link itself goes (the link only); files go, the folders they leave empty too
    delete_listed(out, ["a.txt", "sub/b.txt", "file-link", "missing.txt"])
    assert sorted(os.listdir(out)) == ["lnk"] and (outside / "s.txt").read_text() == "not yours"


# ---------------------------------------------------------------------------
# export_to_hf.py --force (in-process, the 0.1 fixture checkpoint)
# ---------------------------------------------------------------------------


def export(out, **kw):
    from seed_fairseq.encoders.hf.export import export as run_export

    return run_export(CKPT, DATA, out, **kw)


def test_export_force_replaces_exactly_its_files(tmp_path):
    from seed_fairseq.encoders.hf.export import EXPORT_RECORD, ExportError

    out = tmp_path / "hf"
    export(out)
    user_files(out)
    (out / "stale.bin").write_bytes(b"an earlier export wrote this")
    add_to_record(out, EXPORT_RECORD, "stale.bin")
    with pytest.raises(ExportError, match="holds an earlier export; pass --force"):
        export(out)
    export(out, force=True)
    assert_user_files(out)
    assert not (out / "stale.bin").exists()
    assert json.loads((out / EXPORT_RECORD).read_text())["files"][-1] == EXPORT_RECORD
    # a file of the user's where the export writes (its record does not list it) is refused
    add_to_record(out, EXPORT_RECORD, drop=("README.md",))
    before = listing(out)
    with pytest.raises(ExportError) as e:
        export(out, force=True)
    assert str(e.value).startswith(f"{out / 'README.md'}: exists and was not written by")
    assert listing(out) == before and not no_staging(tmp_path)


def test_export_killed_half_way_is_completed_by_the_rerun(tmp_path, monkeypatch):
    from seed_fairseq.encoders.hf.export import EXPORT_RECORD

    out = tmp_path / "hf"
    export(out)
    user_files(out)
    (out / "stale.bin").write_bytes(b"old")
    add_to_record(out, EXPORT_RECORD, "stale.bin")

    def killed(*args):
        raise KeyboardInterrupt  # between the claim and the deletions

    with monkeypatch.context() as m:
        m.setattr(fileio.ownership, "delete_listed", killed)
        with pytest.raises(KeyboardInterrupt):
            export(out, force=True)
    # the folder says it is the export's, unfinished, and what it owns
    owned = owned_output(out, EXPORT_RECORD, "examples/export_to_hf.py")
    assert owned is not None and not owned.complete and "stale.bin" in owned.files
    assert not (out / EXPORT_RECORD).exists() and not no_staging(tmp_path)
    export(out, force=True)  # the same command again completes it
    assert_user_files(out)
    assert not (out / "stale.bin").exists() and not (out / fileio.claim_name(EXPORT_RECORD)).exists()
    assert owned_output(out, EXPORT_RECORD, "examples/export_to_hf.py").complete


def test_export_full_disk_is_one_line_and_changes_nothing(tmp_path, monkeypatch):
    import seed_fairseq.encoders.hf.export as export_mod

    out = tmp_path / "hf"
    export(out)
    before = listing(out)

    def full(staging, record, content):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(Path(staging) / record))

    monkeypatch.setattr(fileio.ownership, "write_output_record", full)  # what fileio.staged_dir writes with
    with pytest.raises(export_mod.ExportError) as e:
        export(out, force=True)
    assert str(e.value).startswith(f"{out / export_mod.EXPORT_RECORD}: {os.strerror(errno.ENOSPC)}")
    assert "\n" not in str(e.value)
    assert listing(out) == before and not no_staging(tmp_path)


def test_export_file_size_limit_is_one_line(tmp_path, capsys):
    """A real EFBIG, in-process: the soft file-size limit is lowered for the export only
    (CPython ignores SIGXFSZ, so the write fails instead of killing the process)."""
    import resource

    export_cli = load_driver("examples/export_to_hf.py")
    out = tmp_path / "hf"
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (40_000, hard))  # model.safetensors is ~110 kB
    try:
        code = export_cli.main(["--checkpoint", str(CKPT), "--data", str(DATA), "--out", str(out)])
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert code == 2 and len(errors) == 1 and "Traceback" not in err, err[-3000:]
    assert errors[0].startswith(f"error: {out}") and os.strerror(errno.EFBIG) in errors[0], errors[0]
    assert not out.exists() and not no_staging(tmp_path)


# ---------------------------------------------------------------------------
# import_from_hf.py --force (in-process, a tiny BERT)
# ---------------------------------------------------------------------------


def test_import_force_keeps_user_files_and_never_deletes_through_a_link(tmp_path):
    from seed_fairseq.encoders.hf.import_ import IMPORT_RECORD, HFImportError, import_model

    bert = save_bert(tmp_path / "bert")
    out = tmp_path / "imported"
    import_model(bert, out)
    user_files(out)
    with pytest.raises(HFImportError, match="holds an earlier import; pass --force"):
        import_model(bert, out)
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "s.txt").write_text("not yours")
    (out / "lnk").symlink_to(outside)
    add_to_record(out, IMPORT_RECORD, "lnk/s.txt")
    before = listing(out)
    with pytest.raises(HFImportError) as e:
        import_model(bert, out, force=True)
    assert str(e.value).startswith(f"{out / 'lnk'}: is a symbolic link"), e.value
    assert (outside / "s.txt").read_text() == "not yours" and listing(out) == before
    (out / "lnk").unlink()
    (out / "tokenizer" / "old_vocab.txt").write_text("an earlier import wrote this")
    add_to_record(out, IMPORT_RECORD, "tokenizer/old_vocab.txt", drop=("lnk/s.txt",))
    import_model(bert, out, force=True)
    assert_user_files(out)
    assert not (out / "tokenizer" / "old_vocab.txt").exists() and (out / "checkpoint.pt").is_file()
    assert not no_staging(tmp_path)


# ---------------------------------------------------------------------------
# finetune.py: a rerun needs --force; SIGTERM; staging debris
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny_model_ownership"))


def beir(root):
    d = Path(root) / "beir"
    (d / "qrels").mkdir(parents=True)
    fruits = "apple pear plum grape melon lemon".split()
    (d / "corpus.jsonl").write_text(
        "".join(json.dumps({"_id": f"d{i}", "text": f"the {w} is a sweet fruit"}) + "\n" for i, w in enumerate(fruits))
    )
    (d / "queries.jsonl").write_text(
        "".join(json.dumps({"_id": f"q{i}", "text": f"sweet {w}"}) + "\n" for i, w in enumerate(fruits))
    )
    (d / "qrels" / "train.tsv").write_text("".join(f"q{i}\td{i}\t1\n" for i in range(len(fruits))))
    return d


def finetune(tiny_model, data, out, *extra):
    args = ["--model", str(tiny_model), "--data", str(data), "--out", str(out), "--no-progress", "--device", "cpu"]
    return finetune_cli.main([*args, "--train-batch-size", "3", *extra])


def test_finetune_rerun_needs_force_and_keeps_user_files(tiny_model, tmp_path, capsys):
    data, out = beir(tmp_path), tmp_path / "ft"
    assert finetune(tiny_model, data, out) == 0
    user_files(out)
    before = listing(out)
    capsys.readouterr()
    assert finetune(tiny_model, data, out) == 2  # a plain rerun no longer replaces anything
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0] == f"error: {out}: holds an earlier output of finetune.py; pass --force " \
        "to replace its files", err  # fmt: skip
    assert listing(out) == before
    # an output of the code before records listed their files: the names it writes are its own
    rec = json.loads((out / "finetune.json").read_text())
    del rec["files"]
    (out / "finetune.json").write_text(json.dumps(rec))
    (out / "curve.jsonl").write_text("{}\n")  # an earlier run's dev curve (this one has none)
    assert finetune(tiny_model, data, out, "--force") == 0
    assert_user_files(out)
    assert (out / "curve.jsonl").exists()  # not provably the tool's: kept
    files = json.loads((out / "finetune.json").read_text())["files"]
    assert "model.safetensors" in files and "notes.txt" not in files
    # a run that now writes the curve lists it; the next one without it deletes it
    (out / "curve.jsonl").unlink()
    add_to_record(out, "finetune.json", "curve.jsonl")
    (out / "curve.jsonl").write_text("{}\n")
    assert finetune(tiny_model, data, out, "--force") == 0
    assert not (out / "curve.jsonl").exists()
    assert_user_files(out)
    assert not no_staging(tmp_path)


def test_finetune_sigterm_and_kill_leave_no_staging(tiny_model, tmp_path, monkeypatch):
    import seed_fairseq.encoders.retrieval.training as training

    data, out = beir(tmp_path), tmp_path / "deep" / "ft"
    out.parent.mkdir()
    # debris beside OUT: a killed run's (mark unlocked), a running one's (locked), the user's, another tool's
    dead, live, mine, other = (out.parent / f".ft.tmp-{n}" for n in ("dead", "live", "mine", "other"))
    for folder, tool in ((dead, "finetune.py"), (live, "finetune.py"), (mine, None), (other, "export")):
        folder.mkdir()
        (folder / "model.safetensors").write_bytes(b"x")
        if tool:
            (folder / STAGING_MARK).write_text(json.dumps({"tool": tool, "pid": 1}))
    holder = os.open(live / STAGING_MARK, os.O_RDWR)
    fcntl.flock(holder, fcntl.LOCK_EX)
    try:

        def terminated(*args, **kwargs):
            # a SIGTERM that would kill the process outright would end the test run: refuse first
            assert signal.getsignal(signal.SIGTERM) != signal.SIG_DFL, "SIGTERM would skip the cleanup"
            signal.raise_signal(signal.SIGTERM)

        monkeypatch.setattr(training, "finetune", terminated)
        with pytest.raises(SystemExit) as e:
            finetune(tiny_model, data, out)
        assert e.value.code == 128 + signal.SIGTERM
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # restored
        assert sorted(os.listdir(out.parent)) == [".ft.tmp-live", ".ft.tmp-mine", ".ft.tmp-other"]
    finally:
        os.close(holder)
    for folder in (live, mine, other):
        assert (folder / "model.safetensors").exists()


# ---------------------------------------------------------------------------
# the comparison: a redone stage deletes only what it wrote
# ---------------------------------------------------------------------------


def comparison(out, **changes):
    """The comparison's real stages and folders, with stage bodies that only write their files."""
    from seed_fairseq.workflows.compare import cli
    from seed_fairseq.workflows.compare.pipeline import Comparison

    argv = ["--out", str(out), "--corpus", str(DEMO_CORPUS), "--objectives", "seed", "--seeds", "1"]
    plan = cli.build_plan(cli.parser().parse_args(argv), argv, "test")
    plan = replace(plan, pretrain=replace(plan.pretrain, **changes.pop("pretrain", {})), **changes)
    comp = Comparison(plan)

    def write(folder, *names):
        for name in names:
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            (folder / name).write_text(str(plan.pretrain.updates))
        return {}

    comp.stage_data = lambda r: write(comp.data_bin, "dict.txt")
    comp.stage_retrieval = lambda r: write(out / "retrieval", "corpus.jsonl", f"qrels/{plan.test_split}.tsv")
    comp.stage_bm25 = lambda r: write(out / "bm25", "test.trec")
    comp.stage_flops = lambda r, seed: {}
    comp.stage_pretrain = lambda r, obj, seed: write(
        comp.pretrain_dir(obj, seed), "checkpoint_last.pt", f"checkpoint_{plan.pretrain.updates}.pt", "train.log"
    )
    comp.stage_export = lambda r, obj, seed: write(comp.hf_dir(obj, seed), "model.safetensors")
    comp.stage_eval = lambda r, obj, seed: write(comp.eval_dir(obj, seed), "cls.zeroshot.trec")
    runner = comp.runner()
    comp.check_foreign(runner)
    return comp, runner


def test_redone_compare_stage_deletes_only_what_it_wrote(tmp_path):
    out = tmp_path / "cmp"
    out.mkdir()
    comp, runner = comparison(out)
    runner.run()
    pretrain = comp.pretrain_dir("seed", 1)
    first = sorted(p.name for p in pretrain.glob("checkpoint_*.pt") if p.name != "checkpoint_last.pt")
    user_files(pretrain)
    user_files(comp.eval_dir("seed", 1))
    updates = comp.plan.pretrain.updates
    comp, runner = comparison(out, pretrain={"updates": updates + 1})
    runner.run()  # pre-training (and what reads it) is redone
    assert_user_files(pretrain)
    assert_user_files(comp.eval_dir("seed", 1))
    assert not any((pretrain / name).exists() for name in first)  # the old run's checkpoints
    assert (pretrain / "checkpoint_last.pt").read_text() == str(updates + 1)
    # something of the user's where the stage writes: one line, nothing deleted
    (pretrain / "checkpoint_best.pt").mkdir()
    before = listing(pretrain)
    comp, runner = comparison(out, pretrain={"updates": updates + 2})
    with pytest.raises(OutputError) as e:
        runner.run()
    assert e.value.path == str(pretrain / "checkpoint_best.pt")
    assert listing(pretrain) == before
    # a link on the way of a stage's files: refused, nothing deleted through it
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    (outside / "test.tsv").write_text("not yours")
    shutil.rmtree(out / "retrieval" / "qrels")
    (out / "retrieval" / "qrels").symlink_to(outside)
    comp, runner = comparison(out, retrieval_docs=comp.plan.retrieval_docs + 1)
    with pytest.raises(OutputError) as e:
        runner.run()
    assert e.value.path == str(out / "retrieval" / "qrels") and (outside / "test.tsv").read_text() == "not yours"
    # a stage folder that is itself a link is refused before any stage runs
    (out / "retrieval" / "qrels").unlink()
    shutil.rmtree(out / "bm25")
    (out / "bm25").symlink_to(outside)
    with pytest.raises(OutputError, match="is a symbolic link where the comparison keeps its bm25 folder"):
        comparison(out)


# ---------------------------------------------------------------------------
# preprocess.build --force uses the same rule
# ---------------------------------------------------------------------------


def test_preprocess_force_never_deletes_through_a_link(demo_data_bin, tmp_path, capsys):
    from preprocess.build import main

    out, outside = tmp_path / "data-bin", tmp_path / "elsewhere"
    shutil.copytree(demo_data_bin, out)
    outside.mkdir()
    (outside / "s.txt").write_text("not yours")
    (out / "lnk").symlink_to(outside)
    rec = json.loads((out / "preprocess.json").read_text())
    rec["outputs"].append("lnk/s.txt")
    (out / "preprocess.json").write_text(json.dumps(rec))
    args = ["--text", str(DEMO_CORPUS), "--out", str(out), "--vocab-size", "500", "--workers", "1", "--force"]
    assert main(args) == 2
    errors = [line for line in capsys.readouterr().err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and errors[0].startswith(f"error: {out / 'lnk'}: is a symbolic link"), errors
    assert (outside / "s.txt").read_text() == "not yours"
    assert (out / "dict.txt").is_file() and (out / "train.bin").is_file()  # nothing deleted
    assert json.loads((out / "preprocess.json").read_text()) == rec  # the record included
