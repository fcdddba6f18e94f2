"""Model-level behaviour: registration, the window mask, the [CLS] bottleneck,
receptive fields, half precision, and clear errors."""

import pytest
import torch
from conftest import build_task_model
from helpers import REPO, parse_argv
from objectives import tiny_encoder

from seed_fairseq.pretrain.models.bottleneck import vector_memory
from seed_fairseq.pretrain.models.seed_encoder import SeedEncoderModel
from seed_fairseq.pretrain.modules.windowed_decoder import (
    FULL,
    parse_window,
    receptive_field,
    window_allowed,
    window_attention_mask,
)


def literal(rows):
    return torch.tensor([[c == "x" for c in r] for r in rows])


def test_registered_names_are_ours():
    import fairseq.criterions as C
    import fairseq.models as M
    import fairseq.tasks as T

    from seed_fairseq.pretrain.criterions.seed_pretrain import SeedPretrainCriterion
    from seed_fairseq.pretrain.tasks.seed_pretrain import SeedPretrainTask

    assert M.MODEL_REGISTRY["seed_encoder"] is SeedEncoderModel
    assert T.TASK_REGISTRY["seed_pretrain"] is SeedPretrainTask
    assert C.CRITERION_REGISTRY["seed_pretrain"] is SeedPretrainCriterion
    names = [
        "seed_encoder_base",
        "seed_encoder_tiny",
        "seed_encoder_mlm_only",
        "weak_decoder_k2",
        "weak_decoder_full",
        "weak_decoder_l5_full",
        "weak_decoder_l1_k2",
        "weak_decoder_l5_k8",
    ]
    for name in names:
        assert M.ARCH_MODEL_REGISTRY[name] is SeedEncoderModel, name
        assert M.ARCH_MODEL_NAME_REGISTRY[name] == "seed_encoder"


def test_window_mask_matches_the_authors_literal_matrix():
    expected = literal(
        [
            "x.....",
            "xx....",
            "xxx...",
            "x.xx..",
            "x..xx.",
            "x...xx",
        ]
    )
    assert torch.equal(window_allowed(6, 2), expected)


def test_window_mask_k3_and_full():
    assert torch.equal(
        window_allowed(6, 3),
        literal(
            [
                "x.....",
                "xx....",
                "xxx...",
                "xxxx..",
                "x.xxx.",
                "x..xxx",
            ]
        ),
    )
    assert torch.equal(window_allowed(4, FULL), literal(["x...", "xx..", "xxx.", "xxxx"]))
    # k=1: itself and [CLS] only
    assert torch.equal(window_allowed(4, 1), literal(["x...", "xx..", "x.x.", "x..x"]))


def test_additive_mask_is_zero_or_minus_inf_and_never_a_full_row():
    m = window_attention_mask(9, 2)
    allowed = window_allowed(9, 2)
    assert torch.all(m[allowed] == 0)
    assert torch.all(torch.isneginf(m[~allowed]))
    assert torch.all(allowed.any(dim=1))


@pytest.mark.parametrize("bad", [0, -1, "0", "abc", 1.5, True])
def test_window_below_one_is_a_clear_error(bad):
    with pytest.raises(ValueError, match="window must be an integer >= 1"):
        parse_window(bad)


def test_decoder_uses_the_window_mask_in_every_layer(odd_dict_dir):
    _, model, _, _ = build_task_model(odd_dict_dir, "--decoder-attention-window", "3")
    seen = []
    for layer in model.weak_decoder.layers:
        layer.register_forward_pre_hook(
            lambda mod, args, kwargs: seen.append(kwargs["self_attn_mask"].clone()),
            with_kwargs=True,
        )
    prev = torch.randint(4, 98, (2, 7))
    model.eval()
    model.weak_decoder(prev, encoder_out=vector_memory(torch.randn(2, 32)))
    assert len(seen) == len(model.weak_decoder.layers) == 2
    for m in seen:
        assert torch.equal(m == 0, window_allowed(7, 3))


def _decoder_logits(model, tokens, features):
    """The model's own forward, with the encoder's output replaced by `features`."""
    model.encoder.extract_features = lambda *a, **k: (features, {"inner_states": None})
    try:
        _, extra = model(tokens, prev_output_tokens=tokens[:, :-1])
    finally:
        del model.encoder.extract_features
    return torch.nn.functional.linear(extra["decoder_features"], *model.decoder_projection())


