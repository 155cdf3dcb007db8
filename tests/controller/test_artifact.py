"""The artifact's line protocol, pure: parsing, the request encoding, the address rule and the
mapping of comms and requests to this job's groups (:mod:`controller.artifact`)."""

from __future__ import annotations

import pytest

from controller.artifact import (
    PP_INTERVAL,
    ArtifactBook,
    ArtifactError,
    CommLine,
    ConfigReqLine,
    ServerMap,
    check_listen_host,
    decode_request,
    encode_request,
    parse_line,
)
from controller.job import CommGroup, JobSpec

# 4 servers x 2 GPUs, one rail per local GPU index; servers 0-1 are stage 0, servers 2-3 stage 1
SERVERS = ["10.0.0.1", "10.0.0.2", "10.0.0.3", "10.0.0.4"]
STAGES = {r: 0 if r < 4 else 1 for r in range(8)}
GROUPS = [CommGroup(f"dp{s}l{lr}", "fsdp", (4 * s + lr, 4 * s + 2 + lr))
          for s in (0, 1) for lr in (0, 1)]
GROUPS += [CommGroup(f"pp{lr}a", "pp", (lr, 4 + lr), "pairs") for lr in (0, 1)]
GROUPS += [CommGroup(f"pp{lr}b", "pp", (2 + lr, 6 + lr), "pairs") for lr in (0, 1)]
GROUPS += [CommGroup(f"ring{lr}", "pp", (lr, 4 + lr)) for lr in (0, 1)]  # same ranks as a pair


def job() -> JobSpec:
    return JobSpec.rail_optimized("j", 8, 2, 1, GROUPS, stages=STAGES)


def book() -> ArtifactBook:
    return ArtifactBook(job(), ServerMap(SERVERS), gpus_per_server=2)


def test_parse_lines() -> None:
    assert parse_line("COMM;ABC123,2,1") == CommLine("ABC123", 2, 1)
    assert parse_line("CONFIG_REQ;ABC123,11,1000003\r") == ConfigReqLine("ABC123", 11, 1000003)
    assert parse_line("") is None and parse_line("\r") is None
    for bad in ("COMM", "COMM;A,2", "COMM;A,2,1,0", "COMM;A,x,1", "COMM;A,0,1", "COMM;,2,1",
                "COMM;A B,2,1", "CONFIG_REQ;A,-1,3", "CONFIG_REQ;A,1,9999999999", "HELLO;A,1,1",
                "comm;A,2,1"):
        with pytest.raises(ArtifactError):
            parse_line(bad)


def test_decode_as_the_artifact_controller() -> None:
    # a pipeline request: backend 1 + 10 g, counter g * 1e6 + n (the shim's topowrite)
    assert decode_request(11, PP_INTERVAL + 7) == decode_request(*encode_request(True, 1, 7))
    dec = decode_request(21, 2 * PP_INTERVAL + 3)
    assert (dec.pp, dec.stage, dec.seq) == (True, 2, 3)
    # a data-parallel request: the counter carries the stage
    dec = decode_request(2, PP_INTERVAL + 18)
    assert (dec.pp, dec.stage, dec.seq) == (False, 1, 18)
    assert decode_request(10, 5) == decode_request(*encode_request(False, 0, 5, backend=10))
    with pytest.raises(ArtifactError, match="pipeline group 1 but counter"):
        decode_request(11, 2 * PP_INTERVAL)  # the artifact throws here
    with pytest.raises(ArtifactError):
        encode_request(False, 0, PP_INTERVAL)


def test_listen_address_rule() -> None:
    assert check_listen_host("127.0.0.1") == "127.0.0.1"
    assert check_listen_host("localhost") == "127.0.0.1"
    assert check_listen_host("::1") == "::1"
    with pytest.raises(ArtifactError, match="no authentication"):
        check_listen_host("10.1.2.3")
    assert check_listen_host("10.1.2.3", trusted=["10.1.2.3"]) == "10.1.2.3"
    with pytest.raises(ArtifactError, match="every interface"):
        check_listen_host("0.0.0.0", trusted=["0.0.0.0"])
    with pytest.raises(ArtifactError, match="not an IP address"):
        check_listen_host("controller.example")


