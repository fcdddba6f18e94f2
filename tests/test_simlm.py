"""SimLM: the masked sets and replacements drawn in the data pipeline, the frozen
generator, the decoder made of the encoder's last layers, and clear errors.

The contract suite (``test_contract.py -k simlm``) checks the rest: the [CLS]
bottleneck, split invariance, resume, head dropping and the export.
"""

import json
import re

import numpy as np
import pytest
import torch
from helpers import check, fairseq_train, parse_argv, run
from objectives import TINY_ENCODER

from seed_fairseq.pretrain.checkpoint import CheckpointError, load_torch_file
from seed_fairseq.pretrain.data.replaced_lm_dataset import ReplacedLMNoiseDataset
from seed_fairseq.pretrain.generator import FrozenGenerator, inverse_cdf_sample, uniform_from_noise

TINY = ["--arch", "simlm_tiny", *TINY_ENCODER]
SGD = ["--optimizer", "sgd", "--lr", "0.5", "--lr-scheduler", "fixed", "--dropout", "0", "--attention-dropout", "0"]


def parse(data, *extra):
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(
        options.get_training_parser(),
        parse_argv(
            data,
            ["--task", "simlm_pretrain", "--criterion", "simlm_pretrain", *TINY]
            + ["--tokens-per-sample", "48", "--sample-break-mode", "none", "--cpu", *extra],
        ),
    )
    return convert_namespace_to_omegaconf(args)


def setup(data, *extra):
    from fairseq import tasks

    cfg = parse(data, *extra)
    return tasks.setup_task(cfg.task), cfg


def build(data, generator, *extra):
    task, cfg = setup(data, "--generator-path", str(generator), *extra)
    model = task.build_model(cfg.model)
    return task, model, task.build_criterion(cfg.criterion), cfg


def first_batch(task, split="valid", n=4):
    task.load_dataset(split)
    itr = task.get_batch_iterator(task.dataset(split), max_sentences=n, seed=1).next_epoch_itr(shuffle=False)
    return next(itr)


def records(proc, kind="train_inner"):
    return [
        json.loads(line.split(f"| {kind} | ", 1)[1])
        for line in (proc.stderr + proc.stdout).splitlines()
        if f"| {kind} | " in line
    ]


def last_line(proc):
    return [line for line in proc.stderr.splitlines() if line.strip()][-1]


# ---------------------------------------------------------------------------
# masked sets and replacements
# ---------------------------------------------------------------------------


def odd_dictionary(odd_dict_dir):
    from fairseq.data import Dictionary

    d = Dictionary.load(str(odd_dict_dir / "dict.txt"))
    return d, d.add_symbol("<mask>")  # 99 entries, <mask> = 98


# <s> w0 w1 w2 w3 w4 w6 </s> w9 w10 <unk> w12 w13 w15 w16 w17 </s> w18 w21 w22 </s>
# (odd_dict_dir: every third symbol, w0 w3 w6 ..., starts a word)
BLOCK = [0, 4, 5, 6, 7, 8, 10, 2, 13, 14, 3, 16, 17, 19, 20, 21, 2, 22, 25, 26, 2]
M = 98


def _noise_item(odd_dict_dir, whole_words=False, seed=7, epoch=1):
    from fairseq.data import ListDataset

    d, mask = odd_dictionary(odd_dict_dir)
    starts = torch.tensor([i < d.nspecial or i == mask or s.startswith("\u2581") for i, s in enumerate(d.symbols)])
    blocks = ListDataset([torch.tensor(BLOCK)], sizes=np.array([len(BLOCK)]))
    ds = ReplacedLMNoiseDataset(blocks, d, mask, seed, 0.3, 0.5, word_starts=starts if whole_words else None)
    ds.set_epoch(epoch)
    return ds[0]


def test_masked_sets_are_the_literal_expected_ones(odd_dict_dir):
    item = _noise_item(odd_dict_dir)
    # 16 maskable positions (not <s> </s> <unk>): floor(0.3 * 16 + r) = 5 and floor(0.5 * 16 + r) = 8
    assert item["enc"].tolist() == [0, 4, 5, 6, 7, 8, M, 2, M, 14, 3, 16, 17, M, M, 21, 2, 22, M, 26, 2]
    assert item["dec"].tolist() == [0, 4, M, 6, 7, 8, M, 2, M, M, 3, M, 17, M, M, 21, 2, 22, M, 26, 2]
    assert item["target"].tolist() == [1, 4, 5, 6, 7, 8, 10, 1, 13, 14, 1, 16, 17, 19, 20, 21, 1, 22, 25, 26, 1]


