"""Shared helpers for the tests: real sentencepiece + real fairseq-preprocess."""

import os
import re
import subprocess
import sys
from pathlib import Path

import sentencepiece as spm

REPO = Path(__file__).resolve().parents[1]
USER_DIR = str(REPO / "seed_fairseq")
DEMO_CORPUS = REPO / "examples" / "data" / "demo_corpus.txt"
SHARED = REPO.parent / "shared"
WIKI_SAMPLE = SHARED / "data" / "enwiki-sample-206-pages.xml.bz2"
BIN = Path(sys.executable).parent


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


def sentences(paragraph):
    """Rough sentence split: fairseq's "complete" mode needs lines shorter than a block."""
    return [s for s in re.split(r"(?<=[.!?])\s+", paragraph.strip()) if s]


def split_documents(text):
    return [d for d in text.split("\n\n") if d.strip()]


def build_data_bin(text_file, out_dir, vocab_size=500, valid_docs=3, test_docs=2):
    """sentencepiece BPE + XLM-R style dict.txt + fairseq-preprocess (mmap)."""
    out = Path(out_dir)
    raw = out / "raw"
    raw.mkdir(parents=True, exist_ok=True)
    docs = split_documents(Path(text_file).read_text(encoding="utf-8"))
    splits = {
        "valid": docs[:valid_docs],
        "test": docs[valid_docs : valid_docs + test_docs],
        "train": docs[valid_docs + test_docs :],
    }
    spm.SentencePieceTrainer.train(
        input=str(text_file),
        model_prefix=str(out / "spm"),
        vocab_size=vocab_size,
        model_type="bpe",
        byte_fallback=True,
        character_coverage=1.0,
        num_threads=2,
        minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_file=str(out / "spm.model"))
    with open(out / "dict.txt", "w", encoding="utf-8") as f:
        for i in range(3, sp.get_piece_size()):
            f.write(f"{sp.id_to_piece(i)} 1\n")
    for name, split_docs in splits.items():
        with open(raw / f"{name}.txt", "w", encoding="utf-8") as f:
            for d in split_docs:
                for line in d.splitlines():
                    for sent in sentences(line):
                        f.write(" ".join(sp.encode(sent, out_type=str)) + "\n")
                f.write("\n")
    check(
        [
            cli("fairseq-preprocess"),
            "--only-source",
            "--srcdict",
            out / "dict.txt",
            "--trainpref",
            raw / "train.txt",
            "--validpref",
            raw / "valid.txt",
            "--testpref",
            raw / "test.txt",
            "--destdir",
            out,
            "--workers",
            "1",
            "--dataset-impl",
            "mmap",
        ]
    )
    return out


TINY_MODEL_ARGS = [
    "--arch",
    "seed_encoder_tiny",
    "--encoder-layers",
    "2",
    "--encoder-embed-dim",
    "32",
    "--encoder-ffn-embed-dim",
    "37",
    "--encoder-attention-heads",
    "2",
    "--decoder-layers",
    "2",
]


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


def train_cmd(data, save_dir, *extra, max_update=20, tokens_per_sample=64, batch_size=8, optim=ADAM):
    return [
        cli("fairseq-train"),
        data,
        "--user-dir",
        USER_DIR,
        "--task",
        "seed_pretrain",
        "--criterion",
        "seed_pretrain",
        *TINY_MODEL_ARGS,
        "--tokens-per-sample",
        str(tokens_per_sample),
        "--batch-size",
        str(batch_size),
        *optim,
        "--max-update",
        str(max_update),
        "--log-format",
        "json",
        "--log-interval",
        "1",
        "--save-dir",
        save_dir,
        "--cpu",
        "--seed",
        "3",
        "--num-workers",
        "0",
        "--no-epoch-checkpoints",
        "--disable-validation",
        *extra,
    ]
