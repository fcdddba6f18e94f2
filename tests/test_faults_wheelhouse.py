"""The wheelhouse's faults (issue 32, items 15 and 16).

Item 15: ``make_wheelhouse.sh`` deleted whatever the old ``SHA256SUMS`` listed (``../x`` and absolute
paths included), deleted before it knew it could finish, then said "left as it was".  Now the folder
follows ``seed_fairseq.base.fileio``'s ownership rule: its record lists its files, a listing outside the
folder or a folder holding unlisted files is refused before anything is downloaded or deleted, and
the new wheelhouse is built beside the old one and installed only when complete.

Item 16: ``setup_env.sh --wheelhouse`` verified only the files ``SHA256SUMS`` listed (an unlisted wheel
passed, and pip could prefer it) and never used the hashed lock.  Now an unlisted file is refused,
and every install step reads the lock with ``--require-hashes --no-deps``.

The download is replaced by a stand-in (no network); everything else is the scripts' own code.
"""

import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from helpers import REPO
from test_wheelhouse import SETUP_ENV, bash, commands, fake_venv, fake_wheelhouse, refused


@pytest.fixture
def wheelhouse_mod():
    spec = importlib.util.spec_from_file_location("wheelhouse_under_test", REPO / "scripts" / "wheelhouse.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def tiny_wheel(folder, name, version, content="x = 1\n"):
    """A real, installable pure-Python wheel."""
    dist = f"{name}-{version}"
    path = Path(folder) / f"{dist}-py3-none-any.whl"
    files = {
        f"{name}.py": content,
        f"{dist}.dist-info/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
        f"{dist}.dist-info/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    with zipfile.ZipFile(path, "w") as z:
        for arc, text in files.items():
            z.writestr(arc, text)
        z.writestr(f"{dist}.dist-info/RECORD", "".join(f"{arc},,\n" for arc in files) + f"{dist}.dist-info/RECORD,,\n")
    return path


def stand_in_download(wheels):
    """``download`` of wheelhouse.py without the network: ``wheels`` (name, version) into the staging folder."""

    def download(args, runner, work, partial):
        Path(partial).mkdir(exist_ok=True)
        (Path(partial) / "fairseq_fixed-0.12.3.1.tar.gz").write_bytes(b"sdist\n")
        for name, version in wheels:
            tiny_wheel(partial, name, version)
        return {"python": args.python, "platform": "test", "torch": None, "fairseq": "fairseq_fixed-0.12.3.1.tar.gz",
                "build": ["setuptools>=64", "wheel"], "install": [n for n, _ in wheels]}  # fmt: skip

    return download


def make(mod, out, capsys):
    code = mod.main(["make", "--out", str(out)])
    return code, capsys.readouterr()


def snapshot(folder):
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(Path(folder).rglob("*")) if p.is_file()}


# ---- item 15 -------------------------------------------------------------------------------------


def test_a_new_wheelhouse_replaces_exactly_the_files_its_record_lists(tmp_path, wheelhouse_mod, capsys, monkeypatch):
    out = tmp_path / "wh"
    monkeypatch.setattr(wheelhouse_mod, "download", stand_in_download([("alpha", "1.0")]))
    code, said = make(wheelhouse_mod, out, capsys)
    assert code == 0, said.err
    record = json.loads((out / "wheelhouse.json").read_text())
    assert sorted(record["files"]) == sorted(p.name for p in out.iterdir())
    assert "alpha-1.0-py3-none-any.whl" in record["files"]
    monkeypatch.setattr(wheelhouse_mod, "download", stand_in_download([("beta", "2.0")]))
    code, said = make(wheelhouse_mod, out, capsys)
    assert code == 0, said.err
    names = sorted(p.name for p in out.iterdir())
    assert "beta-2.0-py3-none-any.whl" in names and "alpha-1.0-py3-none-any.whl" not in names
    assert not list(tmp_path.glob(".wh.tmp-*"))  # no staging folder left beside it


@pytest.mark.parametrize("entry", ["../victim.txt", "ABSOLUTE"])
def test_a_record_listing_files_outside_the_wheelhouse_deletes_nothing(tmp_path, wheelhouse_mod, capsys, monkeypatch,
                                                                       entry):  # fmt: skip
    victim = tmp_path / "victim.txt"
    victim.write_text("not the wheelhouse's\n")
    entry = str(victim) if entry == "ABSOLUTE" else entry
    out = fake_wheelhouse(tmp_path / "wh")
    record = json.loads((out / "wheelhouse.json").read_text())
    record["files"].append(entry)
    (out / "wheelhouse.json").write_text(json.dumps(record))
    with open(out / "SHA256SUMS", "a") as f:  # the listing make_wheelhouse.sh used to delete by
        f.write(f"{hashlib.sha256(victim.read_bytes()).hexdigest()}  {entry}\n")
    before = snapshot(out)
    monkeypatch.setattr(wheelhouse_mod, "download", stand_in_download([("alpha", "1.0")]))
    code, said = make(wheelhouse_mod, out, capsys)
    assert victim.read_text() == "not the wheelhouse's\n"
    assert snapshot(out) == before
    lines = said.err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), said.err
    assert "not a path inside the folder" in lines[0], lines[0]


