"""The rotor plane's clock: a fixed cycle of server matchings, one per slot, whatever the traffic
(RotorNet, Mellette et al., SIGCOMM'17; Sirius, Ballani et al., SIGCOMM'20).

* **The matchings**: the round-robin (circle-method) decomposition of the complete graph of the
  servers, :func:`round_robin`: ``n - 1`` perfect matchings for an even ``n`` (``n`` for an odd
  one, each leaving one server idle); every pair of servers meets in exactly one of them.
* **The switches share the cycle**, as RotorNet's rotor switches each hold a subset of it: in slot
  ``i`` switch number ``j`` (of ``D = rails x K``, in :func:`~controller.planes.switches` order)
  holds matching ``(j + D * i) mod L`` of the ``L`` matchings. With ``D <= L`` the ``D`` switches
  hold distinct matchings in every slot, and the whole cycle passes every ``L / gcd(L, D)``
  slots.
* **Slots**: slot ``i`` is ``[i * slot_s, (i + 1) * slot_s)``; every switch reconfigures at its
  start (all at once, as RotorNet's synchronised rotors), dark for the switching delay, then lit
  for ``slot_s - delay_s``. The default slot is ``max(10 x delay, 0.1 ms)``
  (:func:`default_slot_s`): a 90 % duty cycle as in RotorNet, with a floor that keeps a slot long
  against the per-hop latency and the simulation's event count (a 10 ns PLZT switch would
  otherwise need 10^8 slots per simulated second).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from controller.planes import Matching, Switch, check_matching

DUTY_FACTOR = 10.0  # default slot = 10 x the switching delay ...
MIN_SLOT_S = 1e-4  # ... and at least 0.1 ms


def default_slot_s(delay_s: float) -> float:
    """The rotor's slot for a switching delay of ``delay_s`` (see the module docstring)."""
    return max(DUTY_FACTOR * delay_s, MIN_SLOT_S)


def round_robin(servers: int) -> list[Matching]:
    """The circle-method matchings of ``servers`` (>= 2): each pair meets exactly once."""
    if servers < 2:
        raise ValueError(f"a rotor needs at least 2 servers, got {servers}")
    n = servers + servers % 2  # an odd count gets a dummy server: its partner idles
    out = []
    for i in range(n - 1):
        m: Matching = {}
        pairs = [(n - 1, i)] + [((i + d) % (n - 1), (i - d) % (n - 1)) for d in range(1, n // 2)]
        for a, b in pairs:
            if a < servers and b < servers:
                m[a], m[b] = b, a
        check_matching(m, servers, f"round-robin matching {i}")
        out.append(m)
    return out


@dataclass(frozen=True)
class RotorSchedule:
    """Which matching each switch holds in each slot, and when slots start and light."""

    servers: int
    switch_list: tuple[Switch, ...]
    slot_s: float
    delay_s: float
    cycle: tuple[Matching, ...]

    def __post_init__(self) -> None:
        if not self.switch_list:
            raise ValueError("a rotor needs at least one switch")
        if not 0 <= self.delay_s < self.slot_s:
            raise ValueError(f"rotor slot {self.slot_s * 1e3:g} ms must be longer than the "
                             f"switching delay {self.delay_s * 1e3:g} ms")

    @classmethod
    def build(cls, servers: int, switch_list: list[Switch], delay_s: float,
              slot_s: float | None = None) -> RotorSchedule:
        return cls(servers, tuple(switch_list),
                   default_slot_s(delay_s) if slot_s is None else slot_s, delay_s,
                   tuple(round_robin(servers)))

    @property
    def period_slots(self) -> int:
        """Slots after which every switch holds its first matching again."""
        n = len(self.cycle)
        return n // math.gcd(n, len(self.switch_list))

    def matching_index(self, switch_no: int, slot: int) -> int:
        """Index into :attr:`cycle` of switch number ``switch_no``'s matching in ``slot``."""
        return (switch_no + len(self.switch_list) * slot) % len(self.cycle)

    def config(self, slot: int) -> dict[Switch, Matching]:
        """Every switch's matching in ``slot``."""
        return {sw: self.cycle[self.matching_index(j, slot)]
                for j, sw in enumerate(self.switch_list)}

    def slot_at(self, t_s: float) -> int:
        """The slot ``t_s`` falls in."""
        return math.floor(t_s / self.slot_s + 1e-9)

    def start_s(self, slot: int) -> float:
        return slot * self.slot_s

    def light_s(self, slot: int) -> float:
        """When ``slot``'s circuits light."""
        return slot * self.slot_s + self.delay_s
