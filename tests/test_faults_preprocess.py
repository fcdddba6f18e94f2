"""Fault tests of preprocess.build: what the project promises users.

* bad input or an unusable --out: ONE line ``error: FILE: problem`` on stderr,
  exit code 2, no traceback;
* the tool overwrites or deletes only what its own record says it wrote:
  --out must be missing, empty, or hold its record (preprocess.json, or the
  unfinished build's .work/state.json); --force deletes exactly the files the
  record lists;
* a stage is reused when what it reads (its options, the stages before it,
  the inputs' content) is unchanged, so the error messages' advice ("fix the
  file", "--skip-bad", "lower --vocab-size") works on the same --out;
* every write is atomic and respects the umask; an interrupted command
  resumes when rerun unchanged; nothing hangs.

The CLI runs in-process (``preprocess.build.main``), on tiny inputs.
"""

import bz2
import contextlib
import fcntl
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest
from test_preprocess import BOOKS, REPO, WIKI_SAMPLE, files_of, make_text_corpus

from preprocess import build as build_mod
from preprocess.steps import save_tokenizer

SMALL = ["--vocab-size", 300, "--workers", 1, "--valid-docs", 2, "--test-docs", 2]
TINY = ["--vocab-size", 300, "--workers", 1]  # held-out sizes left to the tool


@pytest.fixture
def text_file(tmp_path):
    path = tmp_path / "corpus.txt"
    make_text_corpus(path)  # 40 documents
    return path


@pytest.fixture
def books_dir(tmp_path):
    d = tmp_path / "books"
    for name, content in BOOKS.items():
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_bytes(content.encode("utf-8"))
    return d


@pytest.fixture
def log(caplog):
    caplog.set_level("INFO", logger="preprocess")
    return caplog


def build(capsys, *args):
    """main() in-process; returns (exit code, stderr)."""
    code = build_mod.main([str(a) for a in args])
    return code, capsys.readouterr().err


def assert_one_error(code, err, path, *words):
    """Exit code 2, exactly one ``error: PATH: ...`` line, no traceback."""
    assert code == 2, err
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err
    assert errors[0].startswith(f"error: {path}: "), err
    for w in words:
        assert w in errors[0], (w, errors[0])
    assert "Traceback" not in err


def snapshot(directory):
    """Every entry below ``directory`` (hidden ones too): files with bytes and mode."""
    directory = Path(directory)
    snap = {}
    for p in sorted(directory.rglob("*")):
        rel = str(p.relative_to(directory))
        if p.is_symlink():
            snap[rel] = ("link", os.readlink(p))
        elif p.is_dir():
            snap[rel] = ("dir", stat.S_IMODE(p.stat().st_mode))
        else:
            snap[rel] = ("file", p.read_bytes(), stat.S_IMODE(p.stat().st_mode))
    return snap


def record_of(out):
    return json.loads((Path(out) / "preprocess.json").read_text(encoding="utf-8"))


def ran(log, stage):
    return f"stage {stage}: running" in log.text


def reused(log, stage):
    return f"stage {stage}: already done, skipping" in log.text


def touch_later(path, seconds=100):
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + seconds * 10**9))


# ---- 1. user files in --out are never written or deleted --------------------------------------


def user_folder(out):
    """A folder of the user's that happens to hold names the tool writes."""
    out.mkdir()
    (out / "train.bin").write_bytes(b"the user's own train.bin")
    (out / "notes.txt").write_text("mine")
    (out / "shard0").mkdir()
    (out / "shard0" / "valid.idx").write_bytes(b"mine too")
    (out / "shard7").mkdir()
    (out / "shard7" / "data").write_bytes(b"\x00\x01")
    return snapshot(out)


@pytest.mark.parametrize("force", [[], ["--force"]])
def test_user_folder_is_refused_and_untouched(tmp_path, text_file, capsys, force):
    out = tmp_path / "out"
    before = user_folder(out)
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL, *force)
    assert_one_error(code, err, out, "not empty", "was not written by preprocess.build")
    assert snapshot(out) == before  # no .work, no train.bin replaced, no shard folder deleted


@pytest.mark.parametrize("content", [b'{"format": "somebody else/1", "splits": {}}', b"not json"])
def test_foreign_preprocess_json_is_not_a_record(tmp_path, text_file, capsys, content):
    out = tmp_path / "out"
    before = user_folder(out)
    (out / "preprocess.json").write_bytes(content)
    before = snapshot(out)
    for force in ([], ["--force"]):
        code, err = build(capsys, "--text", text_file, "--out", out, *SMALL, *force)
        assert_one_error(code, err, out / "preprocess.json", "not a build record of preprocess.build")
        assert snapshot(out) == before


def test_foreign_work_folder_is_not_a_build(tmp_path, text_file, capsys):
    out = tmp_path / "out"
    (out / ".work").mkdir(parents=True)
    (out / ".work" / "notes.txt").write_text("a .work folder of the user's")
    (out / "train.bin").write_bytes(b"mine")
    before = snapshot(out)
    for force in ([], ["--force"]):
        code, err = build(capsys, "--text", text_file, "--out", out, *SMALL, *force)
        assert_one_error(code, err, out, "not empty")
        assert snapshot(out) == before


