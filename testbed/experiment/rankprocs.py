"""Which ranks share a replayer process: ``run.ranks_per_process``.

``rank`` (one process per rank, each inside its Mininet host) is how runs always went.
``server`` starts one process per server that hosts its G ranks as threads
(:mod:`testbed.emulated.serverhost`), each rank's sockets opened inside its own host's network
namespace (:mod:`emulator.netns`): 1/G as many interpreters to load and schedule.
``auto`` is ``server`` unless the run has failover (spares, ``--no-spares``' restart, or rank
or port faults), where it falls back to ``rank``: failover kills, stops (``hang``) and restarts
a rank's process, and its NIC watchdog exits it, which one process per server cannot do to one
rank without the others. ``server`` with failover is refused (:func:`resolve`).

Pure: no processes, no namespaces.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

RANK, SERVER, AUTO = "rank", "server", "auto"
RANKS_PER_PROCESS = (RANK, SERVER, AUTO)
DEFAULT = RANK


class GroupingRefused(ValueError):
    """``server`` was asked for a run that needs one process per rank."""


def resolve(setting: str, failover: str | None) -> str:
    """``rank`` or ``server`` for ``setting`` on a run whose failover is ``failover`` (what
    triggers it in words, or None: the run has no failover)."""
    if setting not in RANKS_PER_PROCESS:
        raise GroupingRefused(f"must be one of {', '.join(RANKS_PER_PROCESS)}, got {setting!r}")
    if failover is None:
        return RANK if setting == RANK else SERVER
    if setting == SERVER:
        raise GroupingRefused(
            f"server cannot be combined with failover ({failover}): failover kills, stops and "
            "restarts one rank's process; use ranks_per_process: rank or auto (auto falls back "
            "to one process per rank when a run has failover), or remove the spares and faults")
    return RANK


def server_groups(ranks: Iterable[int], server_of: Callable[[int], int]
                  ) -> list[tuple[int, ...]]:
    """The ranks of each server, servers in order, ranks ascending within one."""
    groups: dict[int, list[int]] = {}
    for rank in sorted(ranks):
        groups.setdefault(server_of(rank), []).append(rank)
    return [tuple(groups[s]) for s in sorted(groups)]
