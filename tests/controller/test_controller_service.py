"""The controller service over loopback TCP with real shims in separate processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest
import zmq

from controller.core import CoreConfig
from controller.drivers.sim import SimOcsDriver
from controller.events import EventLog, read_events
from controller.job import CommGroup, JobSpec, RankPorts
from controller.ocs import ApplyResult, Reconfiguration
from controller.service import ControllerClient, ControllerService
from controller.shim import CollectiveGrant, ControllerUnavailable, IntentRejected, Shim

ROOT = Path(__file__).resolve().parents[2]
WORKER = Path(__file__).with_name("shim_worker.py")
GROUPS = [CommGroup("dp0", "dp", (0, 1)), CommGroup("dp1", "dp", (2, 3)),
          CommGroup("pp0", "pp", (0, 2)), CommGroup("pp1", "pp", (1, 3))]


def wait_for(cond: Callable[[], bool], timeout_s: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.01)


def grant_in_thread(shim: Shim, group: str) -> Callable[[float], CollectiveGrant]:
    """Ask for ``group``'s call in a thread; returns a function that waits for the grant."""
    grants: list[CollectiveGrant] = []
    t = threading.Thread(target=lambda: grants.append(shim.collective(group).__enter__()),
                         daemon=True)
    t.start()

    def result(timeout_s: float) -> CollectiveGrant:
        t.join(timeout_s)
        assert not t.is_alive(), f"rank {shim.rank}: no grant for {group} within {timeout_s} s"
        assert grants, f"rank {shim.rank}: the call of {group} failed (see the thread's error)"
        return grants[0]

    return result


def spawn(endpoint: str, rank: int, hold_s: float, *groups: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, str(WORKER), endpoint, "j", str(rank), str(hold_s),
                             *groups], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for p in started:  # end only our own processes, by pid
        if p.poll() is None:
            p.kill()
        p.wait(10)


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ControllerService]:
    job = JobSpec.rail_optimized("j", 4, 1, 1, GROUPS)
    driver = SimOcsDriver(job.ports_by_rail, 5.0)
    svc = ControllerService(driver, event_log=EventLog(tmp_path / "events.jsonl", keep=True),
                            config=CoreConfig(provisioning=True), heartbeat_timeout_s=0.5)
    svc.start()
    svc.register_job(job)
    try:
        yield svc
    finally:
        svc.stop()


def test_ranks_in_processes_run_their_calls(service: ControllerService,
                                            procs: list[subprocess.Popen[str]],
                                            tmp_path: Path) -> None:
    for r in range(4):
        dp, pp = ("dp0" if r < 2 else "dp1"), ("pp0" if r % 2 == 0 else "pp1")
        procs.append(spawn(service.endpoint, r, 0.01, dp, pp, dp, pp))
    for p in procs:
        out, err = p.communicate(timeout=60)
        assert p.returncode == 0, err
        assert sum(1 for line in out.splitlines() if json.loads(line).get("done")) == 4
    events = read_events(tmp_path / "events.jsonl")
    kinds = {e["event"] for e in events}
    assert {"intent", "decision", "reconfig_start", "reconfig_end", "ack", "complete"} <= kinds
    assert all("t_s" in e for e in events)
    assert service.core.counters["acks"] == 16 and service.core.counters["rejects"] == 0


def test_shim_that_dies_mid_collective_is_released(service: ControllerService,
                                                   procs: list[subprocess.Popen[str]]) -> None:
    victim = spawn(service.endpoint, 0, 60.0, "dp0")  # holds the call for a minute
    procs.append(victim)
    peer = spawn(service.endpoint, 1, 0.0, "dp0", "pp1")  # then needs rank 1's only port
    procs.append(peer)
    other = spawn(service.endpoint, 3, 0.0, "pp1")
    procs.append(other)
    assert victim.stdout is not None
    assert json.loads(victim.stdout.readline())["in_call"]
    victim.kill()  # dies inside the collective, circuits still protected
    _out, err = peer.communicate(timeout=30)
    assert peer.returncode == 0, err
    assert other.wait(30) == 0
    lost = [e for e in service.events.records if e["event"] == "rank_lost"]
    assert [(e["job"], e["rank"]) for e in lost] == [("j", 0)]