def test_force_deletes_only_the_files_the_record_lists(tmp_path, text_file, capsys):
    out = tmp_path / "out"
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL, "--shards", 2)
    assert code == 0, err
    ours = set(files_of(out))
    assert set(record_of(out)["outputs"]) == ours  # the record lists every file it wrote
    # The user adds files beside the build, some in its shard folders.
    (out / "notes.txt").write_text("mine")
    (out / "shard0" / "mine.txt").write_text("mine")
    (out / "shard9").mkdir()
    (out / "shard9" / "train.bin").write_bytes(b"an unrelated shard of the user's")
    user = {
        k: v for k, v in snapshot(out).items() if k in ("notes.txt", "shard0/mine.txt", "shard9", "shard9/train.bin")
    }
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL, "--shards", 2, "--seed", 2, "--force")
    assert code == 0, err
    after = snapshot(out)
    assert all(after[k] == v for k, v in user.items())
    assert record_of(out)["seed"] == 2 and set(record_of(out)["outputs"]) == ours
    # Back to one shard: shard1 (only ever the tool's) goes, shard0 keeps the user's file.
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL, "--force")
    assert code == 0, err
    assert not (out / "shard1").exists() and not (out / "shard0" / "train.bin").exists()
    assert sorted(p.name for p in (out / "shard0").iterdir()) == ["mine.txt"]
    assert (out / "shard9" / "train.bin").read_bytes() == b"an unrelated shard of the user's"
    assert set(files_of(out)) == set(record_of(out)["outputs"]) | {"notes.txt", "shard0/mine.txt", "shard9/train.bin"}


def legacy_record(out, text_file, **options):
    """Turn OUT's record into one the code before fingerprints wrote: no
    ``outputs`` list, inputs identified by path + size + mtime in ``config``."""
    record = record_of(out)
    for key in ("outputs", "fingerprint", "stage_fingerprints", "input_files", "work_kept", "held_out", "tool"):
        del record[key]
    del record["fairseq_dictionary"]["sha256"]
    for source in record["sources"]:
        del source["sha256"]
    st = Path(text_file).stat()
    config = {
        "lowercase": True,
        "nfkc": True,
        "vocab_size": 300,
        "byte_fallback": True,
        "character_coverage": 0.9995,
        "spm_sample_sentences": 1_000_000,
        "valid_docs": 2,
        "test_docs": 2,
        "shards": 1,
        "seed": 1,
        "skip_bad": False,
        "line_unit": "sentence",
        "max_line_pieces": 510,
    }
    config.update(options)
    config["sources"] = [
        {"kind": "text", "path": str(Path(text_file).resolve()), "bytes": st.st_size, "mtime_ns": st.st_mtime_ns}
    ]
    record["config"] = config
    (out / "preprocess.json").write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")


def test_force_with_a_record_of_the_previous_code(tmp_path, text_file, capsys, log):
    """Records without an ``outputs`` list: the list comes from their splits and shards."""
    out = tmp_path / "out"
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL, "--shards", 2)
    assert code == 0, err
    ours = set(files_of(out))
    legacy_record(out, text_file, shards=2)
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL, "--shards", 2)
    assert code == 0 and "nothing to do" in log.text  # the same command is the same build
    (out / "shard3").mkdir()
    (out / "shard3" / "train.bin").write_bytes(b"mine")
    (out / "shard1" / "notes.txt").write_text("mine")
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL, "--force")
    assert code == 0, err
    assert (out / "shard3" / "train.bin").read_bytes() == b"mine"
    assert sorted(p.name for p in (out / "shard1").iterdir()) == ["notes.txt"]
    assert not (out / "shard0").exists()  # every file of it was listed
    assert set(files_of(out)) == set(record_of(out)["outputs"]) | {"shard3/train.bin", "shard1/notes.txt"}
    assert ours != set(files_of(out))


def test_users_work_folder_in_a_finished_build_is_not_taken(tmp_path, text_file, capsys, log):
    """--force would write its state into .work and delete the folder when done."""
    out = tmp_path / "out"
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL)
    assert code == 0, err
    (out / ".work").mkdir()
    (out / ".work" / "notes.txt").write_text("mine")
    before = snapshot(out)
    log.clear()
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL)
    assert code == 0 and "nothing to do" in log.text and snapshot(out) == before
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL, "--seed", 2, "--force")
    assert_one_error(code, err, out / ".work", "was not written by preprocess.build")
    assert snapshot(out) == before


def test_unfinished_build_of_the_previous_code_resumes(tmp_path, text_file, capsys, log):
    """.work/config.json and markers without fingerprints (the code before
    state.json): the tool's own, its stages are redone, what its finalize may
    have put in OUT is replaced."""
    expected = clean_build(tmp_path, capsys, "--text", text_file, *SMALL)
    out = tmp_path / "out"
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL, "--stop-after", "vocab")
    assert code == 0, err
    work = out / ".work"
    (work / "state.json").unlink()
    for started in work.glob("*.started"):
        started.unlink()
    for done in work.glob("*.done"):
        done.write_text(json.dumps(json.loads(done.read_text())["result"]))
    (work / "config.json").write_text(
        json.dumps({"sources": [], "vocab_size": 300, "shards": 1, "valid_docs": 2, "test_docs": 2})
    )
    (out / "train.bin").write_bytes(b"moved here by the old code's interrupted finalize")
    log.clear()
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL)
    assert code == 0, err
    assert ran(log, "extract") and "already done" not in log.text
    assert files_of(out) == expected


def test_user_file_put_into_an_unfinished_build_is_not_overwritten(tmp_path, text_file, capsys, log):
    out = tmp_path / "out"
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL, "--stop-after", "vocab")
    assert code == 0, err
    (out / "train.bin").write_bytes(b"the user's")
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL)
    assert_one_error(code, err, out / "train.bin", "was not written by preprocess.build")
    assert (out / "train.bin").read_bytes() == b"the user's"
    (out / "train.bin").rename(tmp_path / "moved-away.bin")
    log.clear()
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL)
    assert code == 0, err
    assert reused(log, "vocab") and ran(log, "encode")


