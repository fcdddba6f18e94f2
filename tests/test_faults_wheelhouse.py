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
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import zipfile
from pathlib import Path

import pytest
from helpers import REPO
from test_wheelhouse import FAKE_FILES, SETUP_ENV, bash, commands, fake_venv, fake_wheelhouse, refused


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


# ---- issue 44 item 5: fairseq prebuilt for the image, installed only where it fits --------------------

WHEEL = "fairseq_fixed-0.12.3.1-cp312-cp312-linux_x86_64.whl"


def prebuilt_record(**against):
    """wheelhouse.json's ``fairseq_wheel``, as device_bundle.sh writes it for the lent machine's image."""
    built = {"python": "cp312", "abi": "cp312", "platform": "linux_x86_64", "torch": "2.11.0+cu130",
             "torch_cxx11_abi": True, "numpy": "2.5.2", **against}  # fmt: skip
    return {"file": WHEEL, "sdist": "fairseq_fixed-0.12.3.1.tar.gz", "built_against": built,
            "needs": {"glibc": "2.32", "glibcxx": "3.4.21", "cxxabi": "1.3.9"}}  # fmt: skip


# the lent machine's image (docs/gpu_runs/2026-11-27-h200-third/versions.txt: Ubuntu 24.04's glibc and libstdc++)
IMAGE_FACTS = {
    **prebuilt_record()["built_against"],
    **{"glibc": "2.39", "glibcxx": "3.4.33", "cxxabi": "1.3.15"},
}


def test_the_prebuilt_wheel_fits_only_the_interpreter_it_was_built_against(wheelhouse_mod):
    """The fit check setup_env.sh runs with the target venv's own python (wheelhouse.py fits): the record's
    CPython ABI tag, torch.__version__ with its local label, numpy major and platform, and C libraries at
    least as new as the extensions need; every mismatch named in the one line the install log gets."""
    fit = wheelhouse_mod.fit_problems
    wheel = prebuilt_record()
    assert fit(wheel, IMAGE_FACTS) == []
    # numpy 2.x is one ABI; libraries exactly as new as needed will do
    assert fit(wheel, {**IMAGE_FACTS, "numpy": "2.3.1", "glibc": "2.32", "glibcxx": "3.4.21"}) == []
    for change, says in (
        ({"torch": "2.11.0+cu128"}, "torch 2.11.0+cu128 here, the wheel was built against torch 2.11.0+cu130"),
        ({"torch": "2.11.0"}, "torch 2.11.0 here, the wheel was built against torch 2.11.0+cu130"),
        ({"torch": "2.12.0+cu130"}, "torch 2.12.0+cu130 here, the wheel was built against torch 2.11.0+cu130"),
        ({"torch": None, "torch_error": "ModuleNotFoundError: No module named 'torch'"},
         "no torch here (ModuleNotFoundError: No module named 'torch')"),
        ({"torch_cxx11_abi": False}, "torch's C++11 ABI is False here, True in the wheel's build"),
        ({"python": "cp311", "abi": "cp311"}, "Python cp311 here, the wheel is cp312"),
        ({"abi": "cp312t"}, "Python cp312t here, the wheel is cp312"),
        ({"numpy": "1.26.4"}, "numpy 1.26.4 here, the wheel was built against numpy 2.5.2 (major 1 vs 2)"),
        ({"numpy": None}, "numpy None here, the wheel was built against numpy 2.5.2 (major none vs 2)"),
        ({"platform": "linux_aarch64"}, "platform linux_aarch64 here, the wheel is linux_x86_64"),
        ({"glibc": "2.31"}, "glibc 2.31 here, the wheel needs 2.32"),
        ({"glibcxx": "3.4.19"}, "libstdc++ GLIBCXX 3.4.19 here, the wheel needs 3.4.21"),
        ({"glibcxx": None}, "libstdc++ GLIBCXX not found here, the wheel needs 3.4.21"),
        ({"cxxabi": "1.3.8"}, "libstdc++ CXXABI 1.3.8 here, the wheel needs 1.3.9"),
    ):  # fmt: skip
        assert fit(wheel, {**IMAGE_FACTS, **change}) == [says], change
    two = fit(wheel, {**IMAGE_FACTS, "torch": "2.13.0+cpu", "abi": "cp311", "python": "cp311"})
    assert two == ["Python cp311 here, the wheel is cp312",
                   "torch 2.13.0+cpu here, the wheel was built against torch 2.11.0+cu130"]  # fmt: skip
    assert wheelhouse_mod.built_against(wheel) == "built against torch 2.11.0+cu130, numpy 2.5.2, cp312, linux_x86_64"


