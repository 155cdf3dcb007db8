"""Relay paths through intermediate GPUs, for the planes whose circuits do not follow the
traffic (:mod:`controller.planes.static`, :mod:`controller.planes.rotor`).

A path is a list of hops ``(switch, u, v)``: server ``u``'s port on ``switch`` has a circuit to
server ``v``'s. Between hops the bytes cross a relay server's scale-up domain (free) and leave on
the next hop's switch, as a GPU forwarding for another (TopoOpt's host-based forwarding; one
RotorLB hop for the rotor). :func:`route` picks a shortest path, hop by hop the least-loaded
circuit that stays on a shortest path: a direct circuit when there is one, else the fewest relays
(at most ``max_hops - 1``); the sim's static plane under ``controller.relay_paths: dynamic``
calls it per transfer with the flows in flight as the load. :func:`path_table` fixes one such
path per rank pair (or comm group and rank pair) for a plane whose circuits never change
(static, ``relay_paths: fixed``), balancing the pairs' bytes over the hops, so that both
backends take the same one; :func:`stations` lists the ranks a transfer crosses on it.
:func:`rotor_route` is the rotor's choice within a slot, after RotorLB: the direct circuit by
default, one relay hop when it has spare capacity.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping

from controller.planes import Matching, Switch

Hop = tuple[Switch, int, int]  # (switch, from server, to server)
Adjacency = dict[int, list[tuple[Switch, int]]]  # server -> (switch, neighbour) of its circuits


def adjacency(config: Mapping[Switch, Matching]) -> Adjacency:
    """Each server's circuits in ``config``, in switch order."""
    adj: Adjacency = {}
    for sw, m in config.items():
        for s, t in m.items():
            adj.setdefault(s, []).append((sw, t))
    return adj


def distances_to(adj: Adjacency, t: int) -> dict[int, int]:
    """Hops from every server that can reach ``t`` (circuits are bidirectional)."""
    dist = {t: 0}
    todo = deque([t])
    while todo:
        u = todo.popleft()
        for _sw, v in adj.get(u, ()):
            if v not in dist:
                dist[v] = dist[u] + 1
                todo.append(v)
    return dist


def route(adj: Adjacency, s: int, t: int, load: Callable[[Switch, int, int], float],
          max_hops: int | None = None, dist: Mapping[int, int] | None = None
          ) -> list[Hop] | None:
    """A shortest path of circuits from server ``s`` to ``t`` (``s != t``), or None if none has
    at most ``max_hops`` hops. ``load(switch, u, v)``: the flows already on that hop's ports; the
    least-loaded hop on a shortest path wins (then the first in switch order). ``dist``:
    :func:`distances_to` ``t``, if the caller keeps it."""
    if s == t:
        raise ValueError(f"no route from server {s} to itself: traffic inside a server is on the "
                         "scale-up domain")
    dist = dist if dist is not None else distances_to(adj, t)
    d = dist.get(s)
    if d is None or (max_hops is not None and d > max_hops):
        return None
    path: list[Hop] = []
    u = s
    while u != t:
        best: tuple[float, int, Switch, int] | None = None
        for i, (sw, v) in enumerate(adj[u]):
            if dist.get(v) == dist[u] - 1:
                key = (load(sw, u, v), i, sw, v)
                if best is None or key[:2] < best[:2]:
                    best = key
        assert best is not None  # dist[u] > 0 has a neighbour one hop nearer
        path.append((best[2], u, best[3]))
        u = best[3]
    return path


