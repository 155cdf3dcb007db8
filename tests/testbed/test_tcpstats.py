"""TCP timer counters: parsing the kernel's tables and summing the measured iterations."""

from __future__ import annotations

from testbed.metrics import tcpstats

SNMP = """Ip: Forwarding DefaultTTL
Ip: 1 64
Tcp: RtoAlgorithm RtoMin ActiveOpens RetransSegs OutRsts
Tcp: 1 200 12 7 3
Udp: InDatagrams
Udp: 5
"""
NETSTAT = """TcpExt: SyncookiesSent TCPTimeouts DelayedACKs TCPLossProbes TCPSynRetrans
TcpExt: 0 2 40 5 1
IpExt: InNoRoutes
IpExt: 0
"""


def test_parse_keeps_the_named_tcp_counters_only() -> None:
    assert tcpstats.parse(SNMP) == {"ActiveOpens": 12, "RetransSegs": 7}
    assert tcpstats.parse(NETSTAT) == {"TCPTimeouts": 2, "DelayedACKs": 40,
                                       "TCPLossProbes": 5, "TCPSynRetrans": 1}


def test_read_joins_both_tables_and_tolerates_missing_files(tmp_path) -> None:
    snmp, netstat = tmp_path / "snmp", tmp_path / "netstat"
    snmp.write_text(SNMP)
    netstat.write_text(NETSTAT)
    got = tcpstats.read(str(snmp), str(netstat))
    assert got["RetransSegs"] == 7 and got["TCPTimeouts"] == 2
    assert tcpstats.read(str(tmp_path / "none"), str(netstat)) == tcpstats.parse(NETSTAT)


def _rec(rank: int, ev: str, it: int | None, **tcp: int) -> dict:
    rec = {"rank": rank, "ev": ev, "tcp": tcp}
    if it is not None:
        rec["it"] = it
    return rec


def test_iteration_counts_sums_only_the_measured_iterations_per_rank() -> None:
    records = [
        _rec(0, "started", None, TCPTimeouts=5, RetransSegs=10),
        _rec(0, "iteration", 0, TCPTimeouts=6, RetransSegs=12),   # warm-up: not counted
        _rec(0, "iteration", 1, TCPTimeouts=6, RetransSegs=15),
        _rec(0, "iteration", 2, TCPTimeouts=8, RetransSegs=15),
        _rec(1, "started", None, TCPTimeouts=0, RetransSegs=0),
        _rec(1, "iteration", 0, TCPTimeouts=0, RetransSegs=0),
        _rec(1, "iteration", 1, TCPTimeouts=1, RetransSegs=1),
        {"rank": 1, "ev": "call"},                                 # no reading: ignored
        _rec(1, "iteration", 2, TCPTimeouts=1, RetransSegs=1),
    ]
    got = tcpstats.iteration_counts(records, warmup=1)
    assert got["iterations"] == 2 and got["ranks"] == 2
    assert got["total"]["TCPTimeouts"] == 3 and got["total"]["RetransSegs"] == 4
    assert got["worst_rank"]["TCPTimeouts"] == 2


def test_a_restarted_rank_counts_from_its_new_start() -> None:
    records = [_rec(0, "started", None, TCPTimeouts=0),
               _rec(0, "iteration", 1, TCPTimeouts=1),
               _rec(0, "resumed", None, TCPTimeouts=0),  # a fresh namespace after failover
               _rec(0, "iteration", 2, TCPTimeouts=2)]
    assert tcpstats.iteration_counts(records, warmup=1)["total"]["TCPTimeouts"] == 3


def test_parse_keeps_the_listener_drop_counters() -> None:
    text = ("TcpExt: ListenOverflows ListenDrops TCPTimeouts\n"
            "TcpExt: 2 3 0\n")
    assert tcpstats.parse(text) == {"ListenOverflows": 2, "ListenDrops": 3, "TCPTimeouts": 0}


def test_stall_fault_names_a_full_listen_queue_when_the_kernel_counted_one() -> None:
    assert tcpstats.stall_fault({"total": {"TCPTimeouts": 0, "TCPSynRetrans": 0}}) is None
    lost = tcpstats.stall_fault({"total": {"TCPTimeouts": 1, "TCPSynRetrans": 1}}, 4.0)
    assert lost is not None and "lost outside a switch" in lost and "0.30 s of model" in lost
    full = tcpstats.stall_fault({"total": {"TCPTimeouts": 1, "TCPSynRetrans": 1,
                                           "ListenDrops": 2}})
    assert full is not None and "2 SYNs were dropped by a rank's full listen queue" in full
