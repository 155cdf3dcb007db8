"""The replayer's epochs: an abort wakes every waiter at once and shuts the epoch's sockets."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from testbed.emulated.replayer import Abort, Epoch, EpochInbox, Replayer, link_up
from testbed.plan.replay import PlanOp


def _epoch() -> Epoch:
    ops = [PlanOp(0, "compute", ()), PlanOp(1, "g", (0,))]
    return Epoch(1, "job-e1", start=2, iterations=4, ops=ops, inbox=EpochInbox())


def test_an_abort_wakes_every_waiter_and_shuts_the_sockets() -> None:
    ep = _epoch()
    assert sorted(ep.ended) == [2, 3] and sorted(ep.wake) == ["compute", "g"]
    assert ep.progress.first == 2
    outcomes: list[str] = []

    def wait_done() -> None:
        try:
            Replayer._wait(ep, ep.wake["g"])
            outcomes.append("done")
        except Abort:
            outcomes.append("abort")

    def wait_bytes() -> None:
        try:
            ep.inbox.wait((2, "c", 0, 0), 10, 30.0, ep.aborted)
            outcomes.append("bytes")
        except Abort:
            outcomes.append("abort")

    a, b = socket.socketpair()
    ep.track(a)
    threads = [threading.Thread(target=wait_done), threading.Thread(target=wait_bytes)]
    for t in threads:
        t.start()
    time.sleep(0.05)
    t0 = time.monotonic()
    ep.abort()
    for t in threads:
        t.join(2.0)
    assert outcomes == ["abort", "abort"]
    assert time.monotonic() - t0 < 0.2, "waiters must not wait for their poll slice"
    assert a.recv(1) == b""  # shut: a blocked receive returns at once
    a.close()
    b.close()


def test_a_failure_is_the_first_one_and_aborts() -> None:
    ep = _epoch()
    ep.fail({"error": "first"})
    ep.fail({"error": "second"})
    assert ep.aborted.is_set() and ep.failure == {"error": "first"}
    later = _epoch()
    later.abort()
    later.fail({"error": "caused by the abort"})
    assert later.failure is None


def test_a_socket_tracked_after_the_abort_is_shut_at_once() -> None:
    ep = _epoch()
    ep.abort()
    a, b = socket.socketpair()
    ep.track(a)
    assert a.recv(1) == b""
    a.close()
    b.close()


def test_an_aborted_epochs_connection_errors_are_not_failures() -> None:
    """Shutting an epoch's sockets makes its incoming connections fail: that is the abort."""
    ep = _epoch()
    ep.inbox.fail("before the abort")
    ep.abort()
    ep.inbox.fail("caused by the abort")
    assert ep.inbox.errors == ["before the abort"]


@pytest.mark.parametrize(("intf", "up"), [("lo", True), ("nosuchintf0", False)])
def test_link_up_reads_the_interface_flags(intf: str, up: bool) -> None:
    assert link_up(intf) is up
