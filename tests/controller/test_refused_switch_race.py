"""A refused switch and the decisions queued behind it, at the exact interleaving that broke
failover runs: the controller must never send the switch a request built on circuits the switch
does not hold, and must end holding what the switch holds.

The emulated failure (issue "Green that means working"): decision A (swap 1-2 and 3-4 for 2-3)
was in flight when decision B took the ports A freed (1-4) and queued behind it. The switch
refused A. B, planned on A's circuits, still went to the switch and was refused for the
switch's real state ("port 1 already has peer 2"), and each failure planned the next call on the
same wrong view until a rank ran out of retries. Here the switch is a fake that holds each
request until the test lets it go, so the interleaving is the same on every run.
"""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field

import pytest

from controller.batching import RailBatcher
from controller.core import CoreConfig, Decision
from controller.events import EventLog
from controller.job import CommGroup, JobSpec
from controller.ocs import (
    ApplyResult,
    Circuit,
    CrossconnectState,
    OcsDriver,
    PortState,
    RailDescription,
    Reconfiguration,
    ReconfigurationRejected,
)
from controller.service import ControllerService
from controller.shim import IntentRejected, Shim

GROUPS = [CommGroup("a", "dp", (0, 1)), CommGroup("d", "ep", (2, 3)),
          CommGroup("b", "pp", (1, 2)), CommGroup("e", "cp", (0, 3))]


@dataclass
class _Request:
    reconfs: Sequence[Reconfiguration]
    go: threading.Event = field(default_factory=threading.Event)
    refuse: bool = False


class GatedSwitch(OcsDriver):
    """One OCS rail that holds every request until the test releases it; a released request is
    refused when the test says so (an injected refusal, nothing changes), else checked by the
    OCS rules and applied. A request the rules refuse is kept in :attr:`stale`."""

    def __init__(self, job: JobSpec) -> None:
        self.ports = {rail: tuple(sorted(ps)) for rail, ps in job.ports_by_rail.items()}
        self.state = CrossconnectState(self.ports)
        self.requests: queue.Queue[_Request] = queue.Queue()
        self.stale: list[str] = []

    def describe(self) -> list[RailDescription]:
        return [RailDescription(rail, ps, 0.0) for rail, ps in sorted(self.ports.items())]

    def circuits(self, rail: int) -> frozenset[Circuit]:
        return self.state.circuits(rail)

    def port_states(self, rail: int) -> dict[int, PortState]:
        return self.state.port_states(rail)

    def apply_many(self, reconfs: Sequence[Reconfiguration]) -> list[ApplyResult]:
        req = _Request(reconfs)
        self.requests.put(req)
        assert req.go.wait(20), "the test never released a request"
        if req.refuse:
            rc = reconfs[0]
            raise ReconfigurationRejected(rc.rail, sorted(rc.touched_ports), "injected refusal")
        try:
            self.state.check_all(reconfs)
        except ReconfigurationRejected as exc:
            self.stale.append(str(exc))
            raise
        for rc in reconfs:
            self.state.apply(rc)
        now = time.time()
        return [ApplyResult(rc.rail, rc.add, rc.remove, now, now, now) for rc in reconfs]

    def next_request(self) -> _Request:
        return self.requests.get(timeout=10)


def _calls(shim: Shim, group: str, times: int, failures: list[str]) -> Callable[[], None]:
    """``times`` calls of ``group``, each asked again after a failed switch (as the replayer
    does, up to three times); every refusal is recorded in ``failures``."""
    def run() -> None:
        for _ in range(times):
            for _attempt in range(4):
                try:
                    with shim.collective(group):
                        break
                except IntentRejected as exc:
                    failures.append(f"rank {shim.rank} {group}: {exc.code}: {exc}")
                    if exc.code != "reconfig_failed":
                        return
            else:
                return
    return run


@pytest.fixture
def switched() -> Iterator[tuple[ControllerService, GatedSwitch, list[Shim]]]:
    job = JobSpec.rail_optimized("j", 4, 1, 1, GROUPS)
    switch = GatedSwitch(job)
    service = ControllerService(switch, event_log=EventLog(keep=True),
                                config=CoreConfig.for_mode("on-demand")).start()
    service.register_job(job)
    shims = [Shim(service.endpoint, "j", r, ack_timeout_s=20) for r in range(4)]
    try:
        yield service, switch, shims
    finally:
        for shim in shims:
            shim.close()
        service.stop()


