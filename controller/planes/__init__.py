"""Rival control planes on the same photonic rails (issue 40): pure decisions, no clock.

* ``opus``: the Opus controller (:mod:`controller.core`), reconfiguring per collective phase.
* ``static``: one topology per job, chosen from its traffic before it starts and never changed
  (TopoOpt, Wang et al., NSDI'23): :mod:`controller.planes.static`.
* ``rotor``: a demand-oblivious cycle of matchings, one per slot, whatever the traffic
  (RotorNet, Mellette et al., SIGCOMM'17; Sirius, SIGCOMM'20): :mod:`controller.planes.rotor`.

Both rivals forward traffic through intermediate GPUs where no direct circuit joins the two
ends (:mod:`controller.planes.relay`).

The model they share: a **switch** is one (rail, port index k) pair; it holds a matching of the
*servers* (the GPU of local index ``rail`` in server ``s`` has port ``k`` on it). A GPU reaches
the other rails' switches of its server through the scale-up domain (NVLink), whose hops are
taken as free: a server has ``rails x K`` circuits, as a TopoOpt server has its NICs' degree.
The sim's data path for them is :mod:`testbed.simulator.planes`.
"""

from __future__ import annotations

OPUS, STATIC, ROTOR = "opus", "static", "rotor"
PLANES = (OPUS, STATIC, ROTOR)

#: A switch: (rail, port index k).
Switch = tuple[int, int]
#: A matching of servers on one switch: server -> server (symmetric, no fixed point).
Matching = dict[int, int]


def check_plane(name: str) -> str:
    """``name`` if it is a plane, else ValueError listing them."""
    if name not in PLANES:
        raise ValueError(f"unknown control plane {name!r}; choose from {', '.join(PLANES)}")
    return name


def switches(rails: int, ports_per_rank: int) -> list[Switch]:
    """Every switch of a cluster, in (port index, rail) order: the K-th port of every rail comes
    after the (K-1)-th of all rails, so that a greedy choice spreads over rails first."""
    return [(rail, k) for k in range(ports_per_rank) for rail in range(rails)]


def check_matching(m: Matching, servers: int, where: str) -> None:
    """ValueError naming ``where`` unless ``m`` pairs servers one-to-one (each at most once)."""
    for s, t in m.items():
        if not (0 <= s < servers and 0 <= t < servers) or s == t or m.get(t) != s:
            raise ValueError(f"{where}: {s}->{t} is not a symmetric pair of distinct servers "
                             f"among {servers}")