def test_finalize_checks_again_for_user_files(tmp_path, text_file, capsys, monkeypatch):
    """A file the user puts in OUT while the build runs is not replaced either."""
    out = tmp_path / "out"
    real = build_mod.Build.stage_binarize

    def binarize_then_user_writes(self, results):
        counts = real(self, results)
        (out / "valid.idx").write_bytes(b"the user's")
        return counts

    monkeypatch.setattr(build_mod.Build, "stage_binarize", binarize_then_user_writes)
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL)
    assert_one_error(code, err, out / "valid.idx", "was not written by preprocess.build")
    assert (out / "valid.idx").read_bytes() == b"the user's"
    assert not (out / "train.bin").exists() and not (out / "preprocess.json").exists()


@pytest.mark.parametrize("debris", [None, ".state.json.tmp-x1y2z3"])
def test_kill_right_after_the_work_folder_was_made_resumes(tmp_path, text_file, capsys, debris):
    """An empty .work (or one holding a half-written state file) is what a kill
    between creating the folder and writing the state leaves: still the tool's."""
    out = tmp_path / "out"
    (out / ".work").mkdir(parents=True)
    if debris:
        (out / ".work" / debris).write_text('{"form')
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL)
    assert code == 0, err
    assert not (out / ".work").exists()


# ---- interrupted commands resume; every write is atomic ------------------------------------------


def clean_build(tmp_path, capsys, *args):
    clean = tmp_path / "clean"
    code, err = build(capsys, *args, "--out", clean)
    assert code == 0, err
    return files_of(clean)


def no_temporaries(out):
    names = [p.name for p in Path(out).rglob("*")]
    return not any(".tmp" in n for n in names)


def test_interrupted_vocab_resumes(tmp_path, text_file, capsys, log, monkeypatch):
    expected = clean_build(tmp_path, capsys, "--text", text_file, *SMALL)
    out = tmp_path / "out"

    def killed(*a, **k):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr("preprocess.vocab.write_fairseq_dict", killed)
        code, err = build(capsys, "--text", text_file, "--out", out, *SMALL)
    assert code == 130 and "rerun the same command to resume" in err
    vocab = out / ".work" / "vocab"
    assert not (vocab / "spm.model").exists() and not (vocab / "dict.txt").exists()
    assert not (out / ".work" / "vocab.done").exists() and no_temporaries(out)
    log.clear()
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL)
    assert code == 0, err
    assert reused(log, "split") and ran(log, "vocab")
    assert files_of(out) == expected


def test_interrupted_finalize_resumes(tmp_path, text_file, capsys, log, monkeypatch):
    expected = clean_build(tmp_path, capsys, "--text", text_file, *SMALL, "--shards", 2)
    out = tmp_path / "out"

    def killed(*a, **k):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr("preprocess.record.build_record", killed)  # after the data moved into OUT
        code, err = build(capsys, "--text", text_file, "--out", out, *SMALL, "--shards", 2)
    assert code == 130
    assert (out / "shard1" / "train.bin").exists() and not (out / "preprocess.json").exists()
    assert no_temporaries(out)  # everything is renamed into OUT: no temporary is left there
    log.clear()
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL, "--shards", 2)
    assert code == 0, err
    assert reused(log, "binarize") and ran(log, "finalize")
    assert files_of(out) == expected


def test_interrupted_finalize_then_fewer_splits_leaves_no_stale_file(tmp_path, text_file, capsys, monkeypatch):
    """valid.bin moved into OUT by an interrupted finalize is the tool's: a rerun
    without a valid split deletes it instead of leaving it unlisted."""
    out = tmp_path / "out"

    def killed(*a, **k):
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr("preprocess.record.build_record", killed)
        code, err = build(capsys, "--text", text_file, "--out", out, *SMALL)
    assert code == 130 and (out / "valid.bin").exists()
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL[:-4], "--valid-docs", 0, "--test-docs", 2)
    assert code == 0, err
    assert not (out / "valid.bin").exists() and not (out / "valid.idx").exists()
    assert set(files_of(out)) == set(record_of(out)["outputs"])


