"""FLOPs of a pre-training update, counted on real batches.

    rate             = FLOPs counted in K real training batches
                       / non-padding tokens the encoder received in them
    tokens per update = mean block length of the train split
                       x sequences through the encoder per batch (CPDAE: two views per text)
                       x --update-freq x data-parallel workers
    flops per update = rate x tokens per update;  total = flops per update x updates

The counts come from ``torch.utils.flop_counter.FlopCounterMode`` around the
criterion's forward and the loss's backward: matrix products, attention and
convolutions (2 FLOPs per multiply-add), not element-wise work (softmax,
LayerNorm, GELU, masking), which is a few percent of a transformer's.  It counts
what actually runs, so SimLM's frozen generator (forward only), CPDAE's two
views (the first recomputed in backward: counted in the total, not in the tokens) and the MLM
head applied only at masked positions are what they are.
Normalising by tokens removes the noise of which K batches were drawn (blocks
of ``--sample-break-mode complete`` vary in length, and fairseq batches blocks
of similar length together).  The encoder's share is counted separately: the
inputs every call of ``encoder.sentence_encoder`` received in those batches are
run through it again, forward and backward, under a counter of their own (the
counter's per-module split attributes only the forward pass to modules).  It is
what the identical budget holds equal across objectives.
"""

import warnings
from typing import Dict, List

from ...base.user_dir import parse_argv

BATCHES = 8  # real training batches the FLOPs are counted on

# Dense (not 2:4 sparse) tensor-core peaks in TFLOP/s per precision, from the vendors' data
# sheets (SXM parts; a PCIe part is somewhat lower: gpu_check takes --peak-tflops).
# H100/H200: 989.4 dense FP16/BF16 (1,979 with 2:4 sparsity; NVIDIA's Hopper architecture
# whitepaper). fp32 is the non-tensor-core rate (fairseq does not enable TF32 matmuls).
# The one table of the project: gpu_check's MFU and projection, and the data-pipeline
# benchmark's H100.
PEAK_TFLOPS: Dict[str, Dict[str, float]] = {
    "V100": {"fp16": 125.0, "fp32": 15.7},  # no bf16 units
    "A100": {"fp16": 312.0, "bf16": 312.0, "fp32": 19.5},
    "H100": {"fp16": 989.4, "bf16": 989.4, "fp32": 67.0},
    "H200": {"fp16": 989.4, "bf16": 989.4, "fp32": 67.0},
}


def count_update_flops(data_bin, args: List[str], batches: int = BATCHES) -> Dict[str, float]:
    """{"per_update", "encoder_per_update", "tokens_per_update", "batches"} of the ``fairseq-train``
    arguments ``args`` (see the module docstring)."""
    import numpy as np
    import torch
    from fairseq import options, tasks
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf
    from torch.utils.flop_counter import FlopCounterMode

    import seed_fairseq

    seed_fairseq.register()  # the plugin and the fairseq fixes

    parser = options.get_training_parser()
    ns = options.parse_args_and_arch(parser, parse_argv(data_bin, args))
    with warnings.catch_warnings():  # hydra's deprecation notices on every config build
        warnings.simplefilter("ignore")
        cfg = convert_namespace_to_omegaconf(ns)
    torch.manual_seed(cfg.common.seed)
    task = tasks.setup_task(cfg.task)
    model = task.build_model(cfg.model)
    criterion = task.build_criterion(cfg.criterion)
    task.load_dataset("train", combine=False, epoch=1)
    itr = task.get_batch_iterator(
        dataset=task.dataset("train"),
        max_tokens=cfg.dataset.max_tokens,
        max_sentences=cfg.dataset.batch_size,
        max_positions=task.max_positions(),
        ignore_invalid_inputs=True,
        seed=cfg.common.seed,
        num_workers=0,
        epoch=1,
    ).next_epoch_itr(shuffle=True)
    model.train()
    sentence_encoder = model.encoder.sentence_encoder
    calls = []
    hook = sentence_encoder.register_forward_pre_hook(lambda m, a, kw: calls.append((a, kw)), with_kwargs=True)
    pad = task.source_dictionary.pad()
    total = encoder = tokens = rows = 0.0
    n = 0
    for _, sample in zip(range(batches), itr):
        calls.clear()
        with FlopCounterMode(display=False) as counter:
            loss, _, _ = criterion(model, sample)
            # the encoder's inputs are its forward's calls: a checkpointed call (CPDAE's first view)
            # runs again in backward, a cost counted in ``total`` but not more tokens
            forward_calls = list(calls)
            loss.backward()
        total += counter.get_total_flops()
        hook.remove()
        for a, kw in forward_calls:
            src = a[0] if a else kw["src_tokens"]
            tokens += float(src.ne(pad).sum())
            rows += src.size(0)
        with FlopCounterMode(display=False) as counter:
            for a, kw in forward_calls:
                sentence_encoder(*a, **kw)["encoder_out"][0].float().sum().backward()
        hook = sentence_encoder.register_forward_pre_hook(lambda m, a, kw: calls.append((a, kw)), with_kwargs=True)
        encoder += counter.get_total_flops()
        model.zero_grad(set_to_none=True)
        n += 1
    hook.remove()
    if n == 0:
        raise ValueError(f"{data_bin}: no training batch to count FLOPs on")
    scale = cfg.optimization.update_freq[0] * max(1, cfg.distributed_training.distributed_world_size)
    sizes = task.dataset("train").sizes
    if isinstance(sizes, (list, tuple)):  # NestedDictionaryDataset: [the blocks' sizes]
        sizes = sizes[0]
    per_update = float(np.mean(sizes)) * rows / n * scale
    return {
        "per_update": total / tokens * per_update,
        "encoder_per_update": encoder / tokens * per_update,
        "tokens_per_update": per_update,
        "batches": n,
    }
