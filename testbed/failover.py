"""The failover policy both backends follow (pure): which spare takes a failed rank over, the
iteration the job resumes from, and the job it resumes as.

The emulator's supervisor (:mod:`testbed.emulated.supervisor`) and the simulator
(:mod:`testbed.simulator.failover`) detect failures and restart ranks each their own way; what
they decide is decided here, once, so a fix to the policy reaches both.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from controller.job import RankPorts


@dataclass(frozen=True)
class Host:
    """A host that can run a rank: its id, its rail, its server and its rail ports."""

    host: int
    rail: int
    server: int
    ports: tuple[int, ...]


def pick_spare(free: Iterable[Host], rail: int, failed_server: int) -> Host | None:
    """The free host that takes over a rank of ``rail`` whose host on ``failed_server`` failed:
    one on the same rail (its ports reach the rank's peers), on the same server first (the
    server's other GPUs keep their NVLink peer), then the lowest host id; None if none is left.
    """
    candidates = sorted((h for h in free if h.rail == rail),
                        key=lambda h: (h.server != failed_server, h.host))
    return candidates[0] if candidates else None


def resume_iteration(next_iteration_by_rank: Iterable[int]) -> int:
    """The iteration the job resumes from: the first one that not every rank completed
    (``next_iteration_by_rank``: each rank's first iteration not completed in the epoch)."""
    return min(next_iteration_by_rank)


def epoch_job_id(base_job: str, epoch: int) -> str:
    """The job id the controller knows epoch ``epoch`` of job ``base_job`` by."""
    return f"{base_job}-e{epoch}"


@dataclass(frozen=True)
class Takeover:
    """A spare taking rank ``rank`` over from ``failed``: the job's ports with the rank on the
    spare's, and the ``spare_assigned`` event's fields."""

    rank: int
    failed: Host
    spare: Host
    ports: dict[int, RankPorts]

    def event(self) -> dict[str, Any]:
        """The ``spare_assigned`` event's fields (without ``event`` and ``t_s``)."""
        return {"rank": self.rank, "host": self.spare.host, "failed_host": self.failed.host,
                "rail": self.failed.rail, "old_ports": list(self.failed.ports),
                "new_ports": list(self.spare.ports),
                "same_server": self.spare.server == self.failed.server}


def take_over(ports: Mapping[int, RankPorts], rank: int, failed: Host,
              free: Iterable[Host]) -> Takeover | None:
    """The takeover of ``rank`` (whose host ``failed`` is out) by a spare from ``free``, or
    None if no spare is left on its rail. The rank keeps its rail; its ports are the spare's."""
    spare = pick_spare(free, ports[rank].rail, failed.server)
    if spare is None:
        return None
    moved = dict(ports)
    moved[rank] = RankPorts(rank, ports[rank].rail, spare.ports)
    return Takeover(rank, failed, spare, moved)