def test_interrupted_force_resumes_and_keeps_user_files(tmp_path, text_file, capsys, monkeypatch):
    out = tmp_path / "out"
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL, "--shards", 2)
    assert code == 0, err
    (out / "notes.txt").write_text("mine")
    from preprocess import record as record_mod

    real = record_mod.delete_outputs

    def killed_half_way(out_dir, rels):
        rels = list(rels)
        real(out_dir, rels[: len(rels) // 2])
        raise KeyboardInterrupt

    with monkeypatch.context() as m:
        m.setattr(record_mod, "delete_outputs", killed_half_way)
        code, err = build(capsys, "--text", text_file, "--out", out, *SMALL, "--seed", 3, "--force")
    assert code == 130
    # Not a finished build any more, but still the tool's: the rerun goes on without --force.
    assert not (out / "preprocess.json").exists()
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL, "--seed", 3)
    assert code == 0, err
    assert (out / "notes.txt").read_text() == "mine" and record_of(out)["seed"] == 3
    assert set(files_of(out)) == set(record_of(out)["outputs"]) | {"notes.txt"}


# ---- 2. stages are reused when what they read is unchanged ----------------------------------------


def bad_books(tmp_path):
    bad = tmp_path / "badbooks" / "bad.txt"
    bad.parent.mkdir()
    bad.write_bytes(b"a fine first line\nlatin-1 \xe9t\xe9 line\na fine last line\n")
    return bad


def test_fixing_the_bad_file_resumes_on_the_same_out(tmp_path, text_file, capsys):
    bad = bad_books(tmp_path)
    out = tmp_path / "out"
    args = ["--books", bad.parent, "--text", text_file, "--out", out, *SMALL]
    code, err = build(capsys, *args)
    assert_one_error(code, err, bad, "not valid UTF-8", "fix the file or pass --skip-bad")
    bad.write_bytes(b"a fine first line\nlatin-1 \xc3\xa9t\xc3\xa9 line\na fine last line\n")
    code, err = build(capsys, *args)  # no --force: the advice works as given
    assert code == 0, err
    assert record_of(out)["documents"]["documents"] == 41


def test_skip_bad_advice_works_on_the_same_out(tmp_path, text_file, capsys):
    bad = bad_books(tmp_path)
    out = tmp_path / "out"
    args = ["--books", bad.parent, "--text", text_file, "--out", out, *SMALL]
    code, err = build(capsys, *args)
    assert_one_error(code, err, bad, "--skip-bad")
    code, err = build(capsys, *args, "--skip-bad")
    assert code == 0, err
    assert record_of(out)["sources"][0]["stats"]["bad_lines_skipped"] == 1


@pytest.mark.parametrize(
    "failing,fixed,first_redone",
    [
        (
            ["--vocab-size", 50000, "--valid-docs", 2, "--test-docs", 2],
            ["--vocab-size", 300, "--valid-docs", 2, "--test-docs", 2],
            "vocab",
        ),
        (
            ["--vocab-size", 300, "--valid-docs", 30, "--test-docs", 10],
            ["--vocab-size", 300, "--valid-docs", 3, "--test-docs", 3],
            "split",
        ),
    ],
)
def test_late_failure_then_other_option_reuses_the_extraction(
    tmp_path, text_file, capsys, log, failing, fixed, first_redone
):
    out = tmp_path / "out"
    code, err = build(capsys, "--text", text_file, "--out", out, "--workers", 1, *failing)
    assert code == 2 and "Traceback" not in err
    marker = out / ".work" / "extract.done"
    extract_marker = (marker.read_bytes(), marker.stat().st_mtime_ns)
    log.clear()
    code, err = build(capsys, "--text", text_file, "--out", out, "--workers", 1, *fixed, "--keep-work")
    assert code == 0, err  # no --force needed, and the extraction was not redone
    assert reused(log, "extract") and not ran(log, "extract") and ran(log, first_redone)
    assert (marker.read_bytes(), marker.stat().st_mtime_ns) == extract_marker
    expected = clean_build(tmp_path, capsys, "--text", text_file, "--workers", 1, *fixed, "--keep-work")

    def data(files):
        return {k: v for k, v in files.items() if not k.startswith(".work")}

    assert data(files_of(out)) == data(expected)


def test_stage_redone_with_other_options_reuses_none_of_its_old_files(tmp_path, text_file, capsys, log):
    """encode keeps the splits it finished for a restart with the same options;
    with another --max-line-pieces none of them may be taken."""
    expected = clean_build(tmp_path, capsys, "--text", text_file, *SMALL, "--max-line-pieces", 5)
    out = tmp_path / "out"
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL, "--stop-after", "encode")
    assert code == 0, err
    log.clear()
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL, "--max-line-pieces", 5)
    assert code == 0, err
    assert reused(log, "vocab") and ran(log, "encode") and "reusing" not in log.text
    assert record_of(out)["lines"]["lines_cut"] > 0
    assert files_of(out) == expected


def test_touched_inputs_of_a_finished_build_are_nothing_to_do(tmp_path, text_file, books_dir, capsys, log):
    out = tmp_path / "out"
    args = ["--books", books_dir, "--text", text_file, "--out", out, *SMALL, "--vocab-size", 400]
    code, err = build(capsys, *args)
    assert code == 0, err
    before = snapshot(out)
    touch_later(text_file)
    touch_later(books_dir / "sub" / "b3.txt")
    log.clear()
    code, err = build(capsys, *args)
    assert code == 0, err
    assert "nothing to do" in log.text and snapshot(out) == before


def test_touched_input_of_an_unfinished_build_reuses_its_stages(tmp_path, text_file, capsys, log):
    out = tmp_path / "out"
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL, "--stop-after", "vocab")
    assert code == 0, err
    touch_later(text_file)
    log.clear()
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL)
    assert code == 0, err
    assert all(reused(log, s) for s in ("extract", "split", "vocab")) and ran(log, "encode")


def test_renamed_input_is_the_same_input(tmp_path, text_file, capsys, log):
    """Inputs are identified by their content, not by their path."""
    out = tmp_path / "out"
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL)
    assert code == 0, err
    moved = text_file.rename(tmp_path / "renamed.txt")
    log.clear()
    code, err = build(capsys, "--text", moved, "--out", out, *SMALL)
    assert code == 0 and "nothing to do" in log.text


def test_changed_input_content(tmp_path, text_file, capsys, log):
    out = tmp_path / "out"
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL)
    assert code == 0, err
    before = snapshot(out)
    with open(text_file, "a", encoding="utf-8") as f:
        f.write("\nA new document.\n")
    # A finished build may be in use: other content is refused without --force ...
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL)
    assert_one_error(code, err, out / "preprocess.json", "other inputs or options", "--force")
    assert snapshot(out) == before
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL, "--force")
    assert code == 0 and record_of(out)["documents"]["documents"] == 41
    # ... an unfinished one is not: the extraction is simply redone.
    out2 = tmp_path / "out2"
    code, err = build(capsys, "--text", text_file, "--out", out2, *SMALL, "--stop-after", "split")
    with open(text_file, "a", encoding="utf-8") as f:
        f.write("\nAnother new document.\n")
    log.clear()
    code, err = build(capsys, "--text", text_file, "--out", out2, *SMALL)
    assert code == 0 and ran(log, "extract") and record_of(out2)["documents"]["documents"] == 42


