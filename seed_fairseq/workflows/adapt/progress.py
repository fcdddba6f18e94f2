"""Progress lines of a running fairseq-train, read from its log.

fairseq-train writes into ``pretrain/train.log`` (the driver keeps its terminal for its
own lines).  A thread reads the log every few seconds and prints, in the driver's
voice, one line per validation (the metric the best checkpoint is chosen by, and its
change since the starting model: the task's ``<metric>_vs_start``) and, every ``every``
seconds, the update, the loss, the rate and the time left.  It only reads: what it
prints cannot change the run.
"""

import threading
import time
from pathlib import Path
from typing import Callable, Dict, List, Optional

from ..kit.logs import read_train_inner, read_valid

POLL_SECONDS = 2.0


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds >= 3600:
        return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"
    return f"{seconds // 60}m{seconds % 60:02d}s"


def _rows(read: Callable[[Path], List[Dict[str, float]]], path: Path) -> List[Dict[str, float]]:
    try:
        return read(path)
    except OSError:  # not written yet
        return []


class TrainProgress:
    """``with TrainProgress(log, updates, metric, say):`` around a fairseq-train run."""

    def __init__(self, log_file: Path, updates: int, metric: str, say: Callable[[str], None], every: float = 30.0):
        self.log_file, self.updates, self.metric, self.say, self.every = Path(log_file), updates, metric, say, every
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._validated = {int(r.get("num_updates", -1)) for r in _rows(read_valid, self.log_file)}
        self._first: Optional[tuple] = None  # (time, update) first seen by this process: the rate
        self._last_print, self._last_update = 0.0, -1

    def __enter__(self) -> "TrainProgress":
        self._thread = threading.Thread(target=self._loop, name="adapt-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if exc[0] is None:
            self.poll(final=True)

    def _loop(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            self.poll()

    def poll(self, final: bool = False) -> None:
        """Print what is new in the log."""
        for row in _rows(read_valid, self.log_file):
            update = int(row.get("num_updates", -1))
            if update in self._validated:
                continue
            self._validated.add(update)
            value, change = row.get(self.metric), row.get(f"{self.metric}_vs_start")
            shown = "-" if value is None else f"{value:.4f}"
            versus = f" ({change:+.4f} vs the starting model)" if change is not None else ""
            self.say(f"validation at update {update}: {self.metric} {shown}{versus}")
        inner = _rows(read_train_inner, self.log_file)
        if not inner:
            return
        now, last = time.monotonic(), inner[-1]
        update = int(last.get("num_updates", 0))
        if self._first is None:
            self._first = (now, update)
        if final or update <= self._last_update or now - self._last_print < self.every:
            return
        self._last_print, self._last_update = now, update
        t0, u0 = self._first
        rate = (update - u0) / (now - t0) if now > t0 and update > u0 else None
        eta = f", about {_duration((self.updates - update) / rate)} left" if rate else ""
        speed = f", {1 / rate:.2f} s/update" if rate else ""
        self.say(f"update {update}/{self.updates}: loss {last.get('loss', float('nan')):.3f}{speed}{eta}")
