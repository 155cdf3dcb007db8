"""The wire check of the two kinds of emulated run it once skipped (issue 37): a failover run,
whose ports change hands when a spare takes a rank over (the port map follows the runner's
``spare_assigned`` record), and the static plane, whose circuits are installed once outside
the controller's log (judged by the one-to-one and lost-frame rules only)."""

from __future__ import annotations

import json
import struct
from pathlib import Path
from typing import Any

from testbed.emulated.runner import rail_spec, wire_skip_reason
from testbed.experiment.config import load_experiment
from testbed.metrics.darktime import ExpectedDelay
from testbed.metrics.wire import (
    PortMap,
    check_wire,
    cut_ports,
    own_macs,
    port_macs,
    standing_circuits,
    wire_text,
)

ROOT = Path(__file__).resolve().parents[2]
RAIL = 0
MS = 1e-3
T0 = 1_796_666_000  # a whole second: the capture's clock


def _mac(host: int) -> bytes:
    return bytes([2, 15, 0, host, 0, 1])


def _hex(mac: bytes) -> str:
    return ":".join(f"{b:02x}" for b in mac)


# ports 1 and 2: ranks 0 and 1 (hosts 0, 1); ports 3 and 4: spares (hosts 2, 3)
PORTS = [PortMap(RAIL, p, f"p{p}", _mac(p - 1), p - 1) for p in (1, 2, 3, 4)]


def _takeover(t_s: float, old: int, new: int, rank: int = 1) -> dict[str, Any]:
    return {"event": "spare_assigned", "t_s": t_s, "identity_t_s": t_s - 2 * MS, "rank": rank,
            "host": new - 1, "failed_host": old - 1, "rail": RAIL, "old_ports": [old],
            "new_ports": [new], "same_server": False}


def test_a_spare_port_answers_to_the_rank_it_took_over_from_the_takeover_on() -> None:
    timeline = port_macs(PORTS, [_takeover(T0 + 1.0, old=2, new=3)])
    assert own_macs(timeline[(RAIL, 3)], T0 + 0.5) == {_mac(2)}  # its own until then
    assert own_macs(timeline[(RAIL, 3)], T0 + 0.999) == {_mac(2), _mac(1)}  # identity moved
    assert own_macs(timeline[(RAIL, 2)], T0 + 2.0) == {_mac(1)}  # the failed host keeps its own
    assert own_macs(timeline[(RAIL, 1)], T0 + 2.0) == {_mac(0)}


def test_a_second_takeover_passes_on_the_ranks_address_not_the_first_spares() -> None:
    timeline = port_macs(PORTS, [_takeover(T0 + 3.0, old=3, new=4),
                                 _takeover(T0 + 1.0, old=2, new=3)])  # in any order
    assert own_macs(timeline[(RAIL, 4)], T0 + 2.0) == {_mac(3)}
    assert own_macs(timeline[(RAIL, 4)], T0 + 3.0) == {_mac(3), _mac(1)}


def test_a_takeover_of_a_port_not_captured_changes_nothing() -> None:
    event = {**_takeover(T0 + 1.0, old=2, new=9)}
    assert port_macs(PORTS, [event]) == port_macs(PORTS, [])