def test_decoder_sees_the_encoder_only_through_position_0(odd_dict_dir):
    _, model, _, _ = build_task_model(odd_dict_dir)
    model.eval()
    torch.manual_seed(0)
    tokens = torch.randint(4, 98, (3, 11))
    tokens[:, 0] = 0
    features = torch.randn(3, 11, 32)
    base = _decoder_logits(model, tokens, features)

    other = features.clone()
    other[:, 1:] = torch.randn(3, 10, 32) * 5  # every position but [CLS]
    assert torch.equal(_decoder_logits(model, tokens, other), base)

    cls_changed = features.clone()
    cls_changed[:, 0] += 1.0
    changed = _decoder_logits(model, tokens, cls_changed)
    assert (changed - base).abs().amax(dim=-1).min() > 1e-4  # every position moves


@pytest.mark.parametrize("window,layers", [(2, 2), (3, 2), (2, 3)])
def test_decoder_receptive_field(odd_dict_dir, window, layers):
    _, model, _, _ = build_task_model(
        odd_dict_dir, "--decoder-attention-window", str(window), "--decoder-layers", str(layers)
    )
    # float64: influence through several small-init layers is tiny but must
    # be non-zero inside the field, while outside it must be exactly zero
    model.eval().double()
    torch.manual_seed(1)
    n = 14
    prev = torch.randint(4, 98, (1, n))
    prev[0, 0] = 0
    memory = vector_memory(torch.randn(1, 32, dtype=torch.float64))

    def logits(tokens):
        with torch.no_grad():
            return model.weak_decoder(tokens, encoder_out=memory)[0][0]

    base = logits(prev)
    for p in range(n):
        changed = prev.clone()
        changed[0, p] = 4 + (prev[0, p] - 4 + 7) % 94
        diff = (logits(changed) - base).abs().amax(dim=-1)
        for t in range(n):
            inside = p == 0 or p in receptive_field(t, window, layers)
            if inside:
                assert diff[t] > 1e-12, (p, t)
            else:
                assert diff[t] == 0, (p, t)  # outside or later: not even rounding noise


@pytest.mark.parametrize("window", [1, 2, 3, 5])
@pytest.mark.parametrize("dtype,tol", [(torch.float64, 1e-12), (torch.float32, 2e-5), (torch.bfloat16, 6e-2)])
def test_banded_window_attention_equals_fairseqs_masked_attention(odd_dict_dir, window, dtype, tol):
    """The banded computation (default) against fairseq's masked attention: outputs and every
    gradient, with pads at the end of a row, a row shorter than the window and odd sizes."""
    _, model, _, _ = build_task_model(
        odd_dict_dir, "--decoder-attention-window", str(window), "--dropout", "0", "--attention-dropout", "0"
    )
    dec = model.weak_decoder.to(dtype).train()
    assert dec.banded and all(layer.self_attn.banded for layer in dec.layers)
    torch.manual_seed(3)
    prev = torch.randint(4, 98, (3, 13))
    prev[:, 0] = 0
    prev[1, 9:] = dec.padding_idx
    prev[2, 2:] = dec.padding_idx  # 2 real tokens: shorter than every window but 1
    memory = vector_memory(torch.randn(3, 32, dtype=dtype))

    def run(banded):
        dec.banded = banded
        dec.zero_grad(set_to_none=True)
        out = dec(prev, encoder_out=memory)[0]
        (out.float() * torch.linspace(-1, 1, out.size(-1))).sum().backward()
        return out.detach().float(), {n: p.grad.float() for n, p in dec.named_parameters() if p.grad is not None}

    ref_out, ref_grads = run(False)
    out, grads = run(True)
    assert torch.allclose(out, ref_out, atol=tol, rtol=tol), (out - ref_out).abs().max()
    assert grads.keys() == ref_grads.keys() and any("self_attn.k_proj" in n for n in grads)
    for n, g in grads.items():
        scale = ref_grads[n].abs().max().clamp(min=1)
        assert ((g - ref_grads[n]).abs().max() / scale) <= tol, n


def test_banded_attention_memory_is_linear_in_the_window():
    """No (n x n) tensor: the probabilities the banded attention saves are (n x (1 + k))."""
    from seed_fairseq.pretrain.modules.windowed_decoder import banded_attention

    q, k, v = (torch.randn(2, 3, 50, 8, requires_grad=True) for _ in range(3))
    shapes = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: shapes.append(tuple(t.shape)) or t, lambda t: t):
        banded_attention(q, k, v, 2, None, lambda x: x).sum().backward()
    assert shapes and all(50 * 50 not in (s[-2] * s[-1] if len(s) >= 2 else 0,) for s in shapes)
    assert (2, 3, 50, 3) in shapes  # the probabilities: [CLS] + 2 window slots


