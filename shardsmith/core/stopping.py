"""A clean stop on SIGTERM: SLURM sends it ahead of SIGKILL at a time limit, on preemption and on `scancel`.

`stop_on_sigterm()` turns SIGTERM (and Ctrl-C's SIGINT) into a `Stopped` exception raised in the main
thread, so a job can commit what it has and end with STOPPED_EXIT_CODE; its rerun goes on from that commit.
Where a stop would tear something the commit must describe whole (a record half written, a commit half
made), the code runs inside `deferred()`: a signal arriving there is raised when the block ends.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

STOPPED_EXIT_CODE = 143  # 128 + SIGTERM, what a shell reports for a job ended by it


class Stopped(BaseException):
    """The job was asked to stop (SIGTERM or SIGINT). A BaseException, so `except Exception` lets it pass."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


_state = threading.local()


def _depth() -> int:
    return getattr(_state, "depth", 0)


def _handler(signum: int, frame: object) -> None:
    if _depth() > 0:
        _state.pending = signum
        return
    raise Stopped(signum)


@contextlib.contextmanager
def stop_on_sigterm() -> Iterator[None]:
    """Within the block, SIGTERM and SIGINT raise Stopped in the main thread (outside `deferred` blocks);
    the previous handlers come back after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {s: signal.signal(s, _handler) for s in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for s, h in previous.items():
            signal.signal(s, h)


@contextlib.contextmanager
def deferred() -> Iterator[None]:
    """A stop signalled within the block is raised when it ends (outermost block), never inside it."""
    _state.depth = _depth() + 1
    try:
        yield
    finally:
        _state.depth -= 1
        if _state.depth == 0 and getattr(_state, "pending", None) is not None:
            signum, _state.pending = _state.pending, None
            raise Stopped(signum)


def ignore_stops() -> None:
    """For a helper process its parent stops: SIGTERM and SIGINT are ignored, so it ends when told to."""
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
