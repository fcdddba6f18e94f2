"""gpu_check's time budget (``--budget-seconds``): the whole run ends inside it.

A lent GPU machine runs one command for a few minutes.  The budget starts when
gpu_check starts; every check runs under a hard deadline (``SIGALRM`` raises
:class:`OutOfTime` in the main thread wherever it is: an in-process update, the
wait for a ``fairseq-train`` child, which ``compare.interrupt.run_child`` then stops
with its whole process group), and the training runs share what is left: each run
measures its own update time during the batch search and takes as many updates as
its share allows (``updates_that_fit``).  A check that cannot start, or is stopped,
for lack of time is reported as *not run*, never as failed.

Without a budget (``seconds`` None) nothing is planned: every run takes its
configured updates and each check may take :data:`CHECK_LIMIT` seconds at most, so
that nothing hangs.
"""

import contextlib
import math
import signal
import threading
import time
from typing import Callable, Iterator, Optional

CHECK_LIMIT = 3600.0  # seconds one check may take without a budget (a stuck NCCL rendezvous, a hung child)
MIN_UPDATES = 3  # "losses falling" compares the first and last third


class OutOfTime(BaseException):
    """The budget ran out before or during a check (``str()`` says how).

    A ``BaseException``, as ``KeyboardInterrupt`` is, so that library code's
    ``except Exception`` does not swallow it; ``run_child`` stops its child on it."""


class Budget:
    """A deadline ``seconds`` after the start (None: no budget)."""

    def __init__(self, seconds: Optional[float], clock: Callable[[], float] = time.monotonic):
        self.seconds = seconds
        self.clock = clock
        self.start = clock()

    @property
    def limited(self) -> bool:
        return self.seconds is not None

    def elapsed(self) -> float:
        return self.clock() - self.start

    def left(self) -> float:
        """Seconds until the deadline (infinite without a budget; negative once past it)."""
        return math.inf if self.seconds is None else self.seconds - self.elapsed()

    def share(self, runs_left: int, reserve: float) -> float:
        """The seconds one of ``runs_left`` runs may take, ``reserve`` kept for the checks after them."""
        if self.seconds is None:
            return math.inf
        return max(0.0, self.left() - reserve) / max(1, runs_left)

    def out_of_time(self, what: str) -> OutOfTime:
        return OutOfTime(f"not run: the time budget (--budget-seconds {self.seconds or 0:g}) was spent before {what}")

    @contextlib.contextmanager
    def deadline(self, what: str) -> Iterator[None]:
        """Run the block until the deadline at most (:data:`CHECK_LIMIT` seconds without a budget):
        then :class:`OutOfTime` is raised inside it.  An alarm set before (an enclosing deadline, a
        test runner's timeout) that comes first is left in charge; one that comes later is re-armed,
        with its handler, when the block ends."""
        seconds = min(self.left(), CHECK_LIMIT)
        if seconds <= 0:
            raise self.out_of_time(what)
        outer = signal.getitimer(signal.ITIMER_REAL)[0]
        if threading.current_thread() is not threading.main_thread() or (outer and outer <= seconds):
            yield  # signals reach the main thread only; the earlier alarm stays
            return
        limit = f"--budget-seconds {self.seconds:g}" if self.seconds is not None else f"{CHECK_LIMIT:g} s per check"

        def expire(signum, frame):
            raise OutOfTime(f"stopped: the time budget ({limit}) ran out during {what}")

        began = time.monotonic()
        before = signal.signal(signal.SIGALRM, expire)
        signal.setitimer(signal.ITIMER_REAL, seconds)
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, before)
            if outer:
                signal.setitimer(signal.ITIMER_REAL, max(1e-3, outer - (time.monotonic() - began)))


def updates_that_fit(seconds: float, update: float, overhead: float, wanted: int, minimum: int = MIN_UPDATES) -> int:
    """How many updates of ``update`` seconds fit in ``seconds`` after ``overhead`` seconds (at most
    ``wanted``); 0 when not even ``minimum`` do."""
    if math.isinf(seconds):
        return wanted
    n = int((seconds - overhead) // max(update, 1e-9))
    return min(wanted, n) if n >= minimum else 0


PROFILER_SLOWDOWN = 2.0  # an update under torch.profiler with shapes recorded, against one without (CPU: 1.3-2x)


def profile_seconds(update: float, updates: int, warmup: int, summing: float) -> float:
    """What a kernel profile of ``updates`` updates (after ``warmup``) costs: the updates under the profiler,
    then ``summing`` seconds an update to read its events."""
    return (warmup + updates) * update * PROFILER_SLOWDOWN + updates * summing
