"""The kernel profile of a run (``gpu_check --profile``; docs/gpu.md, "Kernel profile").

A few updates of a :class:`runs.Run` that has already trained (warm) are recorded under
``torch.profiler`` and summed up in a few numbers, never kept as a trace (a base model's update
is tens of thousands of events; the report has to come back from the lent machine):

* the share of the profiled time by class: GEMM, attention, the vocabulary-size projections and
  their losses, element-wise work and normalisation, the optimizer, the gradient norm, other, and
  the host gaps (the device idle inside the updates, waiting for the host);
* the 15 kernels with the most time, with their calls;
* kernel launches per update.

On CUDA the items are the device's kernels, each attributed to the CPU op that launched it (the
profiler links them) and that op's callers. On the CPU (the dry run) the device is the CPU: the
items are the ``aten::`` ops with their self time, and the host gaps are the time spent outside
any of them (Python, fairseq's bookkeeping, autograd's engine). One code path, both devices.

What a kernel belongs to is read from the ops and ranges around it, innermost first: fairseq's
trainer names its steps (``record_function`` ranges "clip-grads", "multiply-grads" and "optimizer";
``torch.optim`` adds "Optimizer.step#..."); attention is a kernel or op named so (flash,
memory-efficient, ``scaled_dot_product_attention``), anything inside the forward of fairseq's
``MultiheadAttention`` (a range this module opens with forward hooks while it profiles: fairseq's
own path, SEED's banded window) but its projections (``aten::linear``), or a product of two batched
operands (RetroMAE's enhanced decoder: B x H x T x d); a vocabulary projection or its loss is a
product or a loss with a vocabulary-sized input dimension (``record_shapes``), or the plugin's
fused ``linear_cross_entropy``. A backward op takes its forward op's context (the autograd
sequence number links them), so the gradient of attention is attention too. The rest is told by
its name: GEMMs (cuBLAS, CUTLASS, nvjet ...), element-wise kernels and normalisation, other.
"""

import contextlib
import math
import time
from typing import Dict, Iterable, Iterator, List, Sequence, Tuple

CLASSES = {  # key -> the report's words, in the report's order
    "gemm": "GEMM",
    "attention": "attention",
    "vocabulary": "vocabulary projections and losses",
    "elementwise": "element-wise and normalisation",
    "optimizer": "optimizer",
    "gradient_norm": "gradient norm",
    "other": "other",
    "host_gaps": "host gaps (device idle)",
}
TOP = 15
UPDATE_RANGE = "gpu_check.update"  # one profiled update: the window the host gaps are measured in
ATTENTION_RANGE = "gpu_check.attention"  # the forward of an attention module (fairseq's MultiheadAttention)

# the ranges fairseq's Trainer.train_step and torch.optim open (fairseq/trainer.py: "clip-grads",
# "optimizer"; torch.optim.Optimizer: "Optimizer.step#Adam.step", "Optimizer.zero_grad#...")
GRADIENT_NORM_RANGES = ("clip-grads",)
OPTIMIZER_RANGES = ("optimizer", "multiply-grads")
OPTIMIZER_PREFIXES = ("optimizer.step#", "optimizer.zero_grad#")
ATTENTION = ("attention", "flash", "fmha", "sdpa", "scaled_dot_product", "scaleddotproduct")
FUSED_VOCABULARY = ("linear_cross_entropy", "linearcrossentropy", "liger", "cut_cross_entropy")
VOCABULARY_LOSSES = ("log_softmax", "logsoftmax", "nll_loss", "cross_entropy", "binary_cross_entropy")
# aten's matrix products (the CPU's names; on CUDA the kernels say gemm, cutlass, nvjet ...)
GEMM_OPS = ("mm", "addmm", "bmm", "baddbmm", "addbmm", "matmul", "linear", "addmv", "mv", "dot", "_addmm_activation")
BATCHED_GEMM_OPS = ("bmm", "baddbmm", "matmul")
GEMM_KERNELS = ("gemm", "cutlass", "cublas", "nvjet", "xmma", "matmul", "gemv")
ELEMENTWISE_KERNELS = (
    "elementwise", "vectorized", "unrolled", "reduce", "norm", "softmax", "dropout", "gelu", "relu", "fill",
    "copy", "cat", "index", "scatter", "gather", "embedding", "where", "masked", "pointwise", "triton",
    "at::native::",
)  # fmt: skip
MEMORY = ("memcpy", "memset")  # copies and fills of the device's memory: not kernel launches
DEVICE_WORK = ("kernel", "gpu_memcpy", "gpu_memset")  # the device's activities that occupy it (kineto's names)

Frame = Tuple[str, Sequence]  # an op (or range) the item ran in: its name and its input shapes


