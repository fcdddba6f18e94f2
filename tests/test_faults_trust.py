"""No checkpoint or model file from elsewhere runs code when a tool of the project
loads it (issue 21, defect 5).

A real plugin checkpoint (the 0.1 fixture) gets an object whose unpickling runs
code (it creates a marker file); every entry point that reads checkpoints
refuses it in one line naming the pickled type, the marker never appears, and
``--trust-checkpoint`` loads it.  The allowlist must still load every real
checkpoint kind the project meets (written here in-process, as fairseq-train
writes them)."""

import os
import pickle
import subprocess
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers import REPO, fairseq_train, load_driver, parse_argv, run
from objectives import OBJECTIVES, TINY_ENCODER

from seed_fairseq.pretrain.checkpoint import (
    CHECKPOINT_TYPES,
    CheckpointError,
    UntrustedCheckpointError,
    load_torch_file,
    peek_checkpoint,
    read_checkpoint,
    trusting,
)
from seed_fairseq.pretrain.checkpoint_files import newest_readable_checkpoint

FIXTURE = REPO / "tests" / "fixtures" / "seed_fairseq_0.1"
CKPT = FIXTURE / "checkpoint_1_3.pt"
DATA = FIXTURE / "data-bin"
# the 0.1 fixture's model (seed_encoder_tiny, one decoder layer)
FIXTURE_MODEL = [
    "--task",
    "seed_pretrain",
    "--criterion",
    "seed_pretrain",
    "--arch",
    "seed_encoder_tiny",
    *TINY_ENCODER,
    "--decoder-layers",
    "1",
]
REFUSED = "holds a pickled 'builtins.exec' object, not one of the types a fairseq checkpoint holds"