def test_bad_input_gets_errors_and_others_are_still_served(service: ControllerService) -> None:
    ctx = zmq.Context()
    raw = ctx.socket(zmq.DEALER)
    raw.connect(service.endpoint)
    try:
        for payload, code in [(b"not json", "malformed"), (b'{"type": "warp"}', "unknown_type"),
                              (b'{"type": "intent", "req": 1, "job": "j", "rank": "x"}',
                               "malformed")]:
            raw.send(payload)
            assert raw.poll(5000)
            reply = json.loads(raw.recv())
            assert reply["type"] == "error" and reply["code"] == code, reply
    finally:
        raw.close(0)
        ctx.term()
    with Shim(service.endpoint, "j", 0, ack_timeout_s=5) as shim:
        with pytest.raises(IntentRejected, match="unknown_group"), shim.collective("zz"):
            pass
        with pytest.raises(IntentRejected, match="not_a_member"), shim.collective("dp1"):
            pass
    with pytest.raises(IntentRejected, match="unknown_rank"):
        Shim(service.endpoint, "j", 42, ack_timeout_s=5).collective("dp0").__enter__()
    thief = JobSpec("k", {0: RankPorts(0, 0, (1,)), 1: RankPorts(1, 0, (4,))},
                    {"g": CommGroup("g", "dp", (0, 1))})
    with ControllerClient(service.endpoint) as client, pytest.raises(IntentRejected,
                                                                     match="owned by job j"):
        client.register_job(thief)
    errors = [e for e in service.events.records if e["event"] == "error"]
    assert len(errors) >= 6
    # the controller still serves a good call
    with Shim(service.endpoint, "j", 2) as a, Shim(service.endpoint, "j", 3) as b:
        b_grant = grant_in_thread(b, "dp1")
        with a.collective("dp1") as grant:
            assert grant.seq == 0
        assert b_grant(10).seq == 0


def test_controller_loss_is_clear_and_reconnection_is_automatic(tmp_path: Path) -> None:
    job = JobSpec.rail_optimized("j", 2, 1, 1, [CommGroup("g", "dp", (0, 1))])
    svc = ControllerService(SimOcsDriver(job.ports_by_rail, 0.0)).start()
    svc.register_job(job)
    endpoint = svc.endpoint
    shim = Shim(endpoint, "j", 0, ack_timeout_s=30, heartbeat_interval_s=0.1,
                controller_silence_s=0.5)
    try:
        svc.stop()
        # the silence detector (0.5 s) speaks, not the 30 s wait for an answer: the error says
        # the controller stopped answering, and names it
        with pytest.raises(ControllerUnavailable, match="stopped answering heartbeats") as err:
            shim.collective("g").__enter__()
        assert endpoint in str(err.value)
        svc2 = ControllerService(SimOcsDriver(job.ports_by_rail, 0.0), bind=endpoint).start()
        try:
            svc2.register_job(job)
            with Shim(endpoint, "j", 1) as peer:
                peer_grant = grant_in_thread(peer, "g")
                with shim.collective("g") as grant:
                    assert grant.reconfigured
                assert peer_grant(10).reconfigured
        finally:
            svc2.stop()
    finally:
        shim.close()



def test_lost_rank_fails_later_calls_at_once_until_it_shows_up_again(tmp_path: Path) -> None:
    job = JobSpec.rail_optimized("j", 4, 1, 1, GROUPS)
    service = ControllerService(SimOcsDriver(job.ports_by_rail, 5.0),
                                event_log=EventLog(keep=True), heartbeat_timeout_s=1.0).start()
    service.register_job(job)
    ctx = zmq.Context()
    raw = ctx.socket(zmq.DEALER)
    raw.setsockopt(zmq.LINGER, 0)
    raw.connect(service.endpoint)
    try:  # rank 0 shows up, then goes silent without a bye (its process died)
        raw.send(json.dumps({"type": "heartbeat", "job": "j", "rank": 0,
                             "shim": "victim"}).encode())
        assert raw.poll(5000)
        raw.recv()
        wait_for(lambda: any(e["event"] == "rank_lost" for e in service.events.records),
                 what="rank 0 declared lost")
        # an answer (IntentRejected), not a wait for ack_timeout_s (ControllerUnavailable)
        with Shim(service.endpoint, "j", 1, ack_timeout_s=20, heartbeat_interval_s=0.1) as peer, \
                pytest.raises(IntentRejected, match=r"peer_lost.*rank 0"), \
                peer.collective("dp0"):
            pass
        assert [(e["code"], e["rank"], e["group"]) for e in service.events.records
                if e["event"] == "error"] == [("peer_lost", 1, "dp0")]
        # a new rank-0 process connects: its groups are served again
        with Shim(service.endpoint, "j", 0, ack_timeout_s=20, heartbeat_interval_s=0.1) as a, \
                Shim(service.endpoint, "j", 1, ack_timeout_s=20, heartbeat_interval_s=0.1) as b:
            wait_for(lambda: any(e["event"] == "rank_rejoined" for e in service.events.records),
                     what="rank 0 back")  # before rank 1 asks, or it is refused again
            b_grant = grant_in_thread(b, "dp0")
            with a.collective("dp0") as grant:
                assert grant.seq == 0
            assert b_grant(10).seq == 0
        assert [e["event"] for e in service.events.records if e.get("rank") == 0
                and e["event"] in ("rank_lost", "rank_rejoined")] == ["rank_lost", "rank_rejoined"]
    finally:
        raw.close(0)
        ctx.term()
        service.stop()


