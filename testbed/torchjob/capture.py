"""A torch run's call records -> the schedule of one iteration (pure: no torch import).

The torch backend writes one JSON line per collective call, in the replayer's ``call`` record
format plus the torch fields: ``op`` (the ProcessGroup method), ``members`` (global ranks in
group order), ``peer`` (send/recv, global), ``dtype``, ``t_issue``, ``t_wait_start`` /
``t_wait_end`` (when the main thread waited for it), ``torch_group``; and one ``iteration``
line per optimizer step (``it``, ``t_start``, ``t_end``). :func:`schedule_from_records` turns
the calls of one iteration into per-rank programs with :mod:`workloads.captured`'s rules
(compute = main-thread time not blocked in a wait; a collective depends on the compute before
its issue; the compute after a wait depends on the waited call), so ``run --backend emu|sim``
replays the captured job like a generated one. An all-to-all without a ``split`` field is taken
as an even split.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from workloads.captured import Call, CaptureError, RankRun, schedule_from_runs
from workloads.schedule import Schedule
from workloads.steps import chunk_sizes

__all__ = ["CaptureError", "last_iteration", "schedule_from_records"]


def last_iteration(records_by_rank: dict[int, list[dict[str, Any]]]) -> int:
    """The last iteration every rank finished (its ``iteration`` record is written)."""
    done = [{int(r["it"]) for r in recs if r.get("ev") == "iteration"}
            for recs in records_by_rank.values()]
    common = set.intersection(*done) if done else set()
    if not common:
        raise CaptureError("no iteration was finished by every rank (no common 'iteration' "
                           "record)")
    return max(common)


def schedule_from_records(records_by_rank: dict[int, list[dict[str, Any]]], *, iteration: int,
                          gpus_per_server: int, sources: Sequence[str] = (),
                          torch_version: str | None = None) -> Schedule:
    """The schedule of ``iteration`` from every rank's records (``workloads/FORMAT.md``).

    ``sources`` (the record files) and ``torch_version`` go into the schedule's ``origin``.
    Raises :class:`CaptureError` naming the rank and call that cannot be represented.
    """
    runs = {rank: _rank_run(rank, recs, iteration) for rank, recs in records_by_rank.items()}
    origin = {"kind": "torch-capture", "sources": list(sources),
              "torch_version": torch_version, "iteration": iteration}
    return schedule_from_runs(runs, gpus_per_server=gpus_per_server, origin=origin)


def _rank_run(rank: int, records: Iterable[dict[str, Any]], iteration: int) -> RankRun:
    bounds = None
    calls: list[tuple[float, int, Call]] = []
    for n, rec in enumerate(records):
        ev = rec.get("ev")
        if ev == "iteration" and int(rec["it"]) == iteration:
            bounds = (float(rec["t_start"]), float(rec["t_end"]))
        elif ev == "call" and int(rec.get("it", -1)) == iteration:
            calls.append((float(rec["t_issue"]), int(rec.get("i", n)), _call(rank, rec)))
    if bounds is None:
        raise CaptureError(f"rank {rank}: no 'iteration' record for iteration {iteration}")
    calls.sort(key=lambda x: (x[0], x[1]))
    return RankRun(rank, [c for _, _, c in calls], *bounds)


def _call(rank: int, rec: dict[str, Any]) -> Call:
    source = (f"rank {rank} call {rec.get('i', '?')} ({rec.get('op', rec.get('kind'))} on "
              f"{rec.get('torch_group', rec.get('lane', '?'))})")
    try:
        members = tuple(int(m) for m in rec["members"])
        kind = str(rec["kind"])
        size = int(rec["size_bytes"])
        wait = None
        if rec.get("t_wait_start") is not None and rec.get("t_wait_end") is not None:
            wait = (float(rec["t_wait_start"]), float(rec["t_wait_end"]))
        split: tuple[int, ...] = ()
        if kind == "all_to_all":
            split = tuple(int(x) for x in rec.get("split") or chunk_sizes(size, len(members)))
        return Call(kind, str(rec["axis"]), members, size, float(rec["t_issue"]),
                    peer=int(rec.get("peer", -1) if rec.get("peer") is not None else -1),
                    split=split, wait=wait, source=source)
    except (KeyError, TypeError, ValueError) as exc:
        raise CaptureError(f"{source}: bad call record ({type(exc).__name__}: {exc})") from exc
