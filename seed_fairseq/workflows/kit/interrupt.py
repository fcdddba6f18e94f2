"""Stopping a workflow's driver stops everything it started.

SIGINT, SIGTERM and SIGHUP raise :class:`Interrupted` in the driver's main
thread (``handle_interrupts``) wherever it is: an in-process stage (data,
export, evaluation) stops there, and ``run_child`` stops the tool it is
running, with the tool's whole process group (fairseq-train may start workers),
and waits for them before the exception goes on.  The driver then exits with
128 + the signal number, as a shell reports a process the signal killed.
Finished stages stay, fairseq-train resumes from its last checkpoint, so the
same command resumes.

SIGKILL cannot be caught.  On Linux every child first asks the kernel for
SIGTERM when the driver dies (``prctl(PR_SET_PDEATHSIG)``, kept across the
``exec`` into the tool; it fires when the thread that forked the child ends, and
``run_child`` waits for its child in that very thread), so a trainer never
outlives its driver and the advised rerun never finds a second fairseq-train
writing into its save-dir.
"""

import contextlib
import os
import signal
import subprocess
import sys
import time
from typing import IO, Dict, Iterator, List, Optional

SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
GRACE_SECONDS = 10.0  # from SIGTERM to SIGKILL for a child that does not stop
# The child's first act, in a bare interpreter that then becomes the tool (exec keeps the
# request): SIGTERM when its parent, argv[1], dies; gone at once if it already has.  Not
# subprocess's preexec_fn, which runs Python in the forked copy of the driver and can
# deadlock there on a lock one of the driver's other threads (torch's) held at the fork.
# ctypes because the standard library has no prctl; 1 is PR_SET_PDEATHSIG (<linux/prctl.h>).
DIE_WITH_PARENT = """\
import ctypes, os, signal, sys
ctypes.CDLL(None).prctl(1, signal.SIGTERM, 0, 0, 0)
if os.getppid() != int(sys.argv[1]):
    sys.exit(128 + signal.SIGTERM)
os.execvp(sys.argv[2], sys.argv[2:])
"""


class Interrupted(KeyboardInterrupt):
    """The driver got ``signum``.  A KeyboardInterrupt, so that ``except Exception`` in
    library code does not swallow it and context managers (multiprocessing pools) clean up."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class _State:
    owner: Optional[int] = None  # the pid that installed the handlers (forked workers inherit them)
    signum: Optional[int] = None  # the first signal received
    raised = False
    deferred = 0


_state = _State()


def _raise_pending() -> None:
    if _state.signum is not None and not _state.raised and not _state.deferred:
        _state.raised = True  # once: a second signal must not break off the stopping of the children
        raise Interrupted(_state.signum)


def _handler(signum: int, frame) -> None:
    if os.getpid() != _state.owner:  # a forked worker: die as the signal's default would
        signal.signal(signum, signal.SIG_DFL)
        os.kill(os.getpid(), signum)
        return
    if _state.signum is None:
        _state.signum = signum
    _raise_pending()


@contextlib.contextmanager
def handle_interrupts() -> Iterator[None]:
    """SIGINT/SIGTERM/SIGHUP raise :class:`Interrupted` inside this block.  A signal the
    driver was started with ignored (``nohup``, a background job) stays ignored."""
    _state.owner, _state.signum, _state.raised, _state.deferred = os.getpid(), None, False, 0
    previous: Dict[int, object] = {}
    for s in SIGNALS:
        if signal.getsignal(s) is not signal.SIG_IGN:
            previous[s] = signal.signal(s, _handler)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        _state.owner = None


@contextlib.contextmanager
def _deferred() -> Iterator[None]:
    """An interrupt inside this block is raised at its end (after a child was created and named)."""
    _state.deferred += 1
    try:
        yield
    finally:
        _state.deferred -= 1
    _raise_pending()


def dying_with_parent(cmd: List[str]) -> List[str]:
    """``cmd`` run so that it gets SIGTERM when this process dies (Linux; elsewhere ``cmd`` itself)."""
    if not sys.platform.startswith("linux"):
        return list(cmd)
    return [sys.executable, "-I", "-S", "-c", DIE_WITH_PARENT, str(os.getpid()), *cmd]


def _signal_group(pgid: int, signum: int) -> bool:
    """Send ``signum`` to the process group; False when no process of it is left."""
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        return False
    return True


def stop(proc: subprocess.Popen, grace: float = GRACE_SECONDS) -> None:
    """Stop ``proc`` and its process group: SIGTERM, SIGKILL after ``grace`` seconds; returns when they are gone."""
    _signal_group(proc.pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if proc.poll() is not None and not _signal_group(proc.pid, 0):
            return
        time.sleep(0.05)
    _signal_group(proc.pid, signal.SIGKILL)
    proc.wait()


def run_child(cmd: List[str], stdout: IO, env: Dict[str, str]) -> int:
    """Run ``cmd`` to its end in a process group of its own; its exit code.

    Interrupted, it stops the child (``stop``) before the interrupt goes on.  The
    child reads nothing (stdin is /dev/null): in its own process group it is not
    the terminal's foreground job, and the driver forwards the terminal's Ctrl-C.
    """
    proc = None
    try:
        with _deferred():
            proc = subprocess.Popen(
                dying_with_parent(cmd),
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=subprocess.STDOUT,
                env=env,
                start_new_session=True,  # its own process group (setsid; process_group= needs 3.11)
            )
        return proc.wait()
    except BaseException:
        if proc is not None:
            stop(proc)
        raise