def classify(name: str, context: Sequence[Frame] = (), vocab: Iterable[int] = ()) -> str:
    """The class (a key of :data:`CLASSES`, not host_gaps) of one kernel or CPU op called ``name``
    that ran inside ``context``: the ops and ranges around it, innermost first (for a CPU op,
    itself first with its shapes; for a backward op, its forward op's context too). ``vocab``:
    the vocabulary's sizes (the dictionary's, the embedding's rows)."""
    names = [name.lower()] + [frame.lower() for frame, _ in context]
    if any(n in GRADIENT_NORM_RANGES for n in names):
        return "gradient_norm"
    if any(n in OPTIMIZER_RANGES or n.startswith(OPTIMIZER_PREFIXES) for n in names):
        return "optimizer"
    if "multi_tensor_apply" in names[0]:  # a foreach kernel outside the ranges: a norm, else an optimizer's
        return "gradient_norm" if "norm" in names[0] else "optimizer"
    if _vocabulary(names[0], context, set(vocab)):
        return "vocabulary"
    for n, shapes in zip(names, [()] + [shapes for _, shapes in context]):
        if n == "aten::linear":  # a projection, inside an attention module or not: a GEMM
            break
        # attention's own work: a fused kernel, a range, or a product of two batched operands (the scores,
        # the weighted values: B x H x T x d; a projection multiplies by a 2-d weight)
        batched = sum(1 for s in shapes if isinstance(s, (list, tuple)) and len(s) >= 3) >= 2
        if any(word in n for word in ATTENTION) or (batched and n.rpartition("::")[2] in BATCHED_GEMM_OPS):
            return "attention"
    own = names[0]
    if own.startswith("aten::"):
        return "gemm" if own[len("aten::") :] in GEMM_OPS else "elementwise"
    if own.startswith(MEMORY) or "nccl" in own:  # copies, fills, communication (an all-reduce is no reduction)
        return "other"
    if any(word in own for word in GEMM_KERNELS):
        return "gemm"
    if any(word in own for word in ELEMENTWISE_KERNELS):
        return "elementwise"
    return "other"


def _vocabulary(own: str, context: Sequence[Frame], vocab: set) -> bool:
    """A vocabulary-size projection or its loss: the plugin's fused loss around it, or a matrix product
    or loss with a vocabulary-sized input dimension; a loss kernel of unknown shapes by its name."""
    if any(word in n for n in [own] + [f.lower() for f, _ in context] for word in FUSED_VOCABULARY):
        return True
    shaped = False
    for frame, shapes in context:
        op = frame.lower().rpartition("::")[2]
        if not shapes or not any(shapes):
            continue
        shaped = True
        if (op in GEMM_OPS or any(w in op for w in VOCABULARY_LOSSES)) and any(
            d in vocab for s in shapes if isinstance(s, (list, tuple)) for d in s
        ):
            return True
    return not shaped and any(word in own for word in VOCABULARY_LOSSES)


def covered(intervals: Iterable[Tuple[float, float]]) -> float:
    """The length of the union of ``(start, end)`` intervals."""
    total, end = 0.0, -math.inf
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def host_gaps(windows: Sequence[Tuple[float, float]], intervals: Sequence[Tuple[float, float]]) -> float:
    """The time inside ``windows`` (the profiled updates) that no interval (a kernel, a CPU op) covers."""
    idle = 0.0
    for w0, w1 in windows:
        inside = [(max(a, w0), min(b, w1)) for a, b in intervals if b > w0 and a < w1]
        idle += (w1 - w0) - covered(inside)
    return idle


class Event:
    """One event of the profiler's raw results (``torch.profiler``'s ``_KinetoEvent``), times in microseconds:
    read straight from them, as building ``prof.events()`` costs ~120 us an event (a base model's
    update has tens of thousands) where this costs a few."""

    __slots__ = ("name", "start", "end", "thread", "seq", "fwd_thread", "corr", "parent", "children", "raw", "_shapes")

    def __init__(self, raw, cpu: bool):
        self.name = raw.name()
        self.start = raw.start_ns() / 1e3
        self.end = self.start + raw.duration_ns() / 1e3
        self.thread, self.fwd_thread, self.seq = raw.start_thread_id(), raw.fwd_thread_id(), raw.sequence_nr()
        # an op's own id; a kernel's: the id of the op that launched it
        self.corr = raw.correlation_id() if cpu else raw.linked_correlation_id()
        self.parent, self.children, self.raw, self._shapes = None, 0.0, raw, None

    @property
    def self_time(self) -> float:
        return self.end - self.start - self.children

    def shapes(self) -> Sequence:
        """Input shapes (``record_shapes``), read only for the ops the vocabulary is told by."""
        if self._shapes is None:
            op = self.name.lower().rpartition("::")[2]
            wanted = op in GEMM_OPS or any(w in op for w in VOCABULARY_LOSSES)
            self._shapes = list(self.raw.shapes()) if wanted else []
        return self._shapes