def test_an_unlisted_file_is_refused_before_anything_is_deleted(tmp_path, wheelhouse_mod, capsys, monkeypatch):
    """The old code deleted the listed files, then found the user's file, then said "left as it was"."""
    out = fake_wheelhouse(tmp_path / "wh")
    (out / "my-notes.txt").write_text("mine\n")
    before = snapshot(out)
    monkeypatch.setattr(wheelhouse_mod, "download", stand_in_download([("alpha", "1.0")]))
    code, said = make(wheelhouse_mod, out, capsys)
    assert snapshot(out) == before
    lines = said.err.strip().splitlines()
    assert code == 2 and len(lines) == 1, said.err
    assert "holds files its record does not list (my-notes.txt)" in lines[0], lines[0]


def test_a_failed_download_leaves_the_old_wheelhouse_whole(tmp_path, wheelhouse_mod, capsys, monkeypatch):
    out = fake_wheelhouse(tmp_path / "wh")
    before = snapshot(out)

    def failing(args, runner, work, partial):
        stand_in_download([("alpha", "1.0")])(args, runner, work, partial)
        raise SystemExit("error: pip failed (exit 1): pip download ...")

    monkeypatch.setattr(wheelhouse_mod, "download", failing)
    with pytest.raises(SystemExit):
        make(wheelhouse_mod, out, capsys)
    assert snapshot(out) == before
    assert not list(tmp_path.glob(".wh.tmp-*"))


# ---- item 16 -------------------------------------------------------------------------------------


def test_an_unlisted_wheel_in_the_wheelhouse_is_refused(tmp_path):
    wh = fake_wheelhouse(tmp_path / "wh")
    tiny_wheel(wh, "sneaky", "9.9")  # pip could prefer it to the listed one
    line = refused(bash(SETUP_ENV, "--wheelhouse", wh, "--dry-run"))
    assert f"{wh}/sneaky-9.9-py3-none-any.whl: not listed in SHA256SUMS" in line


def test_a_lock_that_disagrees_with_sha256sums_is_refused(tmp_path):
    wh = fake_wheelhouse(tmp_path / "wh")
    lock = wh / "requirements.lock"
    lock.write_text(lock.read_text().replace("tqdm==4.67.1 --hash=sha256:", "tqdm==4.67.1 --hash=sha256:0"))
    assert "does not pin tqdm-4.67.1-py3-none-any.whl" in refused(bash(SETUP_ENV, "--wheelhouse", wh, "--dry-run"))


