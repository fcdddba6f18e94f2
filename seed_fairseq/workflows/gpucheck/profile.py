"""What one gpu_check run is: the device, its precisions, its shape, its backend.

Every CUDA-only choice of the check is a field here, not a branch elsewhere: the
dry run (``--dry-run``) is the same code with :func:`dry_run_profile` (the CPU,
bf16 through fairseq's mixed-precision trainer, tiny architectures, gloo, faiss-cpu
on both sides) instead of :func:`cuda_profile`.
"""

import re
from dataclasses import dataclass, field
from typing import Dict, List, Optional, Tuple

from ..kit.argv import DEFAULT_OPTIMIZER, FAIRSEQ_MLM, GENERATOR, train_args
from ..measure.flops import PEAK_TFLOPS  # the vendors' dense peaks, TFLOP/s per precision

# the paper's recipe (SEED-Encoder, RetroMAE, SimLM ...): 1M updates of 256 blocks of 512 tokens
RECIPE_UPDATES = 1_000_000
RECIPE_BLOCKS = 256
RECIPE_TOKENS = 512
ASSUMED_MFU = 0.40  # the projection's utilisation until a report measures one
PROJECTION_GPUS = (8, 16, 64)


def device_family(name: str) -> Optional[str]:
    """``"NVIDIA H100 80GB HBM3"`` -> ``"H100"``; None for a device not in :data:`PEAK_TFLOPS`."""
    for family in sorted(PEAK_TFLOPS, key=len, reverse=True):
        if re.search(rf"\b{family}", name, flags=re.IGNORECASE):
            return family
    return None


def peak_tflops(name: str, precision: str, override: Optional[float] = None) -> Optional[float]:
    """The dense peak of device ``name`` in ``precision``: ``override`` (--peak-tflops) when given, else
    the table's; None when unknown (MFU is then not reported)."""
    if override:
        return float(override)
    family = device_family(name)
    return PEAK_TFLOPS.get(family, {}).get(precision) if family else None


