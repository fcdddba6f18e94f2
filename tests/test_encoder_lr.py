"""The encoder's own learning rate while continuing an import (issue 23, item 2; tasks/encoder_lr.py).

- the schedule's factors, literally: freeze, warm-up, scale, layer decay;
- the parameter groups: which name goes where, the optimizer's one group cut into runs, a saved
  state re-cut to another grouping (so a run resumes with the schedule turned on or off);
- the task's step: each group stepped at its factor, the scheduled rate put back;
- through fairseq-train from a tiny XLM-R import (fresh MLM head, fresh weak decoder): during the
  freeze the encoder keeps the import's weights exactly while the heads move; after it the encoder
  moves; a resumed run continues exactly; a run saved without the schedule resumes with it.
"""

import copy
import shutil

import pytest
import torch
from helpers import DEMO_CORPUS, check
from hf_models import SAVERS
from objectives import BY_NAME
from test_contract import records
from test_hf_continue import continue_cmd

from seed_fairseq.base.errors import ConfigurationError
from seed_fairseq.pretrain.fairseq_patches.optimizer_groups import GROUP_KEY, recut, split_groups
from seed_fairseq.pretrain.tasks import encoder_lr
from seed_fairseq.pretrain.tasks.encoder_lr import EMBEDDINGS, HEADS, EncoderSchedule, group_of, layer_label


class Cfg:
    def __init__(self, freeze=0, warmup=-1, scale=1.0, decay=1.0):
        self.freeze_encoder_updates = freeze
        self.encoder_warmup_updates = warmup
        self.encoder_lr_scale = scale
        self.layer_lr_decay = decay


def test_the_factors_of_each_group_update_by_update():
    s = EncoderSchedule.from_cfg(Cfg(freeze=2, warmup=4, scale=0.5, decay=0.5), layers=2)
    labels = [HEADS, EMBEDDINGS, layer_label(0), layer_label(1)]
    table = [[s.scale(label, u) for label in labels] for u in range(7)]
    # heads 1; top layer 0.5 * 0.5^1, layer 0 0.5 * 0.5^2, embeddings 0.5 * 0.5^3; x ramp
    full = [1.0, 0.0625, 0.125, 0.25]
    ramp = [0, 0, 0.25, 0.5, 0.75, 1, 1]
    assert table == [[1.0] + [f * r for f in full[1:]] for r in ramp]
    # warm-up -1 is the freeze's length; no option -> one group serves
    assert EncoderSchedule.from_cfg(Cfg(freeze=3)).warmup_updates == 3
    assert not EncoderSchedule.from_cfg(Cfg()).active
    assert EncoderSchedule.from_cfg(Cfg(scale=0.1)).active


@pytest.mark.parametrize(
    "cfg, message",
    [
        (Cfg(freeze=-1), "--freeze-encoder-updates must be >= 0"),
        (Cfg(warmup=-2), "--encoder-warmup-updates must be >= 0"),
        (Cfg(scale=-0.5), "--encoder-lr-scale must be >= 0"),
        (Cfg(decay=0), r"--layer-lr-decay must be in \(0, 1\]"),
        (Cfg(decay=1.5), r"--layer-lr-decay must be in \(0, 1\]"),
    ],
)
def test_out_of_range_options_are_refused(cfg, message):
    with pytest.raises(ConfigurationError, match=message):
        EncoderSchedule.from_cfg(cfg)


def test_which_parameter_is_in_which_group():
    names = {
        "encoder.sentence_encoder.embed_tokens.weight": EMBEDDINGS,
        "encoder.sentence_encoder.embed_positions.weight": EMBEDDINGS,
        "encoder.sentence_encoder.layernorm_embedding.weight": EMBEDDINGS,
        "encoder.sentence_encoder.layers.0.fc1.weight": "encoder.layer0",
        "encoder.sentence_encoder.layers.11.self_attn.k_proj.bias": "encoder.layer11",
        "module.module.encoder.sentence_encoder.layers.3.fc2.bias": "encoder.layer3",  # DDP wrappers
        "encoder.lm_head.dense.weight": HEADS,
        "encoder.lm_head.bias": HEADS,
        "weak_decoder.layers.0.fc1.weight": HEADS,
        "enhanced_decoder.query.weight": HEADS,
    }
    assert {n: group_of(n) for n in names} == names