def test_whole_word_masked_sets_are_the_literal_expected_ones(odd_dict_dir):
    item = _noise_item(odd_dict_dir, whole_words=True)
    # 8 words: [w0 w1 w2] [w3 w4] [w6] [w9 w10] [w12 w13] [w15 w16 w17] [w18] [w21 w22]; 3 for the encoder, 4 decoder
    assert item["enc"].tolist() == [0, M, M, M, M, M, 10, 2, 13, 14, 3, 16, 17, 19, 20, 21, 2, M, 25, 26, 2]
    assert item["dec"].tolist() == [0, M, M, M, M, M, 10, 2, M, M, 3, 16, 17, 19, 20, 21, 2, M, 25, 26, 2]


def test_masks_depend_on_seed_epoch_and_index_only(odd_dict_dir):
    a, b = _noise_item(odd_dict_dir), _noise_item(odd_dict_dir)
    assert all(torch.equal(a[k], b[k]) for k in a)
    other_epoch = _noise_item(odd_dict_dir, epoch=2)
    assert not torch.equal(a["dec"], other_epoch["dec"])
    assert not torch.equal(a["enc_noise"], other_epoch["enc_noise"])


class ArgmaxLogits(torch.nn.Module):
    """A deterministic 'generator': at position t its distribution is one-hot on
    id 4 + 7t mod 94, and it puts an even larger logit on </s> (which must never
    be sampled)."""

    def __init__(self, vocab_size):
        super().__init__()
        self.vocab_size = vocab_size
        self.scale = torch.nn.Parameter(torch.ones(()))

    def forward(self, tokens, masked_tokens=None):
        b, t = tokens.shape
        logits = torch.zeros(b, t, self.vocab_size)
        logits[:, :, 2] = 200.0  # </s>
        logits[:, torch.arange(t), 4 + (7 * torch.arange(t)) % 94] = 100.0
        return (logits * self.scale)[masked_tokens], {}


class UniformLogits(ArgmaxLogits):
    """Equal logits everywhere: after the ban of the specials, uniform over ids 4..97."""

    def forward(self, tokens, masked_tokens=None):
        return torch.zeros(int(masked_tokens.sum()), self.vocab_size) * self.scale, {}


class Stub(torch.nn.Module):
    """What the generator needs of a fairseq RoBERTa: ``encoder(tokens, masked_tokens=...)``."""

    def __init__(self, encoder):
        super().__init__()
        self.encoder = encoder


def _stub_generator(stub_class):
    banned = torch.zeros(99, dtype=torch.bool)
    banned[:4] = True
    banned[M] = True
    return FrozenGenerator(Stub(stub_class(99)), "stub", "0" * 64, banned, M)


def test_argmax_generator_gives_the_literal_expected_replacements(odd_dict_dir):
    item = _noise_item(odd_dict_dir)
    gen = _stub_generator(ArgmaxLogits)
    enc = gen.replace(item["enc"][None], item["enc_noise"][None])[0]
    dec = gen.replace(item["dec"][None], item["dec_noise"][None])[0]
    # masked positions 6 8 13 14 18 (encoder) + 2 9 11 (decoder) -> 4 + 7t mod 94; </s> never
    assert enc.tolist() == [0, 4, 5, 6, 7, 8, 46, 2, 60, 14, 3, 16, 17, 95, 8, 21, 2, 22, 36, 26, 2]
    assert dec.tolist() == [0, 4, 18, 6, 7, 8, 46, 2, 60, 67, 3, 81, 17, 95, 8, 21, 2, 22, 36, 26, 2]


def test_samples_are_the_inverse_cdf_of_the_pipeline_noise(odd_dict_dir):
    """With a uniform generator over the 94 allowed ids, the sample at a masked
    position is 4 + floor(94 u): the noise alone decides, nothing else random."""
    gen = _stub_generator(UniformLogits)
    for epoch in (1, 2, 3):
        item = _noise_item(odd_dict_dir, epoch=epoch)
        for side in ("enc", "dec"):
            out = gen.replace(item[side][None], item[f"{side}_noise"][None])[0]
            masked = item[side].eq(M)
            u = uniform_from_noise(item[f"{side}_noise"][masked]).double()
            assert out[masked].tolist() == (4 + torch.floor(94 * u)).long().tolist()
            assert torch.equal(out[~masked], item[side][~masked])


