"""Fault injection for the HuggingFace import and export (examples/import_from_hf.py,
examples/export_to_hf.py): fp16 / bf16 models, and model folders broken in every way the
import reads them.

Every refusal is checked through the command's ``main(argv)`` in-process: exit status 2,
exactly one ``error: FILE: problem`` line naming the file at fault, no traceback, and
nothing written.  The tiny models come from ``hf_models.py``.
"""

import json
import shutil

import pytest
import torch
from helpers import load_driver
from hf_models import save_bert, save_roberta

from seed_fairseq.pretrain.checkpoint import load_torch_file

import_cli = load_driver("examples/import_from_hf.py")
export_cli = load_driver("examples/export_to_hf.py")


@pytest.fixture(scope="module")
def roberta(tmp_path_factory):
    return save_roberta(tmp_path_factory.mktemp("hf_faults") / "roberta")


def refused(capsys, code, *names):
    """Exit 2, one ``error:`` line naming each of ``names``, no traceback; the line."""
    out, err = capsys.readouterr()
    assert code == 2, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
    assert not out.strip(), f"a refused run printed a result: {out}"
    errors = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(errors) == 1, err[-3000:]
    for name in names:
        assert str(name) in errors[0], (name, errors[0])
    return errors[0]


def broken_copy(src, dst, config=None, files=None, remove=()):
    """A copy of the model folder ``src`` with config.json edited (``config(dict)`` returns
    the new JSON value, or edits in place), files replaced (name -> text or bytes) and
    files removed."""
    shutil.copytree(src, dst)
    if config is not None:
        cfg = json.loads((dst / "config.json").read_text())
        new = config(cfg)
        (dst / "config.json").write_text(json.dumps(cfg if new is None else new))
    for name in remove:
        (dst / name).unlink()
    for name, content in (files or {}).items():
        (dst / name).write_bytes(content if isinstance(content, bytes) else content.encode())
    return dst


def import_argv(model, out):
    return ["--model", str(model), "--out", str(out)]


# ---------------------------------------------------------------------------
# defect 9: fp16 / bf16 models import, compared in fp32, written in fp32
# ---------------------------------------------------------------------------


def test_fp16_model_imports_in_fp32(roberta, tmp_path):
    """transformers 5 loaded the fp16 reference in fp16: the comparison failed at 6e-3
    with a message that suggested a mapping bug."""
    from transformers import AutoModelForMaskedLM

    half = tmp_path / "roberta-fp16"
    shutil.copytree(roberta, half)
    AutoModelForMaskedLM.from_pretrained(str(roberta)).half().save_pretrained(str(half))
    from safetensors import safe_open

    with safe_open(str(half / "model.safetensors"), "pt") as f:
        assert f.get_slice(next(iter(f.keys()))).get_dtype() == "F16"  # the folder holds fp16

    out = tmp_path / "imported"
    assert import_cli.main(import_argv(half, out)) == 0
    record = json.loads((out / "seed_fairseq_import.json").read_text())
    assert record["source_dtype"] == "float16"
    assert record["max_abs_diff"] <= 1e-5
    state = load_torch_file(out / "checkpoint.pt")
    assert state["extra_state"]["seed_fairseq"]["source_dtype"] == "float16"
    floats = {v.dtype for v in state["model"].values() if v.is_floating_point()}
    assert floats == {torch.float32}  # the checkpoint holds fp32 weights


def test_bf16_weights_are_read_as_fp32_and_the_reference_loads_in_fp32(roberta, tmp_path):
    from transformers import AutoModel

    from seed_fairseq.encoders.hf.import_ import _load_hf, read_source

    brain = tmp_path / "roberta-bf16"
    shutil.copytree(roberta, brain)
    AutoModel.from_pretrained(str(roberta)).to(torch.bfloat16).save_pretrained(str(brain))
    source = read_source(brain)
    assert source.stored_dtype == "bfloat16"
    assert {v.dtype for v in source.weights.values()} == {torch.float32}
    assert next(_load_hf(AutoModel, brain).parameters()).dtype == torch.float32