def tiny_optimizer():
    torch.manual_seed(0)
    params = [torch.nn.Parameter(torch.randn(3)) for _ in range(5)]
    labels = {id(p): label for p, label in zip(params, ["a", "a", "b", "a", "c"])}

    class Fairseq:  # fairseq's FairseqOptimizer holds the torch optimizer as .optimizer
        def __init__(self):
            self.optimizer = torch.optim.Adam(params, lr=0.1, weight_decay=0.01)

    return Fairseq(), params, labels


def test_one_group_is_cut_into_runs_of_consecutive_parameters():
    opt, params, labels = tiny_optimizer()
    split_groups(opt, labels)
    groups = opt.optimizer.param_groups
    index = {id(p): i for i, p in enumerate(params)}
    assert [(g[GROUP_KEY], [index[id(p)] for p in g["params"]]) for g in groups] == [
        ("a", [0, 1]),
        ("b", [2]),
        ("a", [3]),
        ("c", [4]),
    ]
    assert all(g["lr"] == 0.1 and g["weight_decay"] == 0.01 for g in groups)


def test_a_saved_state_is_re_cut_to_the_current_groups_and_steps_the_same():
    one, params_one, _ = tiny_optimizer()
    for p in params_one:
        p.grad = torch.ones(3)
    one.optimizer.step()
    state = copy.deepcopy(one.optimizer.state_dict())  # one group, as a run without the schedule saves it

    cut, params_cut, labels = tiny_optimizer()
    split_groups(cut, labels)
    cut.optimizer.load_state_dict(recut(state, cut.optimizer.param_groups))
    assert [len(g["params"]) for g in cut.optimizer.param_groups] == [2, 1, 1, 1]
    assert [g[GROUP_KEY] for g in cut.optimizer.param_groups] == ["a", "b", "a", "c"]
    # and back: the cut state into one group
    back, params_back, _ = tiny_optimizer()
    back.optimizer.load_state_dict(recut(copy.deepcopy(cut.optimizer.state_dict()), back.optimizer.param_groups))
    saved = [p.detach().clone() for p in params_one]  # the weights a checkpoint holds with its state
    for opt, params in ((one, params_one), (cut, params_cut), (back, params_back)):
        for p, q in zip(params, saved):
            p.data.copy_(q)
            p.grad = torch.full((3,), 0.5)
        opt.optimizer.step()
    for a, b, c in zip(params_one, params_cut, params_back):
        assert torch.equal(a, b) and torch.equal(a, c)


def test_the_task_steps_each_group_at_its_factor_and_puts_the_schedule_back():
    from seed_fairseq.pretrain.tasks.bottleneck_pretrain import BottleneckPretrainTask

    seen = []

    class Optimizer:
        param_groups = [{"lr": 1e-3, GROUP_KEY: label} for label in (EMBEDDINGS, "encoder.layer0", HEADS)]

        def step(self):
            seen.append([g["lr"] for g in self.param_groups])

    task = BottleneckPretrainTask.__new__(BottleneckPretrainTask)
    schedule = EncoderSchedule.from_cfg(Cfg(freeze=1, warmup=2, decay=0.5), layers=1)
    task.encoder_schedule = lambda model: (schedule, [])
    opt = Optimizer()
    for update in range(4):
        task.optimizer_step(opt, None, update)
        assert [g["lr"] for g in opt.param_groups] == [1e-3] * 3
    emb, layer0 = 0.25, 0.5  # embeddings 0.5^2, the one layer 0.5^1
    expected = [[0, 0, 1e-3], [emb * 0.5e-3, layer0 * 0.5e-3, 1e-3]] + [[emb * 1e-3, layer0 * 1e-3, 1e-3]] * 2
    assert [lr for row in seen for lr in row] == pytest.approx([lr for row in expected for lr in row])


