"""A clean exit (fix 6).

fairseq prefetches batches in a daemon thread (``iterators.BackgroundConsumer``,
``--data-buffer-size``).  When training stops (``--max-update``) that thread is
often still building the next batch inside torch's C++ code with the GIL
released; at interpreter shutdown Python ends such a thread with
``pthread_exit``, whose forced unwinding through a ``noexcept`` C++ frame calls
``std::terminate``: the process aborts with "terminate called without an active
exception" AFTER training finished and the checkpoint was written (exit code
134; 3 of 20 single-process runs on a loaded 2-core machine, and the "flaky"
2-worker torchrun test).

- ``fairseq.data.iterators.BackgroundConsumer.run``: the consumer checks a stop
  flag before each batch, and an ``atexit`` handler (registered with the patch)
  sets it, drains the queue and joins the thread before shutdown begins;
- ``fairseq.distributed.utils.distributed_main``: the process group is
  destroyed when ``distributed_main`` returns, instead of during shutdown.

``benchmarks/launch_stress.py`` counts failures of repeated launches.
"""

import atexit
import queue
import threading
import time
import weakref

import torch

from ._common import logger, mark


def _distributed_main_with_teardown(i, main, cfg, kwargs):
    try:
        return _original_distributed_main(i, main, cfg, kwargs)
    finally:
        # local cleanup only (no barrier: a worker that failed must not wait for the others)
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            try:
                torch.distributed.destroy_process_group()
            except Exception as e:  # teardown must never hide the real outcome
                logger.warning(f"destroying the process group failed: {e!r}")


_original_distributed_main = None


def install_teardown() -> None:
    global _original_distributed_main
    from fairseq.distributed import utils as distributed_utils

    if distributed_utils.distributed_main is not _distributed_main_with_teardown:
        _original_distributed_main = distributed_utils.distributed_main
        distributed_utils.distributed_main = _distributed_main_with_teardown


_stop_consumers = threading.Event()
_live_consumers = weakref.WeakSet()


def _stoppable_consumer_run(self):
    """fairseq's ``BackgroundConsumer.run`` with a stop flag checked before each batch."""
    from fairseq.data import iterators

    _live_consumers.add(self)
    if self.cuda_device is not None:
        torch.cuda.set_device(self.cuda_device)
    try:
        source = iter(self._source)
        while not _stop_consumers.is_set():
            try:
                item = next(source)
            except StopIteration:
                break
            self._queue.put(item)
            self.count += 1
            if self._max_len is not None and self.count >= self._max_len:
                break
        self._queue.put(iterators._sentinel)
    except Exception as e:
        self._queue.put(e)


def _join_consumers(timeout: float = 120.0):
    """At exit: stop the prefetching threads while the interpreter can still run them."""
    _stop_consumers.set()
    deadline = time.time() + timeout
    for consumer in list(_live_consumers):
        while consumer.is_alive() and time.time() < deadline:
            try:  # unblock a put() on a full queue
                while True:
                    consumer._queue.get_nowait()
            except queue.Empty:
                pass
            consumer.join(0.05)


def install_stoppable_consumers() -> None:
    from fairseq.data import iterators

    if iterators.BackgroundConsumer.run is not _stoppable_consumer_run:
        iterators.BackgroundConsumer.run = _stoppable_consumer_run
        atexit.register(_join_consumers)


mark(_distributed_main_with_teardown, __name__)
mark(_stoppable_consumer_run, __name__)
