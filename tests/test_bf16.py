"""``--bf16`` without a TPU (``seed_fairseq/pretrain/fairseq_patches/bf16_device.py``): fairseq 0.12 reads
``--bf16`` as ``--tpu``; the fix keeps the run on its device, where fairseq's own bf16 path (model
cast, fp32 master weights, no loss scaler) is the same code on a GPU and on the CPU."""

import argparse
import json
import sys

import pytest
import torch
from helpers import REPO, check, parse_argv, train_cmd

from seed_fairseq.pretrain.checkpoint import load_torch_file  # weights_only with the allowlist
from seed_fairseq.pretrain.fairseq_patches import bf16_device

EXPORT = str(REPO / "examples" / "export_to_hf.py")


def test_bf16_stays_off_the_tpu_without_torch_xla(monkeypatch):
    monkeypatch.setattr(bf16_device, "xla_available", lambda: False)
    args = bf16_device.bf16_without_tpu(argparse.Namespace(bf16=True, tpu=True, cpu=True))
    assert (args.bf16, args.tpu) == (True, False)
    # only what fairseq set for --bf16 changes: a run without bf16 is untouched
    assert bf16_device.bf16_without_tpu(argparse.Namespace(bf16=False, tpu=True)).tpu is True


def test_with_torch_xla_bf16_keeps_fairseqs_meaning(monkeypatch):
    monkeypatch.setattr(bf16_device, "xla_available", lambda: True)
    assert bf16_device.bf16_without_tpu(argparse.Namespace(bf16=True, tpu=True)).tpu is True


def test_the_config_fairseq_builds_has_no_tpu(demo_data_bin):
    """Through fairseq's own parser and converter, as fairseq-train and gpu_check build the config."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    import seed_fairseq  # noqa: F401  (the fixes)

    argv = [str(demo_data_bin), "--task", "masked_lm", "--arch", "roberta_base", "--cpu", "--bf16"]
    ns = options.parse_args_and_arch(options.get_training_parser(), argv)
    assert ns.tpu is True  # fairseq 0.12's own reading, before the fix
    cfg = convert_namespace_to_omegaconf(ns)
    assert (cfg.common.bf16, cfg.common.tpu) == (True, False)


def test_the_trainer_runs_in_bf16(demo_data_bin):
    """fairseq's Trainer from that config: a bf16 model, fp32 master weights (FP16Optimizer), no loss
    scaler; one update changes the bf16 weights and gives a finite loss."""
    import numpy as np
    from fairseq import options, tasks
    from fairseq.optim.fp16_optimizer import FP16Optimizer
    from fairseq.trainer import Trainer

    import seed_fairseq  # noqa: F401
    from seed_fairseq.pretrain.fairseq_patches import bf16_device as fix

    args = ["--task", "seed_pretrain"]
    args += ["--criterion", "seed_pretrain", "--arch", "seed_encoder_tiny", "--cpu", "--bf16"]
    args += ["--tokens-per-sample", "48", "--optimizer", "adam", "--lr", "1e-3", "--batch-size", "4"]
    args = parse_argv(demo_data_bin, args)
    from fairseq.dataclass import utils as dataclass_utils

    cfg = dataclass_utils.convert_namespace_to_omegaconf(
        options.parse_args_and_arch(options.get_training_parser(), args)
    )
    assert getattr(dataclass_utils.convert_namespace_to_omegaconf, "_seed_fairseq_patch", None) == fix.__name__
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train")
    trainer = Trainer(cfg, task, task.build_model(cfg.model), task.build_criterion(cfg.criterion))
    assert {p.dtype for p in trainer.model.parameters()} == {torch.bfloat16}
    assert isinstance(trainer.optimizer, FP16Optimizer) and trainer.optimizer.scaler is None
    assert {p.dtype for p in trainer.optimizer.fp32_params} == {torch.float32}
    dataset = task.dataset("train")
    ids = np.flatnonzero(np.asarray(dataset.sizes) <= 48)[:4]
    before = [p.detach().clone() for p in trainer.model.parameters()]
    log = trainer.train_step([dataset.collater([dataset[i] for i in ids])])
    assert log is not None and np.isfinite(float(log["loss"]))
    assert any(not torch.equal(a, p) for a, p in zip(before, trainer.model.parameters()))


def _losses(proc):
    out = proc.stdout + proc.stderr
    return [float(json.loads(x[x.index("{") :])["loss"]) for x in out.splitlines() if "| train_inner |" in x]


@pytest.mark.slow
def test_fairseq_train_bf16_on_the_cpu_trains_resumes_and_exports(demo_data_bin, tmp_path):
    """``fairseq-train --bf16``: fairseq's mixed-precision trainer (bf16 model, fp32 master weights in
    ``FP16Optimizer``, no loss scaler) on the CPU, next to the same run in fp32; the checkpoint resumes
    and exports."""
    save = tmp_path / "ckpt"
    extra = ("--required-batch-size-multiple", "1")
    proc = check(train_cmd(demo_data_bin, save, "--bf16", *extra, max_update=4, tokens_per_sample=48))
    assert "--bf16: bfloat16 on the CPU" in proc.stdout + proc.stderr
    bf16 = _losses(proc)
    fp32 = _losses(check(train_cmd(demo_data_bin, tmp_path / "fp32", *extra, max_update=4, tokens_per_sample=48)))
    assert len(bf16) == len(fp32) == 4, (bf16, fp32)
    # the same batches in bfloat16: close to fp32 (an untrained model's near-uniform predictions
    # agree to the log's 3 decimals; test_the_trainer_runs_in_bf16 checks the precision really changed)
    assert all(abs(a - b) <= 3e-2 * abs(b) for a, b in zip(bf16, fp32)), (bf16, fp32)

    state = load_torch_file(save / "checkpoint_last.pt")
    assert state["cfg"]["common"]["bf16"] is True and state["cfg"]["common"]["tpu"] is False
    assert "loss_scale" not in state["last_optimizer_state"]  # bf16: no loss scaler

    # the run resumes (the optimizer's fp32 master weights restored) and goes on
    check(train_cmd(demo_data_bin, save, "--bf16", *extra, max_update=6, tokens_per_sample=48))
    state = load_torch_file(save / "checkpoint_last.pt")
    assert state["optimizer_history"][-1]["num_updates"] == 6

    hf = tmp_path / "hf"
    check([sys.executable, EXPORT, "--checkpoint", save / "checkpoint_last.pt", "--data", demo_data_bin, "--out", hf])
    assert (hf / "config.json").is_file()