def _write_capture(out: Path, frames: list[tuple[float, int, bytes]]) -> None:
    """``wire.json`` for :data:`PORTS` and a nanosecond pcap per port of (t_s, port, head)."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "wire.json").write_text(json.dumps({
        "probe_interval_ms": 1.0, "kernel_drops": {}, "errors": [],
        "ports": [{"rail": p.rail, "port": p.port, "intf": p.intf, "host": p.host,
                   "mac": _hex(p.mac)} for p in PORTS]}))
    for p in PORTS:
        data = struct.pack("<IHHiIII", 0xA1B23C4D, 2, 4, 0, 0, 64, 1)
        for t_s, port, head in sorted(frames):
            if port == p.port:
                sec = int(t_s)
                frame = head + b"\0" * (60 - len(head))
                data += struct.pack("<IIII", sec, round((t_s - sec) * 1e9), len(frame),
                                    len(frame)) + frame
        (out / f"{p.intf}.pcap").write_bytes(data)


def _cross(t_s: float, src_mac: bytes, port_in: int, port_out: int | None, n: int
           ) -> list[tuple[float, int, bytes]]:
    """A probe frame from ``src_mac`` entering at ``port_in`` and leaving at ``port_out``
    (None: dropped) 20 us later."""
    head = b"\xff" * 6 + src_mac + b"\x88\xb5" + n.to_bytes(8, "big")
    out = [(t_s, port_in, head)]
    if port_out is not None:
        out.append((t_s + 20e-6, port_out, head))
    return out


#: rank 1 (port 2) fails; the spare at port 3 takes it over; the controller moves rank 0's
#: circuit from port 2 to port 3 (10 ms dark)
EVENTS: list[dict[str, Any]] = [
    {"event": "reconfig_start", "decision": 0, "rail": RAIL, "t_s": T0 + 0.0, "add": [[1, 2]]},
    {"event": "reconfig_end", "decision": 0, "rail": RAIL, "t_s": T0 + 0.02},
    _takeover(T0 + 1.0, old=2, new=3),
    {"event": "reconfig_start", "decision": 1, "rail": RAIL, "t_s": T0 + 1.01, "add": [[1, 3]],
     "remove": [[1, 2]]},
    {"event": "reconfig_end", "decision": 1, "rail": RAIL, "t_s": T0 + 1.03},
    {"event": "run_end", "t_s": T0 + 2.0},
]


def _takeover_capture() -> list[tuple[float, int, bytes]]:
    frames: list[tuple[float, int, bytes]] = []
    n = 0
    for k in range(100):  # every 10 ms from both ends of rank 0's circuit
        t = T0 + 0.1 + k * 10 * MS
        dark = T0 + 1.012 <= t < T0 + 1.022
        peer = None if dark else (2 if t < T0 + 1.012 else 3)
        frames += _cross(t, _mac(0), 1, peer, n)
        n += 1
        if t < T0 + 0.9:  # rank 1, until it fails
            frames += _cross(t + 1 * MS, _mac(1), 2, 1, n)
        elif t >= T0 + 1.03:  # rank 1 again, from the spare's port, with its address
            frames += _cross(t + 1 * MS, _mac(1), 3, 1, n)
        n += 1
    return frames


def test_a_takeover_is_followed_on_the_wire_with_no_frame_at_a_non_peer(tmp_path: Path) -> None:
    _write_capture(tmp_path, _takeover_capture())
    check = check_wire(tmp_path, EVENTS, ExpectedDelay(10.0))
    assert check.non_peer == () and check.unmatched_exits == 0 and check.lost == 0
    assert check.takeovers == 1 and check.ports_seen == 3  # port 4's spare sent nothing
    switch = next(w for w in check.switches if w.t_request_s == T0 + 1.01)
    assert switch.measured and switch.port == 1
    assert switch.dark_lower_s is not None and switch.dark_upper_s is not None
    assert switch.dark_lower_s <= 10 * MS <= switch.dark_upper_s + 1e-9
    assert "1 ports taken over by a spare followed" in wire_text(
        {**check.to_summary(), "app_minus_wire_ms": {}})


def test_without_the_takeover_record_the_spares_frames_read_as_leaving_it(
        tmp_path: Path) -> None:
    """What the port map across a takeover is for: the spare answers with the rank's address,
    so without it every frame the spare sends looks like one that left at its port."""
    _write_capture(tmp_path, _takeover_capture())
    events = [e for e in EVENTS if e["event"] != "spare_assigned"]
    assert check_wire(tmp_path, events, ExpectedDelay(10.0)).unmatched_exits > 0


def test_a_frame_from_the_new_holder_at_the_old_holders_port_is_non_peer(
        tmp_path: Path) -> None:
    frames = _takeover_capture() + _cross(T0 + 1.5, _mac(1), 3, 2, 10_000)
    _write_capture(tmp_path, frames)
    check = check_wire(tmp_path, EVENTS, ExpectedDelay(10.0))
    assert [(x.src, x.dst) for x in check.non_peer] == [(3, 2)]


#: the static plane's record: circuit {1, 2} installed before the ranks started
STATIC = {"t_request_s": T0 + 0.0, "t_end_s": T0 + 0.01,
          "rails": [{"rail": RAIL, "circuits": [[1, 2]]}]}


def test_a_static_install_is_judged_one_to_one_and_times_no_switch(tmp_path: Path) -> None:
    frames = [f for k in range(50) for f in _cross(T0 + 0.1 + k * 10 * MS, _mac(0), 1, 2, k)]
    frames += _cross(T0 + 0.3, _mac(2), 3, 4, 999)  # two spares' ports lit by nobody
    _write_capture(tmp_path, frames)
    standing = standing_circuits(STATIC)
    assert [(c.rail, sorted(map(sorted, c.added)), c.removed) for c in standing] == [
        (RAIL, [[1, 2]], frozenset())]
    events = [{"event": "job_registered", "t_s": T0 + 0.05}, {"event": "x", "t_s": T0 + 1.0}]
    check = check_wire(tmp_path, events, ExpectedDelay(1.0), standing=standing)
    assert check.switches == () and check.standing == 1 and check.commanded == 0
    assert [(x.src, x.dst) for x in check.non_peer] == [(3, 4)]
    text = wire_text({**check.to_summary(), "app_minus_wire_ms": {}})
    assert text.startswith("watched 1 circuits installed before the ranks started (no switch "
                           "to time) on 4 of 4 ports"), text
    assert "1 frames at a non-peer" in text


def test_the_static_plane_and_failover_runs_are_wire_checked() -> None:
    static = load_experiment(ROOT / "examples" / "tiny.yaml").replace(mode="on-demand",
                                                                      wire_check=True)
    static = static.replace(control_plane="static")
    assert static.rival_plane
    assert wire_skip_reason(static, rail_spec(static, 2, 2, 8.0)) is None
    failover = load_experiment(ROOT / "examples" / "failover.yaml").replace(wire_check=True)
    spec = rail_spec(failover, 4, 1, 8.0, spare_servers=1)
    assert spec.spares and failover.faults
    assert wire_skip_reason(failover, spec) is None


def test_a_link_cut_by_a_fault_is_followed_to_the_ranks_port_and_across_a_takeover() -> None:
    events = [
        {"event": "fault", "t_s": T0 + 1.0, "kind": "link_down", "rank": 1},
        _takeover(T0 + 2.0, old=2, new=3),
        {"event": "ranks_resumed", "t_s": T0 + 2.1, "policy": "spares"},
        {"event": "fault", "t_s": T0 + 3.0, "kind": "link_down", "rank": 1},  # on the spare
        {"event": "fault", "t_s": T0 + 4.0, "kind": "port_failed", "rail": RAIL, "port": 1},
        {"event": "fault", "t_s": T0 + 5.0, "kind": "kill", "rank": 0},  # no link cut
    ]
    assert cut_ports(PORTS, events) == {(RAIL, 2): [(T0 + 1.0, float("inf"))],
                                        (RAIL, 3): [(T0 + 3.0, float("inf"))],
                                        (RAIL, 1): [(T0 + 4.0, float("inf"))]}
    restart = [events[0], {"event": "ranks_resumed", "t_s": T0 + 1.5, "policy": "restart"}]
    assert cut_ports(PORTS, restart) == {(RAIL, 2): [(T0 + 1.0, T0 + 1.5)]}


def test_a_dark_period_is_not_timed_across_a_cut_link(tmp_path: Path) -> None:
    """Rank 1's link is cut 0.5 s before the controller moves rank 0's circuit to the spare:
    rank 0's frames to it look dropped from the cut on, which is no dark period of the OCS."""
    frames = [f for f in _takeover_capture() if not (
        T0 + 0.5 <= f[0] < T0 + 1.012 and f[1] == 2)]  # nothing leaves at the cut port
    _write_capture(tmp_path, frames)
    events = [*EVENTS, {"event": "fault", "t_s": T0 + 0.5, "kind": "link_down", "rank": 1}]
    check = check_wire(tmp_path, events, ExpectedDelay(10.0))
    switch = next(w for w in check.switches if w.t_request_s == T0 + 1.01)
    assert not switch.measured and switch.observed  # its first light only
    uncut = check_wire(tmp_path, EVENTS, ExpectedDelay(10.0))
    wrong = next(w for w in uncut.switches if w.t_request_s == T0 + 1.01)
    assert wrong.dark_lower_s is not None and wrong.dark_lower_s > 0.4  # the cut read as dark
