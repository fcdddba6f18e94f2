"""Order-preserving parallel map with a bounded number of tasks in flight."""

import collections
import pickle
from concurrent.futures import ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from typing import Any, Callable, Iterable, Iterator, List, Optional, Tuple

# An exception raised by a pool's initializer would end its worker (the pool
# then reports a dead worker, not the error); we keep it and raise it from the task.
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
        raise _portable(_INIT_ERROR)
    try:
        return func(item)
    except Exception as e:
        portable = _portable(e)
        if portable is e:
            raise
        raise portable from None


def _portable(error: Exception) -> Exception:
    """``error``, or a RuntimeError naming it when it would not survive the way back.

    A worker's exception is pickled to the parent and rebuilt there; one whose
    class cannot be rebuilt from its pickle (an ``__init__`` with other
    arguments than ``args``) kills multiprocessing's result thread, and the
    parent would then wait for its results forever.
    """
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:  # noqa: BLE001 - whatever fails here, the parent must get an error
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error


class WorkerDied(RuntimeError):
    """A worker process ended without a result: killed, out of memory, or
    crashed in C code. ``items``: the items in flight then, in input order,
    none of whose results was yielded (the caller may run them again)."""

    def __init__(self, items: List[Any]):
        super().__init__(
            f"a worker process ended abruptly (killed, out of memory or crashed) with {len(items)} task(s) in flight"
        )
        self.items = items


def ordered_imap(
    func: Callable[[Any], Any],
    iterable: Iterable[Any],
    workers: int,
    initializer: Optional[Callable[..., Any]] = None,
    initargs: tuple = (),
    inflight_per_worker: int = 4,
    own_process: bool = False,
) -> Iterator[Any]:
    """Like ``ProcessPoolExecutor.map(func, iterable)`` but reads ``iterable`` lazily.

    Hand-written because ``Pool.imap`` and ``ProcessPoolExecutor.map`` (Python
    3.11) both drain the whole input iterable into their task queue as fast as
    it can be produced; with an XML reader that is faster than the wikitext
    cleaners, that would pull the whole dump into memory. Here at most
    ``workers * inflight_per_worker`` tasks exist at a time, results come back
    in input order (deterministic output), and workers=1 runs in-process
    unless ``own_process`` (then a task that must be stopped can end its process).

    A worker that dies raises :class:`WorkerDied` here (``ProcessPoolExecutor``
    notices it; a ``multiprocessing.Pool`` would wait for its result forever).
    """
    if workers <= 1 and not own_process:
        if initializer is not None:
            initializer(*initargs)
        for item in iterable:
            yield func(item)
        return
    workers = max(workers, 1)
    limit = workers * inflight_per_worker
    pool = ProcessPoolExecutor(workers, initializer=_guarded_init, initargs=(initializer, initargs))
    pending = collections.deque()  # (item, future), in input order
    try:
        for item in iterable:
            try:
                pending.append((item, pool.submit(_guarded_call, func, item)))
            except BrokenProcessPool:
                raise WorkerDied([i for i, _ in pending] + [item]) from None
            if len(pending) >= limit:
                yield _first_result(pending)
        while pending:
            yield _first_result(pending)
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def _first_result(pending) -> Any:
    _, future = pending[0]
    try:
        result = future.result()
    except BrokenProcessPool:
        raise WorkerDied([i for i, _ in pending]) from None
    pending.popleft()
    return result


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
