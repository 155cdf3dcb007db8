"""emulator.probe: frame parsing and the pure analysis helpers (no sockets)."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from emulator.probe import (
    MAGIC,
    PROBE_ETHERTYPE,
    BusyPort,
    Frame,
    dark_gaps_s,
    load_frames,
    missing_seqs,
    parse_frame,
    probe_arrivals,
    send_many,
    turns_per_wakeup,
)

DST = bytes.fromhex("ffffffffffff")
SRC = bytes.fromhex("020f00030101")


def probe_bytes(stream: int, seq: int, magic: bytes = MAGIC, pad_to: int = 60) -> bytes:
    """A probe frame as ``send`` builds it: header, payload, zero padding."""
    header = DST + SRC + PROBE_ETHERTYPE.to_bytes(2, "big")
    body = header + struct.pack("!4sIQd", magic, stream, seq, 1234.5)
    return body + b"\0" * max(0, pad_to - len(body))


def test_parse_probe_frame_carries_stream_and_seq() -> None:
    f = parse_frame(probe_bytes(7, 123456789012), 5.5, False)
    assert (f.stream, f.seq) == (7, 123456789012)
    assert f.ethertype == PROBE_ETHERTYPE
    assert f.src == "02:0f:00:03:01:01"
    assert f.dst == "ff:ff:ff:ff:ff:ff"
    assert f.length == 60
    assert f.t_s == 5.5 and f.outgoing is False


def test_parse_outgoing_flag_is_kept() -> None:
    assert parse_frame(probe_bytes(1, 1), 0.0, True).outgoing is True


def test_parse_probe_ethertype_with_wrong_magic_has_no_seq() -> None:
    f = parse_frame(probe_bytes(1, 2, magic=b"NOPE"), 0.0, False)
    assert f.ethertype == PROBE_ETHERTYPE
    assert f.stream is None and f.seq is None


def test_parse_truncated_probe_frame_has_no_seq() -> None:
    data = probe_bytes(1, 2, pad_to=0)[:-1]
    f = parse_frame(data, 0.0, False)
    assert f.stream is None and f.seq is None
    assert f.length == len(data)


def test_parse_other_ethertype_has_no_seq() -> None:
    payload = struct.pack("!4sIQd", MAGIC, 1, 2, 0.0)
    f = parse_frame(DST + SRC + b"\x08\x00" + payload, 0.0, False)
    assert f.ethertype == 0x0800
    assert f.stream is None and f.seq is None


@pytest.mark.parametrize("n", [0, 5, 13])
def test_parse_runt_frame_does_not_crash(n: int) -> None:
    f = parse_frame(b"\x01" * n, 0.0, False)
    assert f.ethertype == 0 and f.seq is None and f.length == n


def frames(*items: tuple[float, bool, int | None, int | None]) -> list[Frame]:
    """Frames from (time, outgoing, stream, seq)."""
    return [Frame(t, out, PROBE_ETHERTYPE if s is not None else 0x0800, "a", "b", 60, s, q)
            for t, out, s, q in items]


def test_probe_arrivals_keeps_incoming_frames_of_stream_in_time_order() -> None:
    fs = frames((3.0, False, 1, 3), (1.0, False, 1, 1), (2.0, True, 1, 2),
                (1.5, False, 2, 9), (0.5, False, None, None), (2.5, False, 1, 2))
    assert probe_arrivals(fs, 1) == [(1.0, 1), (2.5, 2), (3.0, 3)]
    assert probe_arrivals(fs, 2) == [(1.5, 9)]
    assert probe_arrivals(fs, 3) == []


def test_frames_json_round_trip(tmp_path: Path) -> None:
    fs = [parse_frame(probe_bytes(1, 5), 1.25, False), parse_frame(b"\x00" * 20, 2.0, True)]
    path = tmp_path / "frames.jsonl"
    path.write_text("".join(json.dumps(f.to_json()) + "\n" for f in fs) + "\n")
    assert load_frames(path) == fs


def stream(t0: float, t1: float, step: float, seq0: int) -> list[tuple[float, int]]:
    """Arrivals every ``step`` s from ``t0`` to ``t1`` inclusive, seqs counting from ``seq0``."""
    n = round((t1 - t0) / step)
    return [(t0 + i * step, seq0 + i) for i in range(n + 1)]


def test_dark_gaps_one_gap_per_change_of_receiver() -> None:
    a = stream(0.0, 1.0, 0.1, 0) + stream(3.0, 4.0, 0.1, 300)
    b = stream(1.25, 2.0, 0.05, 125) + stream(4.5, 5.0, 0.1, 450)
    gaps = dark_gaps_s([a, b])
    assert gaps == pytest.approx([0.25, 1.0, 0.5])


def test_dark_gaps_three_receivers() -> None:
    gaps = dark_gaps_s([[(0.0, 0), (0.1, 1)], [(0.3, 3)], [(0.35, 4), (0.4, 5)]])
    assert gaps == pytest.approx([0.2, 0.05])


@pytest.mark.parametrize("receivers", [[], [[]], [stream(0, 1, 0.1, 0)], [[], [(1.0, 1)]]])
def test_dark_gaps_none_without_change(receivers: list[list[tuple[float, int]]]) -> None:
    assert dark_gaps_s(receivers) == []


def test_missing_seqs_lists_holes_between_first_and_last() -> None:
    arrivals = [(0.0, 3), (0.1, 4), (0.3, 7), (0.2, 4), (0.4, 10)]
    assert missing_seqs(arrivals) == [5, 6, 8, 9]


@pytest.mark.parametrize("arrivals", [[], [(0.0, 5)], [(0.0, 1), (0.1, 2), (0.2, 3)]])
def test_missing_seqs_none(arrivals: list[tuple[float, int]]) -> None:
    assert missing_seqs(arrivals) == []


def _counter(path: Path, value: int) -> None:
    path.write_text(f"{value}\n")


def test_a_port_is_busy_only_when_its_counter_grew_past_its_own_probes(tmp_path: Path) -> None:
    path = tmp_path / "rx_packets"
    _counter(path, 100)
    port = BusyPort(os.open(path, os.O_RDONLY))
    assert not port.busy()  # the first look has nothing to compare with
    port.probes_since = 1
    _counter(path, 101)  # only its own probe
    assert not port.busy()
    port.probes_since = 1
    _counter(path, 103)  # its probe and two data frames
    assert port.busy()
    _counter(path, 103)  # idle since
    assert not port.busy()


def test_a_port_without_a_readable_counter_is_never_busy(tmp_path: Path) -> None:
    assert not BusyPort(None).busy()
    path = tmp_path / "rx_packets"
    _counter(path, 1)
    fd = os.open(path, os.O_RDONLY)
    port = BusyPort(fd)
    assert not port.busy()
    os.close(fd)
    assert not port.busy()


def test_the_sender_rejects_counters_that_do_not_match_its_targets() -> None:
    with pytest.raises(ValueError, match="2 counters for 1 targets"):
        send_many([("/proc/self/ns/net", "lo")], 1000.0, 0.01, 1, ["a", "b"])


@pytest.mark.parametrize("ports, interval_us, batch", [(4, 500.0, 4), (16, 2000.0, 8),
                                                      (32, 4000.0, 8), (4, 4000.0, 1),
                                                      (1, 1000.0, 1), (0, 1000.0, 1)])
def test_the_sender_wakes_at_most_a_thousand_times_a_second_each_port_once(
        ports: int, interval_us: float, batch: int) -> None:
    assert turns_per_wakeup(ports, interval_us) == batch
    assert batch <= max(1, ports)  # never two probes of one port at one wake-up
    assert max(1, ports) / (interval_us / 1e6) / batch <= 1000.0 or batch == max(1, ports)
