"""What 0.1 users wrote keeps working, wherever the modules behind it live: ``--user-dir
seed_fairseq`` and the registry names it registers, ``python -m preprocess.build``, the console
scripts and the entry points of setup.py, and the module ``seed_fairseq.compat``."""

import json
import subprocess
import sys

from helpers import REPO, USER_DIR

# what 0.1 (commit a2e7ff9) registered
TASKS_0_1 = ["seed_pretrain"]
CRITERIONS_0_1 = ["seed_pretrain"]
ARCHS_0_1 = ["seed_encoder", "seed_encoder_base", "seed_encoder_mlm_only", "seed_encoder_tiny"] + [
    f"weak_decoder_{layers}{window}" for layers in ("l1_", "l3_", "l5_", "") for window in ("k2", "k8", "full")
]

# fairseq-train's own loading of a user dir, then every entry point of setup.py, in a fresh interpreter
PROBE = """
import argparse, json, sys
from importlib.metadata import entry_points
from fairseq.utils import import_user_module
import_user_module(argparse.Namespace(user_dir=sys.argv[1]))
from fairseq.criterions import CRITERION_REGISTRY
from fairseq.models import ARCH_MODEL_REGISTRY
from fairseq.tasks import TASK_REGISTRY
import seed_fairseq.compat
points = {}
for group in ("console_scripts", "seed_fairseq.representations", "seed_fairseq.exporters"):
    for ep in entry_points(group=group):
        if ep.value.startswith("seed_fairseq"):
            points[f"{group}:{ep.name}"] = callable(ep.load()) or type(ep.load()).__name__
print(json.dumps({"tasks": sorted(TASK_REGISTRY), "criterions": sorted(CRITERION_REGISTRY),
                  "archs": sorted(ARCH_MODEL_REGISTRY), "install": callable(seed_fairseq.compat.install),
                  "points": points}))
"""


def test_user_dir_registry_names_and_entry_points():
    out = subprocess.run([sys.executable, "-c", PROBE, USER_DIR], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert set(TASKS_0_1) <= set(got["tasks"])
    assert set(CRITERIONS_0_1) <= set(got["criterions"])
    assert set(ARCHS_0_1) <= set(got["archs"])
    assert got["install"]
    points = got["points"]
    assert points["console_scripts:seed-drop-decoder"] is True  # 0.1's command
    assert points["console_scripts:seed-drop-heads"] is True
    assert set(points) >= {"seed_fairseq.representations:dupmae", "seed_fairseq.exporters:dupmae"}


def test_the_0_1_head_dropping_module():
    """0.1's README documented ``python -m seed_fairseq.drop_decoder`` and ``drop_decoder(state) -> state``."""
    from seed_fairseq.drop_decoder import drop_decoder
    from seed_fairseq.encoders.drop_heads import drop_heads

    assert drop_decoder is drop_heads
    out = subprocess.run([sys.executable, "-m", "seed_fairseq.drop_decoder", "--help"], capture_output=True, text=True)
    assert out.returncode == 0 and out.stdout.startswith("usage:") and "checkpoint" in out.stdout, out.stderr[-2000:]


def test_preprocess_build_runs_as_a_module():
    out = subprocess.run(
        [sys.executable, "-m", "preprocess.build", "--help"], cwd=REPO / "tests", capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.startswith("usage:") and "--out" in out.stdout