def test_input_changed_while_being_read(tmp_path, text_file, capsys, monkeypatch):
    out = tmp_path / "out"
    from preprocess import extract as extract_mod

    real = extract_mod.extract

    def extract_while_user_edits(*a, **k):
        totals = real(*a, **k)
        touch_later(text_file)
        return totals

    monkeypatch.setattr(extract_mod, "extract", extract_while_user_edits)
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL)
    assert_one_error(code, err, text_file.resolve(), "changed while it was being read")
    assert not (out / ".work" / "extract.done").exists()


# ---- 3. --out that cannot be a folder; inputs that cannot be read ----------------------------------


def test_out_is_a_file(tmp_path, text_file, capsys):
    out = tmp_path / "data-bin"
    out.write_bytes(b"a file of the user's")
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL)
    assert_one_error(code, err, out, "exists and is not a folder")
    assert out.read_bytes() == b"a file of the user's"


def test_out_inside_a_file(tmp_path, text_file, capsys):
    parent = tmp_path / "a-file"
    parent.write_bytes(b"x")
    out = parent / "data-bin"
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL)
    assert_one_error(code, err, out, "cannot create the folder")
    assert parent.read_bytes() == b"x"


def test_out_is_a_broken_symlink(tmp_path, text_file, capsys):
    out = tmp_path / "link"
    out.symlink_to(tmp_path / "nowhere")
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL)
    assert_one_error(code, err, out, "broken symbolic link")
    assert not (tmp_path / "nowhere").exists()


def test_shard_folder_in_the_way_is_a_file(tmp_path, text_file, capsys):
    out = tmp_path / "out"
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL, "--stop-after", "split")
    assert code == 0, err
    (out / "shard1").write_bytes(b"the user's")
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL, "--shards", 2)
    assert_one_error(code, err, out / "shard1", "in the way")
    assert (out / "shard1").read_bytes() == b"the user's"


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
def test_out_in_a_read_only_folder(tmp_path, text_file, capsys):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o555)
    try:
        code, err = build(capsys, "--text", text_file, "--out", parent / "out", *SMALL)
        assert_one_error(code, err, parent / "out", "cannot create the folder")
    finally:
        parent.chmod(0o755)


@pytest.mark.skipif(os.geteuid() == 0, reason="root ignores file permissions")
def test_unreadable_input(tmp_path, text_file, capsys):
    text_file.chmod(0)
    try:
        code, err = build(capsys, "--text", text_file, "--out", tmp_path / "out", *SMALL)
        assert_one_error(code, err, text_file, "cannot read")
    finally:
        text_file.chmod(0o644)


def test_fifo_inputs_do_not_hang(tmp_path, text_file):
    """A named pipe is not read (open() would wait for a writer forever)."""
    fifo = tmp_path / "pipe.txt"
    os.mkfifo(fifo)
    books = tmp_path / "books"
    books.mkdir()
    os.mkfifo(books / "pipe.txt")
    (books / "real.txt").write_text("One real book.\n")
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    cmd = [sys.executable, "-m", "preprocess.build", *map(str, SMALL), "--stop-after", "extract"]
    proc = subprocess.run(
        cmd + ["--text", str(fifo), "--out", str(tmp_path / "out1")],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert_one_error(proc.returncode, proc.stderr, fifo, "not a regular file")
    # A pipe named like a book is not a book (the real one is read).
    proc = subprocess.run(
        cmd + ["--books", str(books), "--text", str(text_file), "--out", str(tmp_path / "out2")],
        cwd=REPO,
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]


def test_second_build_in_the_same_out_is_refused_at_once(tmp_path, text_file, capsys):
    out = tmp_path / "out"
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL, "--stop-after", "extract")
    assert code == 0, err
    fd = os.open(out, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # as a running build holds it
        code, err = build(capsys, "--text", text_file, "--out", out, *SMALL)
        assert_one_error(code, err, out, "another preprocess.build is writing this folder")
    finally:
        os.close(fd)
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL)
    assert code == 0, err


# ---- 4. held-out sizes adapt to small corpora when not given ---------------------------------------


def test_default_held_out_sizes_adapt(tmp_path, text_file, capsys, log):
    out = tmp_path / "out"
    code, err = build(capsys, "--text", text_file, "--out", out, *TINY)
    assert code == 0, err
    record = record_of(out)
    assert record["held_out"] == {
        "valid_docs": 2,
        "test_docs": 2,
        "chosen": {"valid_docs": "auto", "test_docs": "auto"},
    }
    assert record["splits"]["valid"]["documents"] == 2 and record["splits"]["train0"]["documents"] == 36
    assert "held out 2 valid and 2 test documents of 40" in log.text


def tiny_corpus(path, docs):
    path.write_text("\n\n".join(f"Document number {i} has some words in it." for i in range(docs)) + "\n")
    return path


@pytest.mark.parametrize(
    "docs,shards,given,expected",
    [
        (1, 1, [], {"train0": 1}),
        (2, 1, [], {"valid": 1, "train0": 1}),
        (3, 1, [], {"valid": 1, "test": 1, "train0": 1}),
        (3, 2, [], {"valid": 1, "train0": 1, "train1": 1}),
        (40, 1, ["--valid-docs", 10], {"valid": 10, "test": 2, "train0": 28}),
        (40, 1, ["--test-docs", 0], {"valid": 2, "train0": 38}),
        (3, 1, ["--valid-docs", 2], {"valid": 2, "train0": 1}),
    ],
)
def test_held_out_sizes_for_small_corpora(tmp_path, capsys, docs, shards, given, expected):
    corpus = tiny_corpus(tmp_path / "tiny.txt", docs)
    out = tmp_path / "out"
    code, err = build(
        capsys, "--text", corpus, "--out", out, *TINY, "--shards", shards, *given, "--stop-after", "split"
    )
    assert code == 0, err
    done = json.loads((out / ".work" / "split.done").read_text())["result"]
    assert {k: v["documents"] for k, v in done["splits"].items()} == expected


