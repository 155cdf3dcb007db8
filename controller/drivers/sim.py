"""A simulated OCS: :class:`~controller.ocs.OcsDriver` under an injectable clock.

Switching follows the physical model of :mod:`controller.ocs`: a request is checked against the
one-to-one rule (:class:`~controller.ocs.CrossconnectState`, all-or-nothing across the rails of
a batch), the touched ports go dark at once, and the new circuits light after the rail's
switching time (Table 3 technology or a number of ms, plus optional seeded jitter). A port that
is dark because its old circuit is being removed may be re-targeted by a later request; it stays
dark until the later light. Dark time is accounted per port. :meth:`SimOcsDriver.begin` starts a
batch without waiting (for discrete-event simulation); :meth:`SimOcsDriver.apply_many` also
sleeps on the clock until the light is back, like a real driver. Thread-safe: the controller
service calls it from worker threads.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Iterable, Mapping, Sequence

from controller.clock import Clock, WallClock
from controller.drivers.faults import OcsFaults
from controller.ocs import (
    ApplyResult,
    Circuit,
    CrossconnectState,
    OcsDriver,
    PortState,
    RailDescription,
    Reconfiguration,
    light_at_s,
    resolve_switching_delay_ms,
)


class SimOcsDriver(OcsDriver):
    """Rails of simulated OCS ports with a switching-time model and per-port dark time."""

    def __init__(
        self,
        ports_by_rail: Mapping[int, Iterable[int]],
        switching_delay: float | str = 0.0,
        *,
        clock: Clock | None = None,
        jitter_ms: float = 0.0,
        seed: int = 0,
        mode: str = "ocs",
        delay_by_rail: Mapping[int, float | str] | None = None,
        faults: OcsFaults | None = None,
        mode_by_rail: Mapping[int, str] | None = None,
    ) -> None:
        self.clock: Clock = clock or WallClock()
        ports = {rail: tuple(sorted(set(ps))) for rail, ps in ports_by_rail.items()}
        base_ms = resolve_switching_delay_ms(switching_delay)
        per_rail = {r: resolve_switching_delay_ms(d) for r, d in (delay_by_rail or {}).items()}
        modes = mode_by_rail or {}
        self._rails = {
            rail: RailDescription(rail, ps, per_rail.get(rail, base_ms), modes.get(rail, mode))
            for rail, ps in ports.items()
        }
        if jitter_ms < 0:
            raise ValueError(f"jitter_ms must be >= 0, got {jitter_ms}")
        self.jitter_ms = jitter_ms
        self.faults = faults  # FAILED ports and refusals (controller.drivers.faults)
        self._rng = random.Random(seed)
        self._state = CrossconnectState(ports)
        self._dark_until: dict[tuple[int, int], float] = {}
        self._dark_s: dict[tuple[int, int], float] = {}
        self._lock = threading.Lock()

    # ---------------------------------------------------------------- views

    def describe(self) -> list[RailDescription]:
        return [self._rails[r] for r in sorted(self._rails)]

    def circuits(self, rail: int) -> frozenset[Circuit]:
        with self._lock:
            return self._state.circuits(rail)

    def lit_circuits(self, rail: int, t_s: float | None = None) -> frozenset[Circuit]:
        """Circuits carrying light at ``t_s`` (default: now): set up and neither port dark."""
        t = self.clock.now() if t_s is None else t_s
        with self._lock:
            return frozenset(
                c for c in self._state.circuits(rail)
                if all(self._dark_until.get((rail, p), float("-inf")) <= t for p in c.ports)
            )

    def lit_peer(self, rail: int, port: int, t_s: float | None = None) -> int | None:
        """The peer of ``port`` if their circuit carries light at ``t_s`` (default: now)."""
        t = self.clock.now() if t_s is None else t_s
        with self._lock:
            peer = self._state.peer(rail, port)
            dark = self._dark_until
            if peer is None or max(dark.get((rail, port), t), dark.get((rail, peer), t)) > t:
                return None
            return peer

    def port_states(self, rail: int) -> dict[int, PortState]:
        t = self.clock.now()
        with self._lock:
            dark = {p for p in self._rails[rail].ports
                    if self._dark_until.get((rail, p), float("-inf")) > t}
            return self._state.port_states(rail, dark=dark)

    def dark_s_by_port(self, rail: int) -> dict[int, float]:
        """Total dark time (s) each port of ``rail`` has accumulated."""
        with self._lock:
            return {p: self._dark_s.get((rail, p), 0.0) for p in self._rails[rail].ports}

    # ------------------------------------------------------------ switching

    def switching_delay_ms(self, rail: int) -> float:
        """One draw of the rail's switching time: the base plus uniform jitter in +-jitter_ms."""
        base = self._rails[rail].switching_delay_ms
        if self.jitter_ms:
            base += self._rng.uniform(-self.jitter_ms, self.jitter_ms)
        return max(0.0, base)

    def begin(self, reconfs: Sequence[Reconfiguration]) -> list[ApplyResult]:
        """Check and commit a batch now; return when each rail's light comes back (no wait)."""
        t_s = self.clock.now()
        if self.faults is not None:
            self.faults.check(reconfs)
        with self._lock:
            self._state.check_all(reconfs)
            results = []
            for r in reconfs:
                delay_ms = (self.switching_delay_ms(r.rail) if self._rails[r.rail].mode == "ocs"
                            else 0.0)
                self._state.apply(r)
                # dark from the request on (t_s); a port re-targeted while still dark lights no
                # earlier than its ongoing switch
                t_light = max([light_at_s(t_s, delay_ms)] + [
                    self._dark_until.get((r.rail, p), float("-inf")) for p in r.touched_ports])
                for p in r.touched_ports:
                    key = (r.rail, p)
                    until = self._dark_until.get(key, float("-inf"))
                    if t_light > until:  # a port re-targeted while dark: count the overlap once
                        self._dark_s[key] = self._dark_s.get(key, 0.0) + t_light - max(t_s, until)
                        self._dark_until[key] = t_light
                res = ApplyResult(r.rail, r.add, r.remove, t_s, t_s, t_light)
                results.append(res)
            return results

    def apply_many(self, reconfs: Sequence[Reconfiguration]) -> list[ApplyResult]:
        """Switch the rails together and wait (on the clock) until all are lit again."""
        results = self.begin(reconfs)
        if results:
            self.clock.sleep(max(r.t_light_s for r in results) - self.clock.now())
        return results
