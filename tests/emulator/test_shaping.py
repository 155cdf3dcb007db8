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


def test_ack_filter_takes_tcp_headers_alone_and_leaves_data_segments() -> None:
    (flt,) = [c for c in shaping_commands("x-eth1", 8.0) if " filter " in c]
    assert "match ip protocol 6 0xff" in flt and flt.endswith(f"flowid {ACK_CLASS}")
    value, mask = re.search(r"match u16 (0x[0-9a-f]+) (0x[0-9a-f]+) at 2", flt).groups()
    ip_total_length = {"ack": 40, "ack with timestamps": 52, "ack with 3 sack blocks": 84,
                       "syn": 60, "one payload byte": 53}
    for what, length in ip_total_length.items():
        assert length & int(mask, 16) == int(value, 16), what
    for data_segment in (128, 576, 1500):
        assert data_segment & int(mask, 16) != int(value, 16), data_segment


@pytest.mark.parametrize(("args", "named"), [(("x", 8.0, "netem"), "netem"),
                                             (("x", 0.0), "link_mbps"),
                                             (("x", -1.0, "fifo"), "link_mbps")])
def test_bad_input_is_refused_by_name(args: tuple[object, ...], named: str) -> None:
    with pytest.raises(ValueError, match=named):
        shaping_commands(*args)  # type: ignore[arg-type]
