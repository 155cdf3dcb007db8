"""os-ken app (OpenFlow 1.3) that makes every rail bridge behave as an optical circuit switch.

What the switch must do is decided in the pure core, :mod:`emulator.ocs_core` (circuits as flow
pairs, table-miss, set-up, the break-before-make sequence of operations); the one-to-one rule is
:class:`controller.ocs.CrossconnectState`. This module is the shell: it encodes the core's
operations into OpenFlow messages, sends them and keeps the time:

* each rail has one worker thread fed in the order requests were accepted, so the physical order
  always matches the order in which the state checked them; bridges run with
  ``fail_mode=secure`` so they never fall back to learning when the app is away;
* a reconfiguration runs break-before-make: the removals and the dark barrier go out, the worker
  waits for the dark barrier's reply, sleeps until the switching delay has passed since that
  reply, then the additions and the light barrier go out; the acknowledgement waits for the
  light barrier's reply too. vswitchd applies one connection's messages in order, so the
  additions can never overtake the removal;
* the switching time runs from the dark barrier's reply, the moment the removal is known
  applied, never from its sending: vswitchd applies a removal 0.3 ms after it is sent at p50
  and up to 5 ms on a loaded machine, and a delay timed from the send let the wire see dark
  periods that much shorter than the delay. A real OCS's darkness starts when its mirrors
  move; the emulated one now never lights early, and pays instead the lag between the
  removal's effect and its confirmation (about 0.3 ms) as late light, which the late-light
  bound reports (``docs/wire.md``, "The dark edge"). The record keeps the send as the dark
  period's start (``t_dark_s``, the conservative end) and the reply as ``t_applied_s``;
* the datapath flow cache is purged (``revalidator/purge`` over unixctl): without it the
  datapath keeps the "drop" flow it cached for a dark port (a stray packet, or the old
  circuit's flow revalidated to a drop) until OVS's revalidators get round to it, which lit new
  circuits ~3.5 ms late on this machine (a miss costs an untouched circuit one upcall, handled
  inline, no loss). Over the rail's own connection (below) the purge runs inside the delay,
  after the removal, and the light purges again only if a touched port received a packet
  since: the ports' counters are read with the removal and again with the additions (in each
  loop pass vswitchd forwards, then reads OpenFlow, then unixctl, so a packet read before the
  first counters was read before that purge). Over os-ken's connection the purge is sent with
  the light barrier in flight, and vswitchd reads the additions first (they were written
  first, and each pass reads OpenFlow before unixctl);
* flow messages are serialised through ``datapath.ofproto_parser`` once per datapath and
  operation, then reused (os-ken's serialiser costs ~0.1 ms per message);
* switching goes over each rail's own OpenFlow connection to its bridge's management socket
  (:mod:`emulator.ofchannel`), which the rail worker writes and reads itself; os-ken's
  connection does the set-up only (an ``event: channel`` record in the log says which rails
  got theirs). Over os-ken's connection a barrier reply hopped its receive thread, the app's
  event thread and the rail worker: in the demo (16 ranks, 4 rails) that put the light 1.4-1.6
  ms late at p50 and up to 8 ms at the tail, against 0.6-0.75 ms and about 1 ms over the
  rail's own connection (``docs/performance.md``, "Light confirmation"). A rail whose
  connection cannot be opened switches over os-ken's, correct but slower to confirm; barrier
  replies there take the app's ordinary ``set_ev_cls`` handler, in the ``config`` state too
  (the set-up barrier can be answered before os-ken's port-description exchange has moved the
  connection to ``main``).

With one Open vSwitch per rail (:mod:`emulator.ovs_instance`) the service names each rail's
management and unixctl sockets: the rail's channel opens its instance's, and each vswitchd has
its own purger (rails that light together then purge their own datapaths, in parallel).

The app runs in its own process (:mod:`emulator.ocs_service`); nothing outside this package
imports os-ken.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import queue
import struct
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, assert_never

from os_ken.base import app_manager
from os_ken.controller import ofp_event
from os_ken.controller.handler import (
    CONFIG_DISPATCHER,
    DEAD_DISPATCHER,
    MAIN_DISPATCHER,
    set_ev_cls,
)
from os_ken.ofproto import ofproto_v1_3

from controller.ocs import (
    ApplyResult,
    Circuit,
    PortState,
    RailDescription,
    Reconfiguration,
)
from emulator.dpflows import flows_entering
from emulator.ocs_core import (
    CIRCUIT_PRIORITY,
    Barrier,
    BarrierKind,
    DeleteAllFlows,
    FlowAdd,
    FlowDelete,
    FlowOperation,
    OcsRails,
    Operation,
    TableMiss,
    WaitDelay,
)
from emulator.ofchannel import (
    ChannelError,
    OpenFlowChannel,
    barrier_request,
    mgmt_socket,
    port_stats_request,
)
from emulator.ovs_unixctl import Unixctl, UnixctlError

LOG = logging.getLogger("opus.ocs")

BARRIER_TIMEOUT_S = 5.0
SETUP_BARRIER_ATTEMPTS = 4
#: Byte offset of the transaction id in an OpenFlow header (version, type, length, xid).
_XID_OFFSET = 4

_PendingBarrier = tuple[int, threading.Event]


class SwitchUnavailable(RuntimeError):
    """A rail bridge is not connected, or did not confirm a change in time."""


@dataclass(frozen=True)
class _Batch:
    data: bytes
    xids: list[int]


@dataclass
class _Job:
    reconf: Reconfiguration
    operations: tuple[Operation, ...]
    t_request_s: float
    future: Future[ApplyResult]


class OcsFabric:
    """All rail switches of one emulated network: the core's state, datapaths, rail workers."""

    def __init__(
        self,
        rails: Sequence[RailDescription],
        dpids: dict[int, int],
        event_log: Path | None = None,
        clock: Callable[[], float] = time.time,
        bridges: dict[int, str] | None = None,
        sockets: dict[int, tuple[str, str]] | None = None,
    ) -> None:
        self.core = OcsRails(rails)
        self.rail_of_dpid = {dpid: rail for rail, dpid in dpids.items()}
        self.clock = clock
        #: a test hook, never set in a run: the app lies in its record (see :data:`LIES`)
        self.lie = os.environ.get(LIE_ENV, "")
        if self.lie and self.lie not in LIES:
            raise ValueError(f"{LIE_ENV} must be one of {', '.join(LIES)}, got {self.lie!r}")
        self._lock = threading.Lock()  # guards the core, datapaths and dark ports
        self._datapaths: dict[int, Any] = {}
        self._ready: dict[int, threading.Event] = {r: threading.Event() for r in self.rails}
        self._dark: dict[int, set[int]] = {r: set() for r in self.rails}
        self._queues: dict[int, queue.Queue[_Job | None]] = {r: queue.Queue() for r in self.rails}
        self._barriers: dict[int, threading.Event] = {}
        self._message_cache: dict[tuple[int, FlowOperation | type[Barrier]], bytes] = {}
        self._xids = itertools.count(0x40000000)
        # rail -> (management socket, vswitchd's unixctl socket) of a rail in its own Open
        # vSwitch (emulator.ovs_instance); rails not named use the system instance's.
        self._sockets = dict(sockets or {})
        self._flushers = {path: _DatapathFlusher(path)
                          for path in {None, *(u for _m, u in self._sockets.values())}}
        self._bridges = dict(bridges or {})  # rail -> bridge name, for the rail's own channel
        self._channels: dict[int, OpenFlowChannel] = {}  # each used by its rail worker only
        self._log_lock = threading.Lock()
        self._log_file = event_log.open("a", encoding="utf-8") if event_log else None
        self._workers = [
            threading.Thread(target=self._worker, args=(rail,), name=f"ocs-rail{rail}",
                             daemon=True)
            for rail in self.rails
        ]
        for w in self._workers:
            w.start()

    @property
    def rails(self) -> dict[int, RailDescription]:
        return self.core.rails

    @property
    def delay_ms(self) -> dict[int, float]:
        return self.core.delay_ms

    # ---- events from the os-ken app -------------------------------------------------------

    def on_datapath(self, datapath: Any) -> None:
        """A bridge connected: run the core's set-up on it and wait until it confirms."""
        rail = self.rail_of_dpid.get(datapath.id)
        if rail is None:
            LOG.warning("ignoring unknown datapath %016x", datapath.id)
            return
        with self._lock:
            self._datapaths[rail] = datapath
            operations = self.core.setup(rail)
        pending = self._run(datapath, operations)
        for attempt in range(SETUP_BARRIER_ATTEMPTS):  # a loaded machine can be slow to confirm
            try:
                self._confirm(datapath, pending)
                break
            except SwitchUnavailable:
                if attempt == SETUP_BARRIER_ATTEMPTS - 1:
                    raise
                LOG.warning("rail %d: setup not confirmed yet, asking again", rail)
                pending = self._run(datapath, (Barrier(BarrierKind.SETUP),))
        self._ready[rail].set()
        self._log({"event": "switch_connected", "rail": rail, "dpid": f"{datapath.id:016x}"})

    def on_disconnect(self, datapath: Any) -> None:
        rail = self.rail_of_dpid.get(datapath.id)
        if rail is None:
            return
        with self._lock:
            if self._datapaths.get(rail) is datapath:
                del self._datapaths[rail]
                self._ready[rail].clear()
        self._log({"event": "switch_disconnected", "rail": rail})

    def on_barrier_reply(self, xid: int) -> None:
        event = self._barriers.get(xid)
        if event is not None:
            event.set()

    # ---- management API ------------------------------------------------------------------

    def connected_rails(self) -> list[int]:
        return sorted(r for r, ev in self._ready.items() if ev.is_set())

    def describe(self) -> list[RailDescription]:
        return self.core.describe()

    def set_delay_ms(self, rail: int, delay_ms: float) -> None:
        with self._lock:
            self.core.set_delay_ms(rail, delay_ms)

    def circuits(self, rail: int) -> frozenset[Circuit]:
        with self._lock:
            return self.core.circuits(rail)

    def port_states(self, rail: int) -> dict[int, PortState]:
        with self._lock:
            return self.core.port_states(rail, dark=self._dark.get(rail, ()))

    def submit(self, reconfs: Sequence[Reconfiguration]) -> list[Future[ApplyResult]]:
        """Check a batch (all-or-nothing), commit it and queue it on the rails' workers."""
        t_request = self.clock()
        with self._lock:
            for r in reconfs:
                self.core.require_ocs(r.rail)
            missing = [r.rail for r in reconfs if not self._ready[r.rail].is_set()]
            if missing:
                raise SwitchUnavailable(f"rail(s) {missing} not connected to the OCS app")
            futures = []
            for r, operations in zip(reconfs, self.core.accept(reconfs), strict=True):
                fut: Future[ApplyResult] = Future()
                self._queues[r.rail].put(_Job(r, operations, t_request, fut))
                futures.append(fut)
        return futures

    def reconfigure(self, reconfs: Sequence[Reconfiguration]) -> list[ApplyResult]:
        futures = self.submit(reconfs)
        # Workers always settle a future: a switch that does not confirm raises SwitchUnavailable.
        return [f.result() for f in futures]

    def close(self) -> None:
        for q in self._queues.values():
            q.put(None)
        if self._log_file:
            with self._log_lock:
                self._log_file.close()
                self._log_file = None

    # ---- internals ------------------------------------------------------------------------

    def _worker(self, rail: int) -> None:
        realtime_priority()
        q = self._queues[rail]
        while True:
            job = q.get()
            if job is None:
                return
            try:
                job.future.set_result(self._switch(rail, job))
            except BaseException as exc:  # the caller gets the error, the worker lives on
                job.future.set_exception(exc)

    def _switch(self, rail: int, job: _Job) -> ApplyResult:
        reconf = job.reconf
        if not job.operations:
            now = self.clock()
            return ApplyResult(rail, reconf.add, reconf.remove, job.t_request_s, now, now)
        datapath = self._datapaths.get(rail)
        if datapath is None:
            raise SwitchUnavailable(f"rail {rail} disconnected during reconfiguration")
        channel = self._channel(rail)
        touched = reconf.touched_ports
        with self._lock:
            self._dark[rail] |= touched
        try:
            t_dark = self.clock()
            purged: bool | None = None  # over os-ken's connection: always, with the barrier
            # in flight (see the module docstring)
            edges: dict[str, float] = {}  # when the removal was confirmed (and purged)
            if channel is None:
                pending = self._run(datapath, job.operations, edges)
                self._flusher(rail).flush()
                self._confirm(datapath, pending)
            else:
                purged = self._switch_on_channel(rail, channel, datapath, job.operations,
                                                 touched, edges)
            t_light = self.clock()
        finally:
            with self._lock:
                self._dark[rail] -= touched
        delay_ms = sum(op.delay_ms for op in job.operations if isinstance(op, WaitDelay))
        if self.lie:  # the record claims the configured delay, whatever the wire saw
            t_light = t_dark + delay_ms / 1e3
        self._log({"event": "dark", "rail": rail, "ports": sorted(touched), "t_s": t_dark,
                   "delay_ms": delay_ms, **edges})
        result = ApplyResult(rail, reconf.add, reconf.remove, job.t_request_s, t_dark, t_light)
        self._log({"event": "light", **result.to_json(),
                   **({} if purged is None else {"purged": purged})})
        return result

    def _channel(self, rail: int) -> OpenFlowChannel | None:
        """The rail worker's own OpenFlow connection to its bridge (opened on first use), or
        None when the app knows no bridge name for the rail or cannot connect: switching then
        goes over os-ken's connection, as correct but slower to confirm."""
        channel = self._channels.get(rail)
        bridge = self._bridges.get(rail)
        if channel is None and bridge is not None:
            try:
                path = self._sockets[rail][0] if rail in self._sockets else mgmt_socket(bridge)
                channel = OpenFlowChannel(path, timeout_s=BARRIER_TIMEOUT_S)
            except ChannelError as exc:
                LOG.warning("rail %d: %s; switching over os-ken's connection", rail, exc)
                del self._bridges[rail]
                self._log({"event": "channel", "rail": rail, "bridge": bridge,
                           "error": str(exc)})
                return None
            self._channels[rail] = channel
            self._log({"event": "channel", "rail": rail, "bridge": bridge, "path": channel.path})
        return channel

    def _switch_on_channel(self, rail: int, channel: OpenFlowChannel, datapath: Any,
                           operations: Sequence[Operation], touched: frozenset[int],
                           edges: dict[str, float]) -> bool:
        """Break-before-make over the rail's own channel; True if the light needed a purge.
        ``edges`` gets when the removal's barrier reply came (``t_applied_s``) and when the
        purge after it ended (``t_purged_s``): the datapath is dark for certain from then
        (``docs/wire.md``, "The dark edge").

        During the delay: the removals and the dark barrier, the touched ports' packet counters,
        then a datapath purge, so no cached flow of the old circuits (or drop) is left. At the
        light: the counters again with the additions and the light barrier (built during the
        delay); only if a touched port received a packet since (which may have cached a drop for
        it) is the datapath purged again, after the barrier. A packet read before the first
        counters was read before the purge too (vswitchd forwards, then reads OpenFlow, then
        unixctl, in each loop pass). The counters are asked port by port, for the touched ports
        only: that adds 0.04 ms to the barrier's answer, every port's 0.16 ms (``bench counters``).
        """
        wait = next(i for i, op in enumerate(operations) if isinstance(op, WaitDelay))
        delay = operations[wait]
        assert isinstance(delay, WaitDelay)
        ports = sorted(touched)
        try:
            dark = self._batch(datapath, operations[:wait])
            before = [self._xid() for _ in ports]
            channel.send(dark.data + _counters_request(before, ports))
            counters = channel.wait([*dark.xids, *before], BARRIER_TIMEOUT_S)
            edges["t_applied_s"] = self.clock()
            # until no flow of a touched port is left (issue 35: emulator.dpflows)
            edges["dark_purges"] = self._flusher(rail).flush_ports(self._port_names(rail,
                                                                                    ports))
            edges["t_purged_s"] = self.clock()
            after = [self._xid() for _ in ports]
            light = self._batch(datapath, operations[wait + 1:])
            request = _counters_request(after, ports) + light.data
            _sleep_until(self._light_at_s(delay, edges["t_applied_s"]), self.clock)
            channel.send(request)
            counters |= channel.wait([*after, *light.xids], BARRIER_TIMEOUT_S)
        except ChannelError as exc:
            self._drop_channel(rail)
            raise SwitchUnavailable(f"rail {rail}: {exc}") from exc
        received = [p for p, b, a in zip(ports, before, after, strict=True)
                    if counters.get(a, {}).get(p, 0) != counters.get(b, {}).get(p, 0)]
        if received:
            self._flusher(rail).flush()
        return bool(received)

    def _port_names(self, rail: int, ports: Sequence[int]) -> list[str]:
        """The datapath's names of ``rail``'s OpenFlow ``ports`` (``<bridge>-eth<port>``,
        :mod:`emulator.naming`); none when the app knows no bridge name for the rail."""
        bridge = self._bridges.get(rail)
        return [f"{bridge}-eth{p}" for p in ports] if bridge else []

    def _light_at_s(self, delay: WaitDelay, t_applied_s: float) -> float:
        """When the additions may go out: the switching delay after the removal was confirmed
        applied (``t_applied_s``), stretched or shrunk by the test hook's lie (:data:`LIES`)."""
        return t_applied_s + LIES.get(self.lie, 1.0) * (delay.until_s(t_applied_s) - t_applied_s)

    def _xid(self) -> int:
        return next(self._xids) & 0xFFFFFFFF

    def _flusher(self, rail: int) -> _DatapathFlusher:
        """The purger of the vswitchd that runs ``rail``'s bridge."""
        sockets = self._sockets.get(rail)
        return self._flushers[sockets[1] if sockets else None]

    def _batch(self, datapath: Any, operations: Sequence[Operation]) -> _Batch:
        """Flow mods and barriers serialised into one write, with the barriers' xids."""
        data = bytearray()
        xids: list[int] = []
        for op in operations:
            if isinstance(op, Barrier):
                xids.append(self._xid())
                data += barrier_request(xids[-1])
            elif isinstance(op, WaitDelay):
                raise ValueError("a batch cannot wait")
            else:
                data += self._message_bytes(datapath, op)
        return _Batch(bytes(data), xids)

    def _drop_channel(self, rail: int) -> None:
        """Close a rail's failed channel; its next switch opens a new one."""
        channel = self._channels.pop(rail, None)
        if channel is not None:
            channel.close()

    def _run(self, datapath: Any, operations: Sequence[Operation],
             edges: dict[str, float] | None = None) -> list[_PendingBarrier]:
        """Send ``operations`` in order; return the barriers whose replies are outstanding.

        Messages between two waits go out in one write. A :class:`WaitDelay` first waits for
        the replies to the barriers sent before it (the dark barrier): its delay counts from
        them (``edges["t_applied_s"]``). Other barriers are sent, not waited for (see
        :meth:`_confirm`).
        """
        buf = bytearray()
        pending: list[_PendingBarrier] = []
        for op in operations:
            if isinstance(op, WaitDelay):
                self._send(datapath, buf)
                self._confirm(datapath, pending)
                pending = []
                t_applied_s = self.clock()
                if edges is not None:
                    edges["t_applied_s"] = t_applied_s
                _sleep_until(self._light_at_s(op, t_applied_s), self.clock)
            elif isinstance(op, Barrier):
                xid = next(self._xids) & 0xFFFFFFFF
                done = threading.Event()
                self._barriers[xid] = done
                pending.append((xid, done))
                buf += self._barrier_bytes(datapath, xid)
            else:
                buf += self._message_bytes(datapath, op)
        self._send(datapath, buf)
        return pending

    @staticmethod
    def _send(datapath: Any, buf: bytearray) -> None:
        if buf:
            datapath.send(bytes(buf))
            buf.clear()

    def _confirm(self, datapath: Any, pending: Sequence[_PendingBarrier]) -> None:
        """Wait for the replies to ``pending`` barriers; SwitchUnavailable after the timeout."""
        deadline_s = time.monotonic() + BARRIER_TIMEOUT_S
        try:
            for _xid, done in pending:
                if not done.wait(max(0.0, deadline_s - time.monotonic())):
                    raise SwitchUnavailable(f"datapath {datapath.id:016x} did not confirm "
                                            f"within {BARRIER_TIMEOUT_S} s")
        finally:
            for xid, _done in pending:
                self._barriers.pop(xid, None)

    def _barrier_bytes(self, datapath: Any, xid: int) -> bytes:
        """A serialised barrier request with transaction id ``xid`` (template cached)."""
        template = self._message_cache.get((datapath.id, Barrier))
        if template is None:
            msg = datapath.ofproto_parser.OFPBarrierRequest(datapath)
            template = self._serialise(msg)
            self._message_cache[(datapath.id, Barrier)] = template
        out = bytearray(template)
        struct.pack_into("!I", out, _XID_OFFSET, xid)
        return bytes(out)

    def _message_bytes(self, datapath: Any, op: FlowOperation) -> bytes:
        """The serialised flow mod for ``op``, built once per datapath and reused (xid 0:
        replies are matched by the barriers)."""
        key = (datapath.id, op)
        cached = self._message_cache.get(key)
        if cached is None:
            cached = self._serialise(_flow_mod(datapath, op))
            self._message_cache[key] = cached
        return cached

    @staticmethod
    def _serialise(msg: Any) -> bytes:
        msg.set_xid(0)
        msg.serialize()
        return bytes(msg.buf)

    def _log(self, record: dict[str, Any]) -> None:
        if self._log_file is None:
            return
        record.setdefault("t_s", self.clock())
        line = json.dumps(record, separators=(",", ":"))
        with self._log_lock:
            if self._log_file:
                self._log_file.write(line + "\n")
                self._log_file.flush()