# ---------------------------------------------------------------------------
# defect 10 (HF folders): every broken part of a model folder is one line naming its file
# ---------------------------------------------------------------------------


def _set(key, value):
    def edit(cfg):
        cfg[key] = value

    return edit


def _drop(key):
    def edit(cfg):
        del cfg[key]

    return edit


def _sharded(index):
    """model.safetensors replaced by the index text ``index`` (and no shard)."""
    return dict(remove=["model.safetensors"], files={"model.safetensors.index.json": index})


CONFIG_FAULTS = {
    "list": dict(config=lambda cfg: [cfg]),
    "not-json": dict(files={"config.json": '{"hidden_size": '}),
    **{
        f"no-{key}": dict(config=_drop(key))
        for key in (
            "hidden_size",
            "num_hidden_layers",
            "num_attention_heads",
            "intermediate_size",
            "max_position_embeddings",
            "vocab_size",
        )
    },
    "hidden_size-string": dict(config=_set("hidden_size", "32")),
    "num_hidden_layers-float": dict(config=_set("num_hidden_layers", 2.0)),
    "num_hidden_layers-bool": dict(config=_set("num_hidden_layers", True)),
    "num_attention_heads-zero": dict(config=_set("num_attention_heads", 0)),
    "intermediate_size-negative": dict(config=_set("intermediate_size", -1)),
    "max_position_embeddings-zero": dict(config=_set("max_position_embeddings", 0)),
    "layer_norm_eps-string": dict(config=_set("layer_norm_eps", "x")),
    "layer_norm_eps-negative": dict(config=_set("layer_norm_eps", -1e-5)),
    "hidden_dropout_prob-above-1": dict(config=_set("hidden_dropout_prob", 1.5)),
    "hidden_act-number": dict(config=_set("hidden_act", 3)),
    "hidden_act-list": dict(config=_set("hidden_act", ["gelu"])),
    "model_type-list": dict(config=_set("model_type", ["roberta"])),
    # sizes that disagree with the weights: config.json's fault, not the tokenizer's or the weights'
    "vocab_size-wrong": dict(config=lambda cfg: cfg.update(vocab_size=cfg["vocab_size"] + 8)),
    "hidden_size-wrong": dict(config=_set("hidden_size", 64)),
    "num_hidden_layers-more": dict(config=_set("num_hidden_layers", 3)),
    "num_hidden_layers-fewer": dict(config=_set("num_hidden_layers", 1)),
    "intermediate_size-wrong": dict(config=_set("intermediate_size", 36)),
    "max_position_embeddings-wrong": dict(config=_set("max_position_embeddings", 96)),
}
INDEX = "model.safetensors.index.json"
FILE_FAULTS = {
    # (how to break the folder, the file the error must name)
    "index-not-json": (_sharded('{"weight_map": '), INDEX),
    "index-a-list": (_sharded("[1, 2]"), INDEX),
    "index-without-weight_map": (_sharded('{"metadata": {}}'), INDEX),
    "index-names-a-missing-shard": (_sharded('{"weight_map": {"a": "model-00001-of-00002.safetensors"}}'), INDEX),
    "index-names-a-path": (_sharded('{"weight_map": {"a": "../elsewhere.safetensors"}}'), INDEX),
    "shard-not-safetensors": (
        dict(
            remove=["model.safetensors"],
            files={INDEX: '{"weight_map": {"a": "shard.safetensors"}}', "shard.safetensors": b"\x00not safetensors"},
        ),
        "shard.safetensors",
    ),
    "weights-not-safetensors": (dict(files={"model.safetensors": b"garbage"}), "model.safetensors"),
    "tokenizer-json-corrupt": (dict(files={"tokenizer.json": '{"version": '}), "tokenizer.json"),
    "tokenizer-config-a-list": (dict(files={"tokenizer_config.json": "[]"}), "tokenizer_config.json"),
}