def _watched_service() -> tuple[ControllerService, list[tuple[str, int]]]:
    """A started service with job ``j`` registered, a 0.5 s heartbeat timeout, and the list
    its ``on_rank_lost`` appends (job, rank) to."""
    job = JobSpec.rail_optimized("j", 4, 1, 1, GROUPS)
    lost: list[tuple[str, int]] = []
    service = ControllerService(SimOcsDriver(job.ports_by_rail, 0.0),
                                event_log=EventLog(keep=True), heartbeat_timeout_s=0.5,
                                on_rank_lost=lambda job_id, rank, _t: lost.append((job_id, rank)))
    service.start()
    service.register_job(job)
    return service, lost


def test_a_shim_closed_before_its_first_call_is_not_declared_lost() -> None:
    """Its heartbeats opened a session: closing it must end that session (a bye), or the
    controller would declare the rank lost a timeout later and refuse its peers' calls."""
    service, lost = _watched_service()
    try:
        with Shim(service.endpoint, "j", 2, heartbeat_interval_s=0.05):
            wait_for(lambda: bool(service._sessions), what="the heartbeat's session")
        wait_for(lambda: not service._sessions, what="the session ended by the bye")
        deadline = time.monotonic() + 1.0  # two timeouts: an expiry would be reported by then
        while time.monotonic() < deadline:
            assert lost == [], "a closed shim's session expired as a lost rank"
            time.sleep(0.02)
        assert not any(e["event"] == "rank_lost" for e in service.events.records)
    finally:
        service.stop()


def test_a_retargeted_shim_serves_the_job_registered_again() -> None:
    """A failover registers the job again under a new id; the ranks' shims move over on
    their connection: fresh call numbers, the old sessions ended (no rank declared lost)."""
    service, lost = _watched_service()
    try:
        with Shim(service.endpoint, "j", 0, heartbeat_interval_s=0.05) as a, \
                Shim(service.endpoint, "j", 1, heartbeat_interval_s=0.05) as b:
            b_grant = grant_in_thread(b, "dp0")
            with a.collective("dp0") as grant:
                assert grant.seq == 0
            assert b_grant(10).seq == 0
            with ControllerClient(service.endpoint) as client:
                client.unregister_job("j")
            service.register_job(JobSpec.rail_optimized("j-e1", 4, 1, 1, GROUPS))
            a.cancel()  # as an aborted epoch leaves it
            for shim in (a, b):
                shim.retarget("j-e1")
            b_grant = grant_in_thread(b, "dp0")
            with a.collective("dp0") as grant:
                assert grant.seq == 0  # numbering starts again for the new job
            assert b_grant(10).seq == 0
            wait_for(lambda: len(service._sessions) == 2, what="only the new sessions")
            assert {s.job_id for s in service._sessions.values()} == {"j-e1"}
        assert lost == []
    finally:
        service.stop()


def test_unregistering_a_job_with_waiting_ranks_answers_the_unregistering_client() -> None:
    job = JobSpec.rail_optimized("j", 4, 1, 1, GROUPS)
    service = ControllerService(SimOcsDriver(job.ports_by_rail, 0.0)).start()
    try:
        service.register_job(job)
        with Shim(service.endpoint, "j", 0, ack_timeout_s=20) as shim:
            errors: list[BaseException] = []

            def ask() -> None:  # rank 1 never asks: rank 0 waits
                try:
                    shim.collective("dp0").__enter__()
                except IntentRejected as exc:
                    errors.append(exc)

            waiting = threading.Thread(target=ask, daemon=True)
            waiting.start()
            wait_for(lambda: bool(service.core.pending()), what="rank 0's call pending")
            with ControllerClient(service.endpoint) as client:
                client.unregister_job("j")  # an answer, not the waiting rank's rejection
            waiting.join(10)
            assert [str(e) for e in errors] == ["job_unregistered: job j was unregistered"]
    finally:
        service.stop()