class Payload:
    """Unpickling it runs code: here, it creates ``marker``."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').close()",)


def poisoned(tmp_path, name="poisoned.pt"):
    """The 0.1 fixture with a payload in its extra state: (file, marker)."""
    state = load_torch_file(CKPT)  # a file of this repository
    marker = tmp_path / f"{name}.MARKER"
    state["extra_state"]["payload"] = Payload(marker)
    torch.save(state, tmp_path / name)
    return tmp_path / name, marker


def assert_refused(error, path):
    text = str(error)
    assert len(text.splitlines()) == 1, text
    assert str(path) in text and REFUSED in text and "--trust-checkpoint" in text, text


# ---------------------------------------------------------------------------
# the loader
# ---------------------------------------------------------------------------


def _fairseq_load(path):
    from fairseq import checkpoint_utils

    return checkpoint_utils.load_checkpoint_to_cpu(str(path))


def _fairseq_ensemble(path):
    from fairseq import checkpoint_utils

    return checkpoint_utils.load_model_ensemble([str(path)], arg_overrides={"data": str(DATA)})


@pytest.mark.parametrize(
    "load",
    [load_torch_file, peek_checkpoint, read_checkpoint, _fairseq_load, _fairseq_ensemble],
    ids=["load_torch_file", "peek_checkpoint", "read_checkpoint", "fairseq_load_checkpoint_to_cpu", "fairseq_ensemble"],
)
def test_every_loader_refuses_a_payload_and_trust_loads_it(load, tmp_path):
    path, marker = poisoned(tmp_path)
    with pytest.raises(UntrustedCheckpointError) as e:
        load(path)
    assert_refused(e.value, path)
    assert not marker.exists()
    with trusting(True):
        load(path)
    assert marker.exists()


@pytest.mark.parametrize(
    "reduce, name",
    [
        ((os.system, ("true",)), "posix.system"),
        ((subprocess.call, (["true"],)), "subprocess.call"),
        ((Path.touch, (Path("x"),)), "builtins.getattr"),  # a method pickles as getattr(class, name)
        ((eval, ("1",)), "builtins.eval"),
    ],
)
def test_the_error_names_the_pickled_type(reduce, name, tmp_path):
    class Code:
        def __reduce__(self):
            return reduce

    torch.save({"model": {}, "args": None, "x": Code()}, tmp_path / "x.pt")
    with pytest.raises(UntrustedCheckpointError) as e:
        peek_checkpoint(tmp_path / "x.pt")
    assert e.value.type_name == name
    assert f"holds a pickled {name!r} object" in str(e.value)


def test_the_allowlist_is_widened_only_while_a_checkpoint_loads(tmp_path):
    import argparse

    torch.save({"args": argparse.Namespace(a=1)}, tmp_path / "ns.pt")
    assert load_torch_file(tmp_path / "ns.pt")["args"].a == 1
    allowed = {id(obj) for _, obj, _ in CHECKPOINT_TYPES}
    assert not allowed & {id(g if not isinstance(g, tuple) else g[0]) for g in torch.serialization.get_safe_globals()}
    with pytest.raises(Exception, match="Namespace"):
        torch.load(tmp_path / "ns.pt")  # the rest of the process keeps torch's default


def test_a_restart_does_not_fall_back_past_a_poisoned_checkpoint_last(tmp_path):
    """A damaged checkpoint_last.pt is skipped for an older one; one with a payload is refused."""
    save = tmp_path / "save"
    save.mkdir()
    os.symlink(CKPT, save / "checkpoint_1_3.pt")
    path, marker = poisoned(save, "checkpoint_last.pt")
    with pytest.raises(UntrustedCheckpointError) as e:
        newest_readable_checkpoint(save)
    assert_refused(e.value, path)
    assert not marker.exists()
    with trusting(True):
        assert newest_readable_checkpoint(save) == (path, [])
    assert marker.exists()


# ---------------------------------------------------------------------------
# the tools
# ---------------------------------------------------------------------------


def test_drop_heads_refuses_a_payload_and_trusts_on_request(tmp_path, capsys):
    from seed_fairseq.encoders.drop_heads import main

    path, marker = poisoned(tmp_path)
    out = tmp_path / "enc.pt"
    assert main([str(path), str(out), "--data", str(DATA)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"error: {path}: ") and REFUSED in err[-1], err
    assert not marker.exists() and not out.exists()
    assert main([str(path), str(out), "--data", str(DATA), "--trust-checkpoint"]) == 0
    assert marker.exists() and out.is_file()


def test_drop_heads_does_not_load_a_payload_at_out_even_when_trusting_the_input(tmp_path, capsys):
    from seed_fairseq.encoders.drop_heads import main

    out, marker = poisoned(tmp_path, "enc.pt")
    assert main([str(CKPT), str(out), "--data", str(DATA), "--trust-checkpoint"]) == 2
    assert "was not written by seed-drop-heads" in capsys.readouterr().err
    assert not marker.exists()


def test_export_refuses_a_payload_and_trusts_on_request(tmp_path, capsys):
    from seed_fairseq.encoders.hf.export import load_inputs

    path, marker = poisoned(tmp_path)
    driver = load_driver("examples/export_to_hf.py")
    argv = ["--checkpoint", str(path), "--data", str(DATA), "--out", str(tmp_path / "hf")]
    assert driver.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith(f"error: {path}: ") and REFUSED in err[-1], err
    assert not marker.exists() and not (tmp_path / "hf").exists()
    with pytest.raises(SystemExit):
        driver.main(["--help"])
    assert "--trust-checkpoint" in capsys.readouterr().out
    load_inputs(path, DATA, trust=True)  # what export(trust_checkpoint=True) reads first
    assert marker.exists()


def _simlm_task(generator, *extra, from_checkpoint=False):
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    args = options.parse_args_and_arch(
        options.get_training_parser(),
        parse_argv(
            DATA,
            ["--task", "simlm_pretrain", "--criterion", "simlm_pretrain"]
            + ["--arch", "simlm_tiny", *TINY_ENCODER, "--tokens-per-sample", "48", "--cpu"]
            + ["--generator-path", str(generator), *extra],
        ),
    )
    return tasks.setup_task(convert_namespace_to_omegaconf(args).task, from_checkpoint=from_checkpoint)


def test_simlm_generator_refuses_a_payload_and_trusts_on_request(tmp_path):
    path, marker = poisoned(tmp_path)
    with pytest.raises(CheckpointError) as e:
        _simlm_task(path).load_generator()
    assert_refused(e.value, path)
    assert "--generator-path" in str(e.value)
    assert not marker.exists()
    task = _simlm_task(path, "--trust-checkpoint")
    assert task.load_generator().sha256 and marker.exists()


def test_a_checkpoints_saved_config_never_turns_trust_on(tmp_path):
    """fairseq-validate sets the task up from the checkpoint's config, then builds the criterion."""
    path, marker = poisoned(tmp_path)
    task = _simlm_task(path, "--trust-checkpoint", from_checkpoint=True)
    assert task.cfg.trust_checkpoint and not task.trust_generator
    with pytest.raises(CheckpointError) as e:
        task.load_generator()
    assert_refused(e.value, path)
    assert not marker.exists()


