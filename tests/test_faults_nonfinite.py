"""A broken model is refused, never scored (issue 43 B).

A model whose weights hold NaN or an infinity, whose vectors do (an overflow, a broken head), or
whose fine-tuning diverges used to be scored: faiss drops the -1 ids of NaN scores, the metrics
read 0.0 with exit 0, a diverged fine-tuning saved a NaN model, and adapt's and the study's reports
showed 0.000 rows with "significant" p-values.  Now each is one ``error:`` line and exit 2 in every
tool that reads a model (evaluate.py, finetune.py, the import and with it adapt and compare --init,
the export), and nothing is written.
"""

import json
import math
import shutil

import numpy as np
import pytest
import torch
from hf_models import save_sentence_model
from test_faults_hf import refused
from test_faults_retrieval import beir, evaluate_cli, finetune_cli, listing
from test_retrieval import make_tiny_model

from seed_fairseq.encoders.retrieval import training
from seed_fairseq.encoders.retrieval.index import NonFiniteError, build_index, make_index, search


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("tiny_model_nonfinite"))


def poisoned(src, dst, value=math.nan, weights="model.safetensors"):
    """A copy of the model folder ``src`` with one weight tensor (the last layer's output LayerNorm) set to
    ``value`` everywhere."""
    from safetensors.torch import load_file, save_file

    shutil.copytree(src, dst)
    state = load_file(str(dst / weights))
    name = next(k for k in sorted(state) if k.endswith("output.LayerNorm.weight"))
    state[name] = torch.full_like(state[name], value)
    save_file(state, str(dst / weights), metadata={"format": "pt"})
    return dst, name


@pytest.mark.parametrize("value", [math.nan, math.inf], ids=["nan", "inf"])
def test_evaluate_and_finetune_refuse_a_model_with_non_finite_weights(tiny_model, tmp_path, capsys, value):
    model, tensor = poisoned(tiny_model, tmp_path / "model", value)
    data = beir(tmp_path)
    run_file = tmp_path / "r.trec"
    code = evaluate_cli.main(["--model", str(model), "--data", str(data), "--run", str(run_file)])
    line = refused(capsys, code, model, "weights hold NaN or infinite values", tensor)
    assert not run_file.exists(), line
    train = beir(tmp_path, split="train", name="train")
    before = listing(tmp_path)
    code = finetune_cli.main(["--model", str(model), "--data", str(train), "--out", str(tmp_path / "ft"),
                              "--no-progress"])  # fmt: skip
    refused(capsys, code, model, "weights hold NaN")
    assert listing(tmp_path) == before


def test_non_finite_vectors_are_an_error_naming_the_model_not_a_score_of_0(tiny_model, capsys):
    """Finite weights, vectors that are not (an overflow, a broken module): the encoding refuses them, and
    every faiss index and search refuses them too, whatever encoded them."""
    from test_faults_retrieval import FRUITS

    from seed_fairseq.base.retrieval_data import RetrievalData
    from seed_fairseq.encoders.retrieval.evaluate import evaluate_model
    from seed_fairseq.encoders.retrieval.search import load_model

    model = load_model(str(tiny_model), "cpu")
    handle = model[0].register_forward_hook(lambda m, i, out: {**out, "token_embeddings": out["token_embeddings"]
                                                               * math.inf})  # fmt: skip
    data = RetrievalData({f"d{i}": f"the {w}" for i, w in enumerate(FRUITS)}, {"q": "sweet apple"}, {"q": {"d0": 1}})
    with pytest.raises(NonFiniteError, match=rf"^{tiny_model} \(corpus\): 8 of 8 vectors hold NaN or infinite values"):
        evaluate_model(model, data, k=10, show_progress=False)
    handle.remove()
    assert evaluate_model(model, data, k=10, show_progress=False)[0]  # the same model, unbroken, is scored

    good = np.eye(4, dtype=np.float32)
    for bad in (math.nan, math.inf, -math.inf):
        broken = good.copy()
        broken[2, 1] = bad
        with pytest.raises(NonFiniteError, match="the corpus: 1 of 4 vectors hold NaN"):
            build_index(broken)
        with pytest.raises(NonFiniteError, match="the queries: 1 of 4 vectors hold NaN"):
            search(build_index(good), broken, 2)
    index = make_index(4)
    index.add(good)
    assert search(index, good, 1)[1].ravel().tolist() == [0, 1, 2, 3]


