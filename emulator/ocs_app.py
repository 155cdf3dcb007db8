"""os-ken app (OpenFlow 1.3) that makes every rail bridge behave as an optical circuit switch.

The rules live in :class:`controller.ocs.CrossconnectState`; this module only turns accepted
reconfigurations into OpenFlow messages and timing:

* a circuit ``a<->b`` is two flows, ``in_port=a -> output:b`` and ``in_port=b -> output:a``;
  the table-miss flow drops (no flooding, no learning, no packet-in), and bridges run with
  ``fail_mode=secure`` so they never fall back to learning when the app is away;
* a reconfiguration is break-before-make: delete the flows of the touched ports, barrier (the
  ports are dark), wait the rail's switching delay, add the new flows, barrier (light), then
  acknowledge. Flows of untouched ports are never modified;
* the switching time runs from the moment the removal is sent: the data plane goes dark as
  soon as vswitchd applies it, well before the barrier reply is back, and both edges then pay
  the same transit to vswitchd;
* after the light barrier the datapath flow cache is purged (``revalidator/purge`` over
  unixctl). Without it the datapath keeps the "drop" flow it cached for a dark port until OVS's
  revalidators get round to it, which lit new circuits ~3.5 ms late on this machine. Purging
  costs untouched circuits one upcall per flow (dpif-netdev handles a miss inline, no loss);
* each rail has one worker thread fed in the order requests were accepted, so the physical order
  always matches the order in which the state checked them;
* in ``electrical`` mode a rail is an all-to-all learning switch (``NORMAL``), the baseline.

The app runs in its own process (:mod:`emulator.ocs_service`); nothing outside this package
imports os-ken.
"""

from __future__ import annotations

import itertools
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

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
    CrossconnectState,
    PortState,
    RailDescription,
    Reconfiguration,
    ReconfigurationRejected,
)
from emulator.ovs_unixctl import Unixctl, UnixctlError

LOG = logging.getLogger("opus.ocs")

CIRCUIT_PRIORITY = 100
BARRIER_TIMEOUT_S = 5.0
SETUP_BARRIER_ATTEMPTS = 4


class SwitchUnavailable(RuntimeError):
    """A rail bridge is not connected, or did not confirm a change in time."""


@dataclass
class _Job:
    reconf: Reconfiguration
    t_request_s: float
    future: Future[ApplyResult]


