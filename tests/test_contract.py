"""What every pre-training objective of the plugin guarantees, checked the same way
for each (``tests/objectives.py`` lists them):

1. the decoder side sees the encoder only through the pooled bottleneck vector, with
   ``--bottleneck-pooling cls`` (changing any encoder output but [CLS] leaves its loss
   terms bit-identical) and ``mean`` (a change whose mean over the valid positions is zero
   leaves them unchanged), and what the pooling sees changes them;
2. split invariance through the real CLI: 1 x 8, 1 x (4+4) with
   ``--update-freq 2`` and 2 gloo workers x 4 make the same update (an objective
   with in-batch terms: the worker split does; an ``--update-freq`` split gives
   the count-weighted mean of the micro-batches' own losses -- ``objectives.py``);
   in-process through fairseq's Trainer, the normalisation of an
   ``--update-freq`` split is exact for every term of every objective;
3. a resumed run logs the same next losses as the uninterrupted one;
4. ``seed-drop-heads`` gives a checkpoint that stock fairseq loads as ``roberta``
   (no plugin) with the same encoder features;
5. the HuggingFace export computes the same features as fairseq;
6. the fused vocabulary loss (``--vocab-loss chunked``, the default) gives the
   same terms, counts and gradients as the full logits (``--vocab-loss plain``).

Each check is a function of an :class:`objectives.Objective` (``check_*``); the
parametrised tests call them for the plugin's objectives, ``test_toy_objective.py``
for an objective defined in the tests only.
"""

import copy
import json
import os
import shutil
import socket
import sys

import pytest
import torch
from helpers import REPO, SGD_ONE_STEP, check, cli, fairseq_train, parse_argv, tiny_run
from objectives import OBJECTIVES

from seed_fairseq.pretrain.checkpoint import load_torch_file

IDS = [o.name for o in OBJECTIVES]
OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}

ADAM = [
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
    "50",
    "--clip-norm",
    "1.0",
    "--weight-decay",
    "0.01",
]


def needs(obj, request) -> dict:
    """The session fixtures an objective needs (``Objective.needs``: a generator checkpoint ...)."""
    return {fixture: request.getfixturevalue(fixture) for _, fixture in obj.needs}


# runs a tool's script (argv[2]) as __main__ after importing the module argv[1]
PRELOAD = (
    "import importlib, runpy, sys; importlib.import_module(sys.argv.pop(1)); sys.argv.pop(0); "
    "runpy.run_path(sys.argv[0], run_name='__main__')"
)
TESTS = os.path.dirname(os.path.abspath(__file__))


def run_tool(obj, cmd, launcher=(), env=None):
    """``check(cmd)``: a tool (a console script such as fairseq-train, or a Python file, then its
    arguments) in a subprocess, with the objective's classes registered there: an objective
    defined outside the plugin (``Objective.preload``) is imported before the script runs."""
    env = dict(env or {})
    if not obj.preload and str(cmd[0]).endswith(".py"):
        cmd = [sys.executable, *cmd]
    elif obj.preload:
        cmd = [sys.executable, "-c", PRELOAD, obj.preload, *cmd]
        env["PYTHONPATH"] = os.pathsep.join(p for p in (TESTS, os.environ.get("PYTHONPATH")) if p)
        if launcher:  # torchrun then starts the command as it is, not as a Python script
            launcher = [*launcher, "--no-python"]
    return check([*launcher, *cmd], env=env)


def train_cmd(obj, data, save_dir, *extra, max_update, batch_size=4, optim=ADAM, fixtures=None):
    return fairseq_train(
        data,
        *obj.args(**(fixtures or {})), "--sample-break-mode", "none", *optim,
        *tiny_run(max_update, tokens_per_sample=48, batch_size=batch_size),
        "--log-format", "json", "--log-interval", "1",
        *extra,
        save_dir=save_dir,
    )  # fmt: skip


def records(proc):
    return [
        json.loads(line.split("| train_inner | ", 1)[1])
        for line in (proc.stderr + proc.stdout).splitlines()
        if "| train_inner | " in line
    ]


def build(obj, data, *extra, fixtures=None):
    """Task, model and criterion through fairseq's own argument parsing."""
    task, model, criterion, _ = build_with_cfg(obj, data, *extra, fixtures=fixtures)
    return task, model, criterion