def _diverging(monkeypatch, after: int = 1):
    """fine-tuning whose loss turns NaN at step ``after`` (a hook on the loss, as a too-high learning rate
    would make it)"""
    real = training.make_loss

    def make_loss(model, cfg):
        loss = real(model, cfg)
        calls = [0]

        def hook(module, inputs, output):
            calls[0] += 1
            return output * math.nan if calls[0] >= after else output

        loss.register_forward_hook(hook)
        return loss

    monkeypatch.setattr(training, "make_loss", make_loss)


def test_a_diverged_fine_tuning_is_an_error_and_saves_nothing(tiny_model, tmp_path, capsys, monkeypatch):
    _diverging(monkeypatch, after=2)
    train = beir(tmp_path, split="train", name="train")
    before = listing(tmp_path)
    code = finetune_cli.main(["--model", str(tiny_model), "--data", str(train), "--out", str(tmp_path / "ft"),
                              "--train-batch-size", "2", "--no-progress"])  # fmt: skip
    line = refused(capsys, code, tiny_model, "fine-tuning diverged: the loss is nan at step 2")
    assert "nothing is saved" in line
    assert listing(tmp_path) == before  # no --out, no staging folder


def test_the_import_refuses_non_finite_weights_before_anything_is_written(tmp_path, capsys):
    """examples/import_from_hf.py, and check_source: what adapt and compare --init run before --out."""
    from helpers import load_driver

    from seed_fairseq.encoders.hf.import_ import HFImportError, check_source

    model, tensor = poisoned(save_sentence_model(tmp_path / "st", "mean"), tmp_path / "broken")
    out = tmp_path / "out"
    code = load_driver("examples/import_from_hf.py").main(["--model", str(model), "--out", str(out)])
    refused(capsys, code, model / "model.safetensors", "weights hold NaN or infinite values", tensor)
    assert not out.exists() and not list(tmp_path.glob(".out*"))
    with pytest.raises(HFImportError, match="weights hold NaN"):
        check_source(model)


def test_adapt_refuses_a_model_with_non_finite_weights_before_out(tmp_path, capsys):
    from helpers import DEMO_CORPUS

    from seed_fairseq.workflows.adapt import cli

    model, _ = poisoned(save_sentence_model(tmp_path / "st", "mean"), tmp_path / "broken")
    out = tmp_path / "out"
    code = cli.main(["--model", str(model), "--corpus", str(DEMO_CORPUS), "--objective", "seed", "--out", str(out)])
    refused(capsys, code, model / "model.safetensors", "weights hold NaN")
    assert not out.exists()


def test_the_export_refuses_a_diverged_checkpoint(tmp_path):
    from seed_fairseq.encoders.hf.export import ExportError, export
    from seed_fairseq.encoders.hf.import_ import import_model
    from seed_fairseq.pretrain.checkpoint import load_torch_file

    imported = import_model(save_sentence_model(tmp_path / "st", "mean"), tmp_path / "imported")
    state = load_torch_file(str(imported / "checkpoint.pt"))
    key = "encoder.sentence_encoder.layers.0.fc1.weight"
    state["model"][key] = torch.full_like(state["model"][key], math.nan)
    torch.save(state, tmp_path / "diverged.pt")
    with pytest.raises(ExportError, match=rf"diverged.pt: weights hold NaN or infinite values \({key}\)"):
        export(tmp_path / "diverged.pt", imported, tmp_path / "exported")
    assert not (tmp_path / "exported").exists()
    assert json.loads((imported / "seed_fairseq_import.json").read_text())["tool"]  # the import itself untouched
