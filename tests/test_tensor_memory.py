"""``seed_fairseq.workflows.measure.memory.peak_tensor_bytes``: the peak of live CPU tensor bytes during a call
(what ``torch.cuda.max_memory_allocated`` is on a GPU), measured by ``benchmarks/step_time.py``."""

import pytest
import torch

from seed_fairseq.workflows.measure.memory import MemoryAccountingError, live_tensor_bytes, peak_tensor_bytes

MIB = 2**20


def test_the_peak_counts_what_was_alive_together():
    keep = torch.zeros(3 * MIB // 4)  # 3 MiB alive before and after

    def work():
        a = torch.ones(MIB)  # 4 MiB
        b = torch.ones(2 * MIB)  # 8 MiB: 12 MiB of new tensors alive together
        del a
        c = torch.ones(MIB)  # 4 MiB into a's place: the peak stays 12
        return b, c

    result, got = peak_tensor_bytes(work)
    assert got["peak"] - got["before"] == pytest.approx(12 * MIB, rel=0.01)
    assert got["after"] - got["before"] == pytest.approx(12 * MIB, rel=0.01)  # b and c returned
    assert keep.numel() and len(result) == 2


def test_views_and_parameters_count_once():
    base = live_tensor_bytes()
    p = torch.nn.Parameter(torch.zeros(MIB))
    view = p.detach()[: MIB // 2]
    assert live_tensor_bytes() - base == pytest.approx(4 * MIB, rel=0.01)
    assert view.numel() == MIB // 2


def test_a_free_the_profiler_cannot_see_is_refused_not_miscounted():
    """The profiler does not record frees of blocks allocated before it started: freeing an older
    tensor inside the call would leave the count high; the check says so instead."""
    holder = [torch.ones(4 * MIB)]

    def frees_an_older_tensor():
        holder.clear()
        return torch.ones(16)

    with pytest.raises(MemoryAccountingError, match="does not add up"):
        peak_tensor_bytes(frees_an_older_tensor)
