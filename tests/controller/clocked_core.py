"""An Opus core on a virtual clock, for the rail-state tests: each decision lights ``delay_s``
after it is made (every rail switched as asked), every output's events are kept, and each ack
goes to :meth:`ClockedCore.record_ack`, which a test's harness overrides to keep what it
needs."""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable
from typing import Any

from controller.core import Ack, OpusCore, Output
from controller.ocs import ApplyResult


class ClockedCore:
    """``core`` driven on a virtual clock ``now`` (seconds)."""

    def __init__(self, core: OpusCore, delay_s: float) -> None:
        self.core, self.delay_s = core, delay_s
        self.now = 0.0
        self.heap: list[tuple[float, int, Callable[[], Output]]] = []
        self.tick = itertools.count()
        self.events: list[dict[str, Any]] = []

    def record_ack(self, ack: Ack) -> None:
        """Called for every ack, at ``now``."""

    def take(self, out: Output) -> None:
        """Keep ``out``'s events and acks; its decisions light ``delay_s`` from now."""
        assert not out.rejects, out.rejects
        self.events += out.events
        for ack in out.acks:
            self.record_ack(ack)
        for dec in out.decisions:
            def done(dec: Any = dec) -> Output:
                res = [ApplyResult(rc.rail, rc.add, rc.remove, self.now, self.now, self.now)
                       for rc in dec.reconfs]
                return self.core.reconfig_done(dec.decision_id, res, self.now)
            heapq.heappush(self.heap, (self.now + self.delay_s, next(self.tick), done))

    def run_until(self, t_s: float = float("inf")) -> None:
        """Light every decision due by ``t_s`` (all, by default), then set the clock there."""
        while self.heap and self.heap[0][0] <= t_s:
            t, _, fn = heapq.heappop(self.heap)
            self.now = t
            self.take(fn())
        if t_s != float("inf"):
            self.now = t_s
