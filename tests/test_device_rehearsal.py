"""The rehearsal of the first real GPU run, on the CPU (issue 35; docs/gpu.md, "The lent GPU machine").

A Python 3.12 venv copies the lent machine's image (scripts/image_venv.sh from scripts/device_image.txt:
torch 2.11.0, numpy 2.5.2, transformers 5.17.0 ...); scripts/device_bundle.sh makes the bundle of what
the image lacks, fairseq's wheel built with that venv among it (issue 44 item 5); then
scripts/device_check.sh --dry-run runs with no network (a network namespace with only loopback): the same
offline install from the same bundle into a --system-site-packages venv (the prebuilt fairseq installed
there, its fit checked first), and the same gpu_check code at tiny shape, its report and logs in OUT.

Opt-in (downloads ~5 GB once for the image venv, builds fairseq's wheel: ~7 min on 2 cores):

    SEED_DEVICE_REHEARSAL=1 pytest -q -s -p no:cacheprovider tests/test_device_rehearsal.py

$SEED_IMAGE_PYTHON names an image venv's python to use instead of making one. The bundle carries the
check's data set (the Wikipedia sample's build, 32,768 pieces) when the sample is there:
../shared/data/enwiki-sample-206-pages.xml.bz2 beside the checkout, or $SEED_WIKI_SAMPLE.
SEED_DEVICE_REHEARSAL_FIT=0 rehearses the other path: the bundle's record says the wheel was built against
another torch, so the install must build fairseq from the sdist (the wheel beside it) and say why.
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
FIT = os.environ.get("SEED_DEVICE_REHEARSAL_FIT", "1") != "0"
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
    reason="opt-in (a ~5 GB image venv once, builds fairseq's wheel: ~8 min): "
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
        ["bash", REPO / "scripts" / "device_bundle.sh", *(["--wiki", wiki] if wiki.is_file() else []),
         "--image-python", image_python, bundle],
        capture_output=True,
        text=True,
        env=dict(os.environ, PYTHON=sys.executable),
    )  # fmt: skip
    assert made.returncode == 0, made.stdout[-2000:] + made.stderr[-3000:]
    bundle_files = [p for p in bundle.rglob("*") if p.is_file()]
    size = sum(p.stat().st_size for p in bundle_files)
    assert size < BUNDLE_LIMIT, size
    assert (bundle / "data" / "preprocess.json").is_file() == wiki.is_file()
    # fairseq's wheel, built against the image venv's own torch and numpy, recorded and hashed beside its sdist
    record = json.loads((bundle / "wheelhouse.json").read_text())
    wheel = record["fairseq_wheel"]
    image = json.loads(subprocess.run([image_python, REPO / "scripts" / "wheelhouse.py", "facts"], capture_output=True,
                                      text=True, check=True).stdout)  # fmt: skip
    against = wheel["built_against"]
    assert (against["torch"], against["numpy"], against["abi"]) == (image["torch"], image["numpy"], "cp312"), wheel
    assert against["torch"].endswith("+cu130") and wheel["file"].endswith("-cp312-cp312-linux_x86_64.whl"), wheel
    assert f"  {wheel['file']}\n" in (bundle / "SHA256SUMS").read_text() and (bundle / record["fairseq"]).is_file()
    if not FIT:  # the record no longer fits the image: the sdist is built (wheelhouse.json is not in SHA256SUMS)
        wheel["built_against"]["torch"] = "2.11.0+cu999"
        (bundle / "wheelhouse.json").write_text(json.dumps(record))
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
    install_log = (out / "install.log").read_text()
    if FIT:
        line = next(ln for ln in install_log.splitlines() if ln.startswith("fairseq: prebuilt wheel installed in "))
        seconds = line.split()[5]
        against = f"built against torch {image['torch']}, numpy {image['numpy']}, cp312, linux_x86_64"
        assert line == f"fairseq: prebuilt wheel installed in {seconds} s ({against})", install_log
        assert line in summary and "building from the sdist" not in install_log, summary  # device_check's install line
    else:
        why = f"the prebuilt wheel does not fit: torch {image['torch']} here, the wheel was built against torch "
        why += "2.11.0+cu999"
        assert f"fairseq: building from the sdist: {why}\n" in install_log, install_log
        seconds = install_log.split("fairseq: built and installed in ", 1)[1].split()[0]
        assert f"fairseq: built and installed in {seconds} s" in summary, summary
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
    assert "fairseq-fixed==0.12.3.1" in venv_own, venv_own
    install = summary.split("install: exit 0 in ", 1)[1].split()[0]
    print(
        f"\ndevice rehearsal: bundle {size / 2**20:.1f} MiB in {len(bundle_files)} files "
        f"(data: {data['vocab_size']} pieces; fairseq's wheel {(bundle / wheel['file']).stat().st_size / 2**20:.1f} "
        f"MiB, built here in {wheel['built_with']['seconds']} s); network "
        f"{'removed (unshare -n, loopback only)' if offline else 'still up (--no-index only)'}; "
        f"device_check.sh {wall:.0f} s: install {install} s, of it fairseq "
        f"{'prebuilt, installed' if FIT else 'built from the sdist'} in {seconds} s; "
        f"{time.monotonic() - start:.0f} s in all\n" + summary
    )
