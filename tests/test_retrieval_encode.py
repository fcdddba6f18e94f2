"""The retrieval encode path: length-sorted batches give the same fp32 embeddings as any
other order and as ``SentenceTransformer.encode``; bf16 (CPU autocast) and int8 (dynamic
quantisation) stay close, leave the model untouched, and are refused where they cannot run.

fp32 tolerance: batches of other lengths pad differently, so matmuls of other shapes
sum in another order: 1e-5 relative / 1e-6 absolute (the tiny model's outputs are O(1)).
"""

import numpy as np
import pytest
import torch
from helpers import DEMO_CORPUS
from test_retrieval import make_tiny_model

from seed_fairseq.encoders.retrieval.index import SearchError
from seed_fairseq.encoders.retrieval.search import encode, length_order, load_model


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    return load_model(str(make_tiny_model(tmp_path_factory.mktemp("tiny_encode"))), device="cpu")


@pytest.fixture(scope="module")
def texts():
    """37 texts of very different lengths (1 to ~60 tokens, truncated beyond), in a scrambled order."""
    words = DEMO_CORPUS.read_text(encoding="utf-8").split()
    rng = np.random.default_rng(0)
    return [" ".join(words[i : i + n]) for i, n in zip(rng.integers(0, 5000, 37), rng.integers(1, 80, 37))]


def test_length_order_sorts_by_tokens_and_keeps_ties_in_input_order(model):
    texts = ["a", "the water cycle moves water", "b", "the water cycle"]
    order = length_order(model, texts).tolist()
    lengths = [len(model.tokenizer(t)["input_ids"]) for t in texts]
    assert [lengths[i] for i in order] == sorted(lengths, reverse=True)
    assert order.index(0) < order.index(2)  # "a" and "b": same length, input order


def test_fp32_does_not_depend_on_length_sorting(model, texts):
    sorted_ = encode(model, texts, batch_size=5, show_progress=False)
    unsorted = encode(model, texts, batch_size=5, show_progress=False, sort_by_length=False)
    one_by_one = np.stack([encode(model, [t], batch_size=1, show_progress=False)[0] for t in texts])
    shuffled_order = np.random.default_rng(1).permutation(len(texts))
    shuffled = encode(model, [texts[i] for i in shuffled_order], batch_size=5, show_progress=False)
    assert sorted_.dtype == np.float32 and sorted_.flags["C_CONTIGUOUS"] and sorted_.shape == (37, 32)
    for other in (unsorted, one_by_one, shuffled[np.argsort(shuffled_order)]):
        np.testing.assert_allclose(other, sorted_, rtol=1e-5, atol=1e-6)
    # the rows are really different texts' (not one vector copied around)
    assert np.abs(sorted_[0] - sorted_[1]).max() > 1e-2


def test_fp32_equals_sentence_transformers_encode(model, texts):
    ours = encode(model, texts, batch_size=8, show_progress=False)
    theirs = model.encode(texts, batch_size=8, convert_to_numpy=True, show_progress_bar=False)
    np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("precision,atol", [("bf16", 0.1), ("int8", 0.3), ("fp16", 0.0)])
def test_lower_precisions_stay_close_and_leave_the_model_alone(model, texts, precision, atol):
    before = {k: v.clone() for k, v in model.state_dict().items()}
    model.train()
    fp32 = encode(model, texts, batch_size=8, show_progress=False)
    low = encode(model, texts, batch_size=8, precision=precision, show_progress=False)
    assert low.dtype == np.float32 and np.isfinite(low).all()
    if precision == "fp16":  # no fast fp16 on the CPU: fp32 there
        np.testing.assert_array_equal(low, fp32)
    else:
        assert 0 < np.abs(low - fp32).max() < atol * np.abs(fp32).max()
        # each text stays nearest to itself
        assert (np.argmax(low @ fp32.T, axis=1) == np.arange(len(texts))).mean() > 0.9
    assert model.training  # the mode is restored
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())  # int8 quantises a copy


def test_bad_precision_and_int8_off_the_cpu(model, monkeypatch):
    with pytest.raises(SearchError, match="precision must be one of fp32, fp16, bf16, int8"):
        encode(model, ["x"], precision="fp8", show_progress=False)
    monkeypatch.setattr(type(model), "device", property(lambda self: torch.device("cuda", 0)))
    with pytest.raises(SearchError, match="int8 .* runs on the CPU only"):
        encode(model, ["x"], precision="int8", show_progress=False)


def test_precision_flag_offers_the_cpu_choices():
    import argparse

    from seed_fairseq.encoders.retrieval.cli import add_search_args

    p = argparse.ArgumentParser()
    add_search_args(p)
    assert p.parse_args(["--precision", "int8"]).precision == "int8"
    assert p.parse_args([]).precision == "fp16"  # unchanged default (= fp32 on the CPU)
    with pytest.raises(SystemExit):
        p.parse_args(["--precision", "fp8"])