# ---------------------------------------------------------------------------
# through fairseq-train, from a tiny XLM-R import
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def xlmr(tmp_path_factory):
    from preprocess.build import build
    from seed_fairseq.encoders.hf.import_ import import_model

    root = tmp_path_factory.mktemp("encoder_lr")
    imp = import_model(SAVERS["xlmr"](root / "hf"), root / "import")
    data = build(root / "data", text=[DEMO_CORPUS], tokenizer=str(imp), workers=1, valid_docs=4, test_docs=2)
    return None, imp, data


def split_state(path):
    from seed_fairseq.pretrain.checkpoint import load_torch_file

    model = load_torch_file(str(path))["model"]
    return (
        {k: v for k, v in model.items() if encoder_lr.group_of(k) != HEADS},
        {k: v for k, v in model.items() if encoder_lr.group_of(k) == HEADS},
    )


# with weight decay, which moves any parameter that has a gradient (even zero) unless its rate is 0
SCHEDULE = ("--freeze-encoder-updates", "2", "--encoder-warmup-updates", "2", "--layer-lr-decay", "0.8")
SCHEDULE += ("--weight-decay", "0.01")
EXACT = ("--save-interval-updates", "2", "--dropout", "0", "--attention-dropout", "0")


@pytest.mark.slow
def test_the_freeze_holds_the_encoder_exactly_and_a_resume_continues_exactly(xlmr, tmp_path):
    seed = BY_NAME["seed"]
    straight = records(check(continue_cmd(seed, xlmr, tmp_path / "a", 4, *SCHEDULE, *EXACT)))
    assert [int(r["num_updates"]) for r in straight] == [1, 2, 3, 4]
    start_encoder, start_heads = split_state(xlmr[1] / "checkpoint.pt")
    frozen_encoder, frozen_heads = split_state(tmp_path / "a" / "checkpoint_1_2.pt")
    assert frozen_encoder.keys() == start_encoder.keys()
    for k, v in start_encoder.items():
        assert torch.equal(frozen_encoder[k], v), k  # exactly: not even weight decay
    for k in ("encoder.lm_head.dense.weight", "encoder.lm_head.bias"):  # fresh MLM head of the import: trained
        assert not torch.equal(frozen_heads[k], start_heads[k]), k
    assert any(k.startswith("weak_decoder.") for k in frozen_heads)
    # the encoder's gradients were zeroed: Adam's moments of its groups are still empty
    from seed_fairseq.pretrain.checkpoint import load_torch_file

    optim = load_torch_file(str(tmp_path / "a" / "checkpoint_1_2.pt"))["last_optimizer_state"]
    encoder_groups = [g for g in optim["param_groups"] if g[GROUP_KEY] != HEADS]
    assert encoder_groups and all(g["lr"] == 1e-3 for g in optim["param_groups"])  # saved: the scheduled rate
    for i in (i for g in encoder_groups for i in g["params"]):
        assert not optim["state"][i]["exp_avg"].any() and not optim["state"][i]["exp_avg_sq"].any(), i
    later_encoder, _ = split_state(tmp_path / "a" / "checkpoint_last.pt")
    fc1 = "encoder.sentence_encoder.layers.0.fc1.weight"
    assert not torch.equal(later_encoder[fc1], start_encoder[fc1])

    (tmp_path / "b").mkdir()
    shutil.copy(tmp_path / "a" / "checkpoint_1_2.pt", tmp_path / "b" / "checkpoint_last.pt")
    resumed = records(check(continue_cmd(seed, xlmr, tmp_path / "b", 4, *SCHEDULE, *EXACT)))
    assert [int(r["num_updates"]) for r in resumed] == [3, 4]
    for r, s in zip(resumed, straight[2:]):
        for key in ("loss", "gnorm", "lr", "mlm_loss", "dec_loss"):
            assert r[key] == s[key], key


@pytest.mark.slow
def test_a_run_saved_without_the_schedule_resumes_with_it(xlmr, tmp_path):
    seed = BY_NAME["seed"]
    check(continue_cmd(seed, xlmr, tmp_path, 2))
    proc = check(continue_cmd(seed, xlmr, tmp_path, 3, "--encoder-lr-scale", "0.5"))
    assert [int(r["num_updates"]) for r in records(proc)] == [3]
    assert "encoder learning rate: x0.5 the scheduled learning rate" in proc.stdout + proc.stderr
