"""Condenser (``condenser_pretrain``) and the head coCondenser shares: what the head reads (the late
bottleneck vector at position 0, the early layer's token states after it, nothing else of the last
layer), its layers, both MLM terms against hand-written references, the option checks and bfloat16.
coCondenser's spans and contrast: ``test_cocondenser.py``.  What every objective guarantees
(bottleneck, split, resume, heads, export) is in test_contract.py (entries ``condenser``,
``cocondenser`` in objectives.py)."""

import math

import pytest
import torch
import torch.nn.functional as F
from objectives import BY_NAME
from test_contract import build, padded_sample

from seed_fairseq.base.errors import ConfigurationError
from seed_fairseq.pretrain.modules.condenser_head import stack_views

CONDENSER, COCONDENSER = BY_NAME["condenser"], BY_NAME["cocondenser"]
NO_DROPOUT = ("--dropout", "0", "--attention-dropout", "0")
COMPLETE = ("--sample-break-mode", "complete")  # blocks of many lengths: padding (padded_sample)


def _batch(task, n, split="valid", seed=1):
    task.load_dataset(split)
    itr = task.get_batch_iterator(task.dataset(split), max_sentences=n, seed=seed).next_epoch_itr(shuffle=False)
    return next(itr)


def test_registered_names_are_ours():
    import fairseq.criterions as C
    import fairseq.models as M
    import fairseq.tasks as T

    from seed_fairseq.pretrain.criterions.condenser_pretrain import CoCondenserCriterion, CondenserCriterion
    from seed_fairseq.pretrain.models.condenser import CondenserModel
    from seed_fairseq.pretrain.tasks.cocondenser_pretrain import CoCondenserPretrainTask
    from seed_fairseq.pretrain.tasks.condenser_pretrain import CondenserPretrainTask

    assert T.TASK_REGISTRY["condenser_pretrain"] is CondenserPretrainTask
    assert T.TASK_REGISTRY["cocondenser_pretrain"] is CoCondenserPretrainTask
    assert C.CRITERION_REGISTRY["condenser_pretrain"] is CondenserCriterion
    assert C.CRITERION_REGISTRY["cocondenser_pretrain"] is CoCondenserCriterion
    assert M.MODEL_REGISTRY["condenser"] is CondenserModel
    for arch in ("condenser", "condenser_base", "condenser_tiny", "cocondenser_base", "cocondenser_tiny"):
        assert M.ARCH_MODEL_REGISTRY[arch] is CondenserModel and M.ARCH_MODEL_NAME_REGISTRY[arch] == "condenser"


# ---------------------------------------------------------------------------
# the head's wiring
# ---------------------------------------------------------------------------


def _head_inputs(model, sample, masked):
    """(the head's inputs: vector, early states, padding; the encoder's inner states) of one forward."""
    seen = {}
    hook = model.condenser_head.register_forward_pre_hook(lambda m, args: seen.update(args=args))
    try:
        with torch.no_grad():
            inputs = dict(masked_tokens=masked, head_positions=masked, return_all_hiddens=True)
            _, extra = model(**sample["net_input"], **inputs)
    finally:
        hook.remove()
    return seen["args"], extra


@pytest.mark.parametrize("layers, skip", [(2, 1), (3, 1), (4, 2), (1, 0)])
def test_default_skip_is_half_the_layers_and_the_head_is_built_like_the_encoder(contract_data, layers, skip):
    """The paper's 6 of 12: half the encoder's layers (2 -> 1, 3 -> 1, 4 -> 2, 1 -> the embeddings)."""
    _, model, _ = build(CONDENSER, contract_data, "--encoder-layers", str(layers), "--encoder-layer-norm-eps", "1e-12")
    assert model.skip_from == skip and model.args.condenser_skip_from == skip
    head, encoder_layer = model.condenser_head.layers, model.encoder.sentence_encoder.layers[0]
    assert len(head) == 2 and all(type(layer) is type(encoder_layer) for layer in head)
    for layer in head:  # the encoder's shape, activation and LayerNorm eps
        assert layer.fc1.weight.shape == (37, 32) and layer.self_attn.num_heads == 2
        assert layer.activation_fn is encoder_layer.activation_fn
        assert layer.self_attn_layer_norm.eps == layer.final_layer_norm.eps == 1e-12
    assert {k.split(".")[0] for k in model.state_dict() if not k.startswith("encoder.")} == {"condenser_head"}