def test_inverse_cdf_sample_literal_and_distribution():
    logits = torch.log(torch.tensor([[0.5, 0.1, 0.2, 0.0, 0.3, 0.4]])).expand(7, 6)
    banned = torch.tensor([True, False, False, False, False, True])  # probabilities 0.1 0.2 0 0.3 over 0.6
    u = torch.tensor([0.0, 0.16, 0.17, 0.49, 0.5, 0.51, 1 - 2**-24])
    # cdf 1/6 1/2 1/2 1 -> id 1 below 1/6, id 2 below 1/2, id 4 above; id 3 (p = 0) and banned never
    assert inverse_cdf_sample(logits, u, banned).tolist() == [1, 1, 2, 2, 4, 4, 4]
    g = torch.Generator().manual_seed(0)
    probs = torch.tensor([0.05, 0.25, 0.0, 0.4, 0.3])
    n = 200_000
    ids = inverse_cdf_sample(probs.log().expand(n, 5), torch.rand(n, generator=g), torch.zeros(5, dtype=torch.bool))
    freq = torch.bincount(ids, minlength=5).double() / n
    torch.testing.assert_close(freq, probs.double(), rtol=0, atol=0.005)


@pytest.fixture(scope="module")
def simlm_valid(contract_data, simlm_generator):
    task, model, criterion, _ = build(contract_data, simlm_generator)
    task.load_dataset("valid")
    dataset = task.dataset("valid")
    batch = dataset.collater([dataset[i] for i in range(len(dataset))])
    return task, model, criterion, batch


def test_masked_sets_on_real_data(simlm_valid):
    task, _, _, batch = simlm_valid
    d, mask = task.source_dictionary, task.mask_idx
    enc, dec = batch["net_input"]["src_tokens"], batch["net_input"]["dec_tokens"]
    target, pad = batch["target"], d.pad()
    original = torch.where(target.ne(pad), target, enc)  # specials and pads are never masked
    special = original.lt(d.nspecial)
    enc_set, dec_set = enc.eq(mask), dec.eq(mask)
    assert not (enc_set & ~dec_set).any()  # decoder ⊇ encoder
    assert not (dec_set & special).any()
    assert torch.equal(target.eq(pad), special)  # every non-special position is predicted
    assert torch.equal(enc[~enc_set], original[~enc_set]) and torch.equal(dec[~dec_set], original[~dec_set])
    n = int((~special).sum())
    assert n > 1000
    assert enc_set.sum() / n == pytest.approx(0.3, abs=0.02)
    assert dec_set.sum() / n == pytest.approx(0.5, abs=0.02)


def test_whole_word_masked_sets_on_real_data(contract_data, simlm_generator):
    task, _, _, _ = build(contract_data, simlm_generator, "--mask-whole-words")
    batch = first_batch(task, n=64)
    starts = task.whole_word_mask().bool()
    for view in (batch["net_input"]["src_tokens"], batch["net_input"]["dec_tokens"]):
        masked = view.eq(task.mask_idx)
        original = torch.where(batch["target"].ne(1), batch["target"], view)
        continues = ~starts[original] & original.ge(task.source_dictionary.nspecial)
        # a masked piece that continues a word has its word's previous piece masked too, and vice versa
        inner = continues[:, 1:] & original[:, :-1].ge(task.source_dictionary.nspecial)
        assert torch.equal(masked[:, 1:][inner], masked[:, :-1][inner])
        assert masked[:, 1:][inner].any() and (~masked[:, 1:][inner]).any()


def test_replacements_on_real_data_keep_the_rest_and_avoid_specials(simlm_valid):
    task, _, _, batch = simlm_valid
    d, mask = task.source_dictionary, task.mask_idx
    enc_in, dec_in = task.replaced_inputs(batch)
    for view, replaced in ((batch["net_input"]["src_tokens"], enc_in), (batch["net_input"]["dec_tokens"], dec_in)):
        masked = view.eq(mask)
        assert torch.equal(replaced[~masked], view[~masked])
        assert replaced[masked].ge(d.nspecial).all() and replaced.ne(mask).all()
    # a generator that prefers </s> at every position still never samples it
    stub = FrozenGenerator(Stub(ArgmaxLogits(len(d))), "stub", "0" * 64, task.generator.banned, mask)
    out = stub.replace(batch["net_input"]["dec_tokens"], batch["dec_noise"])
    assert out[batch["net_input"]["dec_tokens"].eq(mask)].ge(d.nspecial).all()