def _flow_mod(datapath: Any, op: FlowOperation) -> Any:
    """The os-ken message for one of the core's flow operations."""
    parser = datapath.ofproto_parser
    ofp = datapath.ofproto
    if isinstance(op, DeleteAllFlows):
        return parser.OFPFlowMod(datapath, command=ofp.OFPFC_DELETE, table_id=ofp.OFPTT_ALL,
                                 out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY,
                                 match=parser.OFPMatch())
    if isinstance(op, FlowDelete):
        return parser.OFPFlowMod(datapath, command=ofp.OFPFC_DELETE_STRICT,
                                 priority=CIRCUIT_PRIORITY,
                                 match=parser.OFPMatch(in_port=op.in_port),
                                 out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY)
    if isinstance(op, FlowAdd):
        priority = CIRCUIT_PRIORITY
        match = parser.OFPMatch(in_port=op.in_port)
        actions = [parser.OFPActionOutput(op.out_port)]
    elif isinstance(op, TableMiss):
        priority = 0
        match = parser.OFPMatch()
        # An empty action list drops, as on glass.
        actions = [parser.OFPActionOutput(ofp.OFPP_NORMAL)] if op.normal else []
    else:
        assert_never(op)
    inst = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, actions)]
    return parser.OFPFlowMod(datapath, command=ofp.OFPFC_ADD, priority=priority, match=match,
                             instructions=inst)