class GatedDriver(SimOcsDriver):
    """The simulated OCS, whose first request holds until the test opens the gate."""

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
        self.gate = threading.Event()
        self.requests: list[tuple[Reconfiguration, ...]] = []

    def apply_many(self, reconfs: Sequence[Reconfiguration]) -> list[ApplyResult]:
        self.requests.append(tuple(reconfs))
        if len(self.requests) == 1 and not self.gate.wait(30):
            raise TimeoutError("the test did not open the gate within 30 s")
        return super().apply_many(reconfs)


def test_decisions_made_while_a_rail_switches_go_out_as_one_request(tmp_path: Path) -> None:
    groups = [CommGroup("a", "dp", (0, 1)), CommGroup("b", "dp", (2, 3)),
              CommGroup("c", "dp", (4, 5))]
    job = JobSpec.rail_optimized("j", 6, 1, 1, groups)
    driver = GatedDriver(job.ports_by_rail, 5.0)
    svc = ControllerService(driver, event_log=EventLog(tmp_path / "events.jsonl", keep=True))
    svc.start()
    grants: dict[int, bool] = {}

    def rank(r: int, group: str) -> None:
        with Shim(svc.endpoint, "j", r) as shim, shim.collective(group) as grant:
            grants[r] = grant.reconfigured

    try:
        svc.register_job(job)
        threads = [threading.Thread(target=rank, args=(r, "a"), name=f"rank {r}", daemon=True)
                   for r in (0, 1)]
        for t in threads:
            t.start()
        wait_for(lambda: len(driver.requests) == 1, what="group a's switch")
        later = [threading.Thread(target=rank, args=(r, g), name=f"rank {r}", daemon=True)
                 for r, g in ((2, "b"), (3, "b"), (4, "c"), (5, "c"))]
        for t in later:
            t.start()
        wait_for(lambda: sum(e["event"] == "decision" for e in list(svc.events.records)) == 3,
                 what="decisions for b and c")
        assert len(driver.requests) == 1  # b and c wait for the rail
        driver.gate.set()
        for t in threads + later:
            t.join(30)
            assert not t.is_alive(), f"{t.name} still waiting 30 s after the gate opened"
        assert grants == dict.fromkeys(range(6), True)
        assert len(driver.requests) == 2
        (second,) = driver.requests[1]  # one request on rail 0 with b's and c's circuits
        assert len(second.add) == 2 and not second.remove
    finally:
        driver.gate.set()
        svc.stop()


def test_a_switch_still_in_flight_at_stop_is_logged_when_it_ends(tmp_path: Path) -> None:
    """A run's verdict compares the controller's switch ends with the OCS app's log: a switch
    that ends while the service stops must still be logged (it was dropped once)."""
    job = JobSpec.rail_optimized("j", 2, 1, 1, [CommGroup("a", "dp", (0, 1))])
    driver = GatedDriver(job.ports_by_rail, 5.0)
    svc = ControllerService(driver, event_log=EventLog(tmp_path / "events.jsonl", keep=True))
    svc.start()
    shims = [Shim(svc.endpoint, "j", r) for r in (0, 1)]
    try:
        svc.register_job(job)
        for shim in shims:
            threading.Thread(target=lambda s=shim: s.collective("a").__enter__(),
                             daemon=True).start()
        wait_for(lambda: len(driver.requests) == 1, what="group a's switch")
        stopper = threading.Thread(target=svc.stop, daemon=True)
        stopper.start()
        wait_for(svc._draining.is_set, what="the service's loop leaving its main loop")
        driver.gate.set()
        stopper.join(30)
        assert not stopper.is_alive()
        kinds = [e["event"] for e in read_events(tmp_path / "events.jsonl")]
        assert kinds.count("reconfig_start") == kinds.count("reconfig_end") == 1
    finally:
        driver.gate.set()
        for shim in shims:
            shim.close()
        svc.stop()


def test_heartbeat_reads_pongs_each_interval_and_close_does_not_wait_for_the_next() -> None:
    job = JobSpec.rail_optimized("j", 2, 1, 1, [CommGroup("g", "dp", (0, 1))])
    with ControllerService(SimOcsDriver(job.ports_by_rail, 0.0)) as svc:
        svc.register_job(job)
        shim = Shim(svc.endpoint, "j", 0, heartbeat_interval_s=0.1)
        t0 = shim._last_pong
        wait_for(lambda: shim._last_pong > t0 + 0.3, what="pongs read over several intervals")
        shim.close()
        slow = Shim(svc.endpoint, "j", 1, heartbeat_interval_s=60.0)
        t_close = time.monotonic()
        slow.close()  # the heartbeat thread sleeps on the close event, not out its interval
        assert time.monotonic() - t_close < 5.0