@dataclass
class Profile:
    """Everything that differs between a GPU run and the dry run."""

    dry_run: bool
    device: str  # "cuda" or "cpu"
    device_name: str  # torch.cuda.get_device_name(), or "cpu"
    gpus: int  # visible CUDA devices (0 on the CPU)
    precisions: Tuple[str, ...]  # the training precisions checked: fp16/bf16 on CUDA, bf16 in the dry run
    reference: str  # what --fp16/--bf16 is compared with on one fixed batch (fp32)
    backend: str  # data-parallel backend of the 2-process check (nccl / gloo)
    tiny: bool  # *_tiny architectures and the tests' encoder instead of the *_base ones
    tokens_per_sample: int
    updates: int  # updates per objective and precision
    warmup: int
    lr: float
    vocab_size: int
    corpus_copies: int  # the demo corpus repeated: enough blocks for the largest batch searched
    batch_start: int  # the batch search: first size tried, largest allowed, probes at most
    batch_limit: int
    batch_probes: int
    encode_docs: int  # documents encoded for docs/s
    peak_override: Optional[float] = None
    skipped_precisions: Dict[str, str] = field(default_factory=dict)  # precision -> why not here
    # seconds of a time budget kept for the checks after the training runs (data parallel, export, encode)
    tail_seconds: float = 60.0
    # words/s: the updates after the FLOP-counted first one that are not measured (the device warming up)
    measure_warmup: int = 1
    # the kernel profile (kernels.py): updates recorded after the profiler's own warm-up update, and the
    # seconds summing one up takes (the budget's estimate until a profile of this run measured it)
    profile_updates: int = 2
    profile_warmup: int = 1
    profile_seconds_per_update: float = 0.2

    def encoder_args(self) -> List[str]:
        if not self.tiny:
            return []  # the *_base architectures: 12 x 768, 12 heads, FFN 3072
        # the tests' encoder: deliberately odd sizes (tests/objectives.py)
        return ["--encoder-layers", "2", "--encoder-embed-dim", "32", "--encoder-ffn-embed-dim", "37"] + [
            "--encoder-attention-heads",
            "2",
        ]

    def generator_args(self) -> List[str]:
        """SimLM's frozen generator: ELECTRA-base's generator shape (1/3 of the width), or a tiny one."""
        if self.tiny:
            return ["--encoder-layers", "1", "--encoder-embed-dim", "16", "--encoder-ffn-embed-dim", "19"] + [
                "--encoder-attention-heads",
                "2",
            ]
        return ["--encoder-layers", "12", "--encoder-embed-dim", "256", "--encoder-ffn-embed-dim", "1024"] + [
            "--encoder-attention-heads",
            "4",
        ]

    def peak(self, precision: str) -> Optional[float]:
        return peak_tflops(self.device_name, precision, self.peak_override)

    def precision_flags(self, precision: str) -> List[str]:
        """fairseq-train's options of one precision (and --cpu off CUDA)."""
        flags = {"fp16": ["--fp16"], "bf16": ["--bf16"], "fp32": []}[precision]
        return flags + (["--cpu"] if self.device == "cpu" else [])

    def run_args(
        self,
        setup: List[str],
        precision: str,
        batch: int,
        updates: int,
        dropout: bool = True,
        optimizer: Optional[str] = None,
    ) -> List[str]:
        """fairseq-train's options (after DATA) of ``updates`` updates of one objective (``setup``), with
        ``optimizer`` (default: the project's, ``kit.argv.DEFAULT_OPTIMIZER``)."""
        return [
            *setup,
            "--tokens-per-sample",
            str(self.tokens_per_sample),
            "--sample-break-mode",
            "none",  # every block full length: the shape of the paper's batches
            "--required-batch-size-multiple",
            "1",
            "--batch-size",
            str(batch),
            "--optimizer",
            optimizer or DEFAULT_OPTIMIZER,
            "--adam-betas",
            "(0.9,0.98)",
            "--adam-eps",
            "1e-6",
            "--weight-decay",
            "0.01",
            "--lr",
            str(self.lr),
            "--lr-scheduler",
            "polynomial_decay",
            "--warmup-updates",  # a run shortened by a time budget warms up over the same fraction
            str(min(self.warmup, max(1, updates // 5))),
            "--total-num-update",
            str(updates),
            "--max-update",
            str(updates),
            "--clip-norm",
            "1.0",
            *([] if dropout else ["--dropout", "0", "--attention-dropout", "0"]),
            "--num-workers",
            "0",
            "--seed",
            "1",
            "--disable-validation",
            *self.precision_flags(precision),
        ]


REFERENCE_OPTIMIZER = "adam"  # fairseq's own: the reference a new default optimizer is measured against


def dry_run_profile(peak_override: Optional[float] = None) -> Profile:
    """The CPU stand-in of every GPU check: tiny shapes, gloo, a few updates, in bf16: fairseq's
    mixed-precision path (bf16 model, fp32 master weights in ``FP16Optimizer``, no loss scaler) is
    the same code on the CPU (``fairseq_patches/bf16_device.py``). fp16 is not: fairseq's flat fp32
    master weights live on ``torch.cuda.current_device()``."""
    return Profile(
        dry_run=True,
        device="cpu",
        device_name="cpu",
        gpus=0,
        precisions=("bf16",),
        reference="fp32",
        backend="gloo",
        tiny=True,
        tokens_per_sample=48,
        updates=6,
        warmup=1,
        lr=3e-3,
        vocab_size=500,
        corpus_copies=1,
        batch_start=2,
        batch_limit=8,
        batch_probes=3,
        encode_docs=16,
        tail_seconds=40.0,  # 2 gloo processes, the export, encoding: ~20 s on 2 idle cores
        measure_warmup=1,  # 6 updates: the counted one, 1 not measured, 4 measured (2 per half)
        profile_seconds_per_update=0.2,  # measured: 0.05-0.2 s for the tiny models' ~1-3k ops an update
        # a CPU core's fp32 peak is not in the table: a nominal 0.1 TFLOP/s keeps MFU's arithmetic exercised
        peak_override=peak_override or 0.1,
    )


def cuda_profile(updates: int = 30, peak_override: Optional[float] = None) -> Profile:
    """The real check on the visible CUDA devices: base shape, fp16 and bf16, NCCL."""
    import torch

    name = torch.cuda.get_device_name(0)
    precisions, skipped = ["fp16"], {}
    if not torch.cuda.is_bf16_supported():
        skipped["bf16"] = f"{name} has no bfloat16 units"
    else:
        precisions.append("bf16")
    return Profile(
        dry_run=False,
        device="cuda",
        device_name=name,
        gpus=torch.cuda.device_count(),
        precisions=tuple(precisions),
        reference="fp32",
        backend="nccl",
        tiny=False,
        tokens_per_sample=512,
        updates=updates,
        warmup=max(1, updates // 5),
        lr=5e-4,
        # without --data (the device bundle's Wikipedia build: 32,768 pieces, the papers' ~30k): the demo
        # corpus allows at most ~20.9k pieces
        vocab_size=16384,
        corpus_copies=8,
        # 32 x 512 fits any objective at base shape on a 40 GB card: fewer probes to the largest batch
        batch_start=32,
        batch_limit=256,
        batch_probes=7,
        encode_docs=2000,
        peak_override=peak_override,
        skipped_precisions=skipped,
        # fairseq-train (Python, CUDA and data start-up, one update, a 1.3 GB checkpoint), the export on
        # the CPU and the device, loading and encoding 2,000 documents in each precision
        tail_seconds=90.0,
        # the H200's runs of 2026-11-27: the first updates after the counted one are still slower
        measure_warmup=2,
        # an estimate (no GPU run profiled yet): a base model's update is ~20-40k events, read at a few us each
        profile_seconds_per_update=1.0,
    )


@dataclass(frozen=True)
class Setup:
    """One objective as fairseq-train options (task, criterion, architecture, sizes, its own settings)."""

    name: str
    args: Tuple[str, ...]
    # run without --objectives: the plugin's own and the baseline (another --user-dir's runs when named)
    default: bool = True
    optimizer: Optional[str] = None  # None: the default optimizer (kit.argv.DEFAULT_OPTIMIZER)
    label: str = ""  # the report's words for a run that is not just its objective


FAIRSEQ_BASELINE = FAIRSEQ_MLM.name  # fairseq's own masked LM: the denominator of every ratio
# the baseline with fairseq's adam, when that is not the default
REFERENCE = f"{FAIRSEQ_BASELINE}_{REFERENCE_OPTIMIZER}"


def setups(profile: Profile, generator: str) -> List[Setup]:
    """Every objective of the registry (``tasks/registry.py``) that fairseq-train can load (the plugin's
    own, or one whose description names its ``user_dir``), then fairseq's ``masked_lm`` at the same
    shape, and it again with fairseq's ``adam`` when the default optimizer is another (:data:`REFERENCE`);
    ``generator``: the frozen generator checkpoint of the objectives that need one."""
    from ...pretrain.tasks.registry import is_plugins_own, runnable_objectives

    out = []
    for d in runnable_objectives():
        arch, own = (d.test_arch, d.test_args) if profile.tiny else (d.arch, d.args)
        args = train_args(d, model=profile.encoder_args(), arch=arch, own=own, generator=generator)
        out.append(Setup(d.name, tuple(args), is_plugins_own(d)))
    baseline = tuple(train_args(FAIRSEQ_MLM, model=profile.encoder_args()))
    out.append(Setup(FAIRSEQ_BASELINE, baseline))
    if DEFAULT_OPTIMIZER != REFERENCE_OPTIMIZER:  # what the new default is measured against
        label = f"{FAIRSEQ_BASELINE}, fairseq's {REFERENCE_OPTIMIZER} (reference)"
        out.append(Setup(REFERENCE, baseline, optimizer=REFERENCE_OPTIMIZER, label=label))
    return out


def generator_setup(profile: Profile) -> Setup:
    """SimLM's generator: a small ``seed_encoder_mlm_only`` (docs/objectives/simlm.md)."""
    return Setup("generator", tuple(train_args(GENERATOR, model=profile.generator_args())))
