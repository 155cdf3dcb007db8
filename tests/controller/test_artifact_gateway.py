"""The artifact's line protocol served beside the controller service, driven by a client
written from the protocol (:mod:`controller.artifact_client`): eight simulated ranks on four
"servers" (each its own loopback address, as ``SERVER_IPS`` lists them), data-parallel and
pipeline requests under both switching models, malformed lines that get no answer."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from controller.artifact import PP_INTERVAL, comm_id
from controller.artifact_client import ArtifactConnection
from controller.artifact_gateway import ArtifactGateway
from controller.core import CoreConfig
from controller.drivers.sim import SimOcsDriver
from controller.events import EventLog
from controller.job import CommGroup, JobSpec
from controller.railstate import shadow_rails
from controller.service import ControllerService

DELAY_MS = 40.0
SERVERS = [f"127.0.0.{s + 1}" for s in range(4)]  # Linux answers all of 127/8 on lo
STAGES = {r: 0 if r < 4 else 1 for r in range(8)}
# 4 servers x 2 GPUs, a rail per local index; servers 0-1 hold stage 0, servers 2-3 stage 1
GROUPS = [CommGroup(f"dp{s}l{lr}", "fsdp", (4 * s + lr, 4 * s + 2 + lr))
          for s in (0, 1) for lr in (0, 1)]
GROUPS += [CommGroup(f"pp{lr}a", "pp", (lr, 4 + lr), "pairs") for lr in (0, 1)]
GROUPS += [CommGroup(f"pp{lr}b", "pp", (2 + lr, 6 + lr), "pairs") for lr in (0, 1)]


def wait_for(cond: Callable[[], bool], timeout_s: float = 15.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.01)


def job() -> JobSpec:
    return JobSpec.rail_optimized("j", 8, 2, 1, GROUPS, stages=STAGES)


def driver_for(semantics: str, j: JobSpec) -> SimOcsDriver:
    if semantics == "port-exact":
        return SimOcsDriver(j.ports_by_rail, DELAY_MS)
    shadows = shadow_rails(2, 2)  # bits of 2 data rails x 2 stages, on small OCS rails
    return SimOcsDriver({**j.ports_by_rail, **dict.fromkeys(shadows, (1, 2, 3))}, DELAY_MS,
                        mode_by_rail={0: "electrical", 1: "electrical"})


class Ranks:
    """Eight ranks' connections (rank r on server r // 2, local rank r % 2)."""

    def __init__(self, gateway: ArtifactGateway) -> None:
        self.conns = {r: ArtifactConnection("127.0.0.1", gateway.port, source_ip=SERVERS[r // 2])
                      for r in range(8)}
        self.groups = {g.group_id: g for g in GROUPS}

    def checkin_all(self) -> None:
        for r, conn in self.conns.items():
            for g in GROUPS:
                if r in g.ranks:
                    conn.checkin(comm_id("j", g.group_id), len(g.ranks), r % 2)
            conn.checkin("WORLD", 8, r % 2)  # the default group: checked in, never asks
        for r, conn in self.conns.items():
            for g in GROUPS:
                if r in g.ranks:
                    assert conn.wait_checkin(comm_id("j", g.group_id), 10) == 0
            assert conn.wait_checkin("WORLD", 10) == 0

    def ask(self, group: str, counter: int, backend: int = 2) -> dict[int, tuple[int, float]]:
        """Every member sends the request; returns rank -> (ticket, time sent)."""
        comm = comm_id("j", group)
        return {r: (self.conns[r].request(comm, backend, counter), time.time())
                for r in self.groups[group].ranks}

    def acks(self, group: str, sent: dict[int, tuple[int, float]]) -> dict[int, float]:
        comm = comm_id("j", group)
        return {r: self.conns[r].wait_ack(comm, t, 10) for r, (t, _sent) in sent.items()}

    def close(self) -> None:
        for conn in self.conns.values():
            conn.close()


@pytest.fixture(params=["port-exact", "rail-state"])
def served(request: pytest.FixtureRequest, tmp_path: Path
           ) -> Iterator[tuple[str, ControllerService, ArtifactGateway, Ranks]]:
    semantics = request.param
    j = job()
    svc = ControllerService(driver_for(semantics, j),
                            event_log=EventLog(tmp_path / "events.jsonl", keep=True),
                            config=CoreConfig(semantics=semantics), heartbeat_timeout_s=2.0)
    with svc:
        svc.register_job(j)
        with ArtifactGateway(svc, j, server_ips=SERVERS, gpus_per_server=2, port=0) as gw:
            ranks = Ranks(gw)
            try:
                ranks.checkin_all()
                yield semantics, svc, gw, ranks
            finally:
                ranks.close()
        assert gw.error is None and svc.error is None


def light_of(events: list[dict[str, Any]], group: str, seq: int) -> float:
    """When the last circuit of ``group``'s call ``seq`` lit (-inf: it needed no switch)."""
    decisions = {e["decision"] for e in events if e["event"] == "decision"
                 and e["group"] == group and e["seq"] == seq}
    return max((e["t_light_s"] for e in events if e["event"] == "reconfig_end"
                and e["decision"] in decisions), default=float("-inf"))


def test_dp_and_pp_requests_are_acked_after_the_light(
        served: tuple[str, ControllerService, ArtifactGateway, Ranks]) -> None:
    semantics, svc, gw, ranks = served
    events = svc.events.records
    # data-parallel requests of both stages (counter = stage * 1e6 + call number)
    sent = {g: ranks.ask(g, stage * PP_INTERVAL) for g, stage in
            (("dp0l0", 0), ("dp0l1", 0), ("dp1l0", 1), ("dp1l1", 1))}
    acked = {g: ranks.acks(g, s) for g, s in sent.items()}
    # then the pipeline pairs (backend 1 + 10 * 1, counter 1e6 + 0), which take the ports
    sent_pp = {g: ranks.ask(g, PP_INTERVAL, backend=11) for g in ("pp0a", "pp1a", "pp0b", "pp1b")}
    acked.update({g: ranks.acks(g, s) for g, s in sent_pp.items()})
    # (the service sends an ack before it writes the events that led to it)
    wait_for(lambda: sum(e["event"] == "ack" for e in events) == 16, what="16 acks logged")
    for g, by_rank in acked.items():
        lit = light_of(events, g, 0)
        if semantics == "rail-state" and g.startswith("pp"):  # a pair joins its rail's switch
            lit = max(lit, *(light_of(events, f"{g[:3]}{x}", 0) for x in "ab"))
        if g.startswith("pp"):
            assert lit > 0, f"{g}: the pipeline call should have switched ({semantics})"
        for r, t_ack in by_rank.items():
            assert t_ack >= lit, f"rank {r}: CONFIG_ACK of {g} before its light"
    intents = sorted((e["rank"], e["group"], e["seq"]) for e in events if e["event"] == "intent")
    assert intents == sorted((r, g.group_id, 0) for g in GROUPS for r in g.ranks)
    assert gw.counters["config_acks"] == 16 and gw.counters["refused"] == 0
    # a rank's next request completed its earlier call (the protocol reports no ends)
    done = {(e["rank"], e["group"]) for e in events if e["event"] == "complete"}
    assert {(r, g) for g in ("dp0l0", "dp1l1") for r in ranks.groups[g].ranks} <= done
    if semantics == "rail-state":
        assert svc.core.counters["bit_flips"] >= 4  # PP set bits 0 and 1 on both rails
    else:
        assert any(e["event"] == "reconfig_end" and e["removed"] for e in events)


def test_malformed_lines_get_no_answer_and_the_service_goes_on(
        served: tuple[str, ControllerService, ArtifactGateway, Ranks]) -> None:
    _semantics, svc, gw, ranks = served
    c0 = ranks.conns[0]
    pp = comm_id("j", "pp0a")
    bad = [b"GARBAGE\n", b"CONFIG_REQ;zz\n", b"COMM;X,two,0\n", b"\xff\xfe\n",
           b"A" * 5000 + b"\n",  # too long
           f"CONFIG_REQ;{pp},11,{2 * PP_INTERVAL}\n".encode(),  # pipeline group 1, counter 2
           b"CONFIG_REQ;WORLD,0,0\n",  # checked in, but no group of the job is all 8 ranks
           b"CONFIG_REQ;NOBODY,2,0\n"]  # never checked in
    for line in bad:
        c0.send_line(line)
    wait_for(lambda: gw.counters["refused"] >= len(bad), what="every bad line refused")
    codes = [r["code"] for r in gw.refused]
    assert codes == ["malformed"] * 6 + ["unknown_group", "unknown_comm"]
    logged = [e for e in svc.events.records if e["event"] == "artifact_refused"]
    assert len(logged) == len(bad)
    # the same connection and every other one are still served
    sent = ranks.ask("pp0a", PP_INTERVAL, backend=11)
    assert set(ranks.acks("pp0a", sent)) == {0, 4}
    assert c0.other == [] and c0.acked == {pp: 1}  # nothing answered the bad lines
    assert not any(e["event"] == "intent" and e["group"] != "pp0a" for e in svc.events.records)


def test_a_closed_connection_completes_its_calls_and_ends_its_session(
        served: tuple[str, ControllerService, ArtifactGateway, Ranks]) -> None:
    _semantics, svc, _gw, ranks = served
    sent = ranks.ask("dp0l0", 0)
    ranks.acks("dp0l0", sent)
    ranks.conns[0].close()
    wait_for(lambda: any(e["event"] == "complete" and e["rank"] == 0 and e["group"] == "dp0l0"
                         for e in svc.events.records), what="rank 0's call completed")


def test_a_failed_switch_is_asked_for_again(tmp_path: Path) -> None:
    """The protocol has no error reply: a call whose switch the OCS refused is asked for again
    by the gateway (as the replayer's own shim does), and answered once it is lit."""
    from controller.drivers.faults import OcsFaults

    j, faults = job(), OcsFaults()
    svc = ControllerService(SimOcsDriver(j.ports_by_rail, DELAY_MS, faults=faults),
                            event_log=EventLog(keep=True))
    with svc:
        svc.register_job(j)
        with ArtifactGateway(svc, j, server_ips=SERVERS, gpus_per_server=2, port=0) as gw:
            ranks = Ranks(gw)
            try:
                ranks.checkin_all()
                faults.refuse(1)
                ranks.acks("dp0l0", ranks.ask("dp0l0", 0))
            finally:
                ranks.close()
    assert faults.refused == 1 and gw.counters["retries"] == 2  # both members' calls
    assert gw.refused == [] and gw.counters["config_acks"] == 2


def test_replayer_shims_predict_once_and_never_ask_for_an_answered_call(tmp_path: Path) -> None:
    """The replayer's artifact shims (:class:`ArtifactRank`): a prediction sends the call's
    request early, the call itself then only waits for its answer; a prediction of a call
    already answered sends nothing (it would get no answer and shift every later one)."""
    import threading

    from controller.artifact_client import ArtifactRank, rank_comms

    j = job()
    svc = ControllerService(driver_for("port-exact", j), event_log=EventLog(keep=True))
    with svc:
        svc.register_job(j)
        with ArtifactGateway(svc, j, server_ips=SERVERS, gpus_per_server=2, port=0) as gw:
            owners = {r: ArtifactRank("127.0.0.1", gw.port, r % 2, rank_comms(j, r),
                                      ack_timeout_s=10, source_ip=SERVERS[r // 2])
                      for r in (0, 2)}
            try:
                for o in owners.values():  # every comm checks in first, as at a job's start
                    o.connection()
                shims = {r: o.shim() for r, o in owners.items()}
                for shim in shims.values():
                    shim.predict("dp0l0", 0)
                grants = {}

                def call(r: int) -> None:
                    with shims[r].collective("dp0l0") as grant:
                        grants[r] = grant

                threads = [threading.Thread(target=call, args=(r,)) for r in shims]
                for t in threads:
                    t.start()
                for t in threads:
                    t.join(15)
                assert {r: g.seq for r, g in grants.items()} == {0: 0, 2: 0}
                for shim in shims.values():
                    shim.predict("dp0l0", 0)  # answered already: nothing is sent
                comm = comm_id("j", "dp0l0")
                assert all(o.connection().asked == {comm: 1} for o in owners.values())
            finally:
                for o in owners.values():
                    o.close()
    assert gw.counters["requests"] == 2 and gw.counters["config_acks"] == 2
    assert gw.refused == []
