"""Shared helpers for the tests: real sentencepiece + real fairseq-preprocess."""

import os
import subprocess
import sys
from pathlib import Path

from objectives import BY_NAME, TINY_ENCODER

# the tests' USER_DIR and command lines: the kit's builder, as the workflows build theirs
from seed_fairseq.base.user_dir import USER_DIR, parse_argv  # noqa: F401
from seed_fairseq.workflows.kit.argv import GENERATOR, SGD_ONE_STEP, command, train_args  # noqa: F401

REPO = Path(__file__).resolve().parents[1]
DEMO_CORPUS = REPO / "examples" / "data" / "demo_corpus.txt"
SHARED = REPO.parent / "shared"
WIKI_SAMPLE = SHARED / "data" / "enwiki-sample-206-pages.xml.bz2"
BIN = Path(sys.executable).parent


def load_driver(relpath):
    """A command-line driver under examples/ as a module (they are scripts, not a package)."""
    import importlib.util

    path = REPO / relpath
    spec = importlib.util.spec_from_file_location(f"driver_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def cli(name):
    return str(BIN / name)


def run(cmd, **kwargs):
    """Run a command; on failure show its output in the assertion message."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", OMP_NUM_THREADS="1")
    env.update(kwargs.pop("env", {}))
    kwargs.setdefault("timeout", 900)  # a hung command fails its test instead of CI
    proc = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env, **kwargs)
    return proc


def check(cmd, **kwargs):
    proc = run(cmd, **kwargs)
    assert proc.returncode == 0, f"{cmd}\nSTDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-6000:]}"
    return proc


def build_data_bin(text_file, out_dir, vocab_size=500, valid_docs=3, test_docs=2, **options):
    """The project's own preprocessing (``preprocess.build``, in-process): sentencepiece
    BPE, the XLM-R id rule, fairseq mmap data, ``preprocess.json``."""
    from preprocess.build import build

    return build(
        out_dir,
        text=[text_file],
        vocab_size=vocab_size,
        valid_docs=valid_docs,
        test_docs=test_docs,
        workers=1,
        **options,
    )


TINY_MODEL_ARGS = ["--arch", "seed_encoder_tiny", *TINY_ENCODER, "--decoder-layers", "2"]


ADAM = [
    "--optimizer",
    "adam",
    "--adam-betas",
    "(0.9,0.999)",
    "--adam-eps",
    "1e-6",
    "--lr",
    "1e-3",
    "--lr-scheduler",
    "polynomial_decay",
    "--warmup-updates",
    "5",
    "--total-num-update",
    "200",
    "--clip-norm",
    "1.0",
    "--weight-decay",
    "0.01",
]


def fairseq_train(data, *args, save_dir=None, launcher=()):
    """``[launcher] fairseq-train DATA --user-dir seed_fairseq ARGS [--save-dir SAVE_DIR]``: the
    tests' one way to write a fairseq-train command (``kit.argv.command``); ``parse_argv(data, args)``
    is the same without the program, for fairseq's parser in-process."""
    return command(data, args, save_dir=save_dir, launcher=launcher)


# what a tiny run of the tests sets besides the model and the optimizer
def tiny_run(max_update=20, tokens_per_sample=64, batch_size=8, seed=3):
    return [
        "--tokens-per-sample", str(tokens_per_sample), "--batch-size", str(batch_size),
        "--max-update", str(max_update), "--cpu", "--seed", str(seed), "--num-workers", "0",
        "--no-epoch-checkpoints", "--disable-validation",
    ]  # fmt: skip


def train_cmd(data, save_dir, *extra, max_update=20, tokens_per_sample=64, batch_size=8, optim=ADAM):
    """SEED's tiny encoder for ``max_update`` updates (json log every update), then ``extra``."""
    seed = train_args(
        BY_NAME["seed"].description, *optim, *tiny_run(max_update, tokens_per_sample, batch_size),
        "--log-format", "json", "--log-interval", "1", *extra,
        model=TINY_ENCODER, arch="seed_encoder_tiny", own=["--decoder-layers", "2"],
    )  # fmt: skip
    return fairseq_train(data, *seed, save_dir=save_dir)
