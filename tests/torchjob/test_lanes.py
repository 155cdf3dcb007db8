"""A rank's lanes without torch: two runtimes on loopback exchange bytes through calls."""

from __future__ import annotations

import io
import json
import threading
from typing import Any

import pytest

from emulator.network import free_tcp_port
from testbed.torchjob.lanes import CallContext, CallSpec, Runtime


def _pair() -> tuple[Runtime, Runtime, io.StringIO, io.StringIO]:
    peers = {0: ("127.0.0.1", free_tcp_port()), 1: ("127.0.0.1", free_tcp_port())}
    outs = io.StringIO(), io.StringIO()
    rts = [Runtime(r, listen=[peers[r]], peers=peers, out=outs[r], io_timeout_s=5)
           for r in (0, 1)]
    return rts[0], rts[1], outs[0], outs[1]


def _spec(lane: str = "fsdp0-1", **kw: Any) -> CallSpec:
    base = {"op": "all_gather_single", "kind": "all_gather", "lane": lane, "axis": "fsdp",
            "members": (0, 1), "size_bytes": 3, "wire_bytes": 3, "expected": 3,
            "dtype": "uint8", "torch_group": "mesh_fsdp"}
    return CallSpec(**{**base, **kw})


def _records(out: io.StringIO) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.getvalue().splitlines()]


def test_a_call_exchanges_payloads_and_records_every_field() -> None:
    a, b, out_a, out_b = _pair()
    got: dict[int, bytes] = {}
    done = {0: threading.Event(), 1: threading.Event()}

    def body(me: int, other: int) -> Any:
        def run(ctx: CallContext) -> None:
            ctx.send(other, 0, memoryview(bytes([me] * 3)))
            got[me] = bytes(ctx.recv(other, 0, 3))
        return run

    calls = [rt.submit(_spec(), body(r, 1 - r), lambda err, r=r: done[r].set())
             for r, rt in ((0, a), (1, b))]
    assert all(e.wait(10) for e in done.values())
    assert got == {0: b"\x01\x01\x01", 1: b"\x00\x00\x00"}
    a.waited(calls[0], 1.0, 2.0)  # the script waited for rank 0's call: its record is written
    a.end_iteration()
    (call,) = [r for r in _records(out_a) if r["ev"] == "call"]
    assert call["cid"] == "fsdp0-1:0" and call["tag"] == "fsdp0-1.c0" and call["seq"] == 0
    assert call["sent"] == call["received"] == call["expected"] == 3
    assert call["t_issue"] <= call["t_intent"] <= call["t_ack"] <= call["t_end"]
    assert (call["t_wait_start"], call["t_wait_end"]) == (1.0, 2.0)
    assert (call["op"], call["members"], call["torch_group"], call["it"], call["i"],
            call["scale_up"]) == ("all_gather_single", [0, 1], "mesh_fsdp", 0, 0, False)
    assert _records(out_a)[-1]["ev"] == "iteration"
    b.close()  # a call never waited for is written at the end
    assert [r["ev"] for r in _records(out_b)] == ["call"]
    a.close()


def test_a_failed_call_stops_the_rank_and_names_the_call() -> None:
    a, _, _, _ = _pair()
    errors: list[BaseException | None] = []
    finished = threading.Event()

    def boom(_ctx: CallContext) -> None:
        raise ValueError("bad shape")

    def note(err: BaseException | None) -> None:
        errors.append(err)
        finished.set()

    a.submit(_spec(op="allreduce", kind="all_reduce", lane="dp0-1"), boom, note)
    assert finished.wait(10)
    assert isinstance(errors[0], ValueError) and a.aborted.is_set()
    assert a.failure is not None and a.failure["error"] == "ValueError: bad shape"
    assert a.failure["tag"] == "allreduce on mesh_fsdp" and a.failure["lane"] == "dp0-1"
    finished.clear()
    a.submit(_spec(), lambda ctx: None, note)  # later calls end at once, without running
    assert finished.wait(10) and errors[1] is not None and a.failure["lane"] == "dp0-1"
    a.close()


def test_a_receive_that_never_comes_times_out() -> None:
    a, _, _, _ = _pair()
    a.io_timeout_s = 0.3
    result: list[BaseException | None] = []
    done = threading.Event()
    a.submit(_spec(lane="p2p0-1", op="recv", kind="recv", peer=1),
             lambda ctx: ctx.recv(1, 0, 8, "pp:1>0:0#0") and None,
             lambda err: (result.append(err), done.set()))
    assert done.wait(10)
    with pytest.raises(Exception, match="received 0 of 8 bytes from rank 1 for pp:1>0:0#0"):
        raise result[0] or AssertionError("no error")
    a.close()
