"""The wire analysis (:mod:`testbed.metrics.wire`) on made-up captures: forwarding from frame
heads, dark periods bracketed by crossings and drops, early light, non-peer frames, lost frames
and the app's agreement, each from the capture alone."""

from __future__ import annotations

import struct
from collections.abc import Callable
from pathlib import Path

import pytest

from testbed.metrics.darktime import ExpectedDelay
from testbed.metrics.wire import (
    Commanded,
    Frame,
    PortMap,
    WireCheck,
    agreement,
    commanded_switches,
    forwarding,
    lost_frames,
    non_peer,
    read_frames,
    wire_switches,
)

RAIL = 0
MS = 1e-3


def _frames(port_in: int, port_out: int | None, t_s: float, n: int, *, ipv4: bool = False,
            transit_s: float = 20e-6) -> list[Frame]:
    """A frame entering at ``port_in`` at ``t_s`` and, unless ``port_out`` is None, leaving at
    ``port_out`` ``transit_s`` later; ``n`` makes its head unique."""
    ethertype = b"\x08\x00" if ipv4 else b"\x88\xb5"
    head = b"\xff" * 6 + bytes([2, 15, 0, port_in, 0, 1]) + ethertype + n.to_bytes(8, "big")
    out = [Frame(t_s, RAIL, port_in, True, head)]
    if port_out is not None:
        out.append(Frame(t_s + transit_s, RAIL, port_out, False, head))
    return out


def _stream(port: int, peer_of: Callable[[float], int | None], t0: float, t1: float,
            step: float, start: int) -> list[Frame]:
    """Frames from ``port`` every ``step`` s, each to ``peer_of(t)`` (None: dropped)."""
    frames, k, t = [], start, t0
    while t < t1:
        frames += _frames(port, peer_of(t), t, k)
        k += 1
        t += step
    return frames


SWITCH = Commanded(RAIL, 10 * MS, 21 * MS, frozenset({frozenset({1, 2})}),
                   frozenset({frozenset({1, 3})}))
SETUP = Commanded(RAIL, 0.0, 0.5 * MS, frozenset(), frozenset({frozenset({1, 2})}))


def _capture(dark_s: float, dark_at_s: float = 10.2 * MS, step_s: float = 0.5 * MS
             ) -> list[Frame]:
    """Port 1 streams every ``step_s``; its circuit to 2 goes dark at ``dark_at_s`` and its
    circuit to 3 lights ``dark_s`` later."""
    t_dark = dark_at_s
    t_light = t_dark + dark_s

    def peer(t: float) -> int | None:
        if t < t_dark:
            return 2
        return 3 if t >= t_light else None

    return _stream(1, peer, 1 * MS, 40 * MS, step_s, 0)


def test_forwarding_matches_heads_and_finds_drops() -> None:
    frames = _frames(1, 2, 0.001, 1) + _frames(1, None, 0.002, 2) + _frames(2, 1, 0.003, 3)
    crossings, dropped, unmatched = forwarding(frames)
    assert [(c.src, c.dst) for c in crossings] == [(1, 2), (2, 1)]
    assert crossings[0].t_s == 0.001  # the circuit carried it when it entered
    assert [f.t_s for f in dropped] == [0.002]
    assert unmatched == 0


def test_dark_period_is_bracketed_by_the_last_old_and_first_new_frame() -> None:
    crossings, dropped, _ = forwarding(_capture(10 * MS))
    (w,) = wire_switches(crossings, dropped, [SWITCH])
    assert w.measured and w.port == 1
    assert w.dark_lower_s is not None and w.dark_upper_s is not None
    assert w.dark_lower_s <= 10 * MS <= w.dark_upper_s
    assert w.dark_upper_s - w.dark_lower_s <= 2 * 0.5 * MS + 0.1 * MS  # a probe step a side
    assert abs((w.t_light_s or 0) - (w.t_dark_s or 0) - 10 * MS) <= 0.5 * MS


def test_early_light_is_certain_only_when_even_the_upper_bound_is_short() -> None:
    expected = ExpectedDelay(10.0)
    for dark_ms, early in ((10.0, False), (5.0, True)):
        crossings, dropped, _ = forwarding(_capture(dark_ms * MS))
        check = WireCheck(expected, tuple(wire_switches(crossings, dropped, [SWITCH])))
        assert bool(check.early()) is early, dark_ms
        assert bool(check.run_faults()) is early
        assert not check.timing_faults()


def test_light_too_soon_after_the_request_is_early_without_an_old_circuit() -> None:
    lit = Commanded(RAIL, 10 * MS, 21 * MS, frozenset(), frozenset({frozenset({1, 3})}))
    frames = _frames(1, 3, 13 * MS, 1)  # 3 ms after the request, configured 10 ms
    crossings, dropped, _ = forwarding(frames)
    check = WireCheck(ExpectedDelay(10.0), tuple(wire_switches(crossings, dropped, [lit])))
    assert len(check.early()) == 1
    assert not check.switches[0].measured


def test_frames_on_an_uncommanded_circuit_are_non_peer() -> None:
    frames = (_frames(1, 2, 5 * MS, 1)  # {1, 2} lit from the set-up
              + _frames(1, 2, 30 * MS, 2)  # after its removal was confirmed (21 ms)
              + _frames(1, 4, 5 * MS, 3))  # never commanded
    crossings, _dropped, _ = forwarding(frames)
    bad = non_peer(crossings, [SETUP, SWITCH])
    assert sorted((x.src, x.dst, round(x.t_s * 1e3)) for x in bad) == [(1, 2, 30), (1, 4, 5)]