def test_head_reads_the_bottleneck_vector_then_the_early_tokens(contract_data):
    task, model, _ = build(CONDENSER, contract_data, *NO_DROPOUT, *COMPLETE, "--bottleneck-pooling", "mean")
    task.load_dataset("valid")
    sample = padded_sample(task)
    src = sample["net_input"]["src_tokens"]
    masked = sample["target"].ne(task.source_dictionary.pad())
    model.eval()
    (vector, early, padding), extra = _head_inputs(model, sample, masked)
    states = [s.transpose(0, 1) for s in extra["inner_states"]]  # embeddings, layer 1, layer 2
    assert len(states) == 3 and model.skip_from == 1
    assert torch.equal(early, states[1]) and torch.equal(padding, src.eq(1))
    assert torch.equal(vector, model.bottleneck_vector(states[2], src))  # the pooled LAST layer (mean here)
    assert torch.equal(extra["bottleneck"], vector)
    # the head's output by hand: [vector; early tokens 1..] through its two layers, then the MLM head
    x = torch.cat([vector[:, None], states[1][:, 1:]], 1).transpose(0, 1)
    with torch.no_grad():
        for layer in model.condenser_head.layers:
            x = layer(x, encoder_padding_mask=src.eq(1))
        expected = model.mlm_hidden(x.transpose(0, 1), masked)
    torch.testing.assert_close(extra["decoder_features"], expected, rtol=0, atol=1e-6)


def test_the_head_reads_the_early_tokens_but_not_their_cls(contract_data):
    """The head's output moves with the early layer's token states and not with that layer's own [CLS]
    state, which the late vector replaces; with the vector it moves (what the last layer may pass)."""
    task, model, _ = build(CONDENSER, contract_data, *NO_DROPOUT, *COMPLETE)
    task.load_dataset("valid")
    sample = padded_sample(task)
    masked = sample["target"].ne(1)
    model.eval()
    (vector, early, padding), _ = _head_inputs(model, sample, masked)
    noise = torch.randn(early.shape, generator=torch.Generator().manual_seed(3))
    keep = ~padding  # the outputs at real positions (a pad's output is never read)
    with torch.no_grad():
        base = model.condenser_head(vector, early, padding)[keep]
        cls_moved = early.clone()
        cls_moved[:, 0] += noise[:, 0]
        assert torch.equal(model.condenser_head(vector, cls_moved, padding)[keep], base)
        tokens_moved = early.clone()
        tokens_moved[:, 1:] += noise[:, 1:]
        assert float((model.condenser_head(vector, tokens_moved, padding)[keep] - base).abs().max()) > 1e-2
        assert float((model.condenser_head(vector + noise[:, 0], early, padding)[keep] - base).abs().max()) > 1e-2


def test_no_path_from_the_last_layers_tokens_to_the_head(contract_data):
    """The contract perturbs the encoder's output; here the last LAYER's output, which its inner states
    hold too: the head's loss must not move with its token states (whatever the head read), and must
    move with its [CLS] state (the bottleneck vector)."""
    task, model, criterion = build(CONDENSER, contract_data, *NO_DROPOUT, *COMPLETE)
    task.load_dataset("valid")
    sample = padded_sample(task)
    model.eval()

    def head_loss(position_0: bool):
        def hook(module, inputs, output):
            noise = torch.randn(output.shape, generator=torch.Generator().manual_seed(5)) * 10
            noise[1:] *= not position_0
            noise[:1] *= position_0
            return output + noise

        handle = model.encoder.sentence_encoder.layers[-1].register_forward_hook(hook)
        try:
            with torch.no_grad():
                return criterion.compute_terms(model, sample)["head"].loss
        finally:
            handle.remove()

    with torch.no_grad():
        base = criterion.compute_terms(model, sample)["head"].loss
    assert torch.equal(head_loss(False), base)
    assert not torch.equal(head_loss(True), base)  # (an untrained head: a small move)


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--condenser-skip-from", "2"], "--condenser-skip-from must be from 0 .* to 1 .*got 2"),
        (["--condenser-skip-from", "-1"], "--condenser-skip-from must be from 0"),
        (["--condenser-head-layers", "0"], "--condenser-head-layers must be >= 1, got 0"),
        (["--head-weight", "-1"], "--head-weight must be >= 0"),
    ],
)
def test_bad_options_are_clear_errors(contract_data, extra, message):
    with pytest.raises((ConfigurationError, ValueError), match=message):
        build(CONDENSER, contract_data, *extra)


