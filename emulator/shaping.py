"""Rate shaping of the emulated rail links (pure: builds ``tc`` commands, runs nothing).

Both ends of every rail link are shaped to the link rate with HTB: the rank's interface (its
sending direction) and the bridge's port (what the bridge sends to the rank). Two shapings:

* ``ack-priority`` (the default): one HTB class at the link rate holds two leaves; TCP packets
  below :data:`ACK_MAX_IP_BYTES` without FIN (pure ACKs, SYN, RST, and the transport's short
  hello and step headers) go to a leaf served before the data leaf. Every byte still counts
  against the link rate.
* ``fifo``: one HTB class at the link rate, one queue: what Mininet's ``TCLink(bw=...)`` builds.
  Kept for ``opus-testbed bench tcp``, which compares the two in one run.

Why ACKs go first: emulation scales link rates down ~1000x, so a full frame takes 1.5 ms at
8 Mbit/s instead of 30 ns at 400 Gbit/s. In one FIFO, the ACKs a rank returns for its peer's
data wait behind the rank's own data (5-40 KB, i.e. 5-40 ms, measured), a delay no real NIC
adds. The two directions of a ring step then feed on each other: the flow with the longer
queue delays the other's ACKs, whose window then cannot cover the round trip, so fresh
connections settle either near the link rate or ~30 % below it (the bimodal rates of
``tests/emulation/test_crossval.py``). Served first, ACKs wait at most for the frame on the
wire and both directions reach the link rate (figures: ``opus-testbed bench tcp``).

What must not go first: a FIN. It follows its connection's last data; served first, it
overtook that data whenever some was still queued (30 of 384 connections of a 16-rank run). The
receiver SACKs the FIN, and the sender's loss detection (RACK) then retransmits the queued data
spuriously: 23 of 24 data retransmissions in that run, most arriving after the receiver had
closed (so answered by a RST, not counted as spurious by DSACK). docs/performance.md,
"Spurious retransmissions", has the figures. A short data segment can in principle overtake its
own connection's data the same way (a step header behind a step's queued payload); it was not
seen to cause a retransmission, and sending those headers first keeps them from waiting behind
other connections' data, a wait no real NIC adds.
"""

from __future__ import annotations

SHAPINGS = ("ack-priority", "fifo")
#: IPv4 total length (bytes) below which a TCP packet goes first: 20 bytes of IP and at most 60
#: of TCP header (timestamps, SACK blocks) stay below it; a full data segment does not.
ACK_MAX_IP_BYTES = 128
#: Share of the link rate guaranteed to the ACK leaf; it may borrow up to the whole rate, and
#: the data leaf likewise, so either alone reaches the link rate.
ACK_RATE_SHARE = 0.1
#: HTB burst of the link class, as Mininet's TCLink sets it (the calibration was made with it).
LINK_BURST = "15k"
HANDLE = "5:"
LINK_CLASS = "5:1"
ACK_CLASS = "5:10"
DATA_CLASS = "5:20"


def _rate(mbps: float) -> str:
    return f"{mbps * 1000:.3f}kbit"


def shaping_commands(intf: str, link_mbps: float, shaping: str = "ack-priority") -> list[str]:
    """``tc`` commands that shape ``intf`` (no qdisc yet) to ``link_mbps`` with ``shaping``."""
    if shaping not in SHAPINGS:
        raise ValueError(f"shaping must be one of {SHAPINGS}, got {shaping!r}")
    if not link_mbps > 0:
        raise ValueError(f"link_mbps must be > 0, got {link_mbps}")
    rate = _rate(link_mbps)
    if shaping == "fifo":
        return [f"tc qdisc add dev {intf} root handle {HANDLE} htb default 1",
                f"tc class add dev {intf} parent {HANDLE} classid {LINK_CLASS} htb rate {rate} "
                f"burst {LINK_BURST}"]
    # u32 offsets from the IPv4 header (IHL 5: 20 bytes, no options): the total length at 2
    # (a 16-bit value below 128 has its upper nine bits clear), the TCP flags at 33 (FIN = 0x01)
    length_mask = 0xFFFF & ~(ACK_MAX_IP_BYTES - 1)
    ack_filter = (f"tc filter add dev {intf} parent {HANDLE} protocol ip prio 1 u32 "
                  f"match ip protocol 6 0xff match u8 0x45 0xff at 0 "
                  f"match u16 0x0000 {length_mask:#06x} at 2 match u8 0x00 0x01 at 33 "
                  f"flowid {ACK_CLASS}")
    return [
        f"tc qdisc add dev {intf} root handle {HANDLE} htb default {DATA_CLASS.split(':')[1]}",
        f"tc class add dev {intf} parent {HANDLE} classid {LINK_CLASS} htb rate {rate} "
        f"burst {LINK_BURST}",
        f"tc class add dev {intf} parent {LINK_CLASS} classid {ACK_CLASS} htb "
        f"rate {_rate(link_mbps * ACK_RATE_SHARE)} ceil {rate} prio 0 quantum 1514",
        f"tc class add dev {intf} parent {LINK_CLASS} classid {DATA_CLASS} htb "
        f"rate {_rate(link_mbps * (1 - ACK_RATE_SHARE))} ceil {rate} prio 1 quantum 1514",
        ack_filter,
    ]
