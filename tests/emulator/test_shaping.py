"""emulator.shaping: the tc commands that shape a rail link, ACKs first or one FIFO."""

from __future__ import annotations

import re

import pytest

from emulator.shaping import ACK_CLASS, DATA_CLASS, LINK_CLASS, shaping_commands


def _kbit(cmd: str, key: str) -> float:
    match = re.search(rf"\b{key} ([0-9.]+)kbit\b", cmd)
    assert match, (key, cmd)
    return float(match.group(1))


def _class(cmds: list[str], classid: str) -> str:
    found = [c for c in cmds if f"classid {classid} " in c]
    assert len(found) == 1, (classid, cmds)
    return found[0]


def test_fifo_is_one_htb_class_at_the_link_rate() -> None:
    cmds = shaping_commands("x-eth1", 8.0, "fifo")
    assert cmds[0] == "tc qdisc add dev x-eth1 root handle 5: htb default 1"
    assert _kbit(_class(cmds, LINK_CLASS), "rate") == 8000.0
    assert not any(" filter " in c for c in cmds)


@pytest.mark.parametrize("link_mbps", [2.0, 8.0, 25.0, 1000.0])
def test_ack_priority_leaves_share_the_link_rate_and_may_each_take_all_of_it(
        link_mbps: float) -> None:
    cmds = shaping_commands("x-eth1", link_mbps)
    link = _class(cmds, LINK_CLASS)
    ack, data = _class(cmds, ACK_CLASS), _class(cmds, DATA_CLASS)
    assert _kbit(link, "rate") == pytest.approx(link_mbps * 1000)
    assert f"parent {LINK_CLASS} " in ack and f"parent {LINK_CLASS} " in data
    assert _kbit(ack, "rate") + _kbit(data, "rate") == pytest.approx(link_mbps * 1000)
    assert _kbit(ack, "ceil") == _kbit(data, "ceil") == pytest.approx(link_mbps * 1000)
    assert "prio 0" in ack and "prio 1" in data  # ACKs are served first
    assert cmds[0].endswith(f"htb default {DATA_CLASS.split(':')[1]}")  # the rest is data


def _u32_keys(flt: str) -> list[tuple[int, int, int, int]]:
    """(offset, width in bytes, value, mask) of each ``match u8|u16`` of a u32 filter."""
    return [(int(at), {"u8": 1, "u16": 2}[size], int(value, 16), int(mask, 16))
            for size, value, mask, at in re.findall(
                r"match (u8|u16) (0x[0-9a-f]+) (0x[0-9a-f]+) at (\d+)", flt)]


def _goes_first(cmds: list[str], packet: bytes) -> bool:
    """Whether an IPv4 ``packet`` matches one of the ACK leaf's filters, as u32 would."""
    for flt in (c for c in cmds if " filter " in c):
        assert "match ip protocol 6 0xff" in flt and flt.endswith(f"flowid {ACK_CLASS}")
        if packet[9] == 6 and all(
                int.from_bytes(packet[at:at + width], "big") & mask == value
                for at, width, value, mask in _u32_keys(flt)):
            return True
    return False


def _tcp(payload: int, options: int = 12, flags: int = 0x10, ip_options: int = 0) -> bytes:
    ihl = 5 + ip_options // 4
    doff = 5 + options // 4
    total = 4 * ihl + 4 * doff + payload
    ip = bytes([0x40 | ihl, 0]) + total.to_bytes(2, "big") + bytes(5) + bytes([6]) + bytes(
        10 + ip_options)
    tcp = bytes(12) + bytes([doff << 4, flags]) + bytes(6 + options)
    return ip + tcp + bytes(payload)


def test_ack_filter_takes_short_segments_without_fin_and_leaves_the_rest() -> None:
    cmds = shaping_commands("x-eth1", 8.0)
    first = {"ack": _tcp(0, 0), "ack with timestamps": _tcp(0), "ack with 3 sack blocks":
             _tcp(0, 40), "syn": _tcp(0, 20, 0x02), "rst": _tcp(0, 0, 0x04),
             "one payload byte": _tcp(1), "a step header": _tcp(12), "a hello line": _tcp(73)}
    for what, packet in first.items():
        assert _goes_first(cmds, packet), what
    # a FIN follows its connection's data: served first, it overtook it and the sender then
    # retransmitted that data (docs/performance.md, "Spurious retransmissions")
    behind = {"fin": _tcp(0, 12, 0x11), "fin with a header": _tcp(12, 12, 0x19),
              "data segment": _tcp(76), "full segment": _tcp(1448),
              "ip options": _tcp(0, 12, 0x10, 4)}
    for what, packet in behind.items():
        assert not _goes_first(cmds, packet), what


@pytest.mark.parametrize(("args", "named"), [(("x", 8.0, "netem"), "netem"),
                                             (("x", 0.0), "link_mbps"),
                                             (("x", -1.0, "fifo"), "link_mbps")])
def test_bad_input_is_refused_by_name(args: tuple[object, ...], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        shaping_commands(*args)  # type: ignore[arg-type]
