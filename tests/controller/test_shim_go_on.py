"""The shim's rail-state ack timeout (``go_on_after_s``, ``ocs.rail_state_ack_timeout_s``)
against a stand-in controller whose acks the test sends by hand: a call goes on without an ack
that is late, its late ack is read on a drain thread and never taken as a later call's, and
its completion reaches the controller only once both the ack came and the call ended. The
same for the artifact's line protocol (:mod:`controller.artifact_client`) against a stand-in
line server."""

from __future__ import annotations

import queue
import socket
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pytest
import zmq

from controller.artifact_client import ArtifactRank, CommPlan
from controller.protocol import decode, encode
from controller.shim import Shim

GO_ON_S = 0.3


def wait_for(cond: Callable[[], bool], timeout_s: float = 10.0, what: str = "it") -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.005)


@dataclass
class Got:
    """One message the stand-in controller received: from which socket, and when."""

    identity: bytes
    msg: dict[str, Any]
    t: float


class StandInController:
    """A ROUTER socket on loopback that greets, answers heartbeats, and keeps every intent,
    completion and prediction; the test answers an intent with :meth:`ack` or :meth:`refuse`."""

    def __init__(self) -> None:
        self.ctx = zmq.Context()
        self.got: list[Got] = []
        self._out: queue.Queue[tuple[bytes, dict[str, Any]]] = queue.Queue()
        self._stop = threading.Event()
        sock = self.ctx.socket(zmq.ROUTER)
        port = sock.bind_to_random_port("tcp://127.0.0.1")
        self.endpoint = f"tcp://127.0.0.1:{port}"
        self._thread = threading.Thread(target=self._serve, args=(sock,), daemon=True)
        self._thread.start()

    def _serve(self, sock: zmq.Socket[bytes]) -> None:
        try:
            while not self._stop.is_set():
                while not self._out.empty():
                    identity, msg = self._out.get()
                    sock.send_multipart([identity, encode(msg)])
                if not sock.poll(5):
                    continue
                identity, data = sock.recv_multipart()
                msg = decode(data)
                kind = msg["type"]
                if kind == "hello":
                    sock.send_multipart([identity, encode({"type": "welcome", "req": msg["req"],
                                                           "rail": 0, "ports": [1]})])
                elif kind == "heartbeat":
                    sock.send_multipart([identity, encode({"type": "heartbeat_ok"})])
                elif kind != "bye":
                    self.got.append(Got(identity, msg, time.monotonic()))
        finally:
            sock.close(0)

    def of(self, kind: str, group: str | None = None, seq: int | None = None) -> list[Got]:
        return [g for g in list(self.got) if g.msg["type"] == kind
                and (group is None or g.msg["group"] == group)
                and (seq is None or g.msg["seq"] == seq)]

    def intent(self, group: str, seq: int) -> Got:
        wait_for(lambda: bool(self.of("intent", group, seq)), what=f"intent {group} {seq}")
        return self.of("intent", group, seq)[0]

    def ack(self, group: str, seq: int) -> None:
        got = self.intent(group, seq)
        self._out.put((got.identity, {"type": "ack", "req": got.msg["req"], "group": group,
                                      "seq": seq, "reconfigured": True}))

    def refuse(self, group: str, seq: int) -> None:
        got = self.intent(group, seq)
        self._out.put((got.identity, {"type": "error", "req": got.msg["req"],
                                      "code": "reconfig_failed", "message": "injected"}))

    def close(self) -> None:
        self._stop.set()
        self._thread.join(5)
        self.ctx.term()


@pytest.fixture
def ctl() -> Iterator[StandInController]:
    c = StandInController()
    yield c
    c.close()


@pytest.fixture
def late() -> list[tuple[str, int, bool, float]]:
    return []


@pytest.fixture
def shim(ctl: StandInController, late: list[tuple[str, int, bool, float]]) -> Iterator[Shim]:
    s = Shim(ctl.endpoint, "j", 0, ack_timeout_s=10.0, go_on_after_s=GO_ON_S,
             on_late_ack=lambda *a: late.append(a))
    yield s
    s.close()


def test_a_late_ack_lets_the_call_go_on_and_its_completion_waits_for_it(
        ctl: StandInController, shim: Shim, late: list[tuple[str, int, bool, float]]) -> None:
    t0 = time.monotonic()
    with shim.collective("dp0", "allgather", 1 << 20) as grant:
        went_on = time.monotonic()
    assert grant.timed_out and not grant.reconfigured
    assert GO_ON_S <= went_on - t0 < GO_ON_S + 1.0
    assert GO_ON_S <= grant.wait_s < GO_ON_S + 1.0
    time.sleep(0.05)  # (a completion sent at the body's end would be here by now)
    assert not ctl.of("complete") and not late  # the call ended, its ack has not come
    assert shim.ack_timeouts == 1 and shim.late_acks == 0
    t_ack = time.time()
    ctl.ack("dp0", 0)
    wait_for(lambda: bool(ctl.of("complete", "dp0", 0)), what="the completion")
    assert late and late[0][:3] == ("dp0", 0, False) and late[0][3] >= t_ack
    assert shim.late_acks == 1
    done = ctl.of("complete", "dp0", 0)[0]
    assert done.identity == ctl.intent("dp0", 0).identity  # on the request's own socket
    assert done.msg["job"] == "j" and done.msg["shim"] == shim.session


