"""HuggingFace export: a real fairseq-train checkpoint -> transformers /
sentence-transformers folder that computes what fairseq computes."""

import json
import os
import sys

import pytest
import torch
from helpers import DEMO_CORPUS, REPO, check, cli, run, train_cmd

EXPORT = str(REPO / "examples" / "export_to_hf.py")
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def preprocess(out, vocab):
    check(
        [
            sys.executable,
            "-m",
            "preprocess.build",
            "--text",
            DEMO_CORPUS,
            "--out",
            out,
            "--vocab-size",
            str(vocab),
            "--workers",
            "2",
            "--valid-docs",
            "4",
            "--test-docs",
            "4",
        ],
        cwd=REPO,
    )
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    return preprocess(tmp_path_factory.mktemp("export") / "data-bin", 1000)


def pretrain(data, save_dir, *extra):
    check(train_cmd(data, save_dir, *extra, "--required-batch-size-multiple", "1", max_update=6, tokens_per_sample=96))
    return save_dir / "checkpoint_last.pt"


@pytest.fixture(scope="module")
def checkpoint(data, tmp_path_factory):
    return pretrain(data, tmp_path_factory.mktemp("ckpt"))


def export(ckpt, data, out, *extra):
    return run([sys.executable, EXPORT, "--checkpoint", ckpt, "--data", data, "--out", out, *extra], env=OFFLINE)