def rotor_route(adj: Adjacency, s: int, t: int, load: Callable[[Switch, int, int], int]
                ) -> list[Hop] | None:
    """The rotor's path from ``s`` to ``t`` in the current slot, after RotorLB (Mellette et al.,
    SIGCOMM'17: one hop by default, two when there is spare capacity): among the direct circuits
    and the one-relay paths, the one whose busiest hop carries the fewest flows; a tie goes to
    the direct circuit, then to the first in switch order. None if neither exists."""
    if s == t:
        raise ValueError(f"no route from server {s} to itself: traffic inside a server is on the "
                         "scale-up domain")
    best: tuple[int, int, int] | None = None  # (busiest hop's load, hops, order)
    path: list[Hop] | None = None
    order = 0
    for sw1, m in adj.get(s, ()):
        l1 = load(sw1, s, m)
        if m == t:
            key = (l1, 1, order)
            if best is None or key < best:
                best, path = key, [(sw1, s, t)]
            order += 1
            continue
        for sw2, v in adj.get(m, ()):
            if v == t:
                key = (max(l1, load(sw2, m, t)), 2, order)
                if best is None or key < best:
                    best, path = key, [(sw1, s, m), (sw2, m, t)]
                order += 1
    return path


Pair = tuple[int, int]  # (sending rank, receiving rank)
#: a transfer's key in a path table: its rank pair, or (group, sending rank, receiving rank)
TransferKey = tuple[int, int] | tuple[str, int, int]


def path_table(config: Mapping[Switch, Matching], demand: Mapping[TransferKey, float],
               gpus_per_server: int) -> dict[TransferKey, list[Hop]]:
    """One fixed path per transfer key (a rank pair ``(a, b)``, or a comm group's pair
    ``(group, a, b)``) between different servers, for a plane whose circuits never change (the
    static one), computed once from the topology: the same on the sim and on the emulator,
    whose rank processes forward along it.

    The keys are placed heaviest first (``demand``: bytes per iteration; then by key), each on
    a shortest path of circuits (:func:`route`) whose hops are chosen by the bytes already
    placed on each directed hop, least first; a tie goes to the switch of ``a``'s own rail (so
    that a rail's traffic stays on its rail when nothing is gained by leaving it), then to the
    first in switch order. Keyed by group, two groups of one rank pair (a pipeline's sends
    beside an FSDP ring's, say) take different circuits where the pair has several, as they
    may run at once. ValueError names a pair without a path."""
    g = gpus_per_server
    adj = adjacency(config)
    placed: dict[Hop, float] = {}
    dists: dict[int, dict[int, int]] = {}
    out: dict[TransferKey, list[Hop]] = {}
    for key, n in sorted(demand.items(), key=lambda kv: (-kv[1], kv[0])):
        a, b = key[-2], key[-1]
        assert isinstance(a, int) and isinstance(b, int)
        s, t = a // g, b // g
        if s == t:
            continue
        rail = a % g

        def load(sw: Switch, u: int, v: int, rail: int = rail) -> float:
            return placed.get((sw, u, v), 0.0) + (0.0 if sw[0] == rail else 0.5)

        dist = dists.get(t)
        if dist is None:
            dist = dists[t] = distances_to(adj, t)
        path = route(adj, s, t, load, dist=dist)
        if path is None:
            raise ValueError(f"no path of circuits from rank {a} (server {s}) to rank {b} "
                             f"(server {t})")
        for hop in path:
            placed[hop] = placed.get(hop, 0.0) + n
        out[key] = path
    return out


def stations(path: list[Hop], a: int, b: int, gpus_per_server: int) -> list[int]:
    """The ranks a transfer from rank ``a`` to rank ``b`` passes through along ``path``, ``a``
    first and ``b`` last: each hop enters at its rail's GPU of the hop's first server (reached
    from the previous station over the scale-up domain when it is another GPU of that server)
    and leaves at the same rail's GPU of its second server."""
    g = gpus_per_server
    out = [a]
    for (rail, _k), u, v in path:
        x, y = u * g + rail, v * g + rail
        if x != out[-1]:
            if out[-1] // g != u:
                raise ValueError(f"path {path} does not start at rank {a}'s server or is "
                                 "not connected")
            out.append(x)
        out.append(y)
    if out[-1] != b:
        if out[-1] // g != b // g:
            raise ValueError(f"path {path} does not end at rank {b}'s server")
        out.append(b)
    return out
