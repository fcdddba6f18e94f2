"""An earlier output folder resumes: the stage fingerprints of fixed plans of the comparison, the
adaptation and the study, pinned (issue 45 item 1).

A rerun reuses a stage exactly when its fingerprint is the one it was finished with
(``preprocess.stages``): the stage's name, the plan fields it declares and their values, the
stages it reads.  These are the fingerprints every stage of five fixed plans had before the
workflows' shared stages moved into ``kit/pipeline.py``, computed without running anything, with
the run's own paths written ``ROOT`` and ``REPO`` and each external input's content standing as its
name (a folder's fingerprint holds its files' mtimes).  A change that alters one makes every
earlier folder redo that stage and what reads it: then it is deliberate, and the literal is
updated with the reason.
"""

import json
from dataclasses import replace

import pytest
from helpers import DEMO_CORPUS, REPO
from hf_models import save_sentence_model

from preprocess.stages import Runner
from seed_fairseq.base.derived_set import derive_retrieval_set
from seed_fairseq.workflows.adapt import cli as adapt_cli
from seed_fairseq.workflows.adapt import study
from seed_fairseq.workflows.adapt.pipeline import Adaptation
from seed_fairseq.workflows.compare import cli as compare_cli
from seed_fairseq.workflows.compare.pipeline import Comparison

TINY_ENC = "--encoder-layers 2 --encoder-embed-dim 32 --encoder-ffn-embed-dim 37 --encoder-attention-heads 2"
GEN = "--encoder-layers 1 --encoder-embed-dim 16 --encoder-ffn-embed-dim 23 --encoder-attention-heads 2"
COMPARE = ["--objectives", "seed,mlm,simlm", "--vocab-size", "400", "--valid-docs", "4", "--updates", "4", "--warmup",
           "1", "--generator-args", GEN, "--generator-updates", "2", "--tokens-per-sample", "48", "--batch-size", "8",
           "--validate-every", "2", "--probe-size", "16", "--ft-epochs", "1", "--fractions", "0.3,1", "--cos-lengths",
           "16,32,64", "--cos-pairs", "8", "--resamples", "50", "--max-seq-length", "48", "--k", "100"]  # fmt: skip
ADAPT = ["--updates", "4", "--batch-size", "8", "--validate-every", "2", "--probe-size", "16", "--resamples", "100",
         "--ft-batch-size", "8"]  # fmt: skip


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    """The inputs: a tiny sentence-transformers BERT, a BEIR set derived from the demo corpus."""
    root = tmp_path_factory.mktemp("fingerprints")
    save_sentence_model(root / "bert", "mean", normalize=True)
    derive_retrieval_set(DEMO_CORPUS, root / "beir", seed=1)
    return root


def fingerprints(pipeline, root):
    """{stage: the first 16 hex digits of its fingerprint}, paths written ROOT and REPO, inputs by name."""

    def fixed(options):
        text = json.dumps(dict(options)).replace(str(root), "ROOT").replace(str(REPO), "REPO")
        return json.loads(text)

    stages = [replace(s, options=fixed(s.options)) for s in pipeline.stages()]
    fps = Runner(root, stages, {name: name for name in pipeline.external()}).fingerprints
    return {s.name: fps[s.name][:16] for s in stages}


def compare_plan(root, *extra):
    argv = ["--out", str(root / "cmp"), "--corpus", str(DEMO_CORPUS), *COMPARE, *extra]
    return Comparison(compare_cli.build_plan(compare_cli.parser().parse_args(argv), argv, "test"))


def adapt_plan(root, *extra):
    argv = ["--model", str(root / "bert"), "--corpus", str(DEMO_CORPUS), "--out", str(root / "ad"), *ADAPT, *extra]
    return Adaptation(adapt_cli.build_plan(adapt_cli.parser().parse_args(argv), argv, "test"))


def study_plan(root, *extra):
    argv = ["--model", str(root / "bert"), "--corpus", str(DEMO_CORPUS), "--out", str(root / "st"),
            "--updates", "4", "--batch-size", "8", "--resamples", "100", "--ft-batch-size", "8", *extra]  # fmt: skip
    return study.Study(*study.build(study.parser().parse_args(argv), argv, "test"))


PLANS = {
    "compare": lambda root: compare_plan(root, "--encoder-args", TINY_ENC),
    "compare --init --retrieval-data": lambda root: compare_plan(
        root, "--init", str(root / "bert"), "--retrieval-data", str(root / "beir"), "--objectives", "seed,simlm"
    ),
    "adapt --train-queries": lambda root: adapt_plan(
        root, "--objective", "seed", "--train-queries", str(root / "beir")
    ),
    "adapt --retrieval-dev simlm": lambda root: adapt_plan(
        root, "--objective", "simlm", "--retrieval-dev", str(root / "beir")
    ),
    "study": lambda root: study_plan(root, "--objectives", "seed,simlm", "--arms", "none,safeguarded", "--seeds", "1"),
}

