"""Clocks: the wall clock for services and a virtual clock for simulation and tests.

Everything time-dependent in the controller takes a clock object (``now()`` in seconds,
``sleep(duration_s)``) instead of calling :mod:`time`, so that the same code runs in real time
and under a virtual clock that advances only when told to.
"""

from __future__ import annotations

import threading
import time
from typing import Protocol


class Clock(Protocol):
    """Anything with ``now()`` (seconds) and ``sleep(duration_s)``."""

    def now(self) -> float: ...

    def sleep(self, duration_s: float) -> None: ...


class WallClock:
    """Real time: ``time.time()`` so that timestamps of different processes compare."""

    def now(self) -> float:
        return time.time()

    def sleep(self, duration_s: float) -> None:
        if duration_s > 0:
            time.sleep(duration_s)


class VirtualClock:
    """Time that moves only through :meth:`advance_to` / :meth:`sleep`; thread-safe reads."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._t_s = start_s
        self._lock = threading.Lock()

    def now(self) -> float:
        with self._lock:
            return self._t_s

    def advance_to(self, t_s: float) -> None:
        with self._lock:
            if t_s < self._t_s:
                raise ValueError(f"virtual time cannot go back from {self._t_s} to {t_s}")
            self._t_s = t_s

    def sleep(self, duration_s: float) -> None:
        """Advance the virtual time by ``duration_s`` (single-threaded simulations)."""
        if duration_s < 0:
            raise ValueError(f"cannot sleep a negative duration ({duration_s} s)")
        with self._lock:
            self._t_s += duration_s