def _trainer(save_dir, *args):
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from fairseq.trainer import Trainer

    parsed = options.parse_args_and_arch(
        options.get_training_parser(),
        parse_argv(
            DATA,
            ["--tokens-per-sample", "48", "--sample-break-mode", "none"]
            + ["--batch-size", "4", "--optimizer", "adam", "--lr", "1e-3", "--lr-scheduler", "polynomial_decay"]
            + ["--total-num-update", "10", "--cpu", "--num-workers", "0", "--seed", "3", "--save-dir", str(save_dir)]
            + list(args),  # last: they override the above
        ),
    )
    cfg = convert_namespace_to_omegaconf(parsed)
    task = tasks.setup_task(cfg.task)
    return Trainer(cfg, task, task.build_model(cfg.model), task.build_criterion(cfg.criterion)), cfg


def test_fairseq_train_restore_trusts_only_with_the_runs_own_option(tmp_path):
    """fairseq's own load_checkpoint (what fairseq-train calls for --restore-file,
    --finetune-from-model and restarts) takes the decision from the run's task config."""
    from fairseq import checkpoint_utils

    path, marker = poisoned(tmp_path)
    fixture = [*FIXTURE_MODEL, "--tokens-per-sample", "64", "--restore-file", str(path)]
    trainer, cfg = _trainer(tmp_path / "a", *fixture)
    with pytest.raises(UntrustedCheckpointError) as e:
        checkpoint_utils.load_checkpoint(cfg.checkpoint, trainer)
    assert_refused(e.value, path)
    assert not marker.exists()
    trainer, cfg = _trainer(tmp_path / "b", *fixture, "--trust-checkpoint")
    checkpoint_utils.load_checkpoint(cfg.checkpoint, trainer)
    assert marker.exists() and trainer.get_num_updates() == 3


@pytest.mark.slow
def test_fairseq_train_refuses_a_poisoned_restore_file_in_one_line(tmp_path):
    path, marker = poisoned(tmp_path)
    save = tmp_path / "save"
    cmd = fairseq_train(
        DATA, *FIXTURE_MODEL, "--tokens-per-sample", "64",
        "--batch-size", "4", "--optimizer", "adam", "--lr", "1e-3", "--max-update", "4", "--cpu",
        "--num-workers", "0", "--disable-validation", "--restore-file", path,
        save_dir=save,
    )  # fmt: skip
    proc = run(cmd)
    assert proc.returncode == 2, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {path}: ") and REFUSED in last, last
    assert "Traceback" not in proc.stderr
    assert not marker.exists()
    assert not list(save.glob("*.pt"))


# ---------------------------------------------------------------------------
# HuggingFace weights
# ---------------------------------------------------------------------------


