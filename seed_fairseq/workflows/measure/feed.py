"""Does one data-loader worker keep up with a GPU?  Both sides of the question, per objective.

    produced per worker = blocks one data-loader worker turns into batches per second of CPU time
                          (``dataset[i]`` for every block of a batch, then ``dataset.collater``: exactly
                          what fairseq's ``DataLoader`` worker runs; masking, decoder inputs and masks,
                          SimLM's masked sets and sampling noise, CPDAE's second view)
    consumed by a GPU   = MFU x the GPU's dense peak FLOP/s / FLOPs per block (forward + backward,
                          counted as ``flops.py`` counts them, on full blocks: SimLM's frozen
                          generator included)
    workers needed      = consumed / produced per worker

The producer is timed on the task's own dataset (``task.load_dataset("train")``), its blocks
taken in fairseq's order (``ordered_indices``), ``batch_size`` at a time, a new epoch (new
masks) whenever the split is used up.  CPU time (``time.process_time``) is the figure: a
worker is one process, and its CPU time is what it costs whatever else runs on the machine.
Not counted: ``term_counts`` (the main process's batch iterator) and moving the batch to the
main process (shared memory).
"""

import time
import warnings
from typing import Dict, List, Tuple

from ...base.user_dir import parse_argv
from .flops import PEAK_TFLOPS

H100_SXM_BF16_DENSE = PEAK_TFLOPS["H100"]["bf16"] * 1e12  # FLOP/s (flops.PEAK_TFLOPS: its source)
TARGET_MFU = 0.4


def setup_task(data_bin, args: List[str]):
    """``(task, cfg)`` of ``fairseq-train DATA --user-dir seed_fairseq *args``, the train split loaded."""
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf


    parser = options.get_training_parser()
    ns = options.parse_args_and_arch(parser, parse_argv(data_bin, args))
    with warnings.catch_warnings():  # hydra's deprecation notices on every config build
        warnings.simplefilter("ignore")
        cfg = convert_namespace_to_omegaconf(ns)
    task = tasks.setup_task(cfg.task)
    task.load_dataset("train", combine=False, epoch=1)
    return task, cfg


def batches_of(dataset, batch_size: int, epochs: int) -> List[Tuple[int, List[int]]]:
    """``(epoch, block ids)`` of the full batches of ``epochs`` epochs, in fairseq's order."""
    order = [int(i) for i in dataset.ordered_indices()]
    return [
        (epoch, order[start : start + batch_size])
        for epoch in range(1, epochs + 1)
        for start in range(0, len(order) - batch_size + 1, batch_size)
    ]


def make_batch(dataset, epoch: int, ids: List[int]):
    """What a data-loader worker does for one batch (fairseq sets the epoch before each)."""
    dataset.set_epoch(epoch)
    return dataset.collater([dataset[i] for i in ids])


def producer_rate(task, batch_size: int = 32, batches: int = 20, warmup: int = 1) -> Dict[str, float]:
    """Blocks per CPU second one worker produces from the task's train split (module docstring)."""
    import numpy as np

    dataset = task.dataset("train")
    per_epoch = len(dataset) // batch_size
    if per_epoch == 0:
        raise ValueError(f"the train split has {len(dataset)} blocks, fewer than a batch of {batch_size}")
    plan = batches_of(dataset, batch_size, -(-(batches + warmup) // per_epoch))[: batches + warmup]
    for epoch, ids in plan[:warmup]:
        make_batch(dataset, epoch, ids)
    cpu = wall = 0.0
    blocks = tokens = 0
    for epoch, ids in plan[warmup:]:
        t, c = time.perf_counter(), time.process_time()
        make_batch(dataset, epoch, ids)
        cpu += time.process_time() - c
        wall += time.perf_counter() - t
        blocks += len(ids)
        tokens += int(np.asarray(dataset.sizes[0] if isinstance(dataset.sizes, list) else dataset.sizes)[ids].sum())
    return {
        "batches": len(plan) - warmup,
        "blocks": blocks,
        "tokens_per_block": tokens / blocks,
        "cpu_s": cpu,
        "wall_s": wall,
        "blocks_per_cpu_s": blocks / cpu,
        "blocks_per_wall_s": blocks / wall,
    }


def flops_per_block(data_bin, args: List[str], batch_size: int = 2) -> Dict[str, float]:
    """FLOPs of forward + backward per block (CPDAE: per text, both views) on one batch of
    ``batch_size`` full blocks (exactly ``--tokens-per-sample`` tokens: no padding counted), SimLM's
    generator included: ``{"per_block", "tokens_per_block"}``.  Counted as in ``flops.py``
    (``FlopCounterMode`` around the criterion's forward and the loss's backward)."""
    import numpy as np
    import torch
    from torch.utils.flop_counter import FlopCounterMode

    from ...pretrain.data.update_counts import UPDATE_COUNTS

    task, cfg = setup_task(data_bin, args)
    dataset = task.dataset("train")
    sizes = np.asarray(dataset.sizes[0] if isinstance(dataset.sizes, list) else dataset.sizes)
    full = np.flatnonzero(sizes == sizes.max())[:batch_size].tolist()
    if len(full) < batch_size:
        raise ValueError(f"only {len(full)} blocks of {sizes.max()} tokens, fewer than {batch_size}")
    torch.manual_seed(1)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    sample = make_batch(dataset, 1, full)
    if hasattr(task, "term_counts"):  # what the task's batch iterator attaches in fairseq-train
        sample[UPDATE_COUNTS] = task.term_counts(sample)
    model.train()
    with FlopCounterMode(display=False) as counter:
        loss, _, _ = criterion(model, sample)
        loss.backward()
    return {"per_block": counter.get_total_flops() / batch_size, "tokens_per_block": float(sizes[full].mean())}


def consumer_rate(flops_block: float, peak_flops: float = H100_SXM_BF16_DENSE, mfu: float = TARGET_MFU) -> float:
    """Blocks per second a GPU of ``peak_flops`` dense FLOP/s trains at ``mfu``."""
    return mfu * peak_flops / flops_block