def test_the_wheels_needs_are_the_newest_library_versions_its_extensions_name(tmp_path, wheelhouse_mod):
    """What a wheel's compiled files need of glibc and libstdc++: the newest ELF version name of each in any
    .so (version names compared as numbers: 2.32 after 2.4), none from its Python files."""
    path = tmp_path / WHEEL
    with zipfile.ZipFile(path, "w") as z:
        names = b"GLIBC_2.2.5 GLIBC_2.4 GLIBC_2.32 GLIBCXX_3.4 GLIBCXX_3.4.9 GLIBCXX_3.4.21 CXXABI_1.3.9".split()
        z.writestr("fairseq/libbase.cpython-312-x86_64-linux-gnu.so", b"\0".join([b"\x7fELF", *names]))
        z.writestr("fairseq/data/data_utils_fast.cpython-312-x86_64-linux-gnu.so", b"\0GLIBC_2.14\0GLIBC_PRIVATE\0")
        z.writestr("fairseq/notes.py", "GLIBC_2.99 GLIBCXX_3.4.99\n")
    assert wheelhouse_mod.wheel_needs(path) == {"glibc": "2.32", "glibcxx": "3.4.21", "cxxabi": "1.3.9"}


def test_the_plan_names_the_prebuilt_wheel_only_when_it_is_a_listed_file_of_the_sdists_version(
    tmp_path, wheelhouse_mod
):
    files = {**FAKE_FILES, WHEEL: b"not really a wheel\n"}
    wh = fake_wheelhouse(tmp_path / "wh", python="3.12", files=files, fairseq_wheel=prebuilt_record())
    plan = wheelhouse_mod.plan(wh, tmp_path)
    assert plan["WH_FAIRSEQ_WHEEL"] == str(wh / WHEEL) and plan["WH_FAIRSEQ"] == str(wh / FAKE_SDIST)
    # one lock line, both files' hashes: the install picks one with --only-binary / --no-binary
    (line,) = (tmp_path / "fairseq.lock").read_text().splitlines()
    assert line.startswith("fairseq-fixed==0.12.3.1 ") and line.count("--hash=sha256:") == 2, line
    assert wheelhouse_mod.plan(fake_wheelhouse(tmp_path / "none"))["WH_FAIRSEQ_WHEEL"] == ""
    # a record naming a wheel that is not a listed file, or a listed wheel of another package
    for case, named in (("unlisted", WHEEL), ("other", "tqdm-4.67.1-py3-none-any.whl")):
        bad = fake_wheelhouse(tmp_path / case, fairseq_wheel={**prebuilt_record(), "file": named})
        with pytest.raises(wheelhouse_mod.Refused, match=f"names a fairseq wheel {named} that is not the listed wheel"):
            wheelhouse_mod.plan(bad)


FAKE_SDIST = "fairseq_fixed-0.12.3.1.tar.gz"