def test_sampling_in_row_chunks_changes_nothing(simlm_valid, monkeypatch):
    import seed_fairseq.pretrain.generator as generator_module

    task, _, _, batch = simlm_valid
    whole = task.replaced_inputs(batch)
    assert int(batch["net_input"]["dec_tokens"].eq(task.mask_idx).sum()) > 7 * 10
    monkeypatch.setattr(generator_module, "SAMPLE_CHUNK", 7)
    assert all(torch.equal(a, b) for a, b in zip(whole, task.replaced_inputs(batch)))


# ---------------------------------------------------------------------------
# the model
# ---------------------------------------------------------------------------


def test_decoder_starts_as_the_encoder_last_two_layers(contract_data, simlm_generator):
    _, model, _, _ = build(contract_data, simlm_generator, "--encoder-layers", "3")
    state = model.state_dict()
    decoder = {k: v for k, v in state.items() if k.startswith("simlm_decoder.")}
    assert len(decoder) > 10
    for key, value in decoder.items():
        i, rest = key[len("simlm_decoder.") :].split(".", 1)
        assert torch.equal(value, state[f"encoder.sentence_encoder.layers.{int(i) + 1}.{rest}"]), key
    # copies, not shared: training the decoder leaves the encoder alone
    decoder_ptrs = {p.data_ptr() for p in model.simlm_decoder.parameters()}
    assert not decoder_ptrs & {p.data_ptr() for p in model.encoder.parameters()}


def test_decoder_from_an_encoder_only_checkpoint_copies_its_last_layers(contract_data, simlm_generator):
    _, model, _, _ = build(contract_data, simlm_generator, "--encoder-layers", "3")
    encoder_only = {k: v + 1.0 for k, v in model.state_dict().items() if not k.startswith("simlm_decoder.")}
    model.upgrade_state_dict_named(encoder_only, "")
    model.load_state_dict(encoder_only)
    for i in (0, 1):
        for name, p in model.simlm_decoder[i].named_parameters():
            torch.testing.assert_close(p, dict(model.encoder.sentence_encoder.layers[i + 1].named_parameters())[name])
            assert torch.equal(p, encoder_only[f"encoder.sentence_encoder.layers.{i + 1}.{name}"])


def test_decoder_is_the_encoder_stack_over_the_cls_slot(simlm_valid):
    """At step 0 with 2 encoder layers the decoder IS the encoder's stack: given the
    embedding-layer output at slot 0 instead of the [CLS] vector it must reproduce
    the encoder's features (bidirectional, same padding handling)."""
    _, model, _, batch = simlm_valid
    model.eval()
    tokens = batch["net_input"]["src_tokens"][:3].clone()
    tokens[1, 30:] = 1  # padding
    with torch.no_grad():
        features, _ = model.encode(tokens)
        slot0 = model.encoder.sentence_encoder.forward_embedding(tokens)[0][:, 0]
        decoded = model.decode(slot0, tokens)
    keep = tokens.ne(1)
    torch.testing.assert_close(decoded[keep], features[keep], rtol=0, atol=1e-5)


def test_bfloat16_forward_and_loss_are_finite(contract_data, simlm_generator):
    task, model, criterion, _ = build(contract_data, simlm_generator)
    batch = first_batch(task)
    model = model.to(torch.bfloat16).train()
    terms = criterion.compute_terms(model, batch)
    assert set(terms) == {"enc", "dec"}
    for term in terms.values():
        assert term.loss.dtype == torch.float32 and torch.isfinite(term.loss)
    assert next(task.generator.model.parameters()).dtype == torch.bfloat16  # runs in the model's precision


def _loss_grads_rng(criterion, model, batch):
    model.zero_grad()
    torch.manual_seed(3)
    loss, _, _ = criterion(model, batch)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    return loss.detach(), grads, torch.rand(4)