# ---------------------------------------------------------------------------
# the loss terms against hand-written references
# ---------------------------------------------------------------------------


def _cross_entropy(model, features, positions, gold):
    weight, bias = model.mlm_projection()
    logits = F.linear(model.mlm_hidden(features, positions), weight) + bias
    return F.cross_entropy(logits.float(), gold, reduction="sum")


@pytest.mark.parametrize("obj", [CONDENSER, COCONDENSER], ids=lambda o: o.name)
def test_both_mlm_terms_equal_hand_written_references(contract_data, obj):
    task, model, criterion = build(obj, contract_data, *NO_DROPOUT)
    sample = _batch(task, 3)
    pad = task.source_dictionary.pad()
    src = sample["net_input"]["src_tokens"]
    target = sample["target"]
    if obj is COCONDENSER:
        src = stack_views(src, sample["net_input"]["src_tokens_2"], pad)
        target = stack_views(target, sample["target_2"], pad)
    masked = target.ne(pad)
    model.eval()
    with torch.no_grad():
        terms = criterion.compute_terms(model, sample)
        (vector, early, _), extra = _head_inputs(model, sample, masked)
        late, _ = model(src, features_only=True)  # RoBERTa's own forward: the backbone
        head = model.condenser_head(vector, early, src.eq(pad))
        mlm = _cross_entropy(model, late, masked, target[masked])
        by_head = _cross_entropy(model, head, masked, target[masked])
    assert float(mlm) > 0 and float(by_head) > 0 and float(by_head) != float(mlm)  # (near ln |V| each, untrained)
    torch.testing.assert_close(terms["mlm"].loss, mlm, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(terms["head"].loss, by_head, rtol=1e-5, atol=1e-4)
    counts = task.term_counts(sample)
    assert int(counts["mlm"]) == int(counts["head"]) == int(masked.sum())
    weights = {"mlm": 1.0, "head": 1.0, **({"co": 1.0} if obj is COCONDENSER else {})}
    assert criterion.weights == weights  # the paper's plain sum


def test_late_mlm_off_is_the_head_alone(contract_data):
    """--mlm-weight 0: the authors' code without --late_mlm (the head's MLM only)."""
    task, model, criterion = build(CONDENSER, contract_data, *NO_DROPOUT, "--mlm-weight", "0")
    sample = _batch(task, 3)
    model.eval()
    with torch.no_grad():
        loss, _, log = criterion(model, sample)
    assert log["mlm_weight"] == 0 and log["mlm_ntokens"] > 0
    assert float(loss) == pytest.approx(float(log["head_loss_sum"]) / log["head_ntokens"], rel=1e-6)


@pytest.mark.parametrize("obj", [CONDENSER, COCONDENSER], ids=lambda o: o.name)
def test_bfloat16_forward_and_backward_are_finite(contract_data, obj):
    task, model, criterion = build(obj, contract_data)
    sample = _batch(task, 4, split="train")
    model = model.to(torch.bfloat16).train()
    loss, _, log = criterion(model, sample)
    assert bool(torch.isfinite(loss)) and all(math.isfinite(float(log[f"{t}_loss_sum"])) for t in obj.terms)
    assert all(log[f"{t}_ntokens"] > 0 for t in obj.terms)
    loss.backward()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert len(grads) == len(list(model.parameters())) and all(bool(torch.isfinite(g).all()) for g in grads)
