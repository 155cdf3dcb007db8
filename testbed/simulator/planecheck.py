"""Run-time invariants of the rival control planes on the sim backend
(:mod:`testbed.simulator.planes`); a broken one raises
:class:`~testbed.simulator.invariants.InvariantViolation` naming the time, switch and transfer.

* **one-to-one on every switch**: every configuration a plane installs (the static topology
  once; each distinct rotor configuration) is checked through
  :class:`~controller.ocs.CrossconnectState`, the one implementation of the rule, on the
  physical ports of the job (each rail switch holds its K port indices' matchings at once);
* **the rotor follows its cycle**: each installed slot comes after the previous one, and each
  switch's matching is the one its previous matching steps to (``+ D`` per slot, modulo the
  cycle), a recurrence kept here apart from the schedule's closed form;
* **relays use lit circuits**: every hop of every piece of a transfer is a circuit of the
  configuration in force, and (rotor) only while it is lit;
* **no byte lost**: the pieces of a transfer (it pauses at every rotor slot boundary and may
  resume on another path) add up to its bytes, and at the end the bytes delivered to the
  receivers equal the bytes the senders scheduled.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from controller.job import JobSpec
from controller.ocs import Circuit, CrossconnectState, Reconfiguration, ReconfigurationRejected
from controller.planes import Matching, Switch
from controller.planes.rotor import RotorSchedule
from testbed.simulator.invariants import InvariantViolation

#: A transfer's pieces may round: their bits must add up to its bytes within this share, plus
#: what its rate carries in :data:`TIME_TOLERANCE_S` (the float resolution of a time ~ 100 s).
BITS_TOLERANCE = 1e-6
TIME_TOLERANCE_S = 1e-12


class PlaneInvariants:
    """The checks of one run under a rival plane (see the module docstring)."""

    def __init__(self, job: JobSpec, gpus_per_server: int) -> None:
        self.job = job
        self.gpus = gpus_per_server
        self.scheduled_bytes = 0
        self.delivered_bytes = 0
        self._last_slot: int | None = None
        self._last_index: list[int] = []

    def port(self, server: int, sw: Switch) -> int:
        """The physical port of ``server``'s GPU on switch ``sw`` = (rail, k)."""
        rail, k = sw
        return self.job.ranks[server * self.gpus + rail].ports[k]

    def configuration(self, config: Mapping[Switch, Matching], what: str) -> None:
        """``config`` keeps every port of every rail in at most one circuit."""
        by_rail: dict[int, set[Circuit]] = {}
        try:
            for sw, m in config.items():
                for s, t in m.items():
                    if s < t:
                        by_rail.setdefault(sw[0], set()).add(
                            Circuit(sw[0], self.port(s, sw), self.port(t, sw)))
            state = CrossconnectState(self.job.ports_by_rail)
            for rail, circuits in by_rail.items():
                state.check(Reconfiguration.of(rail, add=circuits))
        except (ReconfigurationRejected, ValueError, KeyError) as exc:
            raise InvariantViolation(f"{what} breaks the one-to-one rule: {exc}") from exc

    def slot(self, rotor: RotorSchedule, slot: int, config: Mapping[Switch, Matching],
             now: float) -> None:
        """The rotor installs ``config`` for ``slot`` now: later than the last, on its cycle."""
        n = len(rotor.cycle)
        d = len(rotor.switch_list)
        if self._last_slot is not None and slot <= self._last_slot:
            raise InvariantViolation(f"t={now:.6f} s: rotor slot {slot} installed after slot "
                                     f"{self._last_slot}")
        if self._last_slot is None:
            expected = [j % n for j in range(d)] if slot == 0 else [
                (j + d * slot) % n for j in range(d)]
        else:
            step = d * (slot - self._last_slot)
            expected = [(i + step) % n for i in self._last_index]
        for j, sw in enumerate(rotor.switch_list):
            if config[sw] is not rotor.cycle[expected[j]] and config[sw] != rotor.cycle[
                    expected[j]]:
                raise InvariantViolation(
                    f"t={now:.6f} s: rotor switch {sw} holds a matching other than its cycle's "
                    f"#{expected[j]} in slot {slot}")
        self._last_slot, self._last_index = slot, expected

    def hops(self, config: Mapping[Switch, Matching], path: Sequence[tuple[Switch, int, int]],
             lit: bool, now: float, a: int, b: int) -> None:
        """Every hop of a piece of ``a`` -> ``b`` is a lit circuit of ``config``."""
        if not lit:
            raise InvariantViolation(f"t={now:.6f} s: transfer {a}->{b} placed while the rotor "
                                     "is dark")
        for sw, u, v in path:
            if config[sw].get(u) != v:
                raise InvariantViolation(f"t={now:.6f} s: transfer {a}->{b} hops from server {u} "
                                         f"to {v} on switch {sw}, which joins {u} to "
                                         f"{config[sw].get(u)}")

    def transfer_done(self, a: int, b: int, n_bytes: int, sent_bits: float, rate_bps: float,
                      now: float) -> None:
        """A transfer's last piece left (at ``rate_bps``): its pieces carried its bytes."""
        if abs(sent_bits - 8 * n_bytes) > (BITS_TOLERANCE * 8 * n_bytes
                                           + rate_bps * TIME_TOLERANCE_S):
            raise InvariantViolation(f"t={now:.6f} s: transfer {a}->{b} of {n_bytes} bytes "
                                     f"carried {sent_bits / 8:.1f} bytes over its pieces")

    def finish(self) -> None:
        """The run ended: every byte scheduled was delivered."""
        if self.delivered_bytes != self.scheduled_bytes:
            raise InvariantViolation(f"{self.scheduled_bytes} bytes scheduled but "
                                     f"{self.delivered_bytes} delivered")