def _both(shims: list[Shim], group: str, ranks: tuple[int, int], failures: list[str],
          times: int = 1) -> list[threading.Thread]:
    threads = [threading.Thread(target=_calls(shims[r], group, times, failures), daemon=True)
               for r in ranks]
    for t in threads:
        t.start()
    return threads


def _wait_decisions(service: ControllerService, count: int) -> None:
    deadline = time.monotonic() + 10
    while service.core.counters["decisions"] < count:
        assert time.monotonic() < deadline, "the controller made no such decision"
        time.sleep(0.005)


def test_decisions_queued_behind_a_refused_switch_never_reach_the_switch(
        switched: tuple[ControllerService, GatedSwitch, list[Shim]]) -> None:
    service, switch, shims = switched
    failures: list[str] = []
    for group, ranks in (("a", (0, 1)), ("d", (2, 3))):  # 1-2 and 3-4 lit, calls finished
        threads = _both(shims, group, ranks, failures)
        switch.next_request().go.set()
        for t in threads:
            t.join(10)
    assert switch.state.all_circuits() == {Circuit(0, 1, 2), Circuit(0, 3, 4)}

    b_threads = _both(shims, "b", (1, 2), failures)  # decision A: 2-3 instead of 1-2, 3-4
    a_request = switch.next_request()
    assert {c.ports for rc in a_request.reconfs for c in rc.add} == {(2, 3)}
    e_threads = _both(shims, "e", (0, 3), failures)  # decision B: 1-4, queued behind A
    _wait_decisions(service, 4)

    releaser_stop = threading.Event()

    def release_the_rest() -> None:  # every later request lights
        while not releaser_stop.is_set():
            try:
                switch.requests.get(timeout=0.05).go.set()
            except queue.Empty:
                continue

    releaser = threading.Thread(target=release_the_rest, daemon=True)
    a_request.refuse = True
    a_request.go.set()
    releaser.start()
    try:
        for t in b_threads + e_threads:
            t.join(20)
            assert not t.is_alive(), "a call never ended"
    finally:
        releaser_stop.set()
        releaser.join(5)

    assert switch.stale == [], "requests built on circuits the switch never made reached it"
    # A's ranks were told once (the injected refusal), B's once (withdrawn), then all served
    assert len(failures) == 4, failures
    assert sum("withdrawn" in f for f in failures) == 2, failures
    assert service.core.state.all_circuits() == switch.state.all_circuits()
    events = service.events.records
    assert not any(e["event"] == "state_diverged" for e in events)
    assert [bool(e.get("withdrawn")) for e in events if e["event"] == "reconfig_failed"] \
        == [True, False]  # B (the newer) is undone first, then A


def _decision(did: int, rail: int, add: set[tuple[int, int]],
              remove: tuple[tuple[int, int], ...] = ()) -> Decision:
    rc = Reconfiguration.of(rail, add=add, remove=remove)
    return Decision(did, "j", f"g{did}", 0, (rc,), False)


def test_a_failed_batch_takes_only_the_waiting_decisions_on_its_ports() -> None:
    batcher = RailBatcher()
    (first,) = batcher.submit(_decision(1, 0, {(1, 2)}))
    assert batcher.submit(_decision(2, 0, {(3, 4)})) == []  # other ports: stays valid
    assert batcher.submit(_decision(3, 0, {(2, 5)}, ((1, 2),))) == []  # on 1-2: fails with it
    assert batcher.submit(_decision(4, 0, {(5, 6)})) == []  # on port 5, which 3 touches
    (other_rail,) = batcher.submit(_decision(5, 1, {(1, 2)}))  # another rail: goes at once
    assert [d.decision_id for d in other_rail.decisions] == [5]
    batch, behind, start = batcher.failed(first.batch_id)
    assert batch is first
    assert [d.decision_id for d in behind] == [3, 4]
    assert [[d.decision_id for d in b.decisions] for b in start] == [[2]]
    assert batcher.waiting == 0