def build_with_cfg(obj, data, *extra, fixtures=None):
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    parser = options.get_training_parser()
    args = options.parse_args_and_arch(
        parser,
        parse_argv(
            data,
            [*obj.args(**(fixtures or {})), "--tokens-per-sample", "48", "--sample-break-mode", "none"]
            + ["--cpu", *extra],
        ),
    )
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    return task, task.build_model(cfg.model), task.build_criterion(cfg.criterion), cfg


# ---------------------------------------------------------------------------
# 1. the bottleneck: the decoder side reads the encoder through the pooling only
# ---------------------------------------------------------------------------


# the contract's poolings: for each, (a perturbation of the encoder's output the pooling cannot
# see, one it sees); each takes (T x B x C shape, valid: T x B x 1, 1 at a non-pad position) and
# gives the noise added to the encoder's last-layer output
def _noise(shape):
    """Noise of standard deviation 10: large enough to move an untrained decoder's loss (SimLM's
    moves least) well above the rounding of its sum."""
    return torch.randn(shape, generator=torch.Generator().manual_seed(7)) * 10


def _all_but_cls(shape, valid):
    noise = _noise(shape)
    noise[0] = 0
    return noise


def _cls_only(shape, valid):
    noise = torch.zeros(shape)
    noise[0] = _noise(shape[1:])
    return noise


def _zero_mean(shape, valid):
    """Noise everywhere (padding included) whose mean over each sequence's valid positions is 0."""
    noise = _noise(shape)
    mean = (noise * valid).sum(0, keepdim=True) / valid.sum(0, keepdim=True)
    return noise - mean * valid


def _shifted_mean(shape, valid):
    """The same vector added at every valid position of a sequence: its mean moves by that vector."""
    return _noise(shape[1:]).unsqueeze(0) * valid


POOLINGS = {"cls": (_all_but_cls, _cls_only), "mean": (_zero_mean, _shifted_mean)}


def _perturb_encoder_output(model, noise):
    """Add ``noise(shape, valid)`` to the encoder's last-layer output (valid: the non-pad positions
    of the encoder's input)."""
    pad = model.encoder.sentence_encoder.padding_idx

    def hook(module, inputs, output):
        states = output["encoder_out"][0]  # T x B x C
        valid = inputs[0].ne(pad).t().unsqueeze(-1).to(states.dtype)
        return dict(output, encoder_out=[states + noise(states.shape, valid)])

    return model.encoder.sentence_encoder.register_forward_hook(hook)


def _terms(criterion, model, sample):
    torch.manual_seed(0)
    with torch.no_grad():
        return {k: v.loss for k, v in criterion.compute_terms(model, sample).items()}


