"""Relay paths through intermediate GPUs, for the planes whose circuits do not follow the
traffic (:mod:`controller.planes.static`, :mod:`controller.planes.rotor`).

A path is a list of hops ``(switch, u, v)``: server ``u``'s port on ``switch`` has a circuit to
server ``v``'s. Between hops the bytes cross a relay server's scale-up domain (free) and leave on
the next hop's switch, as a GPU forwarding for another (TopoOpt's host-based forwarding; one
RotorLB hop for the rotor). :func:`route` picks a shortest path, hop by hop the least-loaded
circuit that stays on a shortest path: a direct circuit when there is one, else the fewest relays
(at most ``max_hops - 1``).
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


def route(adj: Adjacency, s: int, t: int, load: Callable[[Switch, int, int], int],
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
        best: tuple[int, int, Switch, int] | None = None
        for i, (sw, v) in enumerate(adj[u]):
            if dist.get(v) == dist[u] - 1:
                key = (load(sw, u, v), i, sw, v)
                if best is None or key[:2] < best[:2]:
                    best = key
        assert best is not None  # dist[u] > 0 has a neighbour one hop nearer
        path.append((best[2], u, best[3]))
        u = best[3]
    return path