def test_full_window_is_plain_causal_attention(odd_dict_dir):
    _, model, _, _ = build_task_model(
        odd_dict_dir,
        arch_args=[
            "--arch",
            "weak_decoder_full",
            *tiny_encoder(layers=1),
            "--decoder-layers",
            "2",
        ],
    )
    assert model.weak_decoder.window == FULL
    model.eval().double()
    torch.manual_seed(2)
    prev = torch.randint(4, 98, (1, 10))
    memory = vector_memory(torch.randn(1, 32, dtype=torch.float64))
    with torch.no_grad():
        base = model.weak_decoder(prev, encoder_out=memory)[0][0]
        changed = prev.clone()
        changed[0, 1] = 4 + (prev[0, 1] - 4 + 5) % 94
        diff = (model.weak_decoder(changed, encoder_out=memory)[0][0] - base).abs().amax(-1)
    assert diff[0] == 0 and torch.all(diff[1:] > 1e-12)


def test_ablation_archs_configure_the_decoder(odd_dict_dir):
    for arch, layers, window in [
        ("weak_decoder_l1_k2", 1, 2),
        ("weak_decoder_l5_full", 5, FULL),
        ("weak_decoder_k8", 3, 8),
    ]:
        from fairseq import options

        parser = options.get_training_parser()
        args = options.parse_args_and_arch(
            parser,
            parse_argv(odd_dict_dir, ["--task", "seed_pretrain", "--arch", arch, "--criterion", "seed_pretrain"]),
        )
        assert args.decoder_layers == layers and args.decoder_attention_window == window
        assert args.encoder_layers == 12 and args.encoder_embed_dim == 768
        assert args.encoder_attention_heads == 12  # the released weights, not the paper's 8


def test_shared_and_tied_weights(odd_dict_dir):
    _, model, _, _ = build_task_model(odd_dict_dir)
    emb = model.encoder.sentence_encoder.embed_tokens.weight
    assert model.weak_decoder.embed_tokens.weight is emb
    assert model.weak_decoder.output_projection.weight is emb
    assert model.weak_decoder.output_projection.bias is None
    assert model.encoder.lm_head.weight is emb
    assert emb.shape == (99, 32)
    assert torch.all(emb[1] == 0)  # padding row kept at zero by the BERT init
    # decoder positions: fairseq's learned positions with the padding offset
    assert model.weak_decoder.embed_positions.weight.shape[0] == 32 + 2


def test_bfloat16_forward_and_loss_are_finite(odd_dict_dir):
    task, model, criterion, _ = build_task_model(odd_dict_dir)
    model = model.to(torch.bfloat16).train()
    pad = task.source_dictionary.pad()
    torch.manual_seed(3)
    src = torch.randint(4, 98, (4, 16))
    src[:, 0] = 0
    src[2, 9:] = pad  # padding in the batch
    target = torch.full_like(src, pad)
    target[:, 3] = src[:, 3]
    sample = {
        "net_input": {"src_tokens": src, "src_lengths": src.ne(pad).sum(1), "prev_output_tokens": src[:, :-1]},
        "target": target,
        "dec_target": torch.where(src[:, 1:].eq(pad), pad, src[:, 1:]),
        "ntokens": int(src.ne(pad).sum()),
        "nsentences": 4,
    }
    loss, _, log = criterion(model, sample)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad.float()).all(), name


def test_mlm_only_arch_has_no_decoder(odd_dict_dir):
    _, model, _, _ = build_task_model(
        odd_dict_dir,
        arch_args=[
            "--arch",
            "seed_encoder_mlm_only",
            *tiny_encoder(layers=1),
        ],
    )
    assert model.weak_decoder is None
    assert not any(k.startswith("weak_decoder") for k in model.state_dict())


def test_dictionary_size_mismatch_is_a_clear_error(odd_dict_dir, tmp_path):
    _, model, _, _ = build_task_model(odd_dict_dir)
    state = model.state_dict()
    with open(tmp_path / "dict.txt", "w") as f:
        for i in range(N := 90):
            f.write(f"v{i} 1\n")
    _, other, _, _ = build_task_model(tmp_path)
    with pytest.raises(ValueError, match=r"dictionary size mismatch: the checkpoint's token embedding has 99 rows"):
        other.load_state_dict(state)
    assert N == 90


# ---------------------------------------------------------------------------
# the pooling every bottleneck reads (models/bottleneck.py)
# ---------------------------------------------------------------------------