@pytest.mark.slow
def test_setup_env_installs_the_prebuilt_wheel_where_it_fits_and_builds_the_sdist_where_not(tmp_path, wheelhouse_mod):
    """setup_env.sh --wheelhouse (--dry-run, a venv whose python is this one): the fit check runs with the venv's
    own interpreter before anything is installed. A record of this interpreter's facts: the wheel, with
    --only-binary; one of another torch (every other mismatch: the unit test above): the sdist, with
    --no-binary (the lock line holds both files' hashes), and why, in one line; no wheel: the sdist."""
    facts = wheelhouse_mod.interpreter_facts()  # what the venv's python (this one) will find
    here = {k: facts[k] for k in ("python", "abi", "platform", "torch", "torch_cxx11_abi", "numpy")}
    name = f"fairseq_fixed-0.12.3.1-{here['python']}-{here['abi']}-{here['platform']}.whl"
    venv = fake_venv(tmp_path / "venv", with_torch=True)
    cases = {"fits": {}, "torch": {"torch": "2.11.0+cu130"}, "none": None}
    for case, change in cases.items():
        record = {**prebuilt_record(**{**here, **change}), "file": name} if change is not None else None
        files = {**FAKE_FILES, name: b"not really a wheel\n"} if record else FAKE_FILES
        wh = fake_wheelhouse(tmp_path / case, files=files, fairseq_wheel=record)
        proc = bash(SETUP_ENV, "--wheelhouse", wh, "--dry-run", env={"VENV": str(venv)})
        assert proc.returncode == 0, (case, proc.stderr)
        (fairseq,) = [c for c in commands(proc) if c.endswith("fairseq.lock")]
        said = [line for line in proc.stdout.splitlines() if line.startswith("fairseq: ")]
        against = f"built against torch {here['torch']}, numpy {here['numpy']}, {here['abi']}, {here['platform']}"
        if case == "fits":
            assert said == [f"fairseq: the prebuilt {name} fits ({against}): installing it"], proc.stdout
            assert "--only-binary :all:" in fairseq and "--no-binary" not in fairseq, fairseq
            assert not fairseq.startswith("env -u CUDA_HOME"), fairseq
            continue
        assert fairseq.startswith("env -u CUDA_HOME ") and "--no-build-isolation --no-binary :all:" in fairseq, fairseq
        assert len(said) == 1 and said[0].startswith("fairseq: building from the sdist: "), proc.stdout
        if case == "none":
            assert said[0].endswith(": the wheelhouse has no prebuilt wheel"), said
        else:
            assert said[0].startswith("fairseq: building from the sdist: the prebuilt wheel does not fit: "), said
        if case == "torch":
            assert said[0].endswith(f"torch {here['torch']} here, the wheel was built against torch 2.11.0+cu130"), said


def tiny_sdist(folder, name, version, content):
    """A real sdist of one module, built by setuptools' setup.py (as fairseq's is)."""
    path = Path(folder) / f"{name}-{version}.tar.gz"
    files = {
        "setup.py": f"from setuptools import setup\nsetup(name={name!r}, version={version!r}, py_modules=[{name!r}])\n",
        f"{name}.py": content,
        "PKG-INFO": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
    }
    with tarfile.open(path, "w:gz") as tar:
        for arc, text in files.items():
            data = text.encode()
            info = tarfile.TarInfo(f"{name}-{version}/{arc}")
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.mark.slow
def test_the_fairseq_steps_pip_options_pick_the_wheel_or_the_sdist_from_one_hashed_lock_line(tmp_path):
    """The two commands of setup_env.sh's fairseq step on a lock line with both the sdist's and the wheel's
    hashes (as a bundle with the prebuilt wheel has it): --only-binary installs the wheel; --no-binary builds
    the sdist even though a wheel that pip would prefer is beside it."""
    wh = tmp_path / "wh"
    wh.mkdir()
    sdist = tiny_sdist(wh, "tinypkg", "1.0", "BUILT = 'from the sdist'\n")
    wheel = tiny_wheel(wh, "tinypkg", "1.0", content="BUILT = 'the prebuilt wheel'\n")
    digests = " ".join(f"--hash=sha256:{hashlib.sha256(p.read_bytes()).hexdigest()}" for p in (sdist, wheel))
    (tmp_path / "fairseq.lock").write_text(f"tinypkg==1.0 {digests}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_CACHE_DIR="1")
    pip = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--find-links", str(wh), "--require-hashes",
           "--no-deps"]  # fmt: skip
    for how, says in ((["--only-binary", ":all:"], "the prebuilt wheel"),
                      (["--no-build-isolation", "--no-binary", ":all:"], "from the sdist")):  # fmt: skip
        site = tmp_path / f"site-{says.split()[-1]}"
        proc = subprocess.run([*pip, *how, "--target", str(site), "-r", str(tmp_path / "fairseq.lock")],
                              capture_output=True, text=True, env=env)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        assert (site / "tinypkg.py").read_text() == f"BUILT = {says!r}\n", how