def test_rail_state_ungated_calls_stay_silent_and_predictions_provision(
        tmp_path: Path) -> None:
    """Rail-state over the protocol: an ungated call takes its number without a message; the
    predictions of both members (``predict`` messages) serve a pipeline call, whose real asks
    are then acknowledged without waiting for a switch."""
    groups = [CommGroup("A", "fsdp", (0, 1)), CommGroup("B", "fsdp", (2, 3)),
              CommGroup("X", "pp", (0, 2), "pairs"), CommGroup("Y", "pp", (1, 3), "pairs")]
    job = JobSpec.rail_optimized("j", 4, 1, 1, groups, stages={0: 0, 1: 0, 2: 1, 3: 1})
    driver = SimOcsDriver({**job.ports_by_rail, 1: (1, 2, 3), 2: (1, 2, 3)}, 5.0,
                          mode_by_rail={0: "electrical"})
    svc = ControllerService(driver, event_log=EventLog(tmp_path / "events.jsonl", keep=True),
                            config=CoreConfig(provisioning=True, semantics="rail-state"))
    with svc, Shim(svc.endpoint, "j", 0, ack_timeout_s=10) as s0, \
            Shim(svc.endpoint, "j", 2, ack_timeout_s=10) as s2:
        svc.register_job(job)
        with s0.collective("A", gated=False) as grant:
            assert (grant.seq, grant.reconfigured) == (0, False)
        s0.predict("X", 0, "send", 1024, "pp")
        s2.predict("X", 0, "recv", 1024, "pp")
        wait_for(lambda: any(e["event"] == "provisioned" and e["group"] == "X"
                             for e in svc.events.records), what="X provisioned")
        first, second = grant_in_thread(s0, "X"), grant_in_thread(s2, "X")
        assert not first(10).reconfigured and not second(10).reconfigured
    intents = [e for e in svc.events.records if e["event"] == "intent"]
    assert sorted((e["rank"], e["group"]) for e in intents) == [(0, "X"), (2, "X")]
    assert svc.core.counters["bit_flips"] == 2  # bits 0 and 1 set, once


def test_a_waited_prediction_is_answered_once_its_call_may_run(tmp_path: Path) -> None:
    """``predict`` with ``answer`` (the phase barrier under provisioning, as the artifact's
    blocking provisioning request): the first member's wait is not answered while the call
    still needs the other member's ask and a 0.3 s switch; both are answered once the switch is
    done (``OpusCore.call_ready``, the simulator's test), and a prediction of a call already
    lit is answered at once."""
    groups = [CommGroup("A", "fsdp", (0, 1)), CommGroup("B", "fsdp", (2, 3)),
              CommGroup("X", "pp", (0, 2), "pairs"), CommGroup("Y", "pp", (1, 3), "pairs")]
    job = JobSpec.rail_optimized("j", 4, 1, 1, groups, stages={0: 0, 1: 0, 2: 1, 3: 1})
    driver = SimOcsDriver({**job.ports_by_rail, 1: (1, 2, 3), 2: (1, 2, 3)}, 300.0,
                          mode_by_rail={0: "electrical"})
    svc = ControllerService(driver, event_log=EventLog(tmp_path / "events.jsonl", keep=True),
                            config=CoreConfig(provisioning=True, semantics="rail-state"))
    with svc, Shim(svc.endpoint, "j", 0, ack_timeout_s=10) as s0, \
            Shim(svc.endpoint, "j", 2, ack_timeout_s=10) as s2:
        svc.register_job(job)
        answered: list[float] = []
        t = threading.Thread(target=lambda: (s0.predict("X", 0, "send", 1024, "pp", wait=True),
                                             answered.append(time.monotonic())), daemon=True)
        t0 = time.monotonic()
        t.start()
        wait_for(lambda: any(e["event"] == "speculative_intent" and e["rank"] == 0
                             for e in svc.events.records), what="rank 0's prediction")
        assert t.is_alive()  # the call still needs rank 2
        s2.predict("X", 0, "recv", 1024, "pp", wait=True)
        t.join(5)
        assert answered and answered[0] - t0 >= 0.29  # after the switch
        provisioned = [e for e in svc.events.records if e["event"] == "provisioned"]
        assert [e["group"] for e in provisioned] == ["X"]
        t1 = time.monotonic()
        s0.predict("X", 0, "send", 1024, "pp", wait=True)  # lit now
        assert time.monotonic() - t1 < 0.25