def test_given_held_out_sizes_stay_strict(tmp_path, capsys):
    corpus = tiny_corpus(tmp_path / "tiny.txt", 3)
    code, err = build(capsys, "--text", corpus, "--out", tmp_path / "out", *TINY, "--valid-docs", 2, "--test-docs", 1)
    assert_one_error(code, err, corpus, "only 3 documents", "--valid-docs 2 + --test-docs 1")
    code, err = build(capsys, "--text", corpus, "--out", tmp_path / "out2", *TINY, "--valid-docs", 3)
    assert_one_error(code, err, corpus, "only 3 documents")


@pytest.mark.skipif(not WIKI_SAMPLE.exists(), reason="real dump not present")
def test_real_small_dump_with_default_held_out_sizes(tmp_path, capsys, log):
    """The follow-up report: no flags at all on the 206-page (106-article) sample."""
    out = tmp_path / "out"
    code, err = build(capsys, "--wiki", WIKI_SAMPLE, "--out", out, "--workers", 2, "--stop-after", "split")
    assert code == 0, err
    done = json.loads((out / ".work" / "split.done").read_text())["result"]
    n = sum(s["documents"] for s in done["splits"].values())
    assert done["valid_docs"] == done["test_docs"] == n * 5 // 100 >= 1
    assert "held out" in log.text


# ---- 5. the dictionary's identity; 6. permissions -------------------------------------------------


def test_record_carries_the_dictionary_sha256(tmp_path, text_file, capsys):
    from seed_fairseq.base.vocabulary.dictionary import dictionary_sha256

    out = tmp_path / "out"
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL, "--shards", 2)
    assert code == 0, err
    sha = record_of(out)["fairseq_dictionary"]["sha256"]
    assert sha == dictionary_sha256(out / "dict.txt") == dictionary_sha256(out / "shard1" / "dict.txt")
    assert len(sha) == 64


@pytest.mark.parametrize("umask", [0o027, 0o002])
def test_everything_written_respects_the_umask(tmp_path, text_file, capsys, umask):
    """Temporaries come from tempfile (0600 files, 0700 folders); what they become must not."""
    out = tmp_path / "out"
    old = os.umask(umask)
    try:
        code, err = build(capsys, "--text", text_file, "--out", out, *SMALL, "--shards", 2, "--keep-work")
        assert code == 0, err
    finally:
        os.umask(old)
    entries = [out, *out.rglob("*")]  # the data, the shard folders, and the kept .work
    assert len(entries) > 30 and (out / ".work" / "bpe").is_dir()
    for p in entries:
        want = (0o777 if p.is_dir() else 0o666) & ~umask
        assert stat.S_IMODE(p.stat().st_mode) == want, (p, oct(p.stat().st_mode))


def test_bz2_dump_input_identity_is_its_bytes(tmp_path, capsys, log):
    """A --wiki dump is identified by its (compressed) bytes like any input."""
    from test_preprocess import SYNTH_PAGES, mediawiki_xml

    dump = tmp_path / "wiki.xml.bz2"
    dump.write_bytes(bz2.compress(mediawiki_xml(SYNTH_PAGES)))
    out = tmp_path / "out"
    args = ["--wiki", dump, "--out", out, "--vocab-size", 300, "--workers", 1]
    code, err = build(capsys, *args)
    assert code == 0, err
    assert record_of(out)["held_out"]["valid_docs"] == 1  # 5 articles: one each
    touch_later(dump)
    log.clear()
    code, err = build(capsys, *args)
    assert code == 0 and "nothing to do" in log.text


# ==== issue 21: outputs are never inputs (defect 8); full disk, file-size limit (defect 10) =========
#
# Defect 8: an --out inside a --books folder was read back as books (its dict.txt and .work
# files): the identical rerun was refused and the advised --force deleted the build, then failed.
# Defect 10: ENOSPC / EFBIG gave tracebacks (writes raise them without a file name).


def test_out_inside_books_is_left_out_of_the_books(tmp_path, text_file, books_dir, capsys, log):
    """At any depth, finished or not, this build's or another's: a build folder is not books."""
    out = books_dir / "deep" / "er" / "data-bin"
    inputs = ["--books", books_dir, "--text", text_file]
    args = [*inputs, "--out", out, "--vocab-size", 400, "--workers", 1]
    code, err = build(capsys, *args, "--keep-work")  # .work keeps .txt files in OUT
    assert code == 0, err
    first = files_of(out)
    assert record_of(out)["sources"][0]["stats"]["files"] == len(BOOKS)
    log.clear()
    code, err = build(capsys, *args, "--keep-work")
    assert code == 0 and "nothing to do" in log.text, err
    assert f"skipping {out}" in log.text
    code, err = build(capsys, *args, "--keep-work", "--force")  # deleted, then rebuilt: the same build
    assert code == 0, err
    assert files_of(out) == first
    # a second build beside it leaves both builds out, and the first stays "nothing to do"
    other = books_dir / "other"
    code, err = build(capsys, *inputs, "--out", other, "--vocab-size", 500, "--workers", 1)
    assert code == 0, err
    assert record_of(other)["sources"][0]["sha256"] == record_of(out)["sources"][0]["sha256"]
    log.clear()
    code, err = build(capsys, *args, "--keep-work")
    assert code == 0 and "nothing to do" in log.text, err


