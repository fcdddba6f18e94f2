"""The rehearsal of the first real GPU run, on the CPU (issue 35; docs/gpu.md, "The lent GPU machine").

A Python 3.12 venv copies the lent machine's image (scripts/image_venv.sh from scripts/device_image.txt:
torch 2.11.0, numpy 2.5.2, transformers 5.17.0 ...); scripts/device_bundle.sh makes the bundle of what
the image lacks; then scripts/device_check.sh --dry-run runs with no network (a network namespace with
only loopback): the same offline install from the same bundle into a --system-site-packages venv
(fairseq built there), and the same gpu_check code at tiny shape, its report and logs in OUT.

Opt-in (downloads ~3 GB once for the image venv, builds fairseq: ~8 min on 2 cores):

    SEED_DEVICE_REHEARSAL=1 pytest -q -s -p no:cacheprovider tests/test_device_rehearsal.py

$SEED_IMAGE_PYTHON names an image venv's python to use instead of making one. The bundle carries the
check's data set (the Wikipedia sample's build, 32,768 pieces) when the sample is there:
../shared/data/enwiki-sample-206-pages.xml.bz2 beside the checkout, or $SEED_WIKI_SAMPLE.
"""

import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
from helpers import REPO, WIKI_SAMPLE

REHEARSAL = os.environ.get("SEED_DEVICE_REHEARSAL") == "1"
BUNDLE_LIMIT = 40 * 2**20  # what the device tool carries with the working tree: 64 MiB in all
OUT_FILES = 8  # the device tool brings back at most 8 files from $OUT


def offline_prefix():
    """A network namespace with loopback only (torchrun's rendezvous needs it), where this user may make one."""
    if shutil.which("unshare") and shutil.which("ip"):
        probe = subprocess.run(["unshare", "-n", "sh", "-c", "ip link set lo up"], capture_output=True)
        if probe.returncode == 0:
            return ["unshare", "-n", "sh", "-c", 'ip link set lo up && exec "$@"', "offline"]
    return []


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items() if not k.startswith("PIP_")}
    env.update(PIP_CONFIG_FILE=os.devnull, PIP_NO_CACHE_DIR="1", MKL_NUM_THREADS="1", **extra)
    env.pop("OUT", None)
    return env


@pytest.mark.airgap
@pytest.mark.slow
@pytest.mark.timeout(3600)
@pytest.mark.skipif(
    not REHEARSAL,
    reason="opt-in (a ~3 GB image venv once, builds fairseq: ~8 min): "
    "SEED_DEVICE_REHEARSAL=1 pytest -q -s -p no:cacheprovider tests/test_device_rehearsal.py",
)
def test_device_check_installs_offline_from_the_bundle_and_passes(tmp_path):
    start = time.monotonic()
    image_python = os.environ.get("SEED_IMAGE_PYTHON")
    if not image_python:
        made = subprocess.run(["bash", REPO / "scripts" / "image_venv.sh"], capture_output=True, text=True)
        assert made.returncode == 0, made.stderr[-3000:]
        image_python = str(Path.home() / ".cache" / "seed_fairseq" / "image-py312" / "bin" / "python")
    bundle, out = tmp_path / "bundle", tmp_path / "out"
    wiki = Path(os.environ.get("SEED_WIKI_SAMPLE") or WIKI_SAMPLE)
    made = subprocess.run(
        ["bash", REPO / "scripts" / "device_bundle.sh", *(["--wiki", wiki] if wiki.is_file() else []), bundle],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHON=sys.executable),
    )
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-3000:]
    bundle_files = [p for p in bundle.rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in bundle_files)
    assert size < BUNDLE_LIMIT, size
    assert (bundle / "data" / "preprocess.json").is_file() == wiki.is_file()
    offline = offline_prefix()
    env = clean_env(PYTHON=image_python, DEVICE_VENV=str(tmp_path / "venv"), DEVICE_WORK=str(tmp_path / "work"))
    if not offline:
        env["PIP_NO_INDEX"] = "1"
    began = time.monotonic()
    # 1200 s, not the GPU run's 480: 2 shared cores build fairseq in 3-10 minutes (other jobs on them)
    cmd = [*offline, "bash", str(REPO / "scripts" / "device_check.sh"), "--dry-run", "--bundle", str(bundle)]
    proc = subprocess.run(
        [*cmd, "--out", str(out), "--seconds", "1200"], capture_output=True, text=True, env=env, cwd=REPO
    )
    wall = time.monotonic() - began
    summary = (out / "device_check.txt").read_text()
    assert proc.returncode == 0, summary + proc.stderr[-3000:] + (out / "install.log").read_text()[-3000:]
    files = sorted(p.name for p in out.iterdir())
    assert len(files) <= OUT_FILES and all((out / f).is_file() for f in files), files
    assert {"device_check.txt", "install.log", "versions.txt", "gpu_check.json", "gpu_check.md"} <= set(files)
    assert "fairseq: built and installed in" in summary, summary
    report = json.loads((out / "gpu_check.json").read_text())
    assert report["passed"] and report["failed"] == [] and report["not_run"] == [], summary
    # the bundle's data set, checked and read where it is; without the sample, one built from the demo corpus
    data = report["data"]
    if wiki.is_file():
        assert data["given"] and data["vocab_size"] == 32768 and data["sources"][0]["file"] == wiki.name, data
        assert "(32768 pieces; gpu_check --data checks it)" in summary, summary
    else:
        assert not data["given"] and data["sources"][0]["file"] == "demo_corpus.txt", data
    faiss = next(c for c in report["checks"] if c["name"] == "faiss")
    assert faiss["status"] == "skip" and "faiss is not installed" in faiss["detail"]  # not in the image
    # the venv kept the image's torch and numpy: nothing of them came from the bundle
    versions = (out / "versions.txt").read_text()
    assert "2.11.0" in versions and "numpy==2.5.2" in versions
    venv_own = versions.split("== the venv's own packages", 1)[1]
    assert "torch==" not in venv_own and "numpy==" not in venv_own, venv_own
    built = summary.split("fairseq: built and installed in ", 1)[1].split()[0]
    print(
        f"\ndevice rehearsal: bundle {size / 2**20:.1f} MiB in {len(bundle_files)} files "
        f"(data: {data['vocab_size']} pieces); network "
        f"{'removed (unshare -n, loopback only)' if offline else 'still up (--no-index only)'}; "
        f"device_check.sh {wall:.0f} s (fairseq built in {built} s); {time.monotonic() - start:.0f} s in all\n"
        + summary
    )
