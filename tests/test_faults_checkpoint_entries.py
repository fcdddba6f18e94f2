"""Checkpoints with wrongly typed entries (issue 32, item 13): ``model`` a list, ``cfg`` a
string, no token embedding ... gave tracebacks in ``seed-drop-heads``, the export and
``fairseq-train --restore-file``.  Every reader goes through ``checkpoint.peek_checkpoint``,
which checks the entries (``check_entries``): one ``error: FILE: problem`` line, exit 2,
nothing written.  In process: the tools' ``main`` and fairseq's own ``load_checkpoint``
with the plugin's patches (what fairseq-train calls; its one line and exit 2 for a
``CheckpointError`` are ``user_errors``', tested in test_faults_checkpoint.py).
"""

import argparse
import copy
import os

import pytest
import torch
from helpers import REPO, load_driver, parse_argv

FIXTURE = REPO / "tests" / "fixtures" / "seed_fairseq_0.1"
EMBED = "encoder.sentence_encoder.embed_tokens.weight"


def _set(path, value):
    def change(state):
        *parents, last = path
        node = state
        for key in parents:
            node = node[key]
        if isinstance(node, argparse.Namespace):  # cfg.model of a registered architecture
            node = vars(node)
        if value is KeyError:
            del node[last]
        else:
            node[last] = value

    return change


# name -> (change of a good checkpoint, what the error line says)
BROKEN = {
    "model-a-list": (lambda s: s.update(model=list(s["model"].values())), "its 'model' entry is a list"),
    "cfg-a-string": (_set(["cfg"], "a string"), "its 'cfg' entry is a str"),
    "no-token-embedding": (_set(["model", EMBED], KeyError), "has no token embedding"),
    "embedding-not-a-tensor": (_set(["model", EMBED], [1.0]), f"maps '{EMBED}' to a list"),
    "parameter-name-not-a-string": (_set(["model", 7], torch.zeros(1)), "maps 7 to a Tensor"),
    "cfg-model-a-string": (_set(["cfg", "model"], "seed_encoder"), "'cfg.model' is a str"),
    "cfg-task-none": (_set(["cfg", "task"], None), "'cfg.task' is None"),
    "optimizer-history-a-string": (_set(["optimizer_history"], "x"), "'optimizer_history' entry is a str"),
    "update-count-a-string": (_set(["optimizer_history", -1, "num_updates"], "3"), "'3', not an integer"),
    "task-state-a-list": (_set(["task_state"], [1]), "'task_state' entry is a list"),
    "extra-state-source-a-list": (_set(["extra_state", "seed_fairseq"], ["x"]), "'extra_state.seed_fairseq'"),
    "dictionary-identity-a-number": (_set(["task_state", "dictionary_sha256"], 1), "not a string"),
    "encoder-size-a-string": (_set(["cfg", "model", "encoder_embed_dim"], "big"), "not an integer"),
}
# what only the tools that rebuild the model from the checkpoint's own config read (fairseq-train
# builds it from its command line)
REBUILT_FROM_CONFIG = {"encoder-size-a-string"}


@pytest.fixture(scope="module")
def broken(tmp_path_factory):
    """name -> a copy of the 0.1 fixture's checkpoint with one entry broken (written with torch.save)."""
    from seed_fairseq.base.vocabulary.dictionary import dictionary_sha256
    from seed_fairseq.pretrain.checkpoint import load_torch_file

    good = load_torch_file(FIXTURE / "checkpoint_1_3.pt")
    sha = dictionary_sha256(FIXTURE / "data-bin" / "dict.txt")  # the fixture's own (0.1 recorded none)
    good["task_state"] = dict(good.get("task_state") or {}, dictionary_sha256=sha)
    good["extra_state"]["seed_fairseq"] = {"source": "fairseq-train"}
    root = tmp_path_factory.mktemp("broken")
    out = {}
    for name, (change, _) in BROKEN.items():
        state = copy.deepcopy(good)
        change(state)
        torch.save(state, root / f"{name}.pt")
        out[name] = root / f"{name}.pt"
    return out


def _one_error_line(code, err, path, says):
    lines = [line for line in err.splitlines() if line.strip()]
    assert code == 2 and "Traceback" not in err, err[-3000:]
    assert len([line for line in lines if line.startswith("error:")]) == 1, err[-3000:]
    assert lines[-1].startswith(f"error: {path}: ") and says in lines[-1], lines[-1]


@pytest.mark.parametrize("name", sorted(BROKEN))
def test_drop_heads_and_export_say_which_entry(name, broken, tmp_path, capsys):
    from seed_fairseq.encoders.drop_heads import main as drop_heads

    ckpt, says = broken[name], BROKEN[name][1]
    code = drop_heads([str(ckpt), str(tmp_path / "encoder.pt"), "--data", str(FIXTURE / "data-bin")])
    _one_error_line(code, capsys.readouterr().err, ckpt, says)
    export = load_driver("examples/export_to_hf.py").main
    code = export(["--checkpoint", str(ckpt), "--data", str(FIXTURE / "data-bin"), "--out", str(tmp_path / "hf")])
    _one_error_line(code, capsys.readouterr().err, ckpt, says)
    assert os.listdir(tmp_path) == []


@pytest.fixture(scope="module")
def trainer_for(tmp_path_factory):
    """restore file -> (checkpoint config, Trainer) of fairseq-train's command with ``--restore-file``."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    encoder = ["--encoder-layers", "2", "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "37"]
    base = ["--task", "seed_pretrain", "--criterion"]
    base += ["seed_pretrain", "--arch", "seed_encoder_tiny", *encoder, "--encoder-attention-heads", "2"]
    base += ["--decoder-layers", "1", "--tokens-per-sample", "64", "--batch-size", "4", "--cpu"]
    base += ["--optimizer", "adam", "--lr", "1e-3", "--lr-scheduler", "fixed", "--num-workers", "0"]
    ns = options.parse_args_and_arch(options.get_training_parser(), parse_argv(FIXTURE / "data-bin", base))
    cfg = convert_namespace_to_omegaconf(ns)
    task = tasks.setup_task(cfg.task)
    trainer = Trainer(cfg, task, task.build_model(cfg.model), task.build_criterion(cfg.criterion))

    def make(restore_file):
        checkpoint_cfg = copy.deepcopy(cfg.checkpoint)
        checkpoint_cfg.restore_file = str(restore_file)
        checkpoint_cfg.save_dir = str(tmp_path_factory.mktemp("save"))
        trainer.cfg.checkpoint.save_dir = checkpoint_cfg.save_dir
        return checkpoint_cfg, trainer

    return make


@pytest.mark.parametrize("name", sorted(set(BROKEN) - REBUILT_FROM_CONFIG))
def test_restore_file_says_which_entry(name, broken, trainer_for):
    from fairseq import checkpoint_utils

    from seed_fairseq.pretrain.checkpoint import CheckpointError
    from seed_fairseq.pretrain.fairseq_patches import user_error_line

    ckpt, says = broken[name], BROKEN[name][1]
    checkpoint_cfg, trainer = trainer_for(ckpt)
    with pytest.raises(CheckpointError) as refused:
        checkpoint_utils.load_checkpoint(checkpoint_cfg, trainer)
    line = user_error_line(refused.value)  # fairseq-train's last line: "error: " + this, exit 2
    assert line.startswith(f"{ckpt}: ") and says in line, line
    assert trainer.get_num_updates() == 0