def _counters_request(xids: Sequence[int], ports: Sequence[int]) -> bytes:
    """One port-stats request per port (``xids[i]`` asks for ``ports[i]``), in one write."""
    return b"".join(port_stats_request(xid, port) for xid, port in zip(xids, ports, strict=True))


#: Purges a switch's dark period makes at most while a flow of a touched port survives them.
MAX_DARK_PURGES = 5


class _DatapathFlusher:
    """Purges OVS's datapath flow cache, so changed OpenFlow rules take effect at once.

    One purge serves every rail that asked before it began: rails whose phases align light
    together, and each used to queue a purge of its own behind vswitchd's main thread. One per
    vswitchd: ``path`` is its unixctl socket (None: the system instance's).
    """

    def __init__(self, path: str | None = None) -> None:
        self._path = path
        self._cond = threading.Condition()
        self._started = 0  # purges begun
        self._done = 0  # the number of the last purge finished
        self._running = False
        self._waiting = 0  # callers waiting while another's purge runs
        self._client: Unixctl | None = None
        self._dump_client: Unixctl | None = None  # flush_ports' dumps, under _dump_lock
        self._dump_lock = threading.Lock()
        self.failures = 0

    @property
    def waiting(self) -> int:
        """Callers waiting for a purge that another caller is running."""
        with self._cond:
            return self._waiting

    def flush(self) -> None:
        """Return once a purge that began after this call has finished."""
        with self._cond:
            needed = self._started + 1
            while self._done < needed:
                if self._running:
                    self._waiting += 1
                    self._cond.wait()
                    self._waiting -= 1
                    continue
                self._running = True
                self._started += 1
                number = self._started
                self._cond.release()
                try:
                    self._purge()
                finally:
                    self._cond.acquire()
                    self._running = False
                    self._done = number
                    self._cond.notify_all()

    def flush_ports(self, ports: Sequence[str]) -> int:
        """Purge until a dump of the datapath shows no flow entering ``ports`` (names), at most
        :data:`MAX_DARK_PURGES` times; the number of purges made. A purge skips a flow whose
        revalidation is running, which then writes the dark table's ``drop`` into it
        (:mod:`emulator.dpflows`); a dump that fails ends the loop (only timing suffers)."""
        purges = 0
        while True:
            self.flush()
            purges += 1
            if purges >= MAX_DARK_PURGES or not ports:
                return purges
            with self._dump_lock:
                try:
                    if self._dump_client is None:
                        self._dump_client = Unixctl(self._path)
                    dump = self._dump_client.call("dpctl/dump-flows", "--names")
                except (UnixctlError, OSError):
                    if self._dump_client is not None:
                        self._dump_client.close()
                        self._dump_client = None
                    return purges
            if not flows_entering(dump, ports):
                return purges

    def _purge(self) -> None:
        try:
            if self._client is None:
                self._client = Unixctl(self._path)
            self._client.call("revalidator/purge")
        except (UnixctlError, OSError) as exc:  # correctness holds without it; only timing
            # suffers (a refused or missing socket is a plain OSError from the connect)
            self.failures += 1
            if self._client is not None:
                self._client.close()
                self._client = None
            if self.failures in (1, 100):
                LOG.warning("datapath flush failed (%s); circuits light late", exc)


