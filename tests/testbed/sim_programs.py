"""Hand-built replay plans for the sim engine's tests: serial programs of calls and compute.

Each rank runs its ops one after the other (every op depends on the rank's previous one), so a
program is a global order of calls that every member follows, as NCCL requires. A call of a
ring group is a ring all-gather (``n - 1`` steps, each sending ``chunk_bytes`` to the next
member and receiving as much from the previous one); a call of a group with explicit pairs is
one step in which each member exchanges ``chunk_bytes`` with its partner.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from controller.job import CommGroup, JobSpec, rail_job_ports
from testbed.experiment.config import RunSettings
from testbed.plan.replay import COMPUTE_LANE, PlanOp, Step
from testbed.simulator.engine import PlanSimulation
from testbed.simulator.network import NetworkModel


class Programs:
    """Per-rank serial programs, built call by call."""

    def __init__(self, ranks: Iterable[int]) -> None:
        self.ops: dict[int, list[PlanOp]] = {r: [] for r in ranks}
        self._calls: dict[str, int] = {}

    def _next(self, rank: int) -> tuple[int, tuple[int, ...]]:
        """Index of the rank's next op and its deps (the rank's previous op)."""
        n = len(self.ops[rank])
        return n, ((n - 1,) if n else ())

    def compute(self, rank: int, duration_s: float) -> Programs:
        i, deps = self._next(rank)
        self.ops[rank].append(PlanOp(i, COMPUTE_LANE, deps, duration_s=duration_s, tag=f"c{i}"))
        return self

    def call(self, group: CommGroup, chunk_bytes: int, kind: str = "all_gather") -> Programs:
        """One call of ``group`` at each of its members."""
        n = self._calls.get(group.group_id, 0)
        self._calls[group.group_id] = n + 1
        for rank in group.ranks:
            steps = _steps(group, rank, chunk_bytes)
            i, deps = self._next(rank)
            self.ops[rank].append(PlanOp(
                i, group.group_id, deps, kind=kind, axis=group.axis,
                collective_id=f"{group.group_id}:{n}", size_bytes=chunk_bytes * len(group.ranks),
                wire_bytes=sum(b for s in steps for _, b in s.sends), steps=steps,
                tag=f"{group.group_id}:{n}"))
        return self


def _steps(group: CommGroup, rank: int, chunk_bytes: int) -> tuple[Step, ...]:
    if group.pairs is not None:
        (partner,) = [b if a == rank else a for a, b in group.pairs if rank in (a, b)]
        return (Step(((partner, chunk_bytes),), ((partner, chunk_bytes),)),)
    members = group.ranks
    i = members.index(rank)
    nxt, prv = members[(i + 1) % len(members)], members[i - 1]
    return tuple(Step(((nxt, chunk_bytes),), ((prv, chunk_bytes),))
                 for _ in range(len(members) - 1))


def simulation(programs: Mapping[int, list[PlanOp]], groups: Iterable[CommGroup], *,
               network: NetworkModel, mode: str, switching_delay_ms: float,
               iterations: int, ports_per_rank: int = 1, gpus_per_server: int = 1,
               jitter_ms: float = 0.0, seed: int = 0) -> PlanSimulation:
    """A :class:`PlanSimulation` of ``programs`` on the standard rail ports."""
    ports = rail_job_ports(programs, gpus_per_server, ports_per_rank)
    job = JobSpec("j", ports, {g.group_id: g for g in groups})
    settings = RunSettings(mode=mode, switching_delay=switching_delay_ms, warmup=0,
                           iterations=iterations)
    return PlanSimulation(programs, job, settings, network=network,
                          gpus_per_server=gpus_per_server, jitter_ms=jitter_ms, seed=seed)
