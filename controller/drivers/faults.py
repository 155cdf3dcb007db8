"""OCS faults, injected under any driver: FAILED ports, refused reconfigurations, jittery switching.

:class:`OcsFaults` is the one rule, shared by the simulated driver (it checks requests in
:meth:`~controller.drivers.sim.SimOcsDriver.begin`) and by :class:`FaultInjectingDriver`, which
wraps any :class:`~controller.ocs.OcsDriver` (the emulated OCS, under the Polatis fronts too):

* a FAILED port carries no light: a request that *adds* a circuit on it is refused
  (:class:`~controller.ocs.ReconfigurationRejected` naming the rail and port); removing the
  circuit it had is allowed, so the controller can move its peer elsewhere;
* ``refuse(n)``: the next ``n`` requests are refused whatever they ask (a switch that says no);
* ``jitter_ms``: each request's switching delay is the rail's base plus uniform noise in
  ``[-jitter_ms, +jitter_ms]`` (never below zero), drawn from a seeded generator.

A refusal changes nothing on the switch, as every driver promises.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Sequence

from controller import ocs
from controller.ocs import OcsDriver, PortState, Reconfiguration, ReconfigurationRejected


class OcsFaults:
    """The faults an OCS shows now; thread-safe, settable while a run goes on."""

    def __init__(self, seed: int = 0) -> None:
        self.failed: set[tuple[int, int]] = set()
        self.jitter_ms = 0.0
        self.refused = 0  # requests refused so far (either reason)
        self._refuse_left = 0
        self._rng = random.Random(seed)
        self._lock = threading.Lock()

    def fail_port(self, rail: int, port: int) -> None:
        with self._lock:
            self.failed.add((rail, port))

    def refuse(self, count: int = 1) -> None:
        """Refuse the next ``count`` requests."""
        with self._lock:
            self._refuse_left += count

    def check(self, reconfs: Sequence[Reconfiguration]) -> None:
        """Raise :class:`ReconfigurationRejected` if the switch would refuse ``reconfs``."""
        with self._lock:
            for rc in reconfs:
                bad = sorted(p for c in rc.add for p in c.ports if (rc.rail, p) in self.failed)
                if bad:
                    self.refused += 1
                    raise ReconfigurationRejected(rc.rail, bad, f"port {bad[0]} is FAILED "
                                                  "(no light): no circuit can use it")
            if self._refuse_left and any(not rc.is_empty for rc in reconfs):
                self._refuse_left -= 1
                self.refused += 1
                rc = next(r for r in reconfs if not r.is_empty)
                raise ReconfigurationRejected(rc.rail, sorted(rc.touched_ports),
                                              "the switch refused the reconfiguration "
                                              "(injected fault)")

    def delay_ms(self, base_ms: float) -> float:
        """One draw of a switching delay around ``base_ms``."""
        with self._lock:
            if not self.jitter_ms:
                return base_ms
            return max(0.0, base_ms + self._rng.uniform(-self.jitter_ms, self.jitter_ms))


class FaultInjectingDriver(OcsDriver):
    """``inner`` with :class:`OcsFaults` applied; jitter needs ``inner`` to have
    ``set_switching_delay_ms(rail, ms)`` (the emulated OCS does)."""

    def __init__(self, inner: OcsDriver, faults: OcsFaults | None = None) -> None:
        self.inner = inner
        self.faults = faults or OcsFaults()
        self._base_ms = {d.rail: d.switching_delay_ms for d in inner.describe()}

    def describe(self) -> list[ocs.RailDescription]:
        return self.inner.describe()

    def circuits(self, rail: int) -> frozenset[ocs.Circuit]:
        return self.inner.circuits(rail)

    def port_states(self, rail: int) -> dict[int, PortState]:
        states = self.inner.port_states(rail)
        for r, p in self.faults.failed:
            if r == rail and p in states:
                states[p] = PortState.FAILED
        return states

    def set_switching_delay_ms(self, rail: int, delay_ms: float) -> None:
        self._base_ms[rail] = delay_ms
        setter = getattr(self.inner, "set_switching_delay_ms", None)
        if setter is not None:
            setter(rail, delay_ms)

    def apply_many(self, reconfs: Sequence[Reconfiguration]) -> list[ocs.ApplyResult]:
        self.faults.check(reconfs)
        setter = getattr(self.inner, "set_switching_delay_ms", None)
        if self.faults.jitter_ms and setter is not None:
            for rc in reconfs:
                if not rc.is_empty:
                    setter(rc.rail, self.faults.delay_ms(self._base_ms.get(rc.rail, 0.0)))
        return self.inner.apply_many(reconfs)

    def close(self) -> None:
        self.inner.close()