def test_every_step_installs_the_lock_with_hashes_and_pip_takes_no_other_file(tmp_path):
    """The dry run's commands read the lock's lines per step; those lines are pip's own hashed
    requirements: pip installs the listed wheel, and refuses a file whose hash the lock does not pin."""
    src = tmp_path / "src"
    src.mkdir()
    wheel = tiny_wheel(src, "tinypkg", "1.0")
    files = {"fairseq_fixed-0.12.3.1.tar.gz": b"sdist\n", "setuptools-80.0.0-py3-none-any.whl": b"w\n",
             wheel.name: wheel.read_bytes()}  # fmt: skip
    wh = fake_wheelhouse(tmp_path / "wh", files=files)
    venv = fake_venv(tmp_path / "venv", with_torch=True)
    proc = bash(SETUP_ENV, "--wheelhouse", wh, "--dry-run", env={"VENV": str(venv)})
    assert proc.returncode == 0, proc.stderr
    installs = [c for c in commands(proc) if " -m pip install " in c]
    assert all("--require-hashes --no-deps" in c for c in installs[:3]), installs
    lock = (wh / "requirements.lock").read_text().splitlines()
    (tmp_path / "install.lock").write_text("".join(f"{line}\n" for line in lock if line.startswith("tinypkg==")))
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wh), "--require-hashes",
           "--no-deps", "--only-binary", ":all:", "--target", str(tmp_path / "site"),
           "-r", str(tmp_path / "install.lock")]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env["PIP_CONFIG_FILE"] = os.devnull
    ok = subprocess.run(pip, capture_output=True, text=True, env=env)
    assert ok.returncode == 0, ok.stderr
    assert (tmp_path / "site" / "tinypkg.py").is_file()
    tiny_wheel(wh, "tinypkg", "1.0", content="x = 2  # altered\n")  # same name, other bytes
    bad = subprocess.run([*pip, "--upgrade"], capture_output=True, text=True, env=env)
    assert bad.returncode != 0 and "hash" in bad.stderr.lower(), bad.stderr


# ---- the device bundle's data set (--data) ------------------------------------------------------


def test_the_data_is_copied_hashed_and_checked_like_the_packages(tmp_path, wheelhouse_mod, capsys, monkeypatch):
    """``--data DIR`` (device_bundle.sh: the GPU check's data set): DIR's files under ``data/``, listed in
    SHA256SUMS and the record, never in the lock; setup_env.sh's check passes them and refuses a data file
    altered or not listed, as it does a wheel; a link in DIR is refused before anything is downloaded."""
    data = tmp_path / "build"
    (data / "sub").mkdir(parents=True)
    (data / "dict.txt").write_text("a 1\n")
    (data / "sub" / "train.bin").write_bytes(b"\0\1\2")
    out = tmp_path / "wh"
    monkeypatch.setattr(wheelhouse_mod, "download", stand_in_download([("alpha", "1.0")]))
    code = wheelhouse_mod.main(["make", "--out", str(out), "--data", str(data)])
    assert code == 0, capsys.readouterr().err
    record = json.loads((out / "wheelhouse.json").read_text())
    assert {"data/dict.txt", "data/sub/train.bin"} <= set(record["files"])
    assert record["data"]["files"] == 2 and record["data"]["bytes"] == 7 and record["packages"] == 2
    sums = (out / "SHA256SUMS").read_text()
    digest = hashlib.sha256((data / "dict.txt").read_bytes()).hexdigest()
    assert f"{digest}  data/dict.txt\n" in sums and "  data/sub/train.bin\n" in sums
    assert "data" not in (out / "requirements.lock").read_text()
    venv = fake_venv(tmp_path / "venv", with_torch=True)
    ok = bash(SETUP_ENV, "--wheelhouse", out, "--dry-run", env={"VENV": str(venv)})
    assert ok.returncode == 0, ok.stderr
    (out / "data" / "sub" / "extra.bin").write_bytes(b"x")
    line = refused(bash(SETUP_ENV, "--wheelhouse", out, "--dry-run", env={"VENV": str(venv)}))
    assert f"{out}/data/sub/extra.bin: not listed in SHA256SUMS" in line, line
    (out / "data" / "sub" / "extra.bin").unlink()
    (out / "data" / "dict.txt").write_text("b 1\n")
    line = refused(bash(SETUP_ENV, "--wheelhouse", out, "--dry-run", env={"VENV": str(venv)}))
    assert f"{out}/data/dict.txt: sha256 differs from SHA256SUMS" in line, line
    (data / "linked.txt").symlink_to(data / "dict.txt")
    assert wheelhouse_mod.main(["make", "--out", str(tmp_path / "wh2"), "--data", str(data)]) == 2
    assert "linked.txt: --data holds a link" in capsys.readouterr().err
    assert not (tmp_path / "wh2").exists()
