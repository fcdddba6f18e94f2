"""Peak memory of live tensors during a piece of CPU work: the quantity a GPU reports as
``torch.cuda.max_memory_allocated``, measured on the CPU.

The peak resident set size of a CPU process is not that quantity.  glibc's ``malloc``
raises its mmap threshold after large blocks are freed, so the next blocks of that
size come from the heap, where freed memory stays in the process: a model that frees
one set of activations and then allocates another (CPDAE's second view's activations
freed in backward, then its first view's recomputed) keeps both in its RSS, although
a GPU's caching allocator reuses the freed blocks.  Measured at base shape: CPDAE's RSS
peak is 1.36x ``masked_lm``'s under the default glibc and 1.08x with
``MALLOC_MMAP_THRESHOLD_=1048576`` (every large block mmapped and returned on free).

:func:`peak_tensor_bytes` counts tensor memory directly, without the allocator:

    peak = bytes of the tensors alive before ``fn`` (every tensor the garbage collector
           reaches, one count per storage)
         + the highest running sum of the CPU allocator's allocations and frees during
           ``fn``, as ``torch.profiler`` records them (``profile_memory=True``)

It is hand-written because torch offers no allocator statistics for the CPU
(``torch.cuda.max_memory_allocated`` has no CPU counterpart).  The result is checked:
the tensors alive after ``fn`` must equal the count before plus the recorded net change,
within ``tolerance`` of the peak; otherwise :class:`MemoryAccountingError` is raised rather
than a wrong number returned.  The profiler does not record the free of a block allocated
before it started (torch warns "Memory block of unknown size was allocated before the
profiling started"), so ``fn`` must not free what existed before it -- e.g. free the
gradients before measuring a training step, which would free them first -- and tensors held
where the garbage collector does not reach them break the count the same way: both fail
the check.  It does not count what is not a tensor (the interpreter, libraries, allocator
fragmentation): compare it between setups of the same program, not with ``nvidia-smi``.
"""

import gc
from typing import Any, Callable, Dict, Tuple

import torch


class MemoryAccountingError(RuntimeError):
    """The profiler's allocation record does not add up to the tensors alive afterwards."""


def live_tensor_bytes() -> int:
    """Bytes of the CPU tensor storages the garbage collector reaches (a storage shared by
    views counted once)."""
    storages: Dict[int, int] = {}
    for obj in gc.get_objects():
        # type(), not isinstance(): isinstance reads obj.__class__, which some lazy module
        # attributes turn into a deprecation warning
        if not issubclass(type(obj), torch.Tensor):
            continue
        try:
            if obj.device.type != "cpu" or obj.is_sparse:
                continue
            storage = obj.untyped_storage()
            ptr, nbytes = storage.data_ptr(), storage.nbytes()
        except (RuntimeError, NotImplementedError, ReferenceError):  # no storage (meta, functional wrappers)
            continue
        if ptr:
            storages[ptr] = max(storages.get(ptr, 0), nbytes)
    return sum(storages.values())


def _allocation_deltas(prof) -> list:
    """(time, bytes) of every CPU allocation (+) and free (-) the profiler recorded, in time order."""
    cpu = torch._C._autograd.DeviceType.CPU
    events = prof.profiler.kineto_results.events()
    deltas = [(e.start_ns(), e.nbytes()) for e in events if e.name() == "[memory]" and e.device_type() == cpu]
    deltas.sort(key=lambda d: d[0])
    return deltas


def peak_tensor_bytes(fn: Callable[[], Any], tolerance: float = 0.02) -> Tuple[Any, Dict[str, int]]:
    """Run ``fn()`` and return ``(its result, {"peak", "before", "after"})`` in bytes of live
    CPU tensors (see the module docstring); raises :class:`MemoryAccountingError` when the
    record and the tensors alive afterwards differ by more than ``tolerance`` x the peak."""
    from torch.profiler import ProfilerActivity, profile

    gc.collect()
    before = live_tensor_bytes()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    running = highest = 0
    for _, nbytes in _allocation_deltas(prof):
        running += nbytes
        highest = max(highest, running)
    gc.collect()
    after = live_tensor_bytes()
    peak = before + highest
    if abs(after - (before + running)) > tolerance * peak:
        raise MemoryAccountingError(
            f"tensor memory does not add up: {before} bytes alive before + {running} recorded = "
            f"{before + running}, but {after} alive after (tolerance {tolerance:.0%} of the peak {peak})"
        )
    return result, {"peak": peak, "before": before, "after": after}