def test_server_map() -> None:
    m = ServerMap(["10.0.0.1", ["10.0.1.1", "10.0.1.2"]])
    assert [m.server_of(ip) for ip in ("10.0.0.1", "10.0.1.2", "10.0.9.9", "junk")] == [
        0, 1, None, None]
    with pytest.raises(ArtifactError, match="servers 0 and 1"):
        ServerMap(["10.0.0.1", "10.0.0.1"])


def checkin(b: ArtifactBook, comm: str, ranks: list[int], nranks: int | None = None
            ) -> list[tuple[int, bytes]]:
    """Check ``ranks`` in (connection id = rank) from their servers' addresses."""
    out: list[tuple[int, bytes]] = []
    for r in ranks:
        out = b.on_comm(r, SERVERS[r // 2], CommLine(comm, nranks or len(ranks), r % 2))
    return out


def test_checkin_acks_every_member_once_complete_with_the_domain() -> None:
    b = book()
    assert b.on_comm(0, SERVERS[0], CommLine("DP", 2, 0)) == []
    assert b.on_comm(2, SERVERS[1], CommLine("DP", 2, 0)) == [
        (0, b"CHECKIN_ACK;DP,0\n"), (2, b"CHECKIN_ACK;DP,0\n")]
    assert checkin(b, "TP", [0, 1]) == [(0, b"CHECKIN_ACK;TP,1\n"), (1, b"CHECKIN_ACK;TP,1\n")]
    with pytest.raises(ArtifactError, match="not in server_ips"):
        b.on_comm(9, "10.9.9.9", CommLine("X", 2, 0))
    with pytest.raises(ArtifactError, match="exceeds the 2 rails"):
        b.on_comm(9, SERVERS[0], CommLine("X", 2, 2))
    with pytest.raises(ArtifactError, match="all 2 ranks checked in already"):
        b.on_comm(4, SERVERS[2], CommLine("DP", 2, 0))
    with pytest.raises(ArtifactError, match="first check-in said 2"):
        b.on_comm(4, SERVERS[2], CommLine("DP", 3, 0))


def test_requests_map_to_the_jobs_groups() -> None:
    b = book()
    checkin(b, "DP1", [5, 7])
    checkin(b, "PP", [1, 5])
    req = b.on_config_req(7, ConfigReqLine("DP1", 2, PP_INTERVAL + 4))
    assert (req.conn, req.intent.rank, req.intent.group_id, req.intent.seq, req.intent.axis) == (
        7, 7, "dp1l1", 4, "fsdp")
    # the pipeline request names the pairs group, not the ring of the same two ranks
    req = b.on_config_req(1, ConfigReqLine("PP", 11, PP_INTERVAL + 0))
    assert (req.intent.rank, req.intent.group_id, req.intent.seq) == (1, "pp1a", 0)
    with pytest.raises(ArtifactError, match="counter says stage 0, but the comm's ranks"):
        b.on_config_req(5, ConfigReqLine("DP1", 2, 4))
    # the pipeline ring (never asked by the artifact's shim; port-exact gates it) asks as a
    # data-parallel request, both ranks with the ring's first stage
    for r in (1, 5):
        req = b.on_config_req(r, ConfigReqLine("PP", 2, 9))
        assert (req.intent.rank, req.intent.group_id, req.intent.seq) == (r, "ring1", 9)
    with pytest.raises(ArtifactError, match="no group of pipeline stages 1-2"):
        b.on_config_req(5, ConfigReqLine("PP", 21, 2 * PP_INTERVAL))
    with pytest.raises(ArtifactError, match="that nobody checked in"):
        b.on_config_req(5, ConfigReqLine("NOPE", 2, 0))
    with pytest.raises(ArtifactError, match="did not check it in"):
        b.on_config_req(3, ConfigReqLine("DP1", 2, PP_INTERVAL))
    b.on_comm(0, SERVERS[0], CommLine("HALF", 2, 0))
    with pytest.raises(ArtifactError, match="before all its 2 ranks"):
        b.on_config_req(0, ConfigReqLine("HALF", 2, 0))


def test_a_comm_without_a_group_is_refused_by_name() -> None:
    b = book()
    checkin(b, "WORLD", list(range(8)))  # the default process group: checks in, never maps
    with pytest.raises(ArtifactError, match="no group of ranks") as exc:
        b.on_config_req(0, ConfigReqLine("WORLD", 0, 0))
    assert exc.value.code == "unknown_group"
