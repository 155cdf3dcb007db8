"""The rank process: replays a rank's plan as timed compute and real TCP collectives.

Run inside the rank's Mininet namespace by the runner::

    python -m testbed.emulated.replayer RANK_PLAN.json

The plan file (written by :mod:`testbed.emulated.runner`) holds ``rank``, ``job``, ``endpoint`` (the
Opus controller on the frontend network), ``addr`` (this rank's rail address), ``peers`` (rank ->
rail address), ``port``, ``iterations``, ``ack_timeout_s``, ``io_timeout_s``, ``out`` (JSON-lines
file) and ``ops`` (:class:`testbed.plan.replay.PlanOp` in JSON form).

Lanes run as threads (see :mod:`testbed.plan.replay`); each comm-group lane wraps every call in its
own :class:`~controller.shim.Shim`, all sharing one call profile so provisioning predicts across
the rank's groups. Under rail-state semantics a call the plan does not gate runs without asking,
and after a call with ``predict`` the rank names that call to the controller
(:mod:`testbed.plan.requestpoints`). Inside a call, the steps travel over
:mod:`testbed.emulated.transport`: one fresh TCP connection per peer to the peer's rail address
(only there: the circuits are lit), filler bytes counted by the receiving rank's listener per
(iteration, collective, sender, step), so a receiving step just waits for its count. Records go
to the ``out`` file as JSON lines: ``call``, ``compute``, ``iteration``, ``error`` and
``finished``; on any failure the process records the rank, iteration and op and exits with
status 1. Fault injection for tests: ``OPUS_FAULT_CRASH=RANK:ITERATION`` makes that rank exit
abruptly (status 7) as the iteration starts.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import IO, Any

from controller.profile import CallProfile
from controller.shim import Shim
from testbed.emulated.transport import Abort, Inbox, Listener, Outgoing
from testbed.emulated.transport import TransportError as ReplayError
from testbed.plan.replay import COMPUTE_LANE, PlanOp
from testbed.plan.requestpoints import lane_positions, predicted_call

POLL_S = 0.25


class Replayer:
    """One rank's replay; :meth:`run` returns the exit status."""

    def __init__(self, plan: dict[str, Any], out: IO[str]) -> None:
        self.plan = plan
        self.rank = int(plan["rank"])
        self.ops = [PlanOp.from_json(o) for o in plan["ops"]]
        self.positions = lane_positions(self.ops)  # for predictions (rail-state)
        self.iterations = int(plan["iterations"])
        self.peers = {int(r): str(a) for r, a in plan["peers"].items()}
        self.port = int(plan["port"])
        self.io_timeout_s = float(plan.get("io_timeout_s", 60.0))
        self.ack_timeout_s = float(plan.get("ack_timeout_s", 120.0))
        self.out = out
        self._out_lock = threading.Lock()
        self.inbox = Inbox()
        self.aborted = threading.Event()
        self.profile = CallProfile()
        self.seqs: dict[str, int] = {}  # next call number per group, shared by the lanes' shims
        self.done = {(it, op.index): threading.Event()
                     for it in range(self.iterations) for op in self.ops}
        self.go = [threading.Event() for _ in range(self.iterations)]
        self.failure: dict[str, Any] | None = None

    def emit(self, **record: Any) -> None:
        line = json.dumps({**record, "rank": self.rank}, separators=(",", ":"))
        with self._out_lock:
            self.out.write(line + "\n")
            self.out.flush()

    # ------------------------------------------------------------------ lanes

    def _wait(self, ev: threading.Event) -> None:
        while not ev.wait(POLL_S):
            if self.aborted.is_set():
                raise Abort

    def _lane(self, name: str, ops: list[PlanOp]) -> None:
        shim: Shim | None = None
        current: tuple[int, PlanOp] | None = None
        try:
            if name != COMPUTE_LANE:
                shim = Shim(str(self.plan["endpoint"]), str(self.plan["job"]), self.rank,
                            ack_timeout_s=self.ack_timeout_s, profile=self.profile,
                            seqs=self.seqs)
            for it in range(self.iterations):
                self._wait(self.go[it])
                for op in ops:
                    current = (it, op)
                    for d in op.deps:
                        self._wait(self.done[(it, d)])
                    if shim is None:
                        self._compute(it, op)
                    else:
                        self._call(shim, it, op)
                    self.done[(it, op.index)].set()
        except Abort:
            pass
        except BaseException as exc:  # record and stop the whole rank
            it, failed = current if current else (-1, None)
            self.failure = {"it": it, "i": failed.index if failed else -1,
                            "tag": failed.tag if failed else "", "lane": name,
                            "error": f"{type(exc).__name__}: {exc}"}
            self.aborted.set()
        finally:
            if shim is not None:
                shim.close()

    def _compute(self, it: int, op: PlanOp) -> None:
        t0 = time.time()
        end = time.monotonic() + op.duration_s
        while (left := end - time.monotonic()) > 0:
            if self.aborted.wait(min(left, POLL_S)):
                raise Abort
        self.emit(ev="compute", it=it, i=op.index, t_start=t0, t_end=time.time())

    def _call(self, shim: Shim, it: int, op: PlanOp) -> None:
        t_intent = time.time()
        sent = received = 0
        with shim.collective(op.lane, op.kind, op.size_bytes, op.axis, op.gated) as grant:
            t_ack = time.time()
            conns: dict[int, Outgoing] = {}
            try:
                for k, step in enumerate(op.steps):
                    for peer, n in step.sends:
                        if peer not in conns:
                            conns[peer] = Outgoing(
                                (self.peers[peer], self.port),
                                {"it": it, "cid": op.collective_id, "src": self.rank},
                                self.io_timeout_s)
                        conns[peer].send_step(k, n)
                        sent += n
                    for peer, n in step.recvs:
                        if self.inbox.errors:
                            raise ReplayError(self.inbox.errors[0])
                        received += self.inbox.wait((it, op.collective_id, peer, k), n,
                                                    self.io_timeout_s, self.aborted)
                for conn in conns.values():
                    conn.finish()
            finally:
                for conn in conns.values():
                    conn.sock.close()
        self.emit(ev="call", it=it, i=op.index, lane=op.lane, kind=op.kind, axis=op.axis,
                  cid=op.collective_id, tag=op.tag, seq=grant.seq,
                  reconfigured=grant.reconfigured, t_intent=t_intent, t_ack=t_ack,
                  t_end=time.time(), sent=sent, received=received,
                  expected=op.expected_bytes, size_bytes=op.size_bytes,
                  wire_bytes=op.wire_bytes)
        if op.predict >= 0:
            seq, target_it = predicted_call(self.positions, op.index, op.predict, it)
            if target_it < self.iterations:
                target = self.ops[op.predict]
                shim.predict(target.lane, seq, target.kind, target.size_bytes, target.axis)

    # -------------------------------------------------------------------- run

    def run(self) -> int:
        listener = Listener((str(self.plan["addr"]), self.port), self.inbox, self.io_timeout_s)
        lanes: dict[str, list[PlanOp]] = {}
        for op in self.ops:
            lanes.setdefault(op.lane, []).append(op)
        threads = [threading.Thread(target=self._lane, args=(name, ops), daemon=True,
                                    name=f"lane-{name}") for name, ops in lanes.items()]
        for t in threads:
            t.start()
        self.emit(ev="started", t=time.time(), lanes=list(lanes))
        status = 0
        try:
            crash_at = os.environ.get("OPUS_FAULT_CRASH", "")  # "RANK:ITERATION", for tests
            for it in range(self.iterations):
                if crash_at == f"{self.rank}:{it}":
                    self.out.flush()
                    os._exit(7)  # a crash: no record, no goodbye
                with self.profile.lock:
                    self.profile.mark_iteration()
                t_start = time.time()
                self.go[it].set()
                for op in self.ops:
                    self._wait(self.done[(it, op.index)])
                self.emit(ev="iteration", it=it, t_start=t_start, t_end=time.time())
        except Abort:
            status = 1
        for t in threads:
            t.join(5.0)
        if self.failure is not None:
            self.emit(ev="error", **self.failure)
            status = 1
        else:
            self.emit(ev="finished", t=time.time(),
                      mispredictions=self.profile.mispredictions)
        listener.close()
        return status


def main(argv: list[str] | None = None, opener: Callable[..., IO[str]] = open) -> int:
    args = sys.argv[1:] if argv is None else argv
    with open(args[0]) as fh:
        plan = json.load(fh)
    with opener(plan["out"], "a", encoding="utf-8") as out:
        status = Replayer(plan, out).run()
    sys.stdout.flush()
    os._exit(status)  # lanes blocked in a failed call must not keep the process alive


if __name__ == "__main__":
    main()
