"""The largest batch that fits, found by a short search.

``fits(batch)`` is the only thing that touches a device: on a GPU it runs one
training step of ``batch`` blocks and answers False on an out-of-memory error;
the tests give it a fake predicate.  The search doubles from ``start`` until a
size does not fit (or passes ``limit``), then bisects between the last size that
fitted and the first that did not, within ``probes`` calls of ``fits`` in all.
Memory grows with the batch, so "fits" is monotone and the answer is the largest
size that fitted among those tried.
"""

from typing import Callable, List, Tuple


def largest_batch(
    fits: Callable[[int], bool], start: int, limit: int, probes: int
) -> Tuple[int, List[Tuple[int, bool]]]:
    """(the largest size that fitted, 0 if ``start`` did not; every (size, fitted) tried, in order)."""
    if start < 1 or limit < start or probes < 1:
        raise ValueError(f"batch search: need 1 <= start <= limit and probes >= 1, got {start}, {limit}, {probes}")
    tried: List[Tuple[int, bool]] = []

    def probe(size: int) -> bool:
        ok = bool(fits(size))
        tried.append((size, ok))
        return ok

    good, bad, size = 0, None, start
    while len(tried) < probes:
        if probe(size):
            good = size
            if size == limit:
                return good, tried
            size = min(size * 2, limit)
        else:
            bad = size
            break
    while bad is not None and bad - good > 1 and len(tried) < probes:
        mid = (good + bad) // 2
        if probe(mid):
            good = mid
        else:
            bad = mid
    return good, tried