def padded_sample(task, split="valid", n=4):
    """A batch of ``n`` blocks of different lengths (padding in every row but the longest); blocks
    longer than the model's positions (a long sentence is a block of its own) left out, as fairseq's
    batches leave them."""
    dataset = task.dataset(split)
    by_size = {}
    for i in range(len(dataset)):
        if int(dataset.size(i)) <= task.cfg.tokens_per_sample:
            by_size.setdefault(int(dataset.size(i)), i)
    sizes = sorted(by_size)
    assert len(sizes) >= n, sizes
    return dataset.collater([dataset[by_size[size]] for size in sizes[:: max(1, len(sizes) // n)][:n]])


@pytest.mark.parametrize("pooling", list(POOLINGS))
@pytest.mark.parametrize("obj", OBJECTIVES, ids=IDS)
def test_decoder_side_sees_the_encoder_only_through_the_pooling(obj, pooling, contract_data, request):
    check_bottleneck(obj, contract_data, pooling, fixtures=needs(obj, request))


def check_bottleneck(obj, contract_data, pooling="cls", fixtures=None, extra=()):
    """With ``--bottleneck-pooling pooling`` (and the options ``extra``): a perturbation of the encoder's
    output that the pooling cannot see leaves every bottleneck term unchanged (bit-identical for cls;
    for mean up to the rounding of the changed sum), one that it sees changes each of them."""
    unseen, seen = POOLINGS[pooling]
    # complete sentences: blocks of many lengths, so the batch has padding
    task, model, criterion = build(
        obj,
        contract_data,
        "--bottleneck-pooling",
        pooling,
        "--sample-break-mode",
        "complete",
        *extra,
        fixtures=fixtures,
    )
    assert model.bottleneck.mode == pooling
    task.load_dataset("valid")
    sample = padded_sample(task)
    assert sample["net_input"]["src_tokens"].eq(task.source_dictionary.pad()).sum(1).gt(0).sum() == 3
    model.eval()
    base = _terms(criterion, model, sample)
    assert set(base) == set(obj.terms)
    # what the code declares is what this entry expects (an MLM-only model has no decoder term)
    assert tuple(t for t in criterion.bottleneck_terms if t in base) == obj.bottleneck_terms
    assert (
        tuple(p for p in type(model).pretraining_only_prefixes if any(k.startswith(p) for k in model.state_dict()))
        == obj.heads
    )

    handle = _perturb_encoder_output(model, unseen)
    others = _terms(criterion, model, sample)
    handle.remove()
    # the perturbation reached the encoder's output (its own terms: MLM, SimLM's enc ...)
    assert any(not torch.equal(others[t], base[t]) for t in base if t not in obj.bottleneck_terms)

    handle = _perturb_encoder_output(model, seen)
    changed = _terms(criterion, model, sample)
    handle.remove()
    for term in obj.bottleneck_terms:
        moved = float(changed[term] - base[term])
        assert moved != 0, term  # what the pooling sees reaches the decoder side
        if pooling == "cls":
            assert torch.equal(others[term], base[term]), term
        else:  # the mean of the perturbed output is the mean up to float rounding (~1e-7 of it)
            assert abs(float(others[term] - base[term])) <= 1e-3 * abs(moved), term


# ---------------------------------------------------------------------------
# 2. split invariance through the real CLI
# ---------------------------------------------------------------------------


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_update(obj, data, save_dir, *extra, launcher=(), fixtures=None):
    cmd = train_cmd(
        obj, data, save_dir, "--curriculum", "1", *extra, max_update=1, optim=SGD_ONE_STEP, fixtures=fixtures
    )
    proc = run_tool(obj, cmd, launcher)  # torchrun starts the script itself
    (record,) = records(proc)
    last = save_dir / "checkpoint_last.pt"
    state = load_torch_file(last)  # the allowlisted loader every tool uses
    return record, state["model"]


@pytest.mark.slow
@pytest.mark.parametrize("obj", OBJECTIVES, ids=IDS)
def test_update_does_not_depend_on_the_split(obj, contract_data, tmp_path, request):
    check_split_invariance(obj, contract_data, tmp_path, fixtures=needs(obj, request))


def check_split_invariance(obj, contract_data, tmp_path, fixtures=None):
    """--curriculum 1 keeps the batch order, so 1 x 8, 1 x (4+4) and 2 x 4 see the same
    eight blocks; one SGD step must move the weights identically.  An objective with
    in-batch terms gathers their negatives over workers (2 x 4 must still equal 1 x 8),
    but its --update-freq micro-batches see only their own negatives: there the logged
    losses must be the count-weighted means of the micro-batches' own losses."""
    f = fixtures
    one, w_one = _one_update(obj, contract_data, tmp_path / "one", "--batch-size", "8", fixtures=f)
    freq, w_freq = _one_update(
        obj, contract_data, tmp_path / "freq", "--batch-size", "4", "--update-freq", "2", fixtures=f
    )
    launcher = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(_free_port()),
    ]
    two, w_two = _one_update(
        obj,
        contract_data,
        tmp_path / "two",
        "--batch-size",
        "4",
        "--distributed-world-size",
        "2",
        "--ddp-backend",
        "legacy_ddp",
        launcher=launcher,
        fixtures=f,
    )
    assert float(one["gnorm"]) > 0
    keys = ["loss", "gnorm", "nsentences"] + [f"{t}_{k}" for t in obj.terms for k in ("loss", "ntokens")]
    exact = [(two, w_two)] if obj.in_batch_terms else [(freq, w_freq), (two, w_two)]
    for other, _ in exact:
        for key in keys:
            assert float(other[key]) == pytest.approx(float(one[key]), rel=1e-3, abs=1e-3), key
    for name, value in w_one.items():
        for _, w_other in exact:
            torch.testing.assert_close(w_other[name], value, rtol=1e-4, atol=1e-6, msg=name)
    if obj.in_batch_terms:
        _check_micro_batch_means(obj, contract_data, tmp_path / "parts", one, freq, fixtures=f)


SGD_NO_STEP = [*SGD_ONE_STEP[:3], "0.0", *SGD_ONE_STEP[4:]]  # lr 0: every update at the same weights


def _check_micro_batch_means(obj, data, save_dir, one, freq, fixtures=None):
    """The two micro-batches of the --update-freq run as two updates of their own at the
    initial weights: each term of the split update is their count-weighted mean."""
    cmd = train_cmd(
        obj,
        data,
        save_dir,
        "--curriculum",
        "1",
        "--batch-size",
        "4",
        max_update=2,
        optim=SGD_NO_STEP,
        fixtures=fixtures,
    )
    parts = records(run_tool(obj, cmd))
    assert [int(p["num_updates"]) for p in parts] == [1, 2]
    for term in obj.terms:
        counts = [float(p[f"{term}_ntokens"]) for p in parts]
        assert float(freq[f"{term}_ntokens"]) == sum(counts) == float(one[f"{term}_ntokens"]), term
        mean = sum(float(p[f"{term}_loss"]) * n for p, n in zip(parts, counts)) / sum(counts)
        assert float(freq[f"{term}_loss"]) == pytest.approx(mean, abs=2e-3), term  # logs round to 1e-3
        if term in obj.in_batch_terms:  # fewer negatives: a different loss, else this tests nothing
            assert float(freq[f"{term}_loss"]) != pytest.approx(float(one[f"{term}_loss"]), abs=0.05), term
        else:
            assert float(freq[f"{term}_loss"]) == pytest.approx(float(one[f"{term}_loss"]), abs=1e-3), term


def _train_step(trainer, samples):
    trainer.train_step(samples)
    return {n: p.grad.detach().clone() for n, p in trainer.model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("obj", OBJECTIVES, ids=IDS)
def test_update_is_the_count_weighted_mean_of_the_micro_batches(obj, contract_data, request):
    check_micro_batch_normalisation(obj, contract_data, fixtures=needs(obj, request))


def check_micro_batch_normalisation(obj, contract_data, fixtures=None):
    """Through fairseq's Trainer: the gradient of a 1 x (4+4) --update-freq 2 update is
    sum_t w_t sum_k (N_tk / N_t) g_tk, where g_tk is micro-batch k's gradient of term t
    alone as an update of its own and N_tk its units of term t: every term is normalised
    by the count of the whole update, whether its per-unit loss is in-batch or not."""
    from fairseq.trainer import Trainer

    from seed_fairseq.pretrain.data.update_counts import UPDATE_COUNTS

    task, model, criterion, cfg = build_with_cfg(
        obj, contract_data, *SGD_ONE_STEP, "--batch-size", "4", "--update-freq", "2", fixtures=fixtures
    )
    trainer = Trainer(cfg, task, model, criterion)
    task.load_dataset("train")
    itr = task.get_batch_iterator(task.dataset("train"), max_sentences=4, seed=5).next_epoch_itr(shuffle=True)
    micro = [next(itr), next(itr)]
    totals = micro[0][UPDATE_COUNTS]
    initial = copy.deepcopy(trainer.model.state_dict())
    split = _train_step(trainer, micro)

    weights = dict(criterion.weights)
    expected = {name: torch.zeros_like(g) for name, g in split.items()}
    for term, weight in weights.items():
        for mb in micro:
            own = {k: v for k, v in mb.items() if k != UPDATE_COUNTS}  # an update of its own
            share = float(task.term_counts(own)[term]) / float(totals[term])
            criterion.weights = {t: float(t == term) for t in weights}
            trainer.model.load_state_dict(initial)
            for name, g in _train_step(trainer, [own]).items():
                expected[name] += weight * share * g
    criterion.weights = weights
    assert len(split) > 10
    for name, g in split.items():
        torch.testing.assert_close(g, expected[name], rtol=1e-4, atol=1e-6, msg=name)


# ---------------------------------------------------------------------------
# 3.-5. resume, head dropping, export: on one short run per objective
# ---------------------------------------------------------------------------

_RUNS = {}


@pytest.fixture
def straight_run(contract_data, tmp_path_factory, request):
    obj = request.param
    return run_straight(obj, contract_data, tmp_path_factory, fixtures=needs(obj, request))


def run_straight(obj, contract_data, tmp_path_factory, fixtures=None):
    """(obj, save dir, records by update) of 4 updates with --update-freq 2 and a checkpoint at
    update 2 (one run per objective)."""
    if obj.name not in _RUNS:
        save = tmp_path_factory.mktemp(f"straight_{obj.name}")
        proc = run_tool(
            obj,
            train_cmd(
                obj,
                contract_data,
                save,
                "--update-freq",
                "2",
                "--save-interval-updates",
                "2",
                max_update=4,
                fixtures=fixtures,
            ),
        )
        _RUNS[obj.name] = (save, {int(r["num_updates"]): r for r in records(proc)})
    return (obj, *_RUNS[obj.name])


@pytest.mark.slow
@pytest.mark.parametrize("straight_run", OBJECTIVES, ids=IDS, indirect=True)
def test_resume_logs_the_same_next_losses(straight_run, contract_data, tmp_path, request):
    check_resume(straight_run, contract_data, tmp_path, fixtures=needs(straight_run[0], request))


def check_resume(straight_run, contract_data, tmp_path, fixtures=None):
    obj, save, straight = straight_run
    shutil.copy(save / "checkpoint_1_2.pt", tmp_path / "checkpoint_last.pt")
    proc = run_tool(
        obj,
        train_cmd(
            obj,
            contract_data,
            tmp_path,
            "--update-freq",
            "2",
            "--save-interval-updates",
            "2",
            max_update=4,
            fixtures=fixtures,
        ),
    )
    resumed = records(proc)
    assert [int(r["num_updates"]) for r in resumed] == [3, 4]
    keys = ["loss", "gnorm", "lr"] + [f"{t}_{k}" for t in obj.terms for k in ("loss", "ntokens")]
    for r in resumed:
        for key in keys:
            assert r[key] == straight[int(r["num_updates"])][key], (r["num_updates"], key)


STOCK_FAIRSEQ_FEATURES = r"""
import sys, torch
from fairseq.models.roberta import RobertaModel
hub = RobertaModel.from_pretrained(sys.argv[1], checkpoint_file="encoder.pt", data_name_or_path=sys.argv[2],
                                   bpe="sentencepiece", sentencepiece_model=sys.argv[2] + "/spm.model")
assert type(hub.model).__name__ == "RobertaModel", type(hub.model)
assert "seed_fairseq" not in sys.modules
hub.eval()
tokens = torch.load(sys.argv[3])
with torch.no_grad():
    torch.save(hub.model(tokens, features_only=True)[0], sys.argv[4])
"""


def _probe_tokens(n_symbols):
    g = torch.Generator().manual_seed(0)
    tokens = torch.randint(4, n_symbols - 1, (3, 19), generator=g)
    tokens[:, 0] = 0
    tokens[:, -1] = 2
    tokens[1, 12:] = 1  # padding
    tokens[1, 11] = 2
    return tokens


def _plugin_features(ckpt, data, tokens):
    from fairseq import checkpoint_utils

    import seed_fairseq  # noqa: F401

    (model,), _ = checkpoint_utils.load_model_ensemble([str(ckpt)], arg_overrides={"data": str(data)})
    model.eval()
    with torch.no_grad():
        return model(tokens, features_only=True)[0], len(model.encoder.dictionary)


@pytest.mark.slow
@pytest.mark.parametrize("straight_run", OBJECTIVES, ids=IDS, indirect=True)
def test_drop_heads_gives_a_stock_roberta(straight_run, contract_data, tmp_path):
    check_drop_heads(straight_run, contract_data, tmp_path)


def check_drop_heads(straight_run, contract_data, tmp_path):
    obj, save, _ = straight_run
    ckpt = save / "checkpoint_last.pt"
    run_tool(obj, [cli("seed-drop-heads"), ckpt, tmp_path / "encoder.pt"])
    state = torch.load(tmp_path / "encoder.pt", weights_only=True)  # safe loading works
    assert state["cfg"]["model"]["_name"] == "roberta"
    full = load_torch_file(ckpt)["model"]  # the allowlisted loader every tool uses
    assert set(state["model"]) == {k for k in full if not k.startswith(obj.heads or ("\0",))}
    _, n_symbols = _plugin_features(ckpt, contract_data, torch.zeros(1, 2, dtype=torch.long))
    tokens = _probe_tokens(n_symbols)
    torch.save(tokens, tmp_path / "tokens.pt")
    check(
        [
            sys.executable,
            "-c",
            STOCK_FAIRSEQ_FEATURES,
            tmp_path,
            contract_data,
            tmp_path / "tokens.pt",
            tmp_path / "stock.pt",
        ]
    )
    ours, _ = _plugin_features(ckpt, contract_data, tokens)
    torch.testing.assert_close(torch.load(tmp_path / "stock.pt"), ours, rtol=0, atol=1e-6)


@pytest.mark.slow
@pytest.mark.parametrize("straight_run", OBJECTIVES, ids=IDS, indirect=True)
def test_export_equals_fairseq(straight_run, contract_data, tmp_path):
    check_export(straight_run, contract_data, tmp_path)


def check_export(straight_run, contract_data, tmp_path):
    from transformers import AutoModel

    obj, save, _ = straight_run
    ckpt = save / "checkpoint_last.pt"
    run_tool(
        obj,
        [
            REPO / "examples" / "export_to_hf.py",
            "--checkpoint",
            ckpt,
            "--data",
            contract_data,
            "--out",
            tmp_path / "hf",
        ],
        env=OFFLINE,
    )
    ours, n_symbols = _plugin_features(ckpt, contract_data, torch.zeros(1, 2, dtype=torch.long))
    tokens = _probe_tokens(n_symbols)
    ours, _ = _plugin_features(ckpt, contract_data, tokens)
    hf = AutoModel.from_pretrained(tmp_path / "hf").eval()
    with torch.no_grad():
        theirs = hf(input_ids=tokens, attention_mask=tokens.ne(1).long()).last_hidden_state
    keep = tokens.ne(1)
    torch.testing.assert_close(theirs[keep], ours[keep], rtol=0, atol=1e-5)
    # the model card names the objective that made the encoder
    card = (tmp_path / "hf" / "README.md").read_text()
    assert f"| {obj.task} / {obj.criterion} |" in card
    assert f"# {obj.title} (exported from fairseq)" in card


# ---------------------------------------------------------------------------
# 6. the fused vocabulary loss
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("obj", OBJECTIVES, ids=IDS)
def test_fused_vocabulary_loss_equals_the_full_logits(obj, contract_data, request):
    check_fused_vocabulary_loss(obj, contract_data, fixtures=needs(obj, request))


def check_fused_vocabulary_loss(obj, contract_data, fixtures=None):
    no_dropout = ("--dropout", "0", "--attention-dropout", "0")
    f = fixtures
    task, model, fused = build(obj, contract_data, *no_dropout, "--vocab-loss-chunk-size", "7", fixtures=f)
    _, _, plain = build(obj, contract_data, *no_dropout, "--vocab-loss", "plain", fixtures=f)
    assert fused.fused and not plain.fused
    task.load_dataset("valid")
    sample = next(task.get_batch_iterator(task.dataset("valid"), max_sentences=4, seed=1).next_epoch_itr(shuffle=False))
    model.train()
    results = []
    for criterion in (plain, fused):
        torch.manual_seed(0)
        model.zero_grad()
        terms = criterion.compute_terms(model, sample)
        sum(t.loss for t in terms.values()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        results.append(({k: (t.loss.detach(), t.correct) for k, t in terms.items()}, grads))
    (t_plain, g_plain), (t_fused, g_fused) = results
    assert set(t_fused) == set(t_plain) == set(obj.terms)
    for term, (loss, correct) in t_plain.items():
        torch.testing.assert_close(t_fused[term][0], loss, rtol=1e-5, atol=1e-5, msg=term)
        assert (correct is None) == (t_fused[term][1] is None), term
        if correct is not None:
            assert int(t_fused[term][1]) == int(correct), term
    assert g_fused.keys() == g_plain.keys()
    for name in g_plain:
        torch.testing.assert_close(g_fused[name], g_plain[name], rtol=1e-4, atol=1e-6, msg=name)