@pytest.mark.slow
def test_device_bundle_builds_the_wheel_with_the_image_venv_or_says_the_device_will_build(tmp_path):
    """device_bundle.sh passes the image venv (--image-python, $SEED_IMAGE_PYTHON, else the cached one) to the
    maker as --prebuild-python; with --no-prebuilt, or no image venv, the bundle is the sdist's alone and one
    line says the device will build fairseq; an image python that is not a 3.12 is one error line, exit 2,
    before anything is written. The maker is a stand-in here that records its arguments."""
    calls = tmp_path / "calls.txt"

    def python(name, version):
        path = tmp_path / name
        path.write_text(f'#!/bin/sh\n[ "$1" = -c ] && {{ echo {version}; exit 0; }}\necho "$*" >> {calls}\n')
        path.chmod(0o755)
        return path

    py312, image, old = python("py312", "3.12"), python("image", "3.12"), python("image311", "3.11")
    home = tmp_path / "home"  # no cached image venv there
    home.mkdir()
    env = {"PYTHON": str(py312), "PYTHON312": str(py312), "HOME": str(home), "SEED_IMAGE_PYTHON": ""}
    script = REPO / "scripts" / "device_bundle.sh"
    for args, extra, prebuilt, says in (
        (["--image-python", image], {}, True, f"fairseq: its wheel built here with the image venv {image}"),
        ([], {"SEED_IMAGE_PYTHON": str(image)}, True, f"with the image venv {image}"),
        (["--image-python", image, "--no-prebuilt"], {}, False, "sdist only (--no-prebuilt): the device will build"),
        ([], {}, False, "fairseq: sdist only: no image venv (scripts/image_venv.sh, or --image-python PY)"),
    ):  # fmt: skip
        calls.unlink(missing_ok=True)
        proc = bash(script, *args, tmp_path / "bundle", env={**env, **extra})
        assert proc.returncode == 0, (args, extra, proc.stdout, proc.stderr)
        (make,) = [line for line in calls.read_text().splitlines() if "wheelhouse.py make" in line]
        assert (f"--prebuild-python {image} " in make) == prebuilt, make
        assert says in proc.stdout, proc.stdout
    (home / ".cache" / "seed_fairseq" / "image-py312" / "bin").mkdir(parents=True)
    shutil.copy(image, home / ".cache" / "seed_fairseq" / "image-py312" / "bin" / "python")
    calls.unlink()
    assert bash(script, tmp_path / "bundle", env=env).returncode == 0
    assert "--prebuild-python " + str(home / ".cache/seed_fairseq/image-py312/bin/python") in calls.read_text()
    calls.unlink()
    for args, extra in ((["--image-python", old], {}), ([], {"SEED_IMAGE_PYTHON": str(old)}),
                        (["--image-python", tmp_path / "absent"], {}), (["--image-python"], {})):  # fmt: skip
        line = refused(bash(script, *args, tmp_path / "out", env={**env, **extra}))
        assert "--image-python" in line, line
        assert not (tmp_path / "out").exists() and not calls.exists()


@pytest.mark.slow
def test_make_refuses_a_prebuild_python_it_cannot_build_with_before_anything_is_written(
    tmp_path, wheelhouse_mod, capsys, monkeypatch
):
    """--prebuild-python: an interpreter that cannot be run, is another Python than --python, or has no torch;
    or with --with-torch (the wheel is built against the image's own torch): one error line, exit 2, before
    anything is downloaded or written. Its facts are a stand-in here."""
    monkeypatch.setattr(wheelhouse_mod, "download", stand_in_download([("alpha", "1.0")]))
    here = f"{sys.version_info[0]}.{sys.version_info[1]}"

    def stand_in(name, facts):
        path = tmp_path / name
        path.write_text(f"#!/bin/sh\necho '{json.dumps(facts)}'\n")
        path.chmod(0o755)
        return path

    image = {"version": here, "torch": "2.11.0+cu130", "torch_error": None}
    for args, says in (
        (["--prebuild-python", tmp_path / "absent"], "cannot be run"),
        (["--prebuild-python", stand_in("other", {**image, "version": "3.9"})], "a Python 3.9, the target is"),
        (["--prebuild-python", stand_in("bare", {**image, "torch": None, "torch_error": "ModuleNotFoundError"})],
         "no torch to build fairseq against (ModuleNotFoundError)"),
        (["--prebuild-python", stand_in("image", image), "--with-torch"], "not with --with-torch"),
    ):  # fmt: skip
        code = wheelhouse_mod.main(["make", "--out", str(tmp_path / "wh"), *map(str, args)])
        err = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(err) == 1 and err[0].startswith("error: --prebuild-python") and says in err[0], err
        assert not (tmp_path / "wh").exists()