def test_ipv4_drops_outside_a_switch_are_lost_and_probe_drops_are_not() -> None:
    frames = (_frames(1, None, 15 * MS, 1, ipv4=True)  # inside the switch: its dark period
              + _frames(1, None, 30 * MS, 2, ipv4=True)  # after it: lost
              + _frames(1, None, 31 * MS, 3))  # a probe with no circuit: expected
    _c, dropped, _ = forwarding(frames)
    assert [round(f.t_s * 1e3) for f in lost_frames(dropped, [SETUP, SWITCH])] == [30]


def test_agreement_flags_an_app_record_outside_the_wires_bounds() -> None:
    crossings, dropped, _ = forwarding(_capture(10 * MS))
    check = WireCheck(ExpectedDelay(10.0), tuple(wire_switches(crossings, dropped, [SWITCH])))
    t_dark = 10.2 * MS - 0.1 * MS
    honest = [{"event": "light", "rail": RAIL, "t_dark_s": t_dark,
               "t_light_s": t_dark + 10.3 * MS}]
    slow_to_confirm = [{"event": "light", "rail": RAIL, "t_dark_s": t_dark,
                        "t_light_s": t_dark + 20 * MS}]
    too_short = [{"event": "light", "rail": RAIL, "t_dark_s": t_dark,
                  "t_light_s": t_dark + 5 * MS}]
    assert agreement(check, honest).outside == 0
    # a late confirmation is reported, not judged (the late-light bound takes the wire's)
    assert agreement(check, slow_to_confirm).longer
    assert not agreement(check, slow_to_confirm).timing_fault()
    # a record shorter than the wire saw dark is a lie, or a switch that read its ports late
    assert agreement(check, too_short).shorter and agreement(check, too_short).timing_fault()


def test_agreement_takes_the_app_record_nearest_the_wires_estimate_even_after_it() -> None:
    # probes every 2 ms: the last old frame at 9 ms, the first drop at 11 ms, so the wire's
    # estimated start (10 ms) precedes the app's stamp (10.15 ms, before the real 10.2 ms)
    crossings, dropped, _ = forwarding(_capture(10 * MS, step_s=2 * MS))
    check = WireCheck(ExpectedDelay(10.0), tuple(wire_switches(crossings, dropped, [SWITCH])))
    (w,) = check.switches
    assert w.t_dark_s is not None and w.t_dark_s < 10.15 * MS
    previous = {"event": "light", "rail": RAIL, "t_dark_s": -90 * MS, "t_light_s": -79.7 * MS}
    too_short = {"event": "light", "rail": RAIL, "t_dark_s": 10.15 * MS,
                 "t_light_s": 15.15 * MS}
    # matched to the rail's previous switch, the short record would pass unseen
    assert agreement(check, [previous, too_short]).shorter


def test_commanded_switches_pair_starts_with_ends() -> None:
    events = [{"event": "reconfig_start", "t_s": 1.0, "decision": 7, "rail": 0,
               "add": [[1, 3]], "remove": [[1, 2]]},
              {"event": "reconfig_start", "t_s": 1.1, "decision": 8, "rail": 0, "add": [],
               "remove": []},
              {"event": "reconfig_end", "t_s": 1.2, "decision": 7, "rail": 0}]
    (c,) = commanded_switches(events)
    assert (c.t_request_s, c.t_end_s, c.ports) == (1.0, 1.2, {1, 2, 3})


def test_non_peer_frames_are_a_timing_fault_with_the_switchs_hold() -> None:
    frames = _frames(1, 4, 5 * MS, 1, transit_s=20 * MS)  # never commanded
    crossings, dropped, _ = forwarding(frames)
    check = WireCheck(ExpectedDelay(10.0), tuple(wire_switches(crossings, dropped, [SETUP])),
                      tuple(non_peer(crossings, [SETUP])))
    (text,) = check.timing_faults()
    assert "port 1 -> 4" in text and "held 20.0 ms" in text
    assert not check.run_faults()


PCAP_MAGIC = {1e9: 0xA1B23C4D, 1e6: 0xA1B2C3D4}  # nanosecond and microsecond files


def _write_pcap(path: Path, resolution: float, records: list[tuple[int, int, bytes]]) -> None:
    """A classic pcap file of Ethernet frames: (seconds, fraction in ``resolution``, data)."""
    out = struct.pack("<IHHiIII", PCAP_MAGIC[resolution], 2, 4, 0, 0, 64, 1)
    for sec, frac, data in records:
        out += struct.pack("<IIII", sec, frac, len(data), len(data)) + data
    path.write_bytes(out)


@pytest.mark.parametrize("resolution", [1e9, 1e6])
def test_capture_times_follow_the_files_resolution_in_the_first_millisecond_too(
        tmp_path: Path, resolution: float) -> None:
    # a nanosecond fraction below 10^6 (the first millisecond of a second) once read as
    # microseconds, a frame up to a second late: the "frames at a non-peer" of docs/wire.md
    mac = bytes([2, 15, 0, 1, 0, 1])
    head = b"\xff" * 6 + mac + b"\x88\xb5"
    sec = 1_796_666_059
    early, later = (290_000, 5_000_000) if resolution == 1e9 else (290, 5_000)
    _write_pcap(tmp_path / "p1.pcap", resolution, [(sec, early, head + b"\x01" * 46),
                                                   (sec, later, head + b"\x02" * 46)])
    frames = read_frames(tmp_path, [PortMap(RAIL, 1, "p1", mac)])
    assert [f.head[14] for f in frames] == [1, 2]
    assert frames[0].t_s == pytest.approx(sec + 0.29 * MS, abs=1e-7)
    assert frames[1].t_s == pytest.approx(sec + 5 * MS, abs=1e-7)
    assert all(f.entered for f in frames)