def test_recomputed_decoder_layers_are_bitwise_the_kept_ones(contract_data, simlm_generator):
    """Dropout on: recomputing the decoder layers in backward gives bitwise the loss and every
    parameter's gradient of keeping their activations, and leaves the RNG where it was."""
    task, model, criterion, _ = build(contract_data, simlm_generator)
    assert model.args.dropout > 0 and model.args.attention_dropout > 0
    batch = first_batch(task, split="train", n=5)
    model.train()
    assert model.recompute_decoder  # the default
    loss, grads, after = _loss_grads_rng(criterion, model, batch)
    model.recompute_decoder = False
    loss_kept, grads_kept, after_kept = _loss_grads_rng(criterion, model, batch)
    assert torch.equal(loss, loss_kept) and torch.equal(after, after_kept)
    assert len(grads_kept) == len(list(model.parameters()))
    assert any(n.startswith("simlm_decoder.") for n in grads_kept)
    for name, grad in grads_kept.items():
        assert torch.equal(grads[name], grad), name


def _saved_bytes_and_decoder_calls(criterion, model, batch):
    calls, saved, phase = [], [0], ["forward"]
    handles = [
        layer.register_forward_pre_hook(lambda module, args, i=i: calls.append(f"{phase[0]} {i}"))
        for i, layer in enumerate(model.simlm_decoder)
    ]

    def pack(t):
        saved[0] += t.numel() * t.element_size()
        return t

    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss, _, _ = criterion(model, batch)
        phase[0] = "backward"
        loss.backward()
    finally:
        for handle in handles:
            handle.remove()
    return saved[0], calls


def test_decoder_layers_are_recomputed_one_at_a_time(contract_data, simlm_generator):
    """The forward keeps no decoder-layer activations, and backward recomputes the layers
    one by one, last first (one decoder layer's activations alive at a time)."""
    task, model, criterion, _ = build(contract_data, simlm_generator)
    batch = first_batch(task, split="train", n=5)
    model.train()
    recomputed, calls = _saved_bytes_and_decoder_calls(criterion, model, batch)
    assert calls == ["forward 0", "forward 1", "backward 1", "backward 0"]
    model.recompute_decoder = False
    kept, calls = _saved_bytes_and_decoder_calls(criterion, model, batch)
    assert calls == ["forward 0", "forward 1"]
    # 2 encoder + 2 decoder layers of the same shape: the decoder's are well over a quarter
    assert recomputed < 0.8 * kept, (recomputed, kept)


# ---------------------------------------------------------------------------
# the frozen generator
# ---------------------------------------------------------------------------


def test_generator_is_frozen_outside_optimizer_and_checkpoint(contract_data, simlm_generator, tmp_path):
    from fairseq.trainer import Trainer

    task, model, criterion, cfg = build(contract_data, simlm_generator, *SGD, "--batch-size", "4")
    trainer = Trainer(cfg, task, model, criterion)
    gen = task.generator.model
    on_file = load_torch_file(simlm_generator)["model"]
    assert gen.state_dict().keys() == on_file.keys()
    task.load_dataset("train")
    itr = task.get_batch_iterator(task.dataset("train"), max_sentences=4, seed=1).next_epoch_itr(shuffle=False)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    for _ in range(3):
        trainer.train_step([next(itr)])
    assert trainer.get_num_updates() == 3
    assert not torch.equal(
        model.state_dict()["encoder.sentence_encoder.layers.0.fc1.weight"],
        start["encoder.sentence_encoder.layers.0.fc1.weight"],
    )
    for key, value in gen.state_dict().items():
        assert torch.equal(value, on_file[key]), key  # bit-identical
    assert not gen.training and all(not p.requires_grad and p.grad is None for p in gen.parameters())
    in_optimizer = {id(p) for group in trainer.optimizer.param_groups for p in group["params"]}
    assert in_optimizer and not in_optimizer & {id(p) for p in gen.parameters()}
    assert in_optimizer == {id(p) for p in model.parameters()}

    trainer.consolidate_optimizer()  # what fairseq's save_checkpoint does first
    trainer.save_checkpoint(str(tmp_path / "ckpt.pt"), {})
    saved = load_torch_file(tmp_path / "ckpt.pt")
    assert saved["model"].keys() == model.state_dict().keys()
    assert all(k.startswith(("encoder.", "simlm_decoder.")) for k in saved["model"])
    assert saved.get("criterion") is None
    assert len(saved["last_optimizer_state"]["param_groups"][0]["params"]) == len(list(model.parameters()))
    assert saved["task_state"]["generator_sha256"] == task.generator.sha256
    assert saved["task_state"]["generator_path"] == str(simlm_generator.resolve())


