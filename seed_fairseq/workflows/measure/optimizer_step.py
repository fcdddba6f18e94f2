"""The optimizer's share of a training update, as fairseq builds the optimizer: time and dispatched ops.

After the backward pass fairseq's Trainer calls ``multiply_grads``, ``clip_grad_norm`` (the norm,
and clipping), ``step`` and, at the next update, ``zero_grad``.  :func:`measure` builds an
optimizer by fairseq's own paths over the parameters of an encoder (``encoder_shapes``: a
RoBERTa encoder with its MLM head, the output projection tied to the embeddings), in one of
fairseq's three precisions -- fp32; ``--fp16`` (``FP16Optimizer``: fp32 master weights in ONE
flat tensor, a dynamic loss scale); ``--bf16`` (fp32 masters unflattened, no scale) -- gives the
model's parameters fixed random gradients, and times those calls (mean of ``steps`` after one
untimed update), then counts the ops they dispatch in one more update with ``torch.profiler``.

"Launches" are the outermost ``aten::`` calls (an op called inside another, such as the per-tensor
loop of a multi-tensor op on the CPU, is not counted), without those that launch no kernel on a
GPU (views, ``detach``, allocation, a ``to`` that copies nothing: :data:`NO_KERNEL`): on a GPU each
is one kernel launch, a multi-tensor (``_foreach_*``, ``_fused_adamw_``) op one per block of tensors.  That count
is the cost this measures: fairseq's Python Adam dispatches ~10 ops per tensor, torch_adam's
fused kernel one per parameter group; the gradient norm, one per tensor without apex, is one
``_foreach_norm`` with the plugin's fix.

The baseline is fairseq as installed, without apex: ``--optimizer adam``, fairseq's own
``clip_grad_norm_`` and ``FP16Optimizer.zero_grad`` (the plugin's fixes ``fairseq_patches/grad_norm.py``
and ``master_grads.py`` put aside while it runs); the other is ``--optimizer torch_adam`` with the
fixes.  Imports fairseq inside its functions.
"""

import contextlib
import time
from typing import Dict, List, Tuple

PRECISIONS = ("fp32", "fp16", "bf16")
OPTIMIZERS = ("adam", "torch_adam")
PHASES = ("norm", "step", "zero_grad")


def encoder_shapes(layers=12, hidden=768, ffn=3072, vocab=32768, positions=514) -> List[Tuple[int, ...]]:
    """The parameters of fairseq's ``roberta`` encoder and MLM head, in its order (the head's output
    projection is the token embedding: not a parameter of its own)."""
    shapes = [(vocab, hidden), (positions, hidden), (hidden,), (hidden,)]
    for _ in range(layers):
        shapes += [(hidden, hidden), (hidden,)] * 4  # k, v, q, out projections
        shapes += [(hidden,), (hidden,), (ffn, hidden), (ffn,), (hidden, ffn), (hidden,), (hidden,), (hidden,)]
    shapes += [(hidden, hidden), (hidden,), (hidden,), (hidden,), (vocab,)]  # dense, layer norm, bias
    return shapes


def fairseq_config(optimizer: str, precision: str, lr: float = 1e-4):
    """fairseq-train's config of the optimizer (``--adam-betas (0.9,0.98) --adam-eps 1e-6 --weight-decay
    0.01``, the papers'), parsed by fairseq itself; the data folder is not read."""
    from fairseq import options
    from fairseq.dataclass.utils import convert_namespace_to_omegaconf

    import seed_fairseq

    seed_fairseq.register()  # torch_adam and the fixes
    argv = ["/no-data", "--task", "masked_lm", "--arch", "roberta_base", "--cpu", "--optimizer", optimizer]
    argv += ["--lr", str(lr), "--adam-betas", "(0.9,0.98)", "--adam-eps", "1e-6", "--weight-decay", "0.01"]
    argv += {"fp32": [], "fp16": ["--fp16"], "bf16": ["--bf16"]}[precision]
    return convert_namespace_to_omegaconf(options.parse_args_and_arch(options.get_training_parser(), argv))


@contextlib.contextmanager
def fairseq_as_installed(optimizer: str):
    """fairseq's own gradient norm and master-gradient zeroing while the baseline (``adam``) runs; the
    plugin's fixes (``fairseq_patches/grad_norm.py``, ``master_grads.py``) otherwise."""
    from fairseq import utils
    from fairseq.optim.fp16_optimizer import _FP16OptimizerMixin

    fixed = [(utils, "clip_grad_norm_"), (_FP16OptimizerMixin, "zero_grad")]
    kept = [(owner, name, getattr(owner, name)) for owner, name in fixed]
    if optimizer == "adam":
        for owner, name, fix in kept:
            setattr(owner, name, getattr(fix, "__wrapped__", fix))
    try:
        yield
    finally:
        for owner, name, fix in kept:
            setattr(owner, name, fix)