def _bert_folder_with_a_poisoned_bin(tmp_path):
    from transformers import BertConfig, BertModel

    folder = tmp_path / "bert"
    config = BertConfig(vocab_size=50, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=9)
    config.save_pretrained(folder)
    state = dict(BertModel(config).state_dict())
    marker = tmp_path / "bin.MARKER"
    state["payload"] = Payload(marker)
    torch.save(state, folder / "pytorch_model.bin")
    return folder, marker


def test_a_pytorch_model_bin_with_a_payload_runs_nothing(tmp_path):
    """transformers 5 reads pytorch_model.bin with weights_only=True; so does the import's check."""
    from transformers import AutoModel

    from seed_fairseq.encoders.hf.folder import HFFolderError, read_weights

    folder, marker = _bert_folder_with_a_poisoned_bin(tmp_path)
    with pytest.raises(pickle.UnpicklingError, match="exec"):
        AutoModel.from_pretrained(folder)
    with pytest.raises(HFFolderError) as e:
        read_weights(folder)
    assert str(e.value) == (
        f"{folder / 'pytorch_model.bin'}: holds a pickled 'builtins.exec' object, not tensors; "
        "loading it could run code (use model.safetensors)"
    )
    assert not marker.exists()


# ---------------------------------------------------------------------------
# the allowlist loads every real checkpoint kind
# ---------------------------------------------------------------------------


def _train_and_save(save_dir, *args) -> Path:
    """One update of fairseq's Trainer, saved as fairseq-train saves it: fairseq's
    ``checkpoint_utils.save_checkpoint`` writes this dict (and copies it to
    checkpoint_best.pt, checkpoint.best_*.pt, checkpoint_last.pt)."""
    trainer, _ = _trainer(save_dir, *args)
    epoch_itr = trainer.get_train_iterator(epoch=1)
    trainer.train_step([next(epoch_itr.next_epoch_itr(shuffle=False))])
    trainer.consolidate_optimizer()
    path = save_dir / "checkpoint_1_1.pt"
    # numpy scalars: what a validation metric fed numpy numbers leaves in val_loss / best
    extra = {"train_iterator": epoch_itr.state_dict(), "val_loss": np.float64(8.5), "best": np.float32(8.5)}
    trainer.save_checkpoint(str(path), extra)
    return path


def assert_loads_under_the_allowlist(path):
    names = {name for name, _, _ in CHECKPOINT_TYPES}
    assert set(torch.serialization.get_unsafe_globals_in_checkpoint(path)) <= names
    state = read_checkpoint(path, trust=False)
    assert state["model"] and peek_checkpoint(path, trust=False)["model"]


KINDS = {o.name: o.args(simlm_generator=CKPT) for o in OBJECTIVES}
KINDS["stock_masked_lm"] = ["--task", "masked_lm", "--criterion", "masked_lm", "--arch", "roberta", *TINY_ENCODER]


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_allowlist_loads_a_fresh_checkpoint_of(kind, tmp_path):
    assert_loads_under_the_allowlist(_train_and_save(tmp_path, *KINDS[kind]))


def test_the_allowlist_loads_the_fixture_and_the_tools_outputs(tmp_path):
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    from seed_fairseq.encoders.drop_heads import write_encoder_checkpoint
    from seed_fairseq.encoders.hf.import_ import checkpoint_dict

    assert_loads_under_the_allowlist(CKPT)  # the 0.1 format: argparse Namespace args
    assert_loads_under_the_allowlist(write_encoder_checkpoint(CKPT, tmp_path / "enc.pt", data=DATA))
    args = options.parse_args_and_arch(
        options.get_training_parser(), parse_argv(DATA, [*FIXTURE_MODEL, "--cpu"])
    )
    cfg = convert_namespace_to_omegaconf(args)
    task = tasks.setup_task(cfg.task)
    torch.save(checkpoint_dict(cfg, task.build_model(cfg.model), task, {"source": "test"}), tmp_path / "imp.pt")
    assert_loads_under_the_allowlist(tmp_path / "imp.pt")  # what examples/import_from_hf.py writes
