"""The static plane's topology: circuits chosen once per job from its traffic (TopoOpt-style).

Input: the job's bytes per iteration between servers (``demand``: an unordered server pair ->
bytes, summed over every rail and both directions) and the switches (:func:`switches`: K per
rail). Output: one matching of the servers per switch, fixed for the whole run.

The algorithm (greedy, heaviest first, reach before weight), one switch at a time, in the order
of :func:`~controller.planes.switches` (every rail's first port, then every rail's second):

1. Rank the server pairs with demand by two keys: first the pairs whose ends are not yet joined
   by any path of circuits chosen so far (so that every pair that talks can reach the other,
   through relays if need be), then by ``bytes / (1 + circuits the pair already has)`` (so that
   a heavy pair gets a second circuit before a light pair gets its first, and parallel circuits
   share a heavy pair's bytes).
2. Walk the ranking and give the switch each pair whose two servers both still have this
   switch's port free (a greedy maximal matching).

Ports no pair claims stay dark. On a ring collective this yields the ring's two alternating
matchings for its heaviest groups first, as TopoOpt's ring permutations do for its AllReduce
traffic; the lighter groups (pipeline Send/Recv) get the switches left once every pair is
reachable. Traffic between servers without a circuit is relayed along the circuits
(:mod:`controller.planes.relay`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from controller.planes import Matching, Switch, check_matching

Pair = tuple[int, int]  # (s, t) with s < t


def _find(parent: list[int], x: int) -> int:
    while parent[x] != x:
        parent[x] = parent[parent[x]]
        x = parent[x]
    return x


def static_topology(demand: Mapping[Pair, float], servers: int, switch_list: Sequence[Switch]
                    ) -> dict[Switch, Matching]:
    """One matching per switch (see the module docstring); pairs with no demand get none."""
    for (s, t), n in demand.items():
        if not (0 <= s < t < servers) or n < 0:
            raise ValueError(f"demand pair {(s, t)} of {n} bytes: need 0 <= s < t < {servers} "
                             "and bytes >= 0")
    wanted = {p: float(n) for p, n in demand.items() if n > 0}
    parent = list(range(servers))
    count: dict[Pair, int] = dict.fromkeys(wanted, 0)
    out: dict[Switch, Matching] = {}
    for sw in switch_list:
        ranked = sorted(wanted, key=lambda p: (_find(parent, p[0]) == _find(parent, p[1]),
                                                -wanted[p] / (1 + count[p]), p))
        m: Matching = {}
        for s, t in ranked:
            if s not in m and t not in m:
                m[s], m[t] = t, s
        for s, t in m.items():
            if s < t:
                count[(s, t)] += 1
                parent[_find(parent, s)] = _find(parent, t)
        check_matching(m, servers, f"static switch {sw}")
        out[sw] = m
    return out


def unreachable(demand: Mapping[Pair, float], topology: Mapping[Switch, Matching],
                servers: int) -> list[Pair]:
    """Pairs with demand that no path of ``topology``'s circuits joins (none, for a topology of
    :func:`static_topology` with enough switches)."""
    parent = list(range(servers))
    for m in topology.values():
        for s, t in m.items():
            parent[_find(parent, s)] = _find(parent, t)
    return sorted(p for p, n in demand.items() if n > 0
                  and _find(parent, p[0]) != _find(parent, p[1]))