def test_books_listing_leaves_out_every_build_folder(tmp_path):
    from preprocess.inputs import book_files
    from preprocess.record import RECORD_FORMAT, STATE_FORMAT

    books = tmp_path / "books"
    for rel in ("a.txt", "kept/b.txt", "kept/.work/c.txt", "done/dict.txt", "done/sub/d.txt", "busy/.work/x.txt"):
        (books / rel).parent.mkdir(parents=True, exist_ok=True)
        (books / rel).write_text("a book\n")
    (books / "done" / "preprocess.json").write_text(json.dumps({"format": RECORD_FORMAT}))
    (books / "busy" / ".work" / "state.json").write_text(json.dumps({"format": STATE_FORMAT}))
    (books / "empty" / ".work").mkdir(parents=True)  # an empty .work is nobody's build
    (books / "empty" / "e.txt").write_text("a book\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "f.txt").write_text("a book\n")
    (books / "link-to-book.txt").symlink_to(elsewhere / "f.txt")
    (books / "link-into-build.txt").symlink_to(books / "done" / "dict.txt")
    skipped = set()
    listed = [p.relative_to(books).as_posix() for p in book_files(books, skipped)]
    assert listed == ["a.txt", "empty/e.txt", "kept/.work/c.txt", "kept/b.txt", "link-to-book.txt"]
    assert skipped == {books / "done", books / "busy", books / "link-into-build.txt"}
    with pytest.raises(build_mod.PreprocessError, match="holds a build of preprocess.build"):
        book_files(books / "done")


@pytest.fixture
def kept_build(tmp_path, text_file, capsys):
    out = tmp_path / "out"
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL, "--keep-work")
    assert code == 0, err
    return out


def test_input_inside_out_is_refused_before_anything_is_written(tmp_path, text_file, kept_build, capsys):
    out = kept_build
    link_out = tmp_path / "link-to-out"
    link_out.symlink_to(out)
    link_in = tmp_path / "link.txt"
    link_in.symlink_to(out / "dict.txt")
    before = snapshot(tmp_path)
    cases = [  # (the input, which the error names; --out; a word of the error)
        (["--text", out / ".work" / "extract" / "corpus.txt"], out, None),
        (["--text", out / "spm.vocab"], out, None),
        (["--text", link_in], out, None),  # a link into OUT
        (["--text", out / "spm.vocab"], link_out, None),  # OUT through a link
        (["--wiki", out / ".work" / "split" / "train0.txt"], out, None),
        (["--books", out], out, "itself"),
        (["--books", out / ".work"], out, None),
        (["--books", link_out], out, "itself"),
        (["--text", text_file], text_file, "itself"),  # --out is the input
        (["--text", text_file], tmp_path, None),  # --out holds the input
    ]
    for inputs, target, word in cases:
        for force in ([], ["--force"]):
            code, err = build(capsys, *inputs, "--out", target, *SMALL, *force)
            assert_one_error(code, err, inputs[1], "--out", word or "inside", "never read from there")
            assert snapshot(tmp_path) == before


def test_out_path_fairseq_cannot_read_is_refused(tmp_path, text_file, capsys):
    for out, words in (
        (tmp_path / "a:b" / "data-bin", ("contains ':'", "list of data folders")),
        (text_file / "sub" / "data-bin", ("cannot create the folder", f"{text_file} is not a folder")),
    ):
        code, err = build(capsys, "--text", text_file, "--out", out, *SMALL)
        assert_one_error(code, err, out, *words)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus.txt"]


# ---- full disk, file-size limit ------------------------------------------------------------------