# computed before the refactor of issue 45 item 1 (kit/pipeline.py), from the code of 83c1e7c
PINNED = {
    "compare": {
        "data": "aa1bc20793bb0a87",
        "retrieval": "2696c130143b6476",
        "bm25": "b5b9b1e482ff9ff4",
        "generator": "be7a114c529cd4de",
        "flops": "8896ecd059d3fc77",
        "pretrain-seed-s1": "50fbbbced510cc96",
        "export-seed-s1": "81ede3d4a0aec88d",
        "eval-seed-s1": "df684783256743d0",
        "pretrain-mlm-s1": "fa9f4a34582ea15c",
        "export-mlm-s1": "caebba1035648a4c",
        "eval-mlm-s1": "8a9b8fae49d6e22a",
        "pretrain-simlm-s1": "68c2bfb556a9a639",
        "export-simlm-s1": "ee03f86779c09699",
        "eval-simlm-s1": "c1bd900c28de7bcc",
    },
    "compare --init --retrieval-data": {
        "import": "763979ecb8053fd1",
        "data": "909ff024fc19d916",
        "bm25": "fc5d2cfa625eaaae",
        "roundtrip": "74fdc3014c799230",
        "generator": "9f9e311d00471486",
        "flops": "9d9a1350ab1b797d",
        "pretrain-seed-s1": "8f1b3d34aacb1f3d",
        "export-seed-s1": "29f5f8c2bf38079b",
        "eval-seed-s1": "f3b462f9641158a4",
        "pretrain-simlm-s1": "55a59ef6576c11fd",
        "export-simlm-s1": "388d6425513bfd5b",
        "eval-simlm-s1": "ee2c5b08e3f7939f",
    },
    "adapt --train-queries": {
        "import": "839db5a5cd943b53",
        "split": "bdf7ee335a7c8e56",
        "retrieval": "8b88f5475fbe944e",
        "data": "70bd43a31609bbd2",
        "pretrain": "f771dde5db7163d2",
        "export": "29835691fab80380",
        "roundtrip": "4091cb12c9de829e",
        "bm25": "b2ab4117ac849dc7",
        "zeroshot-original": "4bb5e359ccb677ea",
        "finetune-original": "d9af2a63efa94ae8",
        "zeroshot-adapted": "cdecf61fb6a997ab",
        "finetune-adapted": "8489882515fea5ac",
        "report": "0bea27cbfd4fec70",
    },
    "adapt --retrieval-dev simlm": {
        "import": "839db5a5cd943b53",
        "data": "787b73d74f79ed87",
        "generator": "7bf0d4e1b75cb889",
        "pretrain": "c56708f42ed6238d",
        "export": "f71699783453bb66",
        "roundtrip": "e5573b5ee91d286c",
        "bm25": "cdea130799817881",
        "zeroshot-original": "a717d53812b1cab4",
        "zeroshot-adapted": "c5d1600b49927b11",
        "report": "e39afa1e41d1684c",
    },
    "study": {
        "import": "839db5a5cd943b53",
        "split": "bdf7ee335a7c8e56",
        "retrieval": "8b88f5475fbe944e",
        "data": "10efa431288af194",
        "generator": "3fb922c986b98d5b",
        "roundtrip": "4091cb12c9de829e",
        "bm25": "b2ab4117ac849dc7",
        "zeroshot-original": "4bb5e359ccb677ea",
        "finetune-original-s1": "c2c568ec45f23b2c",
        "pretrain-seed-none-s1": "40b454d7e196b93e",
        "export-seed-none-s1": "9dc45623fec675ad",
        "zeroshot-seed-none-s1": "996d1cb8432313a9",
        "finetune-seed-none-s1": "446b1827920336f2",
        "pretrain-simlm-none-s1": "8aeb02c38b488924",
        "export-simlm-none-s1": "aca6db12029a502c",
        "zeroshot-simlm-none-s1": "dfe067b79edd6bf5",
        "finetune-simlm-none-s1": "17a71c9669981b96",
        "pretrain-seed-safeguarded-s1": "09bf11654d7eec74",
        "export-seed-safeguarded-s1": "ebd11ff985b2a093",
        "zeroshot-seed-safeguarded-s1": "01923f10addc58a9",
        "finetune-seed-safeguarded-s1": "95994b02e5440d6f",
        "pretrain-simlm-safeguarded-s1": "09d05b6bd8a044e9",
        "export-simlm-safeguarded-s1": "77200bcc6bfb5230",
        "zeroshot-simlm-safeguarded-s1": "81918755113322fb",
        "finetune-simlm-safeguarded-s1": "f14924912f1cf17a",
        "report": "ebcf550b8a5fd3bf",
    },
}


@pytest.mark.parametrize("name", list(PLANS))
def test_every_stage_keeps_its_fingerprint(root, name):
    # in the same order too: the order the stages run in
    assert list(fingerprints(PLANS[name](root), root).items()) == list(PINNED[name].items())