def test_a_late_ack_is_never_taken_as_the_next_calls(ctl: StandInController,
                                                     shim: Shim) -> None:
    with shim.collective("dp0") as first:
        pass
    assert first.timed_out
    grants = []
    t = threading.Thread(target=lambda: grants.append(shim.collective("dp0").__enter__()),
                         daemon=True)
    t.start()
    nxt = ctl.intent("dp0", 1)
    assert nxt.identity != ctl.intent("dp0", 0).identity  # the shim went on on a fresh socket
    ctl.ack("dp0", 0)  # the late ack of call 0 comes while call 1 waits
    wait_for(lambda: bool(ctl.of("complete", "dp0", 0)), what="call 0's completion")
    assert t.is_alive()  # call 1 still waits for its own ack
    ctl.ack("dp0", 1)
    t.join(5)
    assert grants and grants[0].seq == 1 and not grants[0].timed_out
    assert grants[0].reconfigured


def test_a_late_ack_before_the_calls_end_waits_for_it(ctl: StandInController,
                                                     shim: Shim) -> None:
    with shim.collective("dp0") as grant:
        assert grant.timed_out
        ctl.ack("dp0", 0)
        wait_for(lambda: shim.late_acks == 1, what="the late ack")
        time.sleep(0.05)
        assert not ctl.of("complete")  # the call runs still
        t_end = time.monotonic()
    wait_for(lambda: bool(ctl.of("complete", "dp0", 0)), what="the completion")
    assert ctl.of("complete", "dp0", 0)[0].t >= t_end


def test_an_ack_in_time_goes_the_usual_way(ctl: StandInController, shim: Shim,
                                           late: list[tuple[str, int, bool, float]]) -> None:
    threading.Timer(0.05, ctl.ack, ("dp0", 0)).start()
    with shim.collective("dp0") as grant:
        pass
    assert not grant.timed_out and grant.reconfigured and grant.wait_s < GO_ON_S
    wait_for(lambda: bool(ctl.of("complete", "dp0", 0)), what="the completion")
    assert shim.ack_timeouts == 0 and not late


def test_a_late_refusal_completes_nothing(ctl: StandInController, shim: Shim,
                                          late: list[tuple[str, int, bool, float]]) -> None:
    with shim.collective("dp0") as grant:
        pass
    assert grant.timed_out
    ctl.refuse("dp0", 0)
    wait_for(lambda: bool(late), what="the late refusal")
    assert late[0][:3] == ("dp0", 0, True)
    shim.close()  # the drain has ended: close does not wait
    assert not ctl.of("complete")


def test_close_waits_for_a_late_ack_still_to_come(ctl: StandInController, shim: Shim) -> None:
    with shim.collective("dp0") as grant:
        pass
    assert grant.timed_out
    threading.Timer(0.2, ctl.ack, ("dp0", 0)).start()
    shim.close()
    wait_for(lambda: bool(ctl.of("complete", "dp0", 0)), what="the completion")


def test_without_go_on_a_missing_ack_fails_as_before(ctl: StandInController) -> None:
    from controller.shim import ControllerUnavailable

    with (Shim(ctl.endpoint, "j", 0, ack_timeout_s=0.3) as s,
          pytest.raises(ControllerUnavailable, match="no answer"), s.collective("dp0")):
        pass
    with pytest.raises(ValueError, match="go_on_after_s must be a positive"):
        Shim(ctl.endpoint, "j", 0, go_on_after_s=0)


# ------------------------------------------------------------- the artifact's protocol


class StandInLineServer:
    """One TCP connection of the artifact's protocol: checks every comm in; the test answers
    its ``CONFIG_REQ`` lines with :meth:`ack` (``CONFIG_ACK;<comm>``)."""

    def __init__(self) -> None:
        self.srv = socket.create_server(("127.0.0.1", 0))
        self.port = self.srv.getsockname()[1]
        self.requests: list[str] = []
        self.conn: socket.socket | None = None
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        conn, _ = self.srv.accept()
        self.conn = conn
        buf = b""
        while data := conn.recv(4096):
            buf += data
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                head, _, body = line.decode().partition(";")
                if head == "COMM":
                    conn.sendall(f"CHECKIN_ACK;{body.split(',')[0]},0\n".encode())
                elif head == "CONFIG_REQ":
                    self.requests.append(body)

    def ack(self, comm: str) -> None:
        assert self.conn is not None
        self.conn.sendall(f"CONFIG_ACK;{comm}\n".encode())

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
        self.srv.close()


def test_the_artifact_protocol_goes_on_and_counts_the_late_ack_as_its_own() -> None:
    srv = StandInLineServer()
    late: list[tuple[str, int, bool, float]] = []
    rank = ArtifactRank("127.0.0.1", srv.port, 0, {"dp0": CommPlan("c0", 2, None, 0)},
                        ack_timeout_s=10.0, go_on_after_s=GO_ON_S,
                        on_late_ack=lambda *a: late.append(a))
    try:
        shim = rank.shim()
        with shim.collective("dp0") as first:
            pass
        assert first.timed_out and first.wait_s >= GO_ON_S
        grants = []
        t = threading.Thread(target=lambda: grants.append(shim.collective("dp0").__enter__()),
                             daemon=True)
        t.start()
        wait_for(lambda: len(srv.requests) == 2, what="call 1's request")
        srv.ack("c0")  # the first CONFIG_ACK answers call 0, late
        wait_for(lambda: bool(late), what="the late ack")
        assert late[0][:3] == ("dp0", 0, False)
        assert t.is_alive()  # call 1 waits for the second CONFIG_ACK
        srv.ack("c0")
        t.join(5)
        assert grants and grants[0].seq == 1 and not grants[0].timed_out
    finally:
        rank.close()
        srv.close()