#: Test hook: ``OPUS_OCS_TEST_LIE=early`` makes the app light after half the delay and
#: ``late`` after twice it, while its record claims the configured delay: the app's own
#: record then passes every check, and only an observer it does not control (the wire check,
#: :mod:`testbed.metrics.wire`) can tell. Never set in a run; the emulation tests use it.
LIE_ENV = "OPUS_OCS_TEST_LIE"
LIES = {"early": 0.5, "late": 2.0}


#: The last part of a wait is spun, not slept: a sleep to the deadline overshot it by 0.07 ms
#: at p50 and 0.09 ms at p90 on this machine (SCHED_FIFO), the spin by 0.001 ms, and every
#: switch pays the overshoot in its dark period.
SPIN_S = 0.0003


def _sleep_until(deadline_s: float, clock: Callable[[], float]) -> None:
    """Wait to a deadline: sleep until :data:`SPIN_S` before it, then spin."""
    while (remaining := deadline_s - clock()) > SPIN_S:
        time.sleep(remaining - SPIN_S)
    while clock() < deadline_s:
        pass


#: SCHED_FIFO priority of the rail workers (ovs-vswitchd's main thread runs just below, see
#: :mod:`emulator.vswitchd_priority`).
WORKER_PRIORITY = 10


def realtime_priority(priority: int = WORKER_PRIORITY) -> bool:
    """Give the calling thread SCHED_FIFO priority, so switching delays do not stretch when
    the machine is busy. It spins only the last :data:`SPIN_S` of a wait, so it cannot starve
    ovs-vswitchd. False if refused."""
    try:
        os.sched_setscheduler(threading.get_native_id(), os.SCHED_FIFO,
                              os.sched_param(priority))
    except (OSError, AttributeError):
        return False
    return True