# ours -> sentence-transformers' Pooling mode
ST_MODES = {
    "cls": "cls",
    "mean": "mean",
    "max": "max",
    "mean_sqrt_len": "mean_sqrt_len_tokens",
    "lasttoken": "lasttoken",
}
MASKS = [  # 1 = a token; right padding (fairseq's), left padding, none, a single token
    "1111111",
    "1111100",
    "1100000",
    "1000000",
    "0011111",
]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("mode", list(ST_MODES))
def test_pooling_is_sentence_transformers_pooling(mode, dtype):
    """Every mode equals sentence-transformers' own Pooling (and Normalize) on the same token
    embeddings and attention mask, bit for bit."""
    from sentence_transformers.models import Normalize, Pooling

    from seed_fairseq.pretrain.models.bottleneck import BottleneckPooling, pool

    mask = torch.tensor([[int(c) for c in row] for row in MASKS])
    features = torch.randn(len(MASKS), 7, 32, generator=torch.Generator().manual_seed(1)).to(dtype)
    st = Pooling(32, pooling_mode=ST_MODES[mode])({"token_embeddings": features.clone(), "attention_mask": mask})
    ours = pool(features, mask.eq(0), mode)
    assert ours.dtype == dtype and torch.equal(ours, st["sentence_embedding"])
    unit = Normalize()(st)["sentence_embedding"]
    assert torch.equal(BottleneckPooling(mode, normalize=True)(features, mask.eq(0)), unit)
    if mode == "mean":  # literally: the mean over the non-pad positions, specials included
        assert torch.allclose(
            ours[1].float(), features[1, :5].float().mean(0), atol=1e-2 if dtype != torch.float32 else 1e-6
        )


def test_pooling_options_reach_the_bottleneck(odd_dict_dir):
    """--bottleneck-pooling and --retrieval-similarity make the model's bottleneck vector and its
    representation; without them: [CLS], dot product (the papers', an old checkpoint's)."""
    _, model, _, _ = build_task_model(odd_dict_dir)
    assert (model.bottleneck.mode, model.bottleneck.normalize, model.similarity) == ("cls", False, "dot")
    tokens = torch.tensor([[0, 5, 6, 7, 2], [0, 8, 2, 1, 1]])
    features = torch.randn(2, 5, 32)
    assert torch.equal(model.bottleneck_vector(features, tokens), features[:, 0])

    _, model, _, _ = build_task_model(odd_dict_dir, "--bottleneck-pooling", "mean", "--retrieval-similarity", "cosine")
    mean = torch.stack([features[0].mean(0), features[1, :3].mean(0)])
    unit = torch.nn.functional.normalize(mean, dim=-1)
    torch.testing.assert_close(model.bottleneck_vector(features, tokens), unit)
    torch.testing.assert_close(model.sentence_embedding(features, tokens), unit)

    _, model, _, _ = build_task_model(
        odd_dict_dir, "--bottleneck-pooling", "max", "--retrieval-similarity", "cosine", "--bottleneck-unnormalized"
    )
    top = torch.stack([features[0].amax(0), features[1, :3].amax(0)])
    assert torch.equal(model.bottleneck_vector(features, tokens), top)  # the decoder reads it as it is
    torch.testing.assert_close(model.sentence_embedding(features, tokens), torch.nn.functional.normalize(top, dim=-1))


def test_unnormalized_without_cosine_is_refused(odd_dict_dir):
    from seed_fairseq.base.errors import ConfigurationError

    with pytest.raises(ConfigurationError, match="--bottleneck-unnormalized has no effect without"):
        build_task_model(odd_dict_dir, "--bottleneck-unnormalized")


def test_pooling_travels_in_the_checkpoint_and_an_old_one_loads_as_cls(tmp_path):
    """The options are the task's: a checkpoint's task config carries them, and one written before
    they existed (seed_fairseq 0.1) loads with [CLS] and the dot product."""
    from fairseq import checkpoint_utils

    import seed_fairseq  # noqa: F401
    from seed_fairseq.pretrain.checkpoint import load_torch_file
    from seed_fairseq.pretrain.checkpoint_files import torch_save
    from seed_fairseq.pretrain.models.bottleneck import pooling_options

    fixture = REPO / "tests" / "fixtures" / "seed_fairseq_0.1"
    old = fixture / "checkpoint_1_3.pt"
    state = load_torch_file(old)
    assert "bottleneck_pooling" not in state["cfg"]["task"]
    assert pooling_options(state["cfg"]["task"]) == ("cls", "dot", False)  # what a tool reading the file sees
    (model,), _ = checkpoint_utils.load_model_ensemble([str(old)], arg_overrides={"data": str(fixture / "data-bin")})
    assert (model.pooling, model.bottleneck.normalize, model.similarity) == ("cls", False, "dot")

    state["cfg"]["task"].update(bottleneck_pooling="mean", retrieval_similarity="cosine")
    assert pooling_options(state["cfg"]["task"]) == ("mean", "cosine", False)
    torch_save(state, tmp_path / "mean.pt")
    (model,), _ = checkpoint_utils.load_model_ensemble(
        [str(tmp_path / "mean.pt")], arg_overrides={"data": str(fixture / "data-bin")}
    )
    assert (model.pooling, model.bottleneck.normalize, model.similarity) == ("mean", True, "cosine")