def test_registered_names_are_ours():
    import fairseq.criterions as C
    import fairseq.models as Mo
    import fairseq.tasks as T

    from seed_fairseq.pretrain.criterions.simlm_pretrain import SimLMPretrainCriterion
    from seed_fairseq.pretrain.models.simlm import SimLMModel
    from seed_fairseq.pretrain.tasks.simlm_pretrain import SimLMPretrainTask

    assert T.TASK_REGISTRY["simlm_pretrain"] is SimLMPretrainTask
    assert C.CRITERION_REGISTRY["simlm_pretrain"] is SimLMPretrainCriterion
    assert Mo.MODEL_REGISTRY["simlm"] is SimLMModel
    for name in ("simlm", "simlm_base", "simlm_tiny"):
        assert Mo.ARCH_MODEL_REGISTRY[name] is SimLMModel, name


def test_a_stock_roberta_checkpoint_is_a_generator_too(contract_data, simlm_generator, tmp_path):
    """Any fairseq masked LM with the data's dictionary: the generator's own weights as a
    stock ``roberta`` checkpoint (seed-drop-heads) sample exactly the same tokens."""
    from seed_fairseq.encoders.drop_heads import write_encoder_checkpoint

    write_encoder_checkpoint(simlm_generator, tmp_path / "roberta.pt")
    task, _ = setup(contract_data)
    stock = FrozenGenerator.load(str(tmp_path / "roberta.pt"), task)
    ours = FrozenGenerator.load(str(simlm_generator), task)
    assert type(stock.model).__name__ == "RobertaModel" and type(ours.model).__name__ == "SeedEncoderModel"
    batch = first_batch(task)
    tokens, noise = batch["net_input"]["dec_tokens"], batch["dec_noise"]
    replaced = stock.replace(tokens, noise)
    assert torch.equal(replaced, ours.replace(tokens, noise)) and not torch.equal(replaced, tokens)


def _write(path, data):
    path.write_bytes(data)
    return path


def _edited_generator(source, out, edit):
    state = load_torch_file(source)
    edit(state)
    torch.save(state, out)
    return out


def _drop_rows(state):
    key = "encoder.sentence_encoder.embed_tokens.weight"
    state["model"][key] = state["model"][key][:-2]


def _other_symbols(state):
    state["task_state"]["dictionary_sha256"] = "f" * 64


def _not_a_masked_lm(state):
    state["cfg"]["model"].arch = "transformer_lm"
    state["cfg"]["model"]._name = "transformer_lm"


@pytest.mark.parametrize(
    "make, expected",
    [
        (lambda src, p: _write(p, b"not a checkpoint at all"), "not a readable fairseq checkpoint"),
        (lambda src, p: _write(p, b""), "empty"),
        (lambda src, p: p.parent / "missing.pt", "not found"),
        (lambda src, p: _edited_generator(src, p, _drop_rows), "dictionary mismatch: the generator embeds"),
        (lambda src, p: _edited_generator(src, p, _other_symbols), "dictionary mismatch: trained with other"),
        (lambda src, p: _edited_generator(src, p, _not_a_masked_lm), "not a masked language model"),
    ],
    ids=["garbage", "empty", "missing", "dictionary-size", "dictionary-symbols", "not-mlm"],
)
def test_bad_generator_is_a_clear_error_naming_the_file(contract_data, simlm_generator, tmp_path, make, expected):
    task, _ = setup(contract_data)
    path = make(simlm_generator, tmp_path / "generator.pt")
    with pytest.raises(CheckpointError) as e:
        FrozenGenerator.load(str(path), task)
    assert str(e.value).startswith(str(path)) and "--generator-path" in str(e.value) and expected in str(e.value)


@pytest.mark.parametrize(
    "extra, expected",
    [
        ([], "--generator-path is required"),
        (["--decoder-mask-prob", "0.2"], "--mask-prob (0.3) <= --decoder-mask-prob (0.2)"),
        (["--leave-unmasked-prob", "0.1"], "does not support --leave-unmasked-prob"),
        (["--decoder-layers", "3"], "--decoder-layers must be between 0 and --encoder-layers (2)"),
    ],
    ids=["no-generator", "dec-below-enc", "80-10-10", "deep-decoder"],
)
def test_bad_options_are_clear_errors(contract_data, simlm_generator, extra, expected):
    if extra[:1] == ["--decoder-layers"]:
        extra = ["--generator-path", str(simlm_generator), *extra]
    with pytest.raises(ValueError, match=re.escape(expected)):
        task, cfg = setup(contract_data, *extra)
        task.build_model(cfg.model)
        task.build_criterion(cfg.criterion)