@contextlib.contextmanager
def file_size_limit(n):
    """RLIMIT_FSIZE in this process (and the workers it forks): writes past ``n`` bytes
    fail with EFBIG (Python ignores SIGXFSZ), as under a ulimit -f that small."""
    import resource
    import signal

    assert signal.getsignal(signal.SIGXFSZ) == signal.SIG_IGN
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (n, old[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)


def assert_nothing_partial(out, expected):
    """No temporary anywhere; every file in OUT (not .work) is complete: the clean build's bytes."""
    assert no_temporaries(out)
    for rel, data in files_of(out).items():
        if not rel.startswith(".work/"):
            assert data == expected[rel], rel


TWO_WORKERS = ["--vocab-size", 300, "--workers", 2, "--valid-docs", 2, "--test-docs", 2]
# stage -> (file-size limit that makes its first big write fail, what the error names, relative to OUT)
STAGE_LIMITS = {
    "extract": (1500, ".work/extract/corpus.txt"),
    "split": (1500, ".work/split"),  # several files written at once: their folder
    "vocab": (1500, ".work/vocab/spm_sample.txt"),
    "encode": (1500, ".work/bpe/train0.bpe"),  # valid and test fit: kept for the rerun
    "binarize": (1500, ".work/bin/train0.tmp.bin"),  # removed: no partial .bin is left
    "finalize": (3000, "spm.model"),  # dict.txt fits and is moved into OUT
}


def test_file_size_limit_at_every_stage_is_one_line_and_resumes(tmp_path, text_file, capsys, log):
    expected = clean_build(tmp_path, capsys, "--text", text_file, *SMALL)
    out = tmp_path / "out"
    for before, (stage, (limit, named)) in zip((None, *STAGE_LIMITS), STAGE_LIMITS.items()):
        if before:  # the rerun with room enough resumes, up to the stage before
            code, err = build(capsys, "--text", text_file, "--out", out, *SMALL, "--stop-after", before)
            assert code == 0, err
        log.clear()
        with file_size_limit(limit):
            code, err = build(capsys, "--text", text_file, "--out", out, *SMALL)
        assert_one_error(code, err, out / named, "file too large", "ulimit -f", "rerun the same command")
        assert f"stage {stage}: running" in [line for line in log.text.splitlines() if ": running" in line][-1]
        assert not (out / ".work" / f"{stage}.done").exists() and not (out / "preprocess.json").exists()
        assert_nothing_partial(out, expected)
    assert (out / "dict.txt").exists()  # finalize had begun
    log.clear()
    code, err = build(capsys, "--text", text_file, "--out", out, *SMALL)
    assert code == 0, err
    assert reused(log, "binarize") and ran(log, "finalize")
    assert files_of(out) == expected


def test_full_disk_and_worker_errors_are_one_line_and_resume(tmp_path, text_file, capsys, monkeypatch):
    """ENOSPC raised the ways Python raises it: without a file name (a write, a copy),
    with one, and an EFBIG in a pool worker, re-raised in the parent."""
    import errno

    args = ["--text", text_file, *TWO_WORKERS]
    expected = clean_build(tmp_path, capsys, *args)
    out = tmp_path / "out"

    def fail(*error):
        def raiser(*a, **k):
            raise OSError(*error)

        return raiser

    elsewhere = str(tmp_path / "somewhere" / "else")
    faults = [  # (what fails, how, the file the error names)
        ("preprocess.encode.encode_lines", fail(errno.EFBIG, "File too large"), out / ".work" / "bpe" / "valid.bpe"),
        ("preprocess.binarize.write_index", fail(errno.ENOSPC, "No space left on device", elsewhere), elsewhere),
        ("shutil.copyfileobj", fail(errno.ENOSPC, "No space left on device"), out / "dict.txt"),
    ]
    for target, replacement, named in faults:
        with monkeypatch.context() as m:
            m.setattr(target, replacement)
            code, err = build(capsys, *args, "--out", out)
        assert_one_error(code, err, named, "rerun the same command to resume")
        assert_nothing_partial(out, expected)
    code, err = build(capsys, *args, "--out", out)
    assert code == 0, err
    assert files_of(out) == expected


def test_worker_killed_is_one_line_and_resumes(tmp_path, text_file, capsys, monkeypatch):
    """A pool worker that dies (the OOM killer, a crash in C code) ends the build with
    one line, never a traceback or a wait; the rerun resumes."""
    args = ["--text", text_file, *TWO_WORKERS]
    expected = clean_build(tmp_path, capsys, *args)
    out = tmp_path / "out"
    parent = os.getpid()

    def die(*a, **k):
        assert os.getpid() != parent, "expected to run in a worker process"
        os._exit(9)

    with monkeypatch.context() as m:
        m.setattr("preprocess.encode.encode_lines", die)
        code, err = build(capsys, *args, "--out", out)
    assert_one_error(code, err, out, "a worker process ended abruptly")
    assert_nothing_partial(out, expected)
    code, err = build(capsys, *args, "--out", out)
    assert code == 0, err
    assert files_of(out) == expected


def test_os_error_of_the_rust_tokenizers_is_an_os_error(tmp_path):
    """tokenizers' save raises a plain Exception("File too large (os error 27)")."""
    import errno

    class Tokenizer:
        def __init__(self, error):
            self.error = error

        def save_pretrained(self, folder):
            raise self.error

    with pytest.raises(OSError) as e:
        save_tokenizer(Tokenizer(Exception("File too large (os error 27)")), tmp_path)
    assert e.value.errno == errno.EFBIG
    with pytest.raises(ValueError, match="os error 27"):  # not an OS error: unchanged
        save_tokenizer(Tokenizer(ValueError("os error 27")), tmp_path)


def test_error_in_a_worker_reaches_the_parent_without_hanging(tmp_path):
    """A PreprocessError (or any exception that pickle cannot rebuild) raised in a
    pool worker used to kill multiprocessing's result thread: the build waited forever."""
    script = (
        "from preprocess.errors import PreprocessError\n"
        "from preprocess.parallel import ordered_imap\n"
        "class Odd(Exception):\n"
        "    def __init__(self, a, b):\n"
        "        super().__init__(f'{a} {b}')\n"
        "def bad_page(x):\n"
        "    if x == 5:\n"
        "        raise PreprocessError('/some/page.xml', 'bad page')\n"
        "def odd(x):\n"
        "    if x == 50:\n"
        "        raise Odd('odd', 'error')\n"
        "if __name__ == '__main__':\n"
        "    for task in (bad_page, odd):\n"
        "        try:\n"
        "            list(ordered_imap(task, range(100), 2))\n"
        "        except Exception as e:\n"
        "            print(type(e).__name__, getattr(e, 'path', None), e)\n"
    )
    (tmp_path / "probe.py").write_text(script)
    proc = subprocess.run(
        [sys.executable, str(tmp_path / "probe.py")],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env=dict(os.environ, PYTHONPATH=str(REPO)),
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == [
        "PreprocessError /some/page.xml /some/page.xml: bad page",
        "RuntimeError None Odd: odd error",
    ], proc.stdout + proc.stderr


@pytest.mark.slow
def test_file_size_limit_in_the_cli_with_workers(tmp_path, text_file, capsys):
    """The real command, workers alive, a real EFBIG (a process limit; Python ignores
    SIGXFSZ): one line, exit 2; the rerun with room enough gives the clean build."""
    import resource

    args = ["--text", text_file, *TWO_WORKERS]
    expected = clean_build(tmp_path, capsys, *args)
    out = tmp_path / "out"
    limit = 15000  # corpus, split and spm fit; train0.bpe does not

    def limited():
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, resource.getrlimit(resource.RLIMIT_FSIZE)[1]))

    proc = subprocess.run(
        [sys.executable, "-m", "preprocess.build", *map(str, args), "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=300,
        preexec_fn=limited,
        env=dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1"),
    )
    assert_one_error(proc.returncode, proc.stderr, out / ".work" / "bpe" / "train0.bpe", "file too large")
    assert_nothing_partial(out, expected)
    code, err = build(capsys, *args, "--out", out)
    assert code == 0, err
    assert files_of(out) == expected