def build(optimizer: str, precision: str, shapes, seed: int = 0):
    """(fairseq's optimizer, the model's parameters with gradients) as the Trainer builds them."""
    import torch
    from fairseq import optim
    from fairseq.optim.fp16_optimizer import FP16Optimizer

    cfg = fairseq_config(optimizer, precision)
    dtype = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}[precision]
    g = torch.Generator().manual_seed(seed)
    params = [torch.nn.Parameter((torch.randn(s, generator=g) * 0.02).to(dtype)) for s in shapes]
    grads = [(torch.randn(s, generator=g) * 1e-3).to(dtype) for s in shapes]
    if precision == "fp32":
        return optim.build_optimizer(cfg.optimizer, params), params, grads
    cuda_device = torch.cuda.current_device
    if not torch.cuda.is_available():
        # fairseq's flat fp32 master is keyed by torch.cuda.current_device(); a CPU parameter's device
        # index is None, the key fairseq's own syncs then look the flat tensor up with
        torch.cuda.current_device = lambda: None
    try:
        return FP16Optimizer.build_optimizer(cfg, params), params, grads
    finally:
        torch.cuda.current_device = cuda_device


def give_gradients(opt, params, grads) -> None:
    """What the backward pass leaves: the model's gradients (fp16: times the loss scale, as fairseq's
    scaled backward makes them; the wrapper's zero_grad divides by it again)."""
    scale = getattr(getattr(opt, "scaler", None), "loss_scale", 1.0)
    for p, g in zip(params, grads):
        p.grad = g * scale if scale != 1.0 else g
    if hasattr(opt, "fp16_params"):  # the wrapper's flag that its backward() sets
        opt._needs_sync = True


def update(opt, wall: Dict[str, float], cpu: Dict[str, float]) -> None:
    """The optimizer's calls of one update, each phase's wall and CPU seconds added to ``wall`` and
    ``cpu`` (``multiply_grads(1)`` leaves the fixed gradients as they are)."""
    calls = {"norm": lambda: (opt.multiply_grads(1.0), opt.clip_grad_norm(1.0)), "step": opt.step}
    calls["zero_grad"] = opt.zero_grad
    for phase in PHASES:
        t, c = time.perf_counter(), time.process_time()
        calls[phase]()
        wall[phase] += time.perf_counter() - t
        cpu[phase] += time.process_time() - c


# ops that launch no kernel: views, metadata, allocation, and a ``to`` that copies nothing (one that copies
# counts by its ``_to_copy``/``copy_`` inside)
NO_KERNEL = {
    "aten::detach", "aten::to", "aten::view", "aten::view_as", "aten::reshape", "aten::_unsafe_view",
    "aten::alias", "aten::as_strided",
    "aten::slice", "aten::select", "aten::expand", "aten::t", "aten::unsqueeze", "aten::squeeze",
    "aten::lift_fresh", "aten::resolve_conj", "aten::resolve_neg", "aten::result_type", "aten::empty",
    "aten::empty_like", "aten::empty_strided", "aten::_to_copy",
}  # fmt: skip


def launches(event) -> int:
    """Kernel launches of one aten op: 1, or for an op of :data:`NO_KERNEL`, those of the ops inside it."""
    if event.name not in NO_KERNEL:
        return 1
    return sum(launches(c) for c in event.cpu_children if c.name.startswith("aten::"))


def outermost_ops(events) -> int:
    """The kernel launches of the ``aten::`` events with no ``aten::`` event above them."""

    def nested(e):
        parent = e.cpu_parent
        while parent is not None:
            if parent.name.startswith("aten::"):
                return True
            parent = parent.cpu_parent
        return False

    return sum(launches(e) for e in events if e.name.startswith("aten::") and not nested(e))


def measure(optimizer: str, precision: str, steps: int = 5, shapes=None) -> Dict[str, object]:
    """Seconds per update of each phase, wall and CPU (mean of ``steps`` after one untimed update), and
    each phase's kernel launches in one profiled update."""
    from torch.profiler import ProfilerActivity, profile, record_function

    shapes = shapes or encoder_shapes()
    with fairseq_as_installed(optimizer):
        opt, params, grads = build(optimizer, precision, shapes)
        give_gradients(opt, params, grads)
        update(opt, dict.fromkeys(PHASES, 0.0), dict.fromkeys(PHASES, 0.0))  # state allocated: untimed
        wall, cpu = dict.fromkeys(PHASES, 0.0), dict.fromkeys(PHASES, 0.0)
        for _ in range(steps):
            give_gradients(opt, params, grads)
            update(opt, wall, cpu)
        give_gradients(opt, params, grads)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            with record_function("phase::norm"):
                opt.multiply_grads(1.0)
                opt.clip_grad_norm(1.0)
            with record_function("phase::step"):
                opt.step()
            with record_function("phase::zero_grad"):
                opt.zero_grad()
    events = prof.events()
    ops = {}
    for phase in PHASES:
        (mark,) = [e for e in events if e.name == f"phase::{phase}"]
        inside = [e for e in events if mark.time_range.start <= e.time_range.start <= mark.time_range.end]
        ops[phase] = outermost_ops([e for e in inside if e.thread == mark.thread])
    torch_optimizer = opt.optimizer
    return {
        "optimizer": optimizer,
        "precision": precision,
        "tensors": len(shapes),
        "parameters": sum(int(p.numel()) for p in params),
        "master_tensors": sum(len(g["params"]) for g in torch_optimizer.param_groups),
        "kernel": getattr(torch_optimizer, "kernel", "fairseq's Python loop"),
        "seconds": {k: v / steps for k, v in wall.items()},
        "cpu_seconds": {k: v / steps for k, v in cpu.items()},
        "launches": ops,
    }