class OcsApp(app_manager.OSKenApp):
    """The thin os-ken shell: forwards switch events to the :class:`OcsFabric`."""

    OFP_VERSIONS: ClassVar[list[int]] = [ofproto_v1_3.OFP_VERSION]
    #: Set by the service before os-ken instantiates the app (os-ken passes no arguments).
    fabric: OcsFabric | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        if OcsApp.fabric is None:
            raise RuntimeError("OcsApp.fabric must be set before the app starts")
        self.ocs = OcsApp.fabric

    @set_ev_cls(ofp_event.EventOFPBarrierReply, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def _barrier_reply(self, ev: Any) -> None:
        self.ocs.on_barrier_reply(ev.msg.xid)

    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def _switch_features(self, ev: Any) -> None:
        # Set-up waits for a barrier reply, which this very event loop delivers: run it aside.
        threading.Thread(target=self.ocs.on_datapath, args=(ev.msg.datapath,),
                         name="ocs-switch-setup", daemon=True).start()

    @set_ev_cls(ofp_event.EventOFPErrorMsg, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def _error(self, ev: Any) -> None:
        msg = ev.msg
        LOG.error("OpenFlow error from %016x: type=%s code=%s", msg.datapath.id, msg.type,
                  msg.code)

    @set_ev_cls(ofp_event.EventOFPStateChange, [DEAD_DISPATCHER])
    def _state_change(self, ev: Any) -> None:
        if ev.datapath is not None and ev.datapath.id is not None:
            self.ocs.on_disconnect(ev.datapath)