@pytest.mark.parametrize("fault", sorted(CONFIG_FAULTS))
def test_import_refuses_a_broken_config(roberta, tmp_path, capsys, fault):
    model = broken_copy(roberta, tmp_path / "model", **CONFIG_FAULTS[fault])
    out = tmp_path / "out"
    line = refused(capsys, import_cli.main(import_argv(model, out)), model / "config.json")
    if fault.startswith("no-"):
        assert fault[3:] in line
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["model"]


@pytest.mark.parametrize("fault", sorted(FILE_FAULTS))
def test_import_refuses_broken_weights_and_tokenizer_files(roberta, tmp_path, capsys, fault):
    how, name = FILE_FAULTS[fault]
    model = broken_copy(roberta, tmp_path / "model", **how)
    out = tmp_path / "out"
    refused(capsys, import_cli.main(import_argv(model, out)), model / name)
    assert not out.exists() and sorted(p.name for p in tmp_path.iterdir()) == ["model"]


@pytest.mark.parametrize("missing", [["tokenizer.json"], ["tokenizer.json", "tokenizer_config.json"]])
def test_import_refuses_a_folder_without_its_tokenizer(roberta, tmp_path, capsys, missing):
    """transformers builds a 5-token tokenizer for such a folder."""
    model = broken_copy(roberta, tmp_path / "model", remove=missing)
    line = refused(capsys, import_cli.main(import_argv(model, tmp_path / "out")), model)
    assert "no usable tokenizer: it has only its 5 special tokens" in line
    assert not (tmp_path / "out").exists()


def test_preprocess_refuses_a_tokenizer_folder_without_its_tokenizer(roberta, tmp_path):
    """preprocess.build --tokenizer shares the loader: it encoded every word as <unk>."""
    from helpers import DEMO_CORPUS

    from preprocess.build import build
    from preprocess.errors import PreprocessError

    model = broken_copy(roberta, tmp_path / "model", remove=["tokenizer.json", "tokenizer_config.json"])
    with pytest.raises(PreprocessError, match="no usable tokenizer"):
        build(tmp_path / "data", text=[DEMO_CORPUS], tokenizer=model)
    assert not (tmp_path / "data").exists()


def test_import_of_bert_without_its_tokenizer(tmp_path, capsys):
    model = save_bert(tmp_path / "bert")
    for name in ("tokenizer.json", "tokenizer_config.json"):
        (model / name).unlink()
    assert "no usable tokenizer" in refused(capsys, import_cli.main(import_argv(model, tmp_path / "out")), model)


@pytest.mark.parametrize("cli", ["import", "export"])
def test_out_below_a_file_is_refused_before_any_work(roberta, tmp_path, capsys, cli):
    blocker = tmp_path / "file"
    blocker.write_text("mine")
    out = blocker / "sub"
    if cli == "import":
        code = import_cli.main(import_argv(roberta, out))
    else:  # refused before the checkpoint is even looked at
        code = export_cli.main(["--checkpoint", str(tmp_path / "none.pt"), "--data", str(tmp_path), "--out", str(out)])
    assert "not a folder" in refused(capsys, code, blocker)
    assert blocker.read_text() == "mine"


def test_tokenizer_fit_allows_padded_embeddings_only(roberta):
    """Rows beyond the tokenizer are allowed as padding (up to 7, or 1/32 of it), never
    fewer rows than ids, never a near-empty tokenizer."""
    from transformers import AutoTokenizer

    from seed_fairseq.base.vocabulary.tokenizer import TokenizerError, check_tokenizer_fits

    tok = AutoTokenizer.from_pretrained(str(roberta))
    n = len(tok)  # 402: up to 12 spare rows
    for rows in (n, n + 7, n + n // 32):
        check_tokenizer_fits(tok, rows, roberta)
    with pytest.raises(TokenizerError, match=f"has {n} tokens for the model's {n + n // 32 + 1}"):
        check_tokenizer_fits(tok, n + n // 32 + 1, roberta)
    with pytest.raises(TokenizerError, match=f"ids up to {n - 1} but .* {n - 1} rows"):
        check_tokenizer_fits(tok, n - 1, roberta)