def read(raw_events) -> Tuple[List[Event], List[Event]]:
    """(the CPU's ops and ranges, each with its parent; the device's kernels, copies and fills)."""
    cpu, device = [], []
    for r in raw_events:
        if not str(r.device_type()).endswith("CPU"):
            kind = r.activity_type() if hasattr(r, "activity_type") else "kernel"
            if kind in DEVICE_WORK:  # not a device-side copy of a range, nor a synchronisation's span
                device.append(Event(r, cpu=False))
        elif r.linked_correlation_id() == 0 and r.start_thread_id() == r.end_thread_id():
            cpu.append(Event(r, cpu=True))  # not a CUDA runtime call (linked to its op), not an async span
    by_thread: Dict[int, List[Event]] = {}
    for e in cpu:
        by_thread.setdefault(e.thread, []).append(e)
    for events in by_thread.values():  # the call tree, as torch.autograd.profiler_util builds it
        stack: List[Event] = []
        for e in sorted(events, key=lambda e: (e.start, -e.end)):
            while stack and (e.start >= stack[-1].end or e.end > stack[-1].end):
                stack.pop()
            if stack:
                e.parent = stack[-1]
                stack[-1].children += e.end - e.start
            stack.append(e)
    return cpu, device


def _context(event: Event, forward) -> List[Frame]:
    """The frames around ``event``, innermost first, itself included; each backward op (an autograd node:
    a sequence number, not an aten op) brings the frames of the forward ops it differentiates."""
    frames, seen, e = [], set(), event
    while e is not None:
        frames.append((e.name, e.shapes()))
        if e.seq >= 0 and "Backward" in e.name and not e.name.startswith("aten::"):
            for f in forward.get((e.fwd_thread, e.seq), ()):
                while f is not None and id(f) not in seen:
                    seen.add(id(f))
                    frames.append((f.name, f.shapes()))
                    f = f.parent
        e = e.parent
    return frames


def _inside(t: float, windows: Sequence[Tuple[float, float]]) -> bool:
    return any(a <= t <= b for a, b in windows)


def _device_items(cpu, device, windows, forward, vocab) -> Tuple[list, list, int]:
    """CUDA: every kernel an op inside the windows launched, classified in that op's context; the device's
    busy intervals; the kernel launches (copies and fills of memory are not kernels)."""
    ops = {e.corr: e for e in cpu if _inside(e.start, windows)}
    items, contexts = [], {}
    inside = [k for k in device if _inside(k.start, windows)]
    for k in inside:
        op = ops.get(k.corr)
        if op is None:  # no op launched it (no context to classify it in): other
            items.append(("(kernels without a launching op)", "other", k.end - k.start))
            continue
        if id(op) not in contexts:
            contexts[id(op)] = _context(op, forward)
        items.append((k.name, classify(k.name, contexts[id(op)], vocab), k.end - k.start))
    launches = sum(1 for k in inside if not k.name.lower().startswith(MEMORY))
    return items, [(k.start, k.end) for k in inside], launches


def _cpu_items(cpu, windows, forward, vocab) -> Tuple[list, list, int]:
    """The CPU: every aten op inside the windows with its self time; the intervals of the top-level ones
    (an op no other aten op called: one "launch" each) are the time the CPU computed."""
    items, intervals, launches = [], [], 0
    for e in cpu:
        if not e.name.startswith("aten::") or not _inside(e.start, windows):
            continue
        p = e.parent
        while p is not None and not p.name.startswith("aten::"):
            p = p.parent
        if p is None:
            launches += 1
            intervals.append((e.start, e.end))
        if e.self_time > 0:
            items.append((e.name, classify(e.name, _context(e, forward), vocab), e.self_time))
    return items, intervals, launches