class OcsFabric:
    """All rail switches of one emulated network: state, datapaths and per-rail workers."""

    def __init__(
        self,
        rails: Sequence[RailDescription],
        dpids: dict[int, int],
        event_log: Path | None = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        self.rails = {r.rail: r for r in rails}
        self.rail_of_dpid = {dpid: rail for rail, dpid in dpids.items()}
        self.delay_ms = {r.rail: r.switching_delay_ms for r in rails}
        self.state = CrossconnectState({r.rail: r.ports for r in rails if r.mode == "ocs"})
        self.clock = clock
        self._lock = threading.Lock()
        self._datapaths: dict[int, Any] = {}
        self._ready: dict[int, threading.Event] = {r: threading.Event() for r in self.rails}
        self._dark: dict[int, set[int]] = {r: set() for r in self.rails}
        self._queues: dict[int, queue.Queue[_Job | None]] = {r: queue.Queue() for r in self.rails}
        self._barriers: dict[int, threading.Event] = {}
        self._flow_cache: dict[tuple[int, int, int, bool], bytes] = {}
        self._xids = itertools.count(0x40000000)
        self._unixctl = _DatapathFlusher()
        self._log_lock = threading.Lock()
        self._log_file = event_log.open("a", encoding="utf-8") if event_log else None
        self._workers = [
            threading.Thread(target=self._worker, args=(rail,), name=f"ocs-rail{rail}",
                             daemon=True)
            for rail in self.rails
        ]
        for w in self._workers:
            w.start()

    # ---- events from the os-ken app -------------------------------------------------------

    def on_datapath(self, datapath: Any) -> None:
        """A bridge connected: wipe its table and install the mode's base flows and circuits."""
        rail = self.rail_of_dpid.get(datapath.id)
        if rail is None:
            LOG.warning("ignoring unknown datapath %016x", datapath.id)
            return
        parser = datapath.ofproto_parser
        ofp = datapath.ofproto
        datapath.send_msg(parser.OFPFlowMod(datapath, command=ofp.OFPFC_DELETE,
                                            table_id=ofp.OFPTT_ALL, out_port=ofp.OFPP_ANY,
                                            out_group=ofp.OFPG_ANY, match=parser.OFPMatch()))
        if self.rails[rail].mode == "electrical":
            actions = [parser.OFPActionOutput(ofp.OFPP_NORMAL)]
        else:
            actions = []  # table miss: drop, as on glass
        datapath.send_msg(self._flow_add(datapath, 0, parser.OFPMatch(), actions))
        with self._lock:
            self._datapaths[rail] = datapath
            circuits = self.state.circuits(rail) if rail in self.state.rails else frozenset()
        self._send_circuits(datapath, circuits, add=True)
        for attempt in range(SETUP_BARRIER_ATTEMPTS):  # a loaded machine can be slow to confirm
            try:
                self._barrier(datapath)
                break
            except SwitchUnavailable:
                if attempt == SETUP_BARRIER_ATTEMPTS - 1:
                    raise
                LOG.warning("rail %d: setup not confirmed yet, asking again", rail)
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
        return [
            RailDescription(r.rail, r.ports, self.delay_ms[r.rail], r.mode)
            for r in self.rails.values()
        ]

    def set_delay_ms(self, rail: int, delay_ms: float) -> None:
        self._require_rail(rail)
        if delay_ms < 0:
            raise ValueError(f"rail {rail}: switching delay must be >= 0 ms, got {delay_ms}")
        self.delay_ms[rail] = float(delay_ms)

    def circuits(self, rail: int) -> frozenset[Circuit]:
        self._require_ocs(rail)
        with self._lock:
            return self.state.circuits(rail)

    def port_states(self, rail: int) -> dict[int, PortState]:
        self._require_rail(rail)
        desc = self.rails[rail]
        with self._lock:
            if desc.mode == "electrical":
                return dict.fromkeys(desc.ports, PortState.LIT)
            return self.state.port_states(rail, dark=self._dark[rail])

    def submit(self, reconfs: Sequence[Reconfiguration]) -> list[Future[ApplyResult]]:
        """Check a batch (all-or-nothing), commit it and queue it on the rails' workers."""
        t_request = self.clock()
        for r in reconfs:
            self._require_ocs(r.rail)
        with self._lock:
            missing = [r.rail for r in reconfs if not self._ready[r.rail].is_set()]
            if missing:
                raise SwitchUnavailable(f"rail(s) {missing} not connected to the OCS app")
            self.state.check_all(reconfs)
            futures = []
            for r in reconfs:
                self.state.apply(r)
                fut: Future[ApplyResult] = Future()
                self._queues[r.rail].put(_Job(r, t_request, fut))
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

    def _require_rail(self, rail: int) -> None:
        if rail not in self.rails:
            raise ReconfigurationRejected(rail, [], f"no such rail (rails: {sorted(self.rails)})")

    def _require_ocs(self, rail: int) -> None:
        self._require_rail(rail)
        if self.rails[rail].mode != "ocs":
            raise ReconfigurationRejected(
                rail, [], "rail is an electrical packet switch (baseline): it has no circuits")

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
        if reconf.is_empty:
            now = self.clock()
            return ApplyResult(rail, reconf.add, reconf.remove, job.t_request_s, now, now)
        datapath = self._datapaths.get(rail)
        if datapath is None:
            raise SwitchUnavailable(f"rail {rail} disconnected during reconfiguration")
        touched = reconf.touched_ports
        with self._lock:
            self._dark[rail] |= touched
        try:
            # The data plane goes dark as soon as vswitchd applies the removal, well before its
            # barrier reply travels back through os-ken; so the switching time runs from here.
            # vswitchd applies one connection's messages in order, so the additions sent after
            # the delay can never overtake the removal; both barriers confirm before the ack.
            t_dark = self.clock()
            self._send_circuits(datapath, reconf.remove, add=False)
            removed = self._barrier_start(datapath)
            self._log({"event": "dark", "rail": rail, "ports": sorted(touched), "t_s": t_dark})
            _sleep_until(t_dark + self.delay_ms[rail] / 1e3, self.clock)
            self._send_circuits(datapath, reconf.add, add=True)
            lit = self._barrier_start(datapath)
            self._barrier_wait(datapath, *removed)
            self._barrier_wait(datapath, *lit)
            self._unixctl.flush()
            t_light = self.clock()
        finally:
            with self._lock:
                self._dark[rail] -= touched
        result = ApplyResult(rail, reconf.add, reconf.remove, job.t_request_s, t_dark, t_light)
        self._log({"event": "light", **result.to_json()})
        return result

    def _flow_add(self, datapath: Any, priority: int, match: Any, actions: list[Any]) -> Any:
        parser = datapath.ofproto_parser
        ofp = datapath.ofproto
        inst = [parser.OFPInstructionActions(ofp.OFPIT_APPLY_ACTIONS, actions)]
        return parser.OFPFlowMod(datapath, priority=priority, match=match, instructions=inst,
                                 command=ofp.OFPFC_ADD)

    def _send_circuits(self, datapath: Any, circuits: Iterable[Circuit], *, add: bool) -> None:
        """Send the flow mods of ``circuits`` in one write (bytes cached per flow)."""
        buf = b"".join(self._flow_bytes(datapath, src, dst, add)
                       for c in sorted(circuits)
                       for src, dst in ((c.port_a, c.port_b), (c.port_b, c.port_a)))
        if buf:
            datapath.send(buf)

    def _flow_bytes(self, datapath: Any, src: int, dst: int, add: bool) -> bytes:
        """The serialised flow mod for ``in_port=src -> output:dst`` (add or strict delete).

        Serialising through os-ken costs ~0.1 ms per message; circuits recur, so each message
        is built once per datapath and reused (xid 0: replies are matched by the barrier).
        """
        key = (datapath.id, src, dst, add)
        cached = self._flow_cache.get(key)
        if cached is not None:
            return cached
        parser = datapath.ofproto_parser
        ofp = datapath.ofproto
        match = parser.OFPMatch(in_port=src)
        if add:
            msg = self._flow_add(datapath, CIRCUIT_PRIORITY, match, [parser.OFPActionOutput(dst)])
        else:
            msg = parser.OFPFlowMod(datapath, command=ofp.OFPFC_DELETE_STRICT,
                                    priority=CIRCUIT_PRIORITY, match=match,
                                    out_port=ofp.OFPP_ANY, out_group=ofp.OFPG_ANY)
        msg.set_xid(0)
        msg.serialize()
        data = bytes(msg.buf)
        self._flow_cache[key] = data
        return data

    def _barrier(self, datapath: Any) -> None:
        self._barrier_wait(datapath, *self._barrier_start(datapath))

    def _barrier_start(self, datapath: Any) -> tuple[int, threading.Event]:
        msg = datapath.ofproto_parser.OFPBarrierRequest(datapath)
        xid = next(self._xids) & 0xFFFFFFFF
        msg.set_xid(xid)
        done = threading.Event()
        self._barriers[xid] = done
        datapath.send_msg(msg)
        return xid, done

    def _barrier_wait(self, datapath: Any, xid: int, done: threading.Event) -> None:
        try:
            if not done.wait(BARRIER_TIMEOUT_S):
                raise SwitchUnavailable(
                    f"datapath {datapath.id:016x} did not confirm within {BARRIER_TIMEOUT_S} s")
        finally:
            self._barriers.pop(xid, None)

    def _log(self, record: dict[str, Any]) -> None:
        if self._log_file is None:
            return
        record.setdefault("t_s", self.clock())
        line = json.dumps(record, separators=(",", ":"))
        with self._log_lock:
            if self._log_file:
                self._log_file.write(line + "\n")
                self._log_file.flush()


class _DatapathFlusher:
    """Purges OVS's datapath flow cache, so changed OpenFlow rules take effect at once."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._client: Unixctl | None = None
        self.failures = 0

    def flush(self) -> None:
        with self._lock:
            try:
                if self._client is None:
                    self._client = Unixctl()
                self._client.call("revalidator/purge")
            except UnixctlError as exc:  # correctness holds without it; only timing suffers
                self.failures += 1
                if self._client is not None:
                    self._client.close()
                    self._client = None
                if self.failures in (1, 100):
                    LOG.warning("datapath flush failed (%s); circuits light late", exc)


def _sleep_until(deadline_s: float, clock: Callable[[], float]) -> None:
    """Sleep to a deadline (Linux hrtimers wake within ~0.1 ms; no spinning, see below)."""
    while (remaining := deadline_s - clock()) > 0:
        time.sleep(remaining)


def realtime_priority(priority: int = 10) -> bool:
    """Give the calling thread SCHED_FIFO priority, so switching delays do not stretch when
    the machine is busy. It never spins, so it cannot starve ovs-vswitchd. False if refused."""
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

    @set_ev_cls(ofp_event.EventOFPSwitchFeatures, CONFIG_DISPATCHER)
    def _switch_features(self, ev: Any) -> None:
        # Set-up waits for a barrier reply, which this very event loop delivers: run it aside.
        threading.Thread(target=self.ocs.on_datapath, args=(ev.msg.datapath,),
                         name="ocs-switch-setup", daemon=True).start()

    @set_ev_cls(ofp_event.EventOFPBarrierReply, MAIN_DISPATCHER)
    def _barrier_reply(self, ev: Any) -> None:
        self.ocs.on_barrier_reply(ev.msg.xid)

    def _send_event(self, ev: Any, state: Any) -> None:
        # Barrier replies release a waiting rail worker straight from the datapath's receive
        # thread: the detour through this app's event queue and thread cost up to ms.
        if isinstance(ev, ofp_event.EventOFPBarrierReply):
            self.ocs.on_barrier_reply(ev.msg.xid)
            return
        super()._send_event(ev, state)

    @set_ev_cls(ofp_event.EventOFPErrorMsg, [CONFIG_DISPATCHER, MAIN_DISPATCHER])
    def _error(self, ev: Any) -> None:
        msg = ev.msg
        LOG.error("OpenFlow error from %016x: type=%s code=%s", msg.datapath.id, msg.type,
                  msg.code)

    @set_ev_cls(ofp_event.EventOFPStateChange, [DEAD_DISPATCHER])
    def _state_change(self, ev: Any) -> None:
        if ev.datapath is not None and ev.datapath.id is not None:
            self.ocs.on_disconnect(ev.datapath)
