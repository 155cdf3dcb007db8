"""The dark period's purge leaves no flow of a touched port (issue 35, emulator.dpflows).

OVS's ``revalidator/purge`` skips a flow whose revalidation holds its lock; that revalidation,
started by the switch's removal, then writes the dark table's ``drop`` into the flow, which
outlives the dark period and drops the first frames after the light (a lost SYN: TCP's 1 s
timeout). The fake vswitchd below models exactly that: its first purge skips the flows it is
told are being revalidated.
"""

from __future__ import annotations

import json
import socket
import threading
from pathlib import Path

from emulator.dpflows import flows_entering, in_port
from emulator.ocs_app import MAX_DARK_PURGES, _DatapathFlusher

DUMP = """flow-dump from the main thread:
recirc_id(0),in_port(ot1a2r1-eth3),packet_type(ns=0,id=0),eth_type(0x0800),ipv4(frag=no), \
packets:41, bytes:9241, used:0.133s, flags:SFP., actions:drop
recirc_id(0),in_port(ot1a2r1-eth13),packet_type(ns=0,id=0),eth_type(0x0800),ipv4(frag=no), \
packets:3, bytes:200, used:0.01s, flags:., actions:ot1a2r1-eth2
"""


def test_in_port_reads_names_and_numbers_and_skips_headers() -> None:
    lines = DUMP.splitlines()
    assert in_port(lines[0]) is None
    assert in_port(lines[1]) == "ot1a2r1-eth3"
    assert in_port("recirc_id(0),in_port(4),eth_type(0x0800), actions:2") == "4"


def test_flows_entering_matches_whole_port_names_only() -> None:
    assert [in_port(f) for f in flows_entering(DUMP, ["ot1a2r1-eth3"])] == ["ot1a2r1-eth3"]
    assert [in_port(f) for f in flows_entering(DUMP, ["ot1a2r1-eth1"])] == []  # not eth13
    assert flows_entering(DUMP, []) == []


class _FakeVswitchd:
    """A unixctl server whose datapath holds ``flows`` (port names); a purge deletes them all
    but the ones ``busy`` names, as many purges as ``busy_purges`` says (a revalidator holds
    their locks meanwhile, and rewrites them to drop)."""

    def __init__(self, path: Path, flows: set[str], busy: set[str], busy_purges: int) -> None:
        self.flows, self.busy, self.busy_purges = set(flows), busy, busy_purges
        self.purges = 0
        self.dumps = 0
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._sock.bind(str(path))
        self._sock.listen(4)
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._sock.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        decoder = json.JSONDecoder()
        buf = ""
        with conn:
            while chunk := conn.recv(65536):
                buf += chunk.decode()
                try:
                    request, end = decoder.raw_decode(buf)
                except json.JSONDecodeError:
                    continue
                buf = buf[end:]
                conn.sendall(json.dumps({"result": self._run(request["method"]),
                                         "error": None, "id": request["id"]}).encode())

    def _run(self, method: str) -> str:
        if method == "revalidator/purge":
            self.purges += 1
            skipped = self.busy if self.purges <= self.busy_purges else set()
            self.flows &= skipped
            return ""
        assert method == "dpctl/dump-flows"
        self.dumps += 1
        return "flow-dump from the main thread:\n" + "".join(
            f"recirc_id(0),in_port({p}),eth_type(0x0800), packets:1, bytes:60, used:0.001s, "
            "actions:drop\n" for p in sorted(self.flows))

    def close(self) -> None:
        self._sock.close()


def test_one_purge_leaves_a_flow_under_revalidation(tmp_path: Path) -> None:
    """The old dark period (one purge): the flow a revalidator held survives it."""
    ovs = _FakeVswitchd(tmp_path / "ctl", {"r1-eth1", "r1-eth3"}, {"r1-eth3"}, busy_purges=1)
    try:
        _DatapathFlusher(str(tmp_path / "ctl")).flush()
        assert ovs.flows == {"r1-eth3"}
    finally:
        ovs.close()


def test_flush_ports_purges_until_no_touched_flow_is_left(tmp_path: Path) -> None:
    ovs = _FakeVswitchd(tmp_path / "ctl", {"r1-eth1", "r1-eth3", "r1-eth4"}, {"r1-eth3"},
                        busy_purges=2)
    try:
        purges = _DatapathFlusher(str(tmp_path / "ctl")).flush_ports(["r1-eth3", "r1-eth4"])
        assert ovs.flows == set()
        assert purges == ovs.purges == 3  # two skipped the busy flow, the third removed it
        assert ovs.dumps == 3
    finally:
        ovs.close()


def test_flush_ports_ignores_flows_of_untouched_ports_and_stops_at_its_bound(
        tmp_path: Path) -> None:
    # an untouched port's flow never asks for another purge
    ovs = _FakeVswitchd(tmp_path / "a", {"r1-eth1", "r1-eth2"}, {"r1-eth2"}, busy_purges=99)
    try:
        assert _DatapathFlusher(str(tmp_path / "a")).flush_ports(["r1-eth1"]) == 1
        assert ovs.flows == {"r1-eth2"}
    finally:
        ovs.close()
    # a flow held through every purge: the loop ends at its bound, not never
    ovs = _FakeVswitchd(tmp_path / "b", {"r1-eth1"}, {"r1-eth1"}, busy_purges=99)
    try:
        assert _DatapathFlusher(str(tmp_path / "b")).flush_ports(["r1-eth1"]) == MAX_DARK_PURGES
        assert ovs.purges == MAX_DARK_PURGES
    finally:
        ovs.close()


def test_flush_ports_without_names_or_without_a_dump_purges_once(tmp_path: Path) -> None:
    ovs = _FakeVswitchd(tmp_path / "ctl", {"r1-eth1"}, {"r1-eth1"}, busy_purges=1)
    try:
        assert _DatapathFlusher(str(tmp_path / "ctl")).flush_ports([]) == 1
    finally:
        ovs.close()
    # no vswitchd at all: the purge and the dump fail, the switch goes on (timing only)
    assert _DatapathFlusher(str(tmp_path / "missing")).flush_ports(["r1-eth1"]) == 1