def test_generator_check_applies_to_simlm_checkpoints_only(contract_data, simlm_generator):
    task, _, _, _ = build(contract_data, simlm_generator)
    recorded = {"dictionary_sha256": task.dictionary_sha256, "generator_sha256": "e" * 64, "generator_path": "/old.pt"}
    encoder = torch.zeros(1)
    # an encoder-only checkpoint (seed-drop-heads of a run with another generator) may start a new run
    task.check_checkpoint({"task_state": recorded, "model": {"encoder.lm_head.bias": encoder}}, "enc.pt")
    with pytest.raises(CheckpointError, match="another generator"):
        task.check_checkpoint({"task_state": recorded, "model": {"simlm_decoder.0.fc1.bias": encoder}}, "ckpt.pt")
    same = dict(recorded, generator_sha256=task.generator.sha256)
    task.check_checkpoint({"task_state": same, "model": {"simlm_decoder.0.fc1.bias": encoder}}, "ckpt.pt")


# ---------------------------------------------------------------------------
# end to end through the real CLI
# ---------------------------------------------------------------------------


def train_cmd(data, save_dir, generator, *extra, max_update=4):
    return fairseq_train(
        data,
        "--task", "simlm_pretrain", "--criterion", "simlm_pretrain", *TINY, "--generator-path", generator,
        "--tokens-per-sample", "48", "--sample-break-mode", "none", "--batch-size", "4",
        "--optimizer", "adam", "--lr", "1e-3", "--lr-scheduler", "fixed", "--max-update", str(max_update),
        "--log-format", "json", "--log-interval", "1", "--cpu", "--seed", "3", "--num-workers", "0",
        "--no-epoch-checkpoints", *extra,
        save_dir=save_dir,
    )  # fmt: skip


@pytest.mark.slow
def test_simlm_trains_and_validates_with_a_generator_made_by_this_project(contract_data, simlm_generator, tmp_path):
    """The recipe of docs/objectives/simlm.md end to end: a small seed_encoder_mlm_only generator trained on
    the same data with fairseq-train (the simlm_generator fixture), then SimLM with it."""
    proc = check(train_cmd(contract_data, tmp_path / "simlm", simlm_generator, "--validate-interval-updates", "2"))
    train, valid = records(proc), records(proc, "valid")
    assert [int(r["num_updates"]) for r in train] == [1, 2, 3, 4] and valid
    for r in train:
        assert np.isfinite(float(r["enc_loss"])) and np.isfinite(float(r["dec_loss"]))
        assert int(r["enc_ntokens"]) == int(r["dec_ntokens"]) > 0
        # ~30% / ~50% of the positions are replaced, and the 3-update generator rarely guesses the original
        assert 20 < float(r["enc_replaced"]) < float(r["dec_replaced"]) < 60
    assert 0 < float(valid[-1]["valid_enc_loss"]) < 12
    saved = load_torch_file(tmp_path / "simlm" / "checkpoint_last.pt")
    assert all(k.startswith(("encoder.", "simlm_decoder.")) for k in saved["model"])


@pytest.mark.slow
def test_resume_with_another_generator_is_refused(contract_data, simlm_generator, tmp_path):
    check(train_cmd(contract_data, tmp_path / "run", simlm_generator, "--disable-validation", max_update=2))
    other = _edited_generator(
        simlm_generator, tmp_path / "other.pt", lambda s: s["model"]["encoder.lm_head.bias"].add_(1.0)
    )
    proc = run(train_cmd(contract_data, tmp_path / "run", other, "--disable-validation", max_update=3))
    assert proc.returncode != 0
    line = last_line(proc)
    assert "checkpoint_last.pt" in line and "another generator" in line and str(other) in line, line
    check(
        train_cmd(
            contract_data,
            tmp_path / "run",
            other,
            "--disable-validation",
            "--allow-generator-change",
            max_update=3,
        )
    )


@pytest.mark.slow
def test_missing_generator_is_a_clear_error_through_the_cli(contract_data, tmp_path):
    missing = tmp_path / "no" / "generator.pt"
    proc = run(train_cmd(contract_data, tmp_path / "run", missing, "--disable-validation", max_update=1))
    assert proc.returncode != 0
    line = last_line(proc)
    assert str(missing) in line and "not found" in line, line
