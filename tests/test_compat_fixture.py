"""A checkpoint written by seed_fairseq 0.1 still loads, resumes and exports to
the same numbers (tests/fixtures/seed_fairseq_0.1/README.md says how it was made)."""

import json
import shutil
import sys

import pytest
import torch
from helpers import REPO, check, cli, fairseq_train

FIXTURE = REPO / "tests" / "fixtures" / "seed_fairseq_0.1"
CKPT = FIXTURE / "checkpoint_1_3.pt"
DATA = FIXTURE / "data-bin"
EXPECTED = json.loads((FIXTURE / "expected.json").read_text())

TRAIN_ARGS = [
    "--task",
    "seed_pretrain",
    "--criterion",
    "seed_pretrain",
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
    "1",
    "--tokens-per-sample",
    "64",
    "--sample-break-mode",
    "none",
    "--batch-size",
    "4",
    "--update-freq",
    "2",
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
    "2",
    "--total-num-update",
    "20",
    "--clip-norm",
    "1.0",
    "--weight-decay",
    "0.01",
    "--max-update",
    "5",
    "--log-format",
    "json",
    "--log-interval",
    "1",
    "--cpu",
    "--seed",
    "3",
    "--num-workers",
    "0",
    "--no-epoch-checkpoints",
    "--disable-validation",
    "--save-interval-updates",
    "3",
]


def _tokens():
    return torch.tensor(EXPECTED["tokens"])


def test_old_checkpoint_loads_with_the_same_outputs():
    from fairseq import checkpoint_utils

    import seed_fairseq  # noqa: F401

    (model,), _ = checkpoint_utils.load_model_ensemble([str(CKPT)], arg_overrides={"data": str(DATA)})
    model.eval()
    tokens = _tokens()
    with torch.no_grad():
        features, _ = model(tokens, features_only=True)
        _, extra = model(tokens, prev_output_tokens=tokens[:, :-1])
        decoder_logits = torch.nn.functional.linear(extra["decoder_features"], *model.decoder_projection())
    torch.testing.assert_close(features, torch.tensor(EXPECTED["features"]), rtol=0, atol=1e-6)
    assert float(decoder_logits.sum()) == pytest.approx(EXPECTED["decoder_logits_sum"], rel=1e-6)


@pytest.mark.slow
def _resume(tmp_path, *extra):
    shutil.copy(CKPT, tmp_path / "checkpoint_last.pt")
    proc = check(fairseq_train(DATA, *TRAIN_ARGS, *extra, save_dir=tmp_path))
    log = proc.stderr + proc.stdout
    assert "@ 3 updates" in log
    records = [
        json.loads(line.split("| train_inner | ", 1)[1]) for line in log.splitlines() if "| train_inner | " in line
    ]
    return [{k: r[k] for k in EXPECTED["next_updates"][0]} for r in records]


@pytest.mark.slow
def test_old_checkpoint_resumes_with_the_same_next_losses(tmp_path):
    # fairseq's masked window attention draws 0.1's attention-dropout random numbers: bit-identical
    assert _resume(tmp_path, "--decoder-attention-impl", "masked") == EXPECTED["next_updates"]


@pytest.mark.slow
def test_old_checkpoint_resumes_with_the_banded_window(tmp_path):
    """The default banded window draws attention dropout for the allowed scores only: the same
    training, other random numbers, so the next losses are close to 0.1's, not equal."""
    got = _resume(tmp_path)
    assert len(got) == len(EXPECTED["next_updates"])
    for g, e in zip(got, EXPECTED["next_updates"]):
        for k in ("loss", "dec_loss"):
            if k in e:
                assert float(g[k]) == pytest.approx(float(e[k]), rel=0.05), (k, g, e)


@pytest.mark.slow
def test_old_checkpoint_exports_to_the_same_features(tmp_path):
    from transformers import AutoModel

    check(
        [
            sys.executable,
            str(REPO / "examples" / "export_to_hf.py"),
            "--checkpoint",
            CKPT,
            "--data",
            DATA,
            "--out",
            tmp_path / "hf",
        ],
        env={"HF_HUB_OFFLINE": "1"},
    )
    check([cli("seed-drop-decoder"), CKPT, tmp_path / "encoder.pt", "--data", DATA])
    hf = AutoModel.from_pretrained(tmp_path / "hf").eval()
    tokens = _tokens()
    with torch.no_grad():
        features = hf(input_ids=tokens, attention_mask=tokens.ne(1).long()).last_hidden_state
    expected = torch.tensor(EXPECTED["features"])
    keep = tokens.ne(1)
    torch.testing.assert_close(features[keep], expected[keep], rtol=0, atol=1e-5)


# the model card 0.1's export wrote into its folder (seed_fairseq/hf/export.py at 0.1), its first lines
CARD_0_1 = """---
library_name: transformers
tags: [seed-encoder, dense-retrieval, fairseq, sentence-transformers]
license: mit
---

# SEED-Encoder (exported from fairseq)

A RoBERTa-style encoder pre-trained with MLM plus a weak decoder that reconstructs the
input from the [CLS] vector alone (SEED-Encoder, Lu et al., EMNLP 2021), trained with
`seed_fairseq`. Exported as **XLMRobertaModel (encoder only)**; the decoder is not included.
"""


def test_a_folder_0_1s_export_wrote_is_scored_as_0_1_did(tmp_path):
    """0.1's export kept no record: sentence-transformers wrote its default "cosine" beside [CLS] pooling,
    and the model card said [CLS] and dot product. The retrieval tools score such a folder by the dot
    product, as 0.1 did; the same folder without 0.1's card is a model from elsewhere (cosine)."""
    from test_retrieval import make_tiny_model

    from seed_fairseq.encoders.retrieval.search import load_model, similarity

    model = make_tiny_model(tmp_path)  # [CLS] pooling, no Normalize, "cosine" written by sentence-transformers
    assert json.loads((model / "config_sentence_transformers.json").read_text())["similarity_fn_name"] == "cosine"
    assert similarity(load_model(str(model), "cpu")) == "cosine"
    (model / "README.md").write_text(CARD_0_1, encoding="utf-8")
    assert similarity(load_model(str(model), "cpu")) == "dot"
