"""Order-preserving parallel map with a bounded number of tasks in flight."""

import collections
import multiprocessing
from typing import Any, Callable, Iterable, Iterator, List, Optional, Tuple

# An exception raised by a Pool initializer makes multiprocessing restart the
# worker forever (the map then hangs); we keep it and raise it from the task.
_INIT_ERROR = None


def _guarded_init(initializer, initargs):
    global _INIT_ERROR
    try:
        if initializer is not None:
            initializer(*initargs)
    except Exception as e:  # noqa: BLE001 - re-raised in _guarded_call
        _INIT_ERROR = e


def _guarded_call(func, item):
    if _INIT_ERROR is not None:
        raise _INIT_ERROR
    return func(item)


def ordered_imap(
    func: Callable[[Any], Any],
    iterable: Iterable[Any],
    workers: int,
    initializer: Optional[Callable[..., Any]] = None,
    initargs: tuple = (),
    inflight_per_worker: int = 4,
) -> Iterator[Any]:
    """Like ``Pool.imap(func, iterable)`` but reads ``iterable`` lazily.

    Hand-written because ``Pool.imap`` and ``ProcessPoolExecutor.map`` (Python
    3.11) both drain the whole input iterable into their task queue as fast as
    it can be produced; with an XML reader that is faster than the wikitext
    cleaners, that would pull the whole dump into memory. Here at most
    ``workers * inflight_per_worker`` tasks exist at a time, results come back
    in input order (deterministic output), and workers=1 runs in-process.
    """
    if workers <= 1:
        if initializer is not None:
            initializer(*initargs)
        for item in iterable:
            yield func(item)
        return
    limit = workers * inflight_per_worker
    with multiprocessing.Pool(workers, initializer=_guarded_init, initargs=(initializer, initargs)) as pool:
        pending = collections.deque()
        for item in iterable:
            pending.append(pool.apply_async(_guarded_call, (func, item)))
            if len(pending) >= limit:
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


def line_ranges(path, chunk_bytes: int) -> Iterator[Tuple[int, int]]:
    """(start, end) byte ranges covering ``path``, each ending after a b"\\n" (or at EOF).

    Workers read their range themselves (``read_range``), so only results cross
    process boundaries; every line lies in exactly one range, in order.
    """
    with open(path, "rb") as f:
        f.seek(0, 2)
        size = f.tell()
        start = 0
        while start < size:
            f.seek(min(size, start + chunk_bytes))
            f.readline()  # to the end of the line the cut fell into
            end = min(size, f.tell())
            if end <= start:  # pragma: no cover - readline always advances before EOF
                end = size
            yield start, end
            start = end


def read_range(path, start: int, end: int) -> bytes:
    with open(path, "rb") as f:
        f.seek(start)
        return f.read(end - start)


def split_lines(text: str) -> List[str]:
    """The lines of ``text`` split on "\\n" only (a last line without "\\n" counts)."""
    lines = text.split("\n")
    if lines[-1] == "":
        lines.pop()
    return lines
