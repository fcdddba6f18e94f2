"""RetroMAE / DupMAE pre-training: the enhanced decoder's masks and two streams, the
bag-of-words term, the memory-light vocabulary max-pool, half precision, bad options.

(The [CLS] bottleneck, split invariance, resume, head dropping and export of both
objectives are checked by the contract suite: ``objectives.py``.)
"""

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers import fairseq_train, parse_argv, run
from objectives import TINY_ENCODER

from seed_fairseq.pretrain.criterions.retromae_pretrain import bow_term
from seed_fairseq.pretrain.data.decoder_mask_dataset import SALT, DecoderMaskDataset, decoder_mask
from seed_fairseq.pretrain.models.retromae import RetroMAEModel
from seed_fairseq.pretrain.modules import vocab_pool
from seed_fairseq.pretrain.modules.vocab_pool import vocab_max_pool
from seed_fairseq.pretrain.tasks.retromae_pretrain import bag_of_words


def build(data_dir, *extra, task="dupmae_pretrain", arch="dupmae_tiny", tokens_per_sample=32):
    """Task, model and criterion through fairseq's own argument parsing."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser,
        parse_argv(
            data_dir,
            ["--task", task, "--criterion", task, "--arch", arch, *TINY_ENCODER, "--decoder-ffn-embed-dim", "23"]
            + ["--tokens-per-sample", str(tokens_per_sample), "--cpu", *extra],
        ),
    )
    cfg = convert_namespace_to_omegaconf(args)
    task_ = tasks.setup_task(cfg.task)
    return task_, task_.build_model(cfg.model), task_.build_criterion(cfg.criterion)


def literal(rows):
    """Rows of 'x' (visible) and '.' (hidden) -> the boolean HIDDEN matrix."""
    return torch.tensor([[c == "." for c in r] for r in rows])


# ids in the conftest dictionary: 0 <s>, 1 <pad>, 2 </s>, 3 <unk>, 4 + i = "w{i}" (a word start
# when i % 3 == 0), 98 <mask>.  This block: <s> [w0 w1] [w3 w4] </s> [w6 w2 w7]
BLOCK = np.array([0, 4, 5, 7, 8, 2, 10, 6, 11])


def odd_word_starts():
    starts = np.zeros(99, dtype=bool)
    starts[:4] = True
    starts[98] = True
    starts[4::3] = True
    return starts


def test_registered_names_are_ours():
    import fairseq.criterions as C
    import fairseq.models as M
    import fairseq.tasks as T

    from seed_fairseq.pretrain.criterions.retromae_pretrain import DupMAECriterion, RetroMAECriterion
    from seed_fairseq.pretrain.tasks.retromae_pretrain import DupMAEPretrainTask, RetroMAEPretrainTask

    assert T.TASK_REGISTRY["retromae_pretrain"] is RetroMAEPretrainTask
    assert T.TASK_REGISTRY["dupmae_pretrain"] is DupMAEPretrainTask
    assert C.CRITERION_REGISTRY["retromae_pretrain"] is RetroMAECriterion
    assert C.CRITERION_REGISTRY["dupmae_pretrain"] is DupMAECriterion
    assert issubclass(DupMAEPretrainTask, RetroMAEPretrainTask) and issubclass(DupMAECriterion, RetroMAECriterion)
    for name in ("retromae_base", "dupmae_base", "retromae_tiny", "dupmae_tiny"):
        assert M.ARCH_MODEL_REGISTRY[name] is RetroMAEModel, name


def test_base_archs_are_bert_base_with_one_decoder_layer():
    import argparse

    from fairseq.models import ARCH_CONFIG_REGISTRY

    for name in ("retromae_base", "dupmae_base"):
        args = argparse.Namespace()
        ARCH_CONFIG_REGISTRY[name](args)
        assert (args.encoder_layers, args.encoder_embed_dim, args.encoder_ffn_embed_dim) == (12, 768, 3072)
        assert (args.encoder_attention_heads, args.decoder_attention_heads, args.decoder_ffn_embed_dim) == (
            12,
            12,
            3072,
        )
        assert args.decoder_query_layernorm is False


# ---------------------------------------------------------------------------
# the decoder's attention masks
# ---------------------------------------------------------------------------


def test_decoder_masks_literal_for_a_fixed_seed():
    """Seed 3, epoch 1, index 0, ratio 0.5: four words [1 2] [3 4] [5] [6 7 8], two hidden per row,
    the diagonal always hidden, column 0 always visible (except to row 0)."""
    ws = odd_word_starts()[BLOCK]
    got = decoder_mask(BLOCK, 0.5, np.random.default_rng([3, 1, 0, SALT]), word_starts=ws)
    expected = literal(
        [
            "...xx.xxx",
            "x.xxx....",
            "xx...x...",
            "x...x.xxx",
            "xxxx.....",
            "xxx...xxx",
            "x....x.xx",
            "x....xx.x",
            "x..xxx...",
        ]
    )
    assert torch.equal(torch.from_numpy(got), expected)
    # the dataset draws exactly this for (seed 3, epoch 1, index 0)
    ds = DecoderMaskDataset([torch.from_numpy(BLOCK)], 0.5, seed=3, word_starts=odd_word_starts())
    ds.set_epoch(1)
    assert torch.equal(ds[0], expected)
    ds.set_epoch(2)
    assert not torch.equal(ds[0], expected)  # a new epoch draws new masks

    # --decoder-separators-visible: </s> (position 5) is never drawn; three words, 1 or 2 hidden
    special = BLOCK < 4
    got = decoder_mask(BLOCK, 0.5, np.random.default_rng([3, 1, 0, SALT]), word_starts=ws, special=special)
    expected = literal(
        [
            ".xxxxx...",
            "x..xxxxxx",
            "x....xxxx",
            "x...xx...",
            "x..x.xxxx",
            "x..xx.xxx",
            "x....x.xx",
            "x....xx.x",
            "xxx..xxx.",
        ]
    )
    assert torch.equal(torch.from_numpy(got), expected)
    # --mask-single-pieces: eight units, four hidden per row (plus the diagonal)
    got = decoder_mask(BLOCK, 0.5, np.random.default_rng([3, 1, 0, SALT]))
    expected = literal(
        [
            "..x..xx.x",
            "x..xx.x..",
            "xx...x..x",
            "xx..x...x",
            "x.xx.x..x",
            "x.xx...xx",
            "x..xxx..x",
            "xx....x.x",
            "xxxx.....",
        ]
    )
    assert torch.equal(torch.from_numpy(got), expected)


@pytest.mark.parametrize("n,ratio", [(2, 0.5), (13, 0.3), (41, 0.5), (64, 0.9)])
def test_decoder_mask_rules_on_random_blocks(n, ratio):
    g = np.random.default_rng(n)
    tokens = g.integers(4, 98, n)
    tokens[0] = 0
    ws = odd_word_starts()[tokens]
    word = np.cumsum(np.r_[False, True, ws[2:]])  # word of each position; position 1 opens one
    n_words = int(word[-1])
    for index in range(20):
        m = decoder_mask(tokens, ratio, np.random.default_rng([1, 1, index, SALT]), word_starts=ws)
        assert m.diagonal().all()
        assert not m[1:, 0].any()
        for i in range(n):
            hidden_words = set()
            for w in range(1, n_words + 1):
                cols = [c for c in np.flatnonzero(word == w) if c != i]
                assert len(set(m[i, cols])) <= 1, (i, w)  # a word is hidden whole (the diagonal aside)
                if cols and m[i, cols[0]]:
                    hidden_words.add(w)
            drawn = int(ratio * n_words)  # int(ratio * U + u): this or one more; i's own word may be unseen
            assert drawn - 1 <= len(hidden_words) <= drawn + 1, (i, len(hidden_words), n_words)


def test_collater_pads_with_hidden_rows_and_columns():
    ds = DecoderMaskDataset([torch.arange(5), torch.arange(3)], 0.5, seed=1)
    ds.set_epoch(1)
    batch = ds.collater([ds[0], ds[1]])
    assert batch.shape == (2, 5, 5) and batch.dtype == torch.bool
    assert batch[1, 3:].all() and batch[1, :, 3:].all()
    assert torch.equal(batch[1, :3, :3], ds[1])


# ---------------------------------------------------------------------------
# enhanced decoding
# ---------------------------------------------------------------------------


def _decoder_inputs(model, batch=3, n=11, seed=0):
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(4, 98, (batch, n), generator=g)
    tokens[:, 0] = 0
    tokens[-1, 7:] = 1  # padding
    hidden = torch.stack(
        [
            torch.from_numpy(decoder_mask(t.numpy(), 0.5, np.random.default_rng([seed, 1, b, SALT])))
            for b, t in enumerate(tokens)
        ]
    )
    hidden[-1, 7:] = True
    hidden[-1, :, 7:] = True
    cls = torch.randn(batch, model.args.encoder_embed_dim, generator=g)
    return tokens, hidden, cls


def test_prediction_at_i_never_depends_on_token_i_and_always_on_cls(odd_dict_dir):
    _, model, _ = build(odd_dict_dir)
    model.eval()
    tokens, hidden, cls = _decoder_inputs(model)
    cls.requires_grad_(True)
    query, content = model.decoder_streams(cls, tokens)
    content = content.detach().requires_grad_(True)
    logits = model.mlm_logits(model.enhanced_decoder(query, content, hidden))
    for b in range(tokens.size(0)):
        for i in range(1, int(tokens[b].ne(1).sum())):
            gc, gcls = torch.autograd.grad(logits[b, i].sum(), [content, cls], retain_graph=True)
            assert torch.all(gc[b, i] == 0), (b, i)  # exactly zero: position i never sees token i
            seen = ~hidden[b, i]
            assert torch.all(gc[b, ~seen] == 0) and torch.all(gc[b, seen].abs().sum(-1) > 0), (b, i)
            assert gcls[b].abs().sum() > 0  # ... and always sees the [CLS] vector
            assert torch.all(gc[torch.arange(tokens.size(0)) != b] == 0)  # nor another text


def test_changing_token_i_leaves_prediction_i_bit_identical(odd_dict_dir):
    _, model, _ = build(odd_dict_dir)
    model.eval()
    tokens, hidden, cls = _decoder_inputs(model, seed=5)
    with torch.no_grad():
        base = model.decode(cls, tokens, hidden)
        for i in range(1, tokens.size(1)):
            other = tokens.clone()
            other[0, i] = 4 + (int(other[0, i]) - 3) % 90  # another ordinary token
            changed = model.decode(cls, other, hidden)
            assert torch.equal(changed[0, i], base[0, i]), i
            for j in range(1, tokens.size(1)):  # j sees i exactly when row j shows column i
                assert torch.equal(changed[0, j], base[0, j]) == bool(hidden[0, j, i]), (i, j)
            assert torch.equal(changed[1:], base[1:])
        assert not torch.equal(model.decode(cls + 1, tokens, hidden)[:, 1:], base[:, 1:])


def test_query_stream_is_cls_plus_position_and_content_slot0_is_cls(odd_dict_dir):
    _, model, _ = build(odd_dict_dir)
    model.eval()
    tokens, _, cls = _decoder_inputs(model)
    query, content = model.decoder_streams(cls, tokens)
    positions = model.encoder.sentence_encoder.embed_positions(tokens)
    torch.testing.assert_close(query, cls.unsqueeze(1) + positions, rtol=0, atol=0)
    assert torch.equal(content[:, 0], cls)
    emb, _ = model.encoder.sentence_encoder.forward_embedding(tokens)
    assert torch.equal(content[:, 1:], emb[:, 1:])
    # the reference code v2: the query goes through the embedding LayerNorm
    _, model2, _ = build(odd_dict_dir, "--decoder-query-layernorm")
    model2.eval()
    query2, _ = model2.decoder_streams(cls, tokens)
    ln = model2.encoder.sentence_encoder.layernorm_embedding
    torch.testing.assert_close(query2, ln(cls.unsqueeze(1) + model2.encoder.sentence_encoder.embed_positions(tokens)))


def test_shared_embeddings_and_head(odd_dict_dir):
    _, model, _ = build(odd_dict_dir)
    own = {k for k, _ in model.enhanced_decoder.named_parameters()}
    # the decoder owns one layer and nothing else: embeddings and output head are the encoder's
    assert all(not k.startswith(("embed", "lm_head", "output")) for k in own)
    assert model.encoder.lm_head.weight is model.encoder.sentence_encoder.embed_tokens.weight
    _, retro, _ = build(odd_dict_dir, task="retromae_pretrain", arch="retromae_tiny")
    assert model.state_dict().keys() == retro.state_dict().keys()  # one model for both objectives


def _sample(task, batch=4, n=17, seed=3):
    g = torch.Generator().manual_seed(seed)
    pad = task.source_dictionary.pad()
    blocks = torch.randint(4, 98, (batch, n), generator=g)
    blocks[:, 0] = 0
    blocks[:, 9] = 2  # a sentence boundary
    blocks[2, 11:] = pad
    blocks[3, 3:] = pad  # a short text
    target = torch.full_like(blocks, pad)
    src = blocks.clone()
    for b, positions in enumerate([[1, 4], [2, 3, 12], [5], [1]]):
        target[b, positions] = blocks[b, positions]
        src[b, positions] = task.mask_idx
    hidden = torch.stack(
        [
            torch.from_numpy(decoder_mask(b.numpy(), 0.5, np.random.default_rng([seed, 1, i, SALT])))
            for i, b in enumerate(blocks)
        ]
    )
    hidden |= blocks.eq(pad).unsqueeze(1) | blocks.eq(pad).unsqueeze(2)
    return {
        "net_input": {"src_tokens": src, "src_lengths": src.ne(pad).sum(1), "dec_tokens": blocks, "dec_hidden": hidden},
        "target": target,
        "ntokens": int(src.ne(pad).sum()),
        "nsentences": batch,
    }


def test_bfloat16_forward_and_loss_are_finite_with_fully_hidden_rows(odd_dict_dir):
    task, model, criterion = build(odd_dict_dir)
    model = model.to(torch.bfloat16).train()
    sample = _sample(task)
    assert sample["net_input"]["dec_hidden"][3, 3:].all()  # padding rows: every key hidden
    loss, _, log = criterion(model, sample)
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    assert log["bow_ntokens"] > 0 and log["dec_ntokens"] > 0
    loss.backward()
    for name, p in model.named_parameters():
        assert p.grad is None or torch.isfinite(p.grad.float()).all(), name
    # the layer alone: a row that hides every key gives a finite (uniform) average
    layer = model.enhanced_decoder
    q = torch.randn(2, 5, 32, dtype=torch.bfloat16)
    out = layer(q, q, torch.ones(2, 5, 5, dtype=torch.bool))
    assert torch.isfinite(out.float()).all()


# ---------------------------------------------------------------------------
# the bag of words
# ---------------------------------------------------------------------------


def test_bag_of_words_targets_are_the_distinct_ordinary_tokens(odd_dict_dir):
    task, _, _ = build(odd_dict_dir)
    d = task.source_dictionary
    dec_tokens = torch.tensor(
        [
            [0, 7, 9, 7, 2, 3, 9, 98, 11],  # repeats, </s>, <unk>, <mask>
            [0, 5, 2, 1, 1, 1, 1, 1, 1],  # padding
            [0, 2, 1, 1, 1, 1, 1, 1, 1],  # nothing ordinary
        ]
    )
    bag, length = bag_of_words(dec_tokens, d, task.mask_idx)
    assert [sorted(row.nonzero().flatten().tolist()) for row in bag] == [[7, 9, 11], [5], []]
    assert length.tolist() == [5, 1, 0]
    sample = {"net_input": {"dec_tokens": dec_tokens}, "target": torch.ones_like(dec_tokens)}
    assert task.term_counts(sample)["bow"] == 4  # distinct (text, token) pairs
    assert task.term_counts(sample)["dec"] == 6  # ordinary positions after [CLS]


def test_bow_pools_ordinary_unmasked_positions_by_default(odd_dict_dir):
    task, _, criterion = build(odd_dict_dir)
    sample = _sample(task)
    pool = criterion.bow_positions(sample)
    expected = torch.ones(4, 17, dtype=torch.bool)
    expected[:, 0] = False
    expected[:, 9] = False  # </s>
    expected[2, 11:] = False
    expected[3, 3:] = False  # padding
    for b, positions in enumerate([[1, 4], [2, 3, 12], [5], [1]]):
        expected[b, positions] = False  # masked
    assert torch.equal(pool, expected)
    _, _, reference = build(odd_dict_dir, "--bow-pool-all-positions")
    expected = sample["net_input"]["dec_tokens"].ne(1)
    expected[:, 0] = False
    assert torch.equal(reference.bow_positions(sample), expected)


def test_bow_term_on_hand_numbers():
    mu = torch.tensor([[1.0, 2.0, 0.0, -1.0], [0.5, 0.5, 3.0, 0.0]])
    bag = torch.tensor([[False, True, True, False], [True, False, False, False]])
    length = torch.tensor([3, 1])
    lse = torch.logsumexp(mu, -1)
    nll = [(lse[0] - 2.0) + (lse[0] - 0.0), lse[1] - 0.5]
    term = bow_term(mu, bag, length, "distinct")
    assert term.loss.item() == pytest.approx(float(nll[0] + nll[1]))
    # text 0: its targets {1, 2} rank 1st and 3rd, top-2 holds one; text 1: {0} not 1st
    assert term.correct == 1
    term = bow_term(mu, bag, length, "tokens")  # the reference code: / tokens of the text, per text
    assert term.loss.item() == pytest.approx(float(nll[0] / 3 + nll[1] / 1))


@pytest.mark.parametrize("extra", [[], ["--bow-pool-all-positions"]])
def test_bow_loss_equals_a_plain_reference(odd_dict_dir, extra):
    task, model, criterion = build(odd_dict_dir, *extra)
    model.eval()
    sample = _sample(task)
    got = criterion.compute_terms(model, sample)["bow"].loss
    with torch.no_grad():
        features, _ = model.encode(sample["net_input"]["src_tokens"])
        logits = model.encoder.lm_head(features)  # every position, plain autograd-free reference
    dec_tokens = sample["net_input"]["dec_tokens"]
    loss = 0.0
    for b in range(dec_tokens.size(0)):
        if extra:
            pool = [t for t in range(1, dec_tokens.size(1)) if dec_tokens[b, t] != 1]
        else:
            pool = [
                t
                for t in range(1, dec_tokens.size(1))
                if dec_tokens[b, t] >= 4 and dec_tokens[b, t] != 98 and sample["target"][b, t] == 1
            ]
        mu = torch.stack([logits[b, t] for t in pool]).max(0).values
        for x in {int(t) for t in dec_tokens[b] if t >= 4 and t != 98}:
            loss += -F.log_softmax(mu, -1)[x]
    assert got.item() == pytest.approx(float(loss), rel=1e-5)


def test_retromae_has_no_bow_term_and_dupmae_needs_its_task(odd_dict_dir):
    task, model, criterion = build(odd_dict_dir, task="retromae_pretrain", arch="retromae_tiny")
    sample = _sample(task)
    assert set(criterion.compute_terms(model, sample)) == {"mlm", "dec"}
    assert set(task.term_counts(sample)) == {"mlm", "dec"}
    from seed_fairseq.pretrain.criterions.retromae_pretrain import DupMAECriterion, DupMAECriterionConfig

    with pytest.raises(ValueError, match="--criterion dupmae_pretrain needs --task dupmae_pretrain"):
        DupMAECriterion(DupMAECriterionConfig(), task)


# ---------------------------------------------------------------------------
# the vocabulary max-pool
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("chunk", [1 << 24, 7])
def test_vocab_max_pool_equals_plain_autograd(monkeypatch, chunk):
    monkeypatch.setattr(vocab_pool, "CHUNK_ELEMENTS", chunk)  # 7: one row / one vocabulary entry at a time
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(3, 6, 5, dtype=torch.float64, generator=g, requires_grad=True)
    weight = torch.randn(11, 5, dtype=torch.float64, generator=g, requires_grad=True)
    bias = torch.randn(11, dtype=torch.float64, generator=g, requires_grad=True)
    pool = torch.rand(3, 6, generator=g) > 0.4
    pool[1] = False  # nothing to pool
    pool[2, 0] = True
    upstream = torch.randn(3, 11, dtype=torch.float64, generator=g)

    mu, arg = vocab_max_pool(hidden, weight, bias, pool)
    grads = torch.autograd.grad((mu * upstream * pool.any(1, keepdim=True)).sum(), [hidden, weight, bias])

    logits = hidden @ weight.t() + bias
    ref = logits.masked_fill(~pool.unsqueeze(-1), float("-inf")).amax(1)
    keep = pool.any(1)
    ref_grads = torch.autograd.grad((ref[keep] * upstream[keep]).sum(), [hidden, weight, bias])
    torch.testing.assert_close(mu[keep], ref[keep], rtol=0, atol=1e-12)
    assert torch.all(mu[1] == torch.finfo(torch.float64).min) and torch.all(arg[1] == -1)
    for got, want in zip(grads, ref_grads):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-12)


# ---------------------------------------------------------------------------
# the data pipeline on real blocks
# ---------------------------------------------------------------------------


def test_pipeline_on_real_blocks(demo_data_bin):
    task, _, _ = build(demo_data_bin, "--seed", "7", tokens_per_sample=48)
    task.load_dataset("valid")
    itr = task.get_batch_iterator(task.dataset("valid"), max_sentences=4, seed=7).next_epoch_itr(shuffle=False)
    sample = next(itr)
    pad = task.source_dictionary.pad()
    src, target = sample["net_input"]["src_tokens"], sample["target"]
    dec_tokens, hidden = sample["net_input"]["dec_tokens"], sample["net_input"]["dec_hidden"]
    assert hidden.shape == (src.size(0), src.size(1), src.size(1))
    # dec_tokens is the unmasked block: equal to the encoder input where nothing was masked
    masked = target.ne(pad)
    assert torch.equal(dec_tokens[~masked], src[~masked]) and torch.equal(dec_tokens[masked], target[masked])
    # the masks are the seeded draws of decoder_mask for each example
    ws = task.whole_word_mask().bool().numpy()
    for row, index in enumerate(sample["id"].tolist()):
        n = int(dec_tokens[row].ne(pad).sum())
        tokens = dec_tokens[row, :n].numpy()
        want = decoder_mask(tokens, 0.5, np.random.default_rng([7, 1, index, SALT]), word_starts=ws[tokens])
        assert torch.equal(hidden[row, :n, :n], torch.from_numpy(want))
        assert hidden[row, n:].all() and hidden[row, :, n:].all()
    # 30% of the words, masked whole: a masked piece's word is masked entirely
    assert task.cfg.mask_whole_words and task.cfg.mask_prob == 0.3
    starts = torch.from_numpy(ws)[dec_tokens]
    for row in range(src.size(0)):
        word = torch.cumsum(starts[row].long(), 0)
        for w in word[masked[row]].unique():
            assert masked[row][word == w].all()


def test_single_pieces_option(odd_dict_dir):
    task, _, _ = build(odd_dict_dir, "--mask-single-pieces")
    assert not task.cfg.mask_whole_words


@pytest.mark.parametrize("value", ["0", "1", "1.5", "-0.2"])
def test_decoder_mask_prob_outside_0_1_is_a_clear_error(odd_dict_dir, value):
    with pytest.raises(ValueError, match=r"--decoder-mask-prob must be in \(0, 1\)"):
        build(odd_dict_dir, "--decoder-mask-prob", value)


def test_contradicting_masking_options_are_refused(odd_dict_dir):
    with pytest.raises(ValueError, match="--mask-single-pieces and --mask-whole-words"):
        build(odd_dict_dir, "--mask-single-pieces", "--mask-whole-words")


@pytest.mark.slow
def test_fairseq_train_names_the_bad_option_last(demo_data_bin, tmp_path):
    proc = run(
        fairseq_train(
            demo_data_bin,
            "--task", "dupmae_pretrain", "--criterion", "dupmae_pretrain", "--arch", "dupmae_tiny",
            "--decoder-mask-prob", "1.0", "--batch-size", "4", "--cpu", "--max-update", "1",
            save_dir=tmp_path,
        )
    )  # fmt: skip
    assert proc.returncode != 0
    assert "--decoder-mask-prob must be in (0, 1), got 1.0" in proc.stderr.strip().splitlines()[-1]