@pytest.fixture(scope="module")
def exported(checkpoint, data, tmp_path_factory):
    out = tmp_path_factory.mktemp("hf") / "seed-hf"
    proc = export(checkpoint, data, out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


LOAD_OFFLINE = r"""
import logging, sys, warnings
from transformers import AutoModel, AutoTokenizer
from transformers.utils import logging as hf_logging
from sentence_transformers import SentenceTransformer
hf_logging.set_verbosity_warning()
warnings.simplefilter("always")
AutoModel.from_pretrained(sys.argv[1])
AutoTokenizer.from_pretrained(sys.argv[1])
SentenceTransformer(sys.argv[1], device="cpu")
print("loaded")
"""

REAL_TEXT = [
    "The Rhine rises in the Swiss Alps and flows north to the North Sea.",
    "Sourdough bread is leavened by a culture of wild yeast and lactic acid bacteria.",
    "Café culture in São Paulo, Zürich and Reykjavík — 1755, 3.14 and 42%!",
    "",
    "word " * 300,  # longer than the model (96 positions): truncation
]


def fairseq_model(ckpt, data):
    from fairseq import checkpoint_utils

    import seed_fairseq  # noqa: F401

    (model,), _ = checkpoint_utils.load_model_ensemble([str(ckpt)], arg_overrides={"data": str(data)})
    return model.eval()


def fairseq_ids(text, data):
    import sentencepiece as spm
    from fairseq.data import Dictionary

    from preprocess.text import normalize_line

    d = Dictionary.load(str(data / "dict.txt"))
    sp = spm.SentencePieceProcessor(model_file=str(data / "spm.model"))
    line = normalize_line(text)
    ids = [d.bos()] + [d.index(p) for p in (sp.encode(line, out_type=str) if line else [])] + [d.eos()]
    return ids[:95] + [d.eos()] if len(ids) > 96 else ids


def test_export_loads_offline_without_weight_warnings(exported):
    proc = check([sys.executable, "-c", LOAD_OFFLINE, exported], env=OFFLINE)
    assert "loaded" in proc.stdout
    log = (proc.stderr + proc.stdout).lower()
    for bad in ("newly initialized", "not used", "missing", "unexpected", "not initialized"):
        assert bad not in log, proc.stderr[-2000:]
    files = set(os.listdir(exported))
    assert {"config.json", "model.safetensors", "tokenizer.json", "modules.json", "README.md"} <= files
    pooling = json.loads((exported / "1_Pooling" / "config.json").read_text())
    # sentence-transformers >= 5 writes "pooling_mode"; older versions one flag per mode
    assert pooling.get("pooling_mode") == "cls" or (
        pooling.get("pooling_mode_cls_token") and not pooling.get("pooling_mode_mean_tokens")
    )
    assert not any("Normalize" in m["type"] for m in json.loads((exported / "modules.json").read_text()))


def test_tokenizer_ids_equal_fairseq(exported, data):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(exported)
    for text in REAL_TEXT + ["UPPER case Ünïcödé ﬁ 北京 🙂", "digits 0123456789"]:
        assert tok(text, truncation=True, max_length=96)["input_ids"] == fairseq_ids(text, data), text[:40]
    assert tok.mask_token_id == len(tok) - 1 == 1001 and tok.pad_token_id == 1


def test_features_and_sentence_transformer_equal_fairseq(exported, checkpoint, data):
    from sentence_transformers import SentenceTransformer
    from transformers import AutoModel, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(exported)
    hf = AutoModel.from_pretrained(exported).eval()
    fs = fairseq_model(checkpoint, data)
    batch = tok(REAL_TEXT, padding=True, truncation=True, max_length=96, return_tensors="pt")
    assert batch["attention_mask"].eq(0).any()  # padding in the batch
    with torch.no_grad():
        ours, _ = fs(batch["input_ids"], features_only=True)
        theirs = hf(**batch).last_hidden_state
    keep = batch["attention_mask"].bool()
    assert (ours - theirs).abs()[keep].max() <= 1e-5

    st = SentenceTransformer(str(exported), device="cpu")
    emb = st.encode(REAL_TEXT, convert_to_tensor=True, batch_size=2)
    torch.testing.assert_close(emb, ours[:, 0], rtol=0, atol=1e-5)


def test_mlm_head_export_matches_fairseq_logits(checkpoint, data, tmp_path):
    from transformers import AutoModelForMaskedLM, AutoTokenizer

    proc = export(checkpoint, data, tmp_path / "mlm", "--mlm-head")
    assert proc.returncode == 0, proc.stderr[-3000:]
    tok = AutoTokenizer.from_pretrained(tmp_path / "mlm")
    hf = AutoModelForMaskedLM.from_pretrained(tmp_path / "mlm").eval()
    batch = tok(REAL_TEXT[:3], padding=True, return_tensors="pt")
    with torch.no_grad():
        ours, _ = fairseq_model(checkpoint, data)(batch["input_ids"])
        theirs = hf(**batch).logits
    keep = batch["attention_mask"].bool()
    assert (ours - theirs).abs()[keep].max() <= 1e-4


def test_ablation_arch_and_encoder_only_checkpoints_export(checkpoint, data, tmp_path):
    full = pretrain(data, tmp_path / "full", "--decoder-attention-window", "full", "--decoder-layers", "1")
    assert export(full, data, tmp_path / "full-hf").returncode == 0
    check([cli("seed-drop-decoder"), checkpoint, tmp_path / "encoder.pt"])
    proc = export(tmp_path / "encoder.pt", data, tmp_path / "enc-hf")
    assert proc.returncode == 0, proc.stderr[-3000:]


def _no_partial_output(parent):
    return not any(p.name.startswith(".") and ".tmp-" in p.name for p in parent.iterdir())


def test_prenorm_arch_has_no_exact_hf_equivalent(data, tmp_path):
    ckpt = pretrain(data, tmp_path / "pre", "--encoder-normalize-before")
    proc = export(ckpt, data, tmp_path / "out")
    assert proc.returncode == 2
    assert "has no exact HuggingFace equivalent: encoder_normalize_before=True" in proc.stderr
    assert not (tmp_path / "out").exists() and _no_partial_output(tmp_path)


def test_vocabulary_that_does_not_match_the_checkpoint(checkpoint, tmp_path):
    other = preprocess(tmp_path / "other", 700)
    proc = export(checkpoint, other, tmp_path / "out")
    assert proc.returncode == 2
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {checkpoint}: dictionary size mismatch"), last
    assert "embedding has 1002 rows" in last and f"{other}/dict.txt gives 702 symbols" in last
    assert not (tmp_path / "out").exists() and _no_partial_output(tmp_path)


def test_same_size_foreign_vocabulary_is_refused(checkpoint, data, tmp_path):
    """Same number of pieces, other pieces: the ids would not match the embeddings."""
    docs = DEMO_CORPUS.read_text(encoding="utf-8").split("\n\n")
    text = tmp_path / "half.txt"
    text.write_text("\n\n".join(docs[len(docs) // 2 :]), encoding="utf-8")
    other = tmp_path / "other"
    check(
        [
            sys.executable,
            "-m",
            "preprocess.build",
            "--text",
            text,
            "--out",
            other,
            "--vocab-size",
            "1000",
            "--workers",
            "1",
            "--valid-docs",
            "2",
            "--test-docs",
            "2",
        ],
        cwd=REPO,
    )
    assert len((other / "dict.txt").read_text().splitlines()) == len((data / "dict.txt").read_text().splitlines())
    proc = export(checkpoint, other, tmp_path / "out")
    assert proc.returncode == 2, proc.stderr[-2000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {checkpoint}: trained with a different dictionary than {other}/dict.txt"), last
    assert not (tmp_path / "out").exists() and _no_partial_output(tmp_path)


def test_export_respects_the_umask(checkpoint, data, tmp_path):
    import subprocess

    out = tmp_path / "hf"
    proc = subprocess.run(
        [sys.executable, EXPORT, "--checkpoint", str(checkpoint), "--data", str(data), "--out", str(out)],
        capture_output=True,
        text=True,
        env=dict(os.environ, **OFFLINE),
        preexec_fn=lambda: os.umask(0o007),
        timeout=900,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    modes = {p.relative_to(out).as_posix(): os.stat(p).st_mode & 0o777 for p in [out, *out.rglob("*")]}
    assert modes["."] == 0o770 and modes["model.safetensors"] == 0o660, modes
    assert set(modes.values()) == {0o770, 0o660}, modes


def test_existing_output_needs_force(checkpoint, data, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    # a folder the export did not write is never touched, with or without --force
    for extra in ((), ("--force",)):
        proc = export(checkpoint, data, out, *extra)
        assert proc.returncode == 2 and f"{out}: folder is not empty and was not written by" in proc.stderr
        assert os.listdir(out) == ["keep.txt"] and _no_partial_output(tmp_path)
    out = tmp_path / "out2"
    assert export(checkpoint, data, out).returncode == 0
    proc = export(checkpoint, data, out)
    assert proc.returncode == 2 and f"{out}: holds an earlier export; pass --force" in proc.stderr
    assert export(checkpoint, data, out, "--force").returncode == 0
    assert (out / "model.safetensors").exists() and (out / "seed_fairseq_export.json").exists()
    assert _no_partial_output(tmp_path)