def summarize(raw_events, updates: int, vocab: Iterable[int], device: str) -> Dict:
    """The profile of ``updates`` updates from the profiler's raw events (``prof.profiler.kineto_results
    .events()``): classes, top kernels, launches per update, the window and its host gaps."""
    vocab = set(vocab)
    cpu, device_events = read(raw_events)
    windows = [(e.start, e.end) for e in cpu if e.name == UPDATE_RANGE]
    forward: Dict[Tuple[int, int], list] = {}
    for e in cpu:
        if e.seq >= 0 and "Backward" not in e.name and not e.name.startswith("autograd::"):
            forward.setdefault((e.thread, e.seq), []).append(e)
    if device == "cuda":
        items, intervals, launches = _device_items(cpu, device_events, windows, forward, vocab)
    else:
        items, intervals, launches = _cpu_items(cpu, windows, forward, vocab)
    window = sum(b - a for a, b in windows)
    updates = len(windows) or updates  # what the profiler holds (its schedule records ``updates`` of them)
    if not items or window <= 0:
        what = "CUDA kernels (is CUPTI available?)" if device == "cuda" else "CPU ops"
        return {"status": "error", "detail": f"the profiler recorded no {what} in {len(windows)} updates"}
    gaps = max(0.0, host_gaps(windows, intervals))
    busy = max(0.0, window - gaps)
    per_class = {key: 0.0 for key in CLASSES if key != "host_gaps"}
    top: Dict[Tuple[str, str], List[float]] = {}
    for name, cls, t in items:
        per_class[cls] += t
        entry = top.setdefault((name, cls), [0.0, 0])
        entry[0] += t
        entry[1] += 1
    # kernels on several streams overlap: the classes split the busy time in proportion to their sums
    total = sum(per_class.values()) or 1.0
    classes = {k: {"seconds": t / 1e6, "share": (t / total) * (busy / window)} for k, t in per_class.items()}
    classes["host_gaps"] = {"seconds": gaps / 1e6, "share": gaps / window}
    ranked = sorted(top.items(), key=lambda kv: -kv[1][0])[:TOP]
    return {
        "status": "ok",
        "activity": "CUDA kernels" if device == "cuda" else "CPU aten ops (self time)",
        "updates": updates,
        "window_seconds": window / 1e6,
        "seconds_per_update": window / 1e6 / updates,
        "busy_seconds": busy / 1e6,
        "classes": classes,
        "launches_per_update": launches / updates,
        "top": [
            {"name": name[:300], "class": cls, "seconds": t / 1e6, "calls": int(calls)}
            for (name, cls), (t, calls) in ranked
        ],
    }


def vocabulary_sizes(run) -> List[int]:
    """The vocabulary's sizes a projection over it has: the dictionary's, and the embedding's rows (a model
    may pad them)."""
    sizes = {len(run.task.source_dictionary)}
    encoder = getattr(getattr(run.trainer.model, "encoder", None), "sentence_encoder", None)
    embed = getattr(encoder, "embed_tokens", None)
    if embed is not None:
        sizes.add(int(embed.weight.shape[0]))
    return sorted(sizes)


@contextlib.contextmanager
def attention_ranges(model) -> Iterator[None]:
    """Each forward of fairseq's ``MultiheadAttention`` (and its subclasses: SEED's windowed decoder
    attention) inside a :data:`ATTENTION_RANGE` range: attention that is not one fused kernel (fairseq's
    own path, a banded window of element-wise ops) is told by it, and its backward by its forward."""
    from fairseq.modules import MultiheadAttention
    from torch.profiler import record_function

    open_ranges: Dict[int, list] = {}

    def enter(module, args):
        scope = record_function(ATTENTION_RANGE)
        scope.__enter__()
        open_ranges.setdefault(id(module), []).append(scope)

    def leave(module, args, output):
        scopes = open_ranges.get(id(module))
        if scopes:
            scopes.pop().__exit__(None, None, None)

    handles = []
    for m in model.modules():
        if isinstance(m, MultiheadAttention):
            handles += [m.register_forward_pre_hook(enter), m.register_forward_hook(leave)]
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def profile_updates(run, updates: int, warmup: int = 1) -> Dict:
    """``warmup`` then ``updates`` updates of ``run`` (a :class:`runs.Run`) under ``torch.profiler``: the
    profiler's own start-up falls in the warm-up, which it records and discards (its schedule). Adds
    ``cost_seconds``: what profiling and summing up took, ``summing_seconds`` the summing up alone."""
    from torch.profiler import ProfilerActivity, profile, record_function, schedule

    began = time.perf_counter()
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if run.device == "cuda" else [])
    plan = schedule(wait=0, warmup=warmup, active=updates, repeat=1)
    with attention_ranges(run.trainer.model), profile(activities=activities, schedule=plan, record_shapes=True) as prof:
        for _ in range(warmup + updates):
            sample = run.next_sample()
            with record_function(UPDATE_RANGE):
                run.step(sample)
            prof.step()
    summing = time.perf_counter()
    raw = prof.profiler.kineto_results.events()  # prof.events() would build a FunctionEvent of each
    result = summarize(raw, updates, vocabulary_sizes(run), run.device)
    result["summing_seconds"] = time.perf_counter() - summing
    result["cost_seconds"] = time.perf_counter() - began
    return result


def short_name(name: str, width: int = 100) -> str:
    """A kernel's name for a table: no ``void``, no argument list, at most ``width`` characters."""
    name = name.strip()
    if name.startswith("void "):
        name = name[len("void ") :]
    if name.endswith(")"):  # the argument list: from its matching "(" (a template may hold parentheses)
        depth = 0
        for i in range(len(name) - 1, -1, -1):
            depth += {")": 1, "(": -1}.get(name[i], 0)
            if depth == 0:
                name = name[:i].rstrip() if i > 0 else name
                break
    return name if len(name) <= width else name[: width - 3] + "..."
