"""The air-gapped install: scripts/make_wheelhouse.sh fills a folder, scripts/setup_env.sh --wheelhouse
installs from it with no index, and never replaces a torch the venv already has.

The fast tests drive the scripts' checks and setup_env.sh's --dry-run on fake wheelhouses and venvs.
The end-to-end test (download ~500 MB, build fairseq, train) is opt-in: SEED_AIRGAP_TEST=1.
"""

import hashlib
import json
import math
import os
import shutil
import subprocess
import sys
import time

import pytest
from helpers import DEMO_CORPUS, REPO, train_cmd

SETUP_ENV = REPO / "scripts" / "setup_env.sh"
MAKE_WHEELHOUSE = REPO / "scripts" / "make_wheelhouse.sh"
HERE = f"{sys.version_info[0]}.{sys.version_info[1]}"


def bash(script, *args, env=None, timeout=120):
    full = dict(os.environ, PYTHON=sys.executable)
    full.update(env or {})
    return subprocess.run(
        ["bash", str(script), *map(str, args)], capture_output=True, text=True, env=full, timeout=timeout
    )


def refused(proc):
    """Exit 2 with exactly one line, an ``error:`` one."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2, (proc.returncode, proc.stdout, proc.stderr)
    assert len(lines) == 1 and lines[0].startswith("error: "), proc.stderr
    return lines[0]


FAKE_FILES = {
    "fairseq_fixed-0.12.3.1.tar.gz": b"not really an sdist\n",
    "setuptools-80.0.0-py3-none-any.whl": b"not really a wheel\n",
    "tqdm-4.67.1-py3-none-any.whl": b"not really tqdm\n",
}


def fake_wheelhouse(folder, torch=None, python=HERE, files=FAKE_FILES, **record):
    """A wheelhouse as make_wheelhouse.sh writes it (record, SHA256SUMS, hashed lock: one line per name and
    version, every file's hash on it), around small files; ``record``: more of wheelhouse.json."""
    folder.mkdir()
    sums, pins = [], {}
    for name, content in sorted(files.items()):
        (folder / name).write_bytes(content)
        digest = hashlib.sha256(content).hexdigest()
        sums.append(f"{digest}  {name}\n")
        stem = name[: -len(".tar.gz")] if name.endswith(".tar.gz") else name
        dist, version = stem.split("-")[:2] if name.endswith(".whl") else stem.rsplit("-", 1)
        pins.setdefault(f"{dist.replace('_', '-').lower()}=={version}", []).append(f"--hash=sha256:{digest}")
    (folder / "SHA256SUMS").write_text("".join(sums))
    (folder / "requirements.lock").write_text("".join(f"{pin} {' '.join(h)}\n" for pin, h in sorted(pins.items())))
    (folder / "requirements.txt").write_text("tqdm\n")
    meta = {
        "python": python,
        "torch": torch,
        "fairseq": "fairseq_fixed-0.12.3.1.tar.gz",
        "build": ["setuptools>=64", "wheel"],
        "files": [*sorted(files), "SHA256SUMS", "requirements.lock", "requirements.txt", "wheelhouse.json"],
        **record,
    }
    (folder / "wheelhouse.json").write_text(json.dumps(meta))
    return folder


def fake_venv(folder, with_torch):
    """A venv whose python is this one (torch importable) or this one without site-packages (no torch)."""
    (folder / "bin").mkdir(parents=True)
    python = folder / "bin" / "python"
    python.write_text(f'#!/bin/sh\nexec {sys.executable} {"" if with_torch else "-S "}"$@"\n')
    python.chmod(0o755)
    return folder


def commands(proc):
    return [line[2:] for line in proc.stdout.splitlines() if line.startswith("+ ")]


def lock_lines(command):
    """The hashed lock lines a dry-run install command reads (its ``-r FILE``, still there: check wrote it)."""
    return command.split(" -r ", 1)[1] if " -r " in command else None


# ---- make_wheelhouse.sh: bad input before any download ------------------------------------------


@pytest.mark.parametrize(
    "args, says",
    [
        (["--python", "3.10"], "needs Python >= 3.11"),
        (["--python", "three"], "expected a version such as 3.11"),
        (["--python", "3.99"], "no python3.99 on PATH"),
        (["--extras", "nosuchextra"], "--extras nosuchextra: setup.py has"),
    ],
)
def test_make_wheelhouse_refuses_a_bad_target(tmp_path, args, says):
    line = refused(bash(MAKE_WHEELHOUSE, *args, "--out", tmp_path / "wh"))
    assert says in line
    assert list(tmp_path.iterdir()) == []  # neither DIR nor a partial one


def test_make_wheelhouse_needs_out_and_never_takes_a_foreign_folder(tmp_path):
    assert "--out" in refused(bash(MAKE_WHEELHOUSE))
    foreign = tmp_path / "mine"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("keep me\n")
    assert f"{foreign}: folder is not empty and was not written by make_wheelhouse.sh" in refused(
        bash(MAKE_WHEELHOUSE, "--out", foreign)
    )
    assert (foreign / "notes.txt").read_text() == "keep me\n"


# ---- setup_env.sh --wheelhouse: checks, then the plan (--dry-run) ----------------------------------


def test_setup_env_refuses_a_missing_or_foreign_or_altered_wheelhouse(tmp_path):
    assert "--wheelhouse needs an existing folder" in refused(bash(SETUP_ENV, "--wheelhouse", tmp_path / "absent"))
    assert "unknown option" in refused(bash(SETUP_ENV, "--frobnicate"))
    assert "--dry-run: only with --wheelhouse" in refused(bash(SETUP_ENV, "--dry-run"))
    assert "no wheelhouse.json" in refused(bash(SETUP_ENV, "--wheelhouse", tmp_path, "--dry-run"))
    wh = fake_wheelhouse(tmp_path / "wh")
    (wh / "fairseq_fixed-0.12.3.1.tar.gz").write_bytes(b"tampered\n")
    assert "sha256 differs from SHA256SUMS" in refused(bash(SETUP_ENV, "--wheelhouse", wh, "--dry-run"))
    other = fake_wheelhouse(tmp_path / "wh312", python="3.99")
    assert "made for Python 3.99" in refused(bash(SETUP_ENV, "--wheelhouse", other, "--dry-run"))


def test_setup_env_keeps_the_installed_torch_even_when_the_wheelhouse_has_one(tmp_path):
    import torch

    wh = fake_wheelhouse(tmp_path / "wh", torch="torch==2.13.0")
    venv = fake_venv(tmp_path / "venv", with_torch=True)
    proc = bash(SETUP_ENV, "--wheelhouse", wh, "--dry-run", env={"VENV": str(venv)})
    assert proc.returncode == 0, proc.stderr
    assert f"keeping the installed torch {torch.__version__}" in proc.stdout
    cmds = commands(proc)
    # no venv is created, no torch installed; every install is offline, and after the build
    # requirements each one is bound to the installed torch
    assert not any(" venv " in c for c in cmds)
    assert f"echo torch=={torch.__version__} > {venv}/torch-constraint.txt" in cmds
    installs = [c for c in cmds if " -m pip install " in c]
    assert len(installs) == 4, cmds
    # the wheelhouse's files only through its hashed lock, one step at a time, no dependency resolution
    for c in installs[:3]:
        assert f"--no-index --find-links {wh} --require-hashes --no-deps" in c, c
    assert not any("torch==" in c.split(" -c ")[0] for c in installs)
    assert all(f" -c {venv}/torch-constraint.txt " in c for c in installs[1:])
    assert installs[0].endswith("build.lock") and installs[1].endswith("install.lock")
    assert installs[2].startswith("env -u CUDA_HOME ")  # no nvcc for kernels text training never uses
    assert installs[2].endswith("fairseq.lock") and "--no-build-isolation" in installs[2]
    # the plugin: no wheelhouse file can come in (no --find-links)
    assert "--find-links" not in installs[3] and installs[3].endswith(
        f"--no-deps --no-build-isolation -c {venv}/torch-constraint.txt -e ."
    )


def test_setup_env_installs_the_wheelhouse_torch_only_where_none_is_importable(tmp_path):
    venv = fake_venv(tmp_path / "venv", with_torch=False)
    with_torch = fake_wheelhouse(tmp_path / "with", torch="torch==2.13.0")
    proc = bash(SETUP_ENV, "--wheelhouse", with_torch, "--dry-run", env={"VENV": str(venv)})
    assert proc.returncode == 0, proc.stderr
    assert [c for c in commands(proc) if c.endswith("torch.lock")], proc.stdout
    without = fake_wheelhouse(tmp_path / "without")
    line = refused(bash(SETUP_ENV, "--wheelhouse", without, "--dry-run", env={"VENV": str(venv)}))
    assert "torch is not importable" in line and "--with-torch" in line


# ---- end to end, offline -------------------------------------------------------------------------

AIRGAP = os.environ.get("SEED_AIRGAP_TEST") == "1"


def offline_env(venv):
    """No index, no find-links but the wheelhouse, no cache (a built fairseq would be reused)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_INDEX="1", PIP_NO_CACHE_DIR="1", VENV=str(venv))
    env.update(PYTHON=getattr(sys, "_base_executable", sys.executable), OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return env


def no_network():
    """``unshare -n`` (a network namespace with no interface) where this user may make one."""
    if shutil.which("unshare") and subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode == 0:
        return ["unshare", "-n"]
    return []


@pytest.mark.airgap
@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.skipif(
    not AIRGAP,
    reason="opt-in (downloads ~500 MB, builds fairseq: ~7 min): "
    "SEED_AIRGAP_TEST=1 pytest -q -p no:cacheprovider tests/test_wheelhouse.py -m airgap",
)
def test_air_gapped_install_trains(tmp_path):
    start = time.monotonic()
    wh, venv = tmp_path / "wh", tmp_path / "venv"
    made = bash(MAKE_WHEELHOUSE, "--out", wh, "--with-torch", timeout=1800)
    assert made.returncode == 0, made.stderr[-4000:]
    record = json.loads((wh / "wheelhouse.json").read_text())
    offline = no_network()
    env = offline_env(venv)

    def run(cmd, timeout=1800):
        proc = subprocess.run([*offline, *map(str, cmd)], capture_output=True, text=True, env=env, timeout=timeout)
        assert proc.returncode == 0, f"{cmd}\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
        return proc

    installed = run(["bash", SETUP_ENV, "--wheelhouse", wh])
    assert "fairseq 0.12.3.1 | torch 2.13.0" in installed.stdout, installed.stdout
    python = venv / "bin" / "python"
    where = run([python, "-c", "import seed_fairseq, torch; print(seed_fairseq.__file__); print(torch.__file__)"])
    plugin, torch_file = where.stdout.split()
    assert plugin.startswith(str(REPO)) and torch_file.startswith(str(venv)), where.stdout
    assert run([python, "-m", "pip", "list"]).stdout.count("torchaudio") == 0

    data = tmp_path / "data-bin"
    run([python, "-m", "preprocess.build", "--text", DEMO_CORPUS, "--out", data, "--vocab-size", "397",
         "--workers", "1", "--valid-docs", "3", "--test-docs", "2"])  # fmt: skip
    cmd = train_cmd(data, tmp_path / "ckpt", max_update=3)
    cmd[0] = venv / "bin" / "fairseq-train"
    trained = run(cmd)
    lines = (trained.stdout + trained.stderr).splitlines()
    losses = [json.loads(line[line.index("{") :])["loss"] for line in lines if '"num_updates"' in line]
    assert len(losses) >= 3 and all(math.isfinite(float(x)) for x in losses), trained.stderr[-3000:]
    assert (tmp_path / "ckpt" / "checkpoint_last.pt").is_file()
    print(
        f"\nair-gapped install: wheelhouse {record['packages']} files, {record['bytes'] / 1e6:.0f} MB; "
        f"network {'removed (unshare -n)' if offline else 'still up (--no-index only)'}; "
        f"{time.monotonic() - start:.0f} s in all"
    )
