"""The Polatis OCS driver: :class:`controller.ocs.OcsDriver` over one device per rail.

One physical Polatis switch serves one rail. Rail ports map onto device ports as
:mod:`controller.drivers.polatis.ports` describes (rail port ``p`` = ingress ``p`` + egress ``N+p``;
a duplex circuit is two pairs). The driver keeps the controller's view of every rail in a
:class:`~controller.ocs.CrossconnectState`, and

* checks a whole batch against it before sending anything (all-or-nothing across rails);
* sends one batched edit per rail (deletes, then creates), the rails concurrently;
* after any device fault (timeout, dropped session, refused edit, reconnect) marks the rail
  *dirty* and re-reads its cross-connects from the device -- at once, and again before anything
  else is sent to it -- so the view never diverges from the glass;
* reads ``circuits``/``port_states`` straight from the device and adopts what it reads as the
  view (a port the switch reports FAILED is failed; a circuit whose egress monitor reads below
  ``dark_below_dbm``, default -40 dBm, is dark: switching or no light); while an edit is in
  flight on a rail, the device's session is busy and those reads answer from the view, with the
  switched ports dark.

Timestamps are wall-clock seconds (``time.time``, as the other drivers): ``t_request_s`` when the
edit is sent, ``t_dark_s`` the same instant (the device starts on receipt; the wire hides the
exact moment), ``t_light_s`` when the device confirms the edit.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from controller import ocs
from controller.drivers.polatis.errors import DeviceMismatch, DeviceRejected, PolatisError
from controller.drivers.polatis.ports import DeviceView, PortMap
from controller.drivers.polatis.session import DeviceInfo, DeviceSession

#: A monitor reading below this is no light (the simulator reads about -60 dBm when dark).
DEFAULT_DARK_BELOW_DBM = -40.0


@dataclass
class RailDevice:
    """One rail's device, as the driver needs it."""

    rail: int
    session: DeviceSession
    ports: tuple[int, ...] | None = None  # rail ports; default: 1..N of the device
    expected_size: int | None = None  # N of N x N; a device reporting another size is refused
    switching_delay: float | str = "polatis"  # ms or a Table 3 technology
    dark_below_dbm: float | None = DEFAULT_DARK_BELOW_DBM  # None: do not read the monitors


@dataclass
class _Link:
    device: RailDevice
    lock: threading.Lock = field(default_factory=threading.Lock)  # one writer per device
    info: DeviceInfo | None = None
    portmap: PortMap | None = None
    dirty: bool = True
    inflight: ocs.Reconfiguration | None = None  # the edit being sent, if any
    stray: Mapping[int, tuple[tuple[int, int], ...]] = field(default_factory=dict)

    @property
    def rail(self) -> int:
        return self.device.rail

    @property
    def session(self) -> DeviceSession:
        return self.device.session

    @property
    def pm(self) -> PortMap:
        assert self.portmap is not None
        return self.portmap


class PolatisDriver(ocs.OcsDriver):
    """Rails of Polatis switches (NETCONF or TL1 sessions); connects in the constructor."""

    def __init__(self, devices: Sequence[RailDevice], *,
                 clock: Callable[[], float] = time.time) -> None:
        rails = [d.rail for d in devices]
        if not devices or len(set(rails)) != len(rails):
            raise ValueError(f"need one device per rail, got rails {rails}")
        self.clock = clock
        self._links = {d.rail: _Link(d) for d in sorted(devices, key=lambda d: d.rail)}
        self._delay_ms = {d.rail: ocs.resolve_switching_delay_ms(d.switching_delay)
                          for d in devices}
        self._state_lock = threading.Lock()
        self._pool: ThreadPoolExecutor | None = None
        try:
            for link in self._links.values():
                self._open(link)
            self._state = ocs.CrossconnectState(
                {rail: link.pm.ports for rail, link in self._links.items()})
            for link in self._links.values():
                self._resync(link)
        except BaseException:
            self.close()
            raise

    # --- OcsDriver ---------------------------------------------------------------------------

    def describe(self) -> list[ocs.RailDescription]:
        return [ocs.RailDescription(rail, link.pm.ports, self._delay_ms[rail], "ocs")
                for rail, link in self._links.items()]

    def circuits(self, rail: int) -> frozenset[ocs.Circuit]:
        """The full duplex circuits on the device now (one-way strays are not circuits)."""
        link = self._link(rail)
        with self._reading(link) as busy:
            if busy:
                return self._view(link)[0]
            return self._read_pairs(link).circuits

    def port_states(self, rail: int) -> dict[int, ocs.PortState]:
        """Light per rail port, from the device's cross-connects, monitors and port status.

        A rail port whose ingress or egress the switch reports FAILED (NETCONF ``port-config``
        status, TL1 RTRV-PORT-SHUTTER) is FAILED, whatever its cross-connect.

        While an edit is in flight on the rail the device session is busy (NETCONF replies
        come in request order, TL1 is serial), so the answer then comes from the view: the
        ports being switched are dark.
        """
        link = self._link(rail)
        with self._reading(link) as busy:
            if busy:
                circuits, switching = self._view(link)
                ends = {p for c in circuits for p in c.ports}
                return {p: ocs.PortState.DARK if p in switching else
                        ocs.PortState.LIT if p in ends else ocs.PortState.IDLE
                        for p in link.pm.ports}
            view = self._read_pairs(link)
            threshold = link.device.dark_below_dbm
            with self._faults(link):
                power = link.session.power_dbm() if threshold is not None else {}
                status = link.session.port_status()
        peers = {p for c in view.circuits for p in c.ports}
        out: dict[int, ocs.PortState] = {}
        for p in link.pm.ports:
            ingress, egress = link.pm.ingress(p), link.pm.egress(p)
            if "FAILED" in (status.get(ingress), status.get(egress)):
                out[p] = ocs.PortState.FAILED
            elif p in view.stray:
                out[p] = ocs.PortState.DARK
            elif p in peers:
                reading = power.get(egress)
                dark = threshold is not None and reading is not None and reading < threshold
                out[p] = ocs.PortState.DARK if dark else ocs.PortState.LIT
            else:
                out[p] = ocs.PortState.IDLE
        return out

    def switch_connections(self, rail: int) -> frozenset[tuple[int, int]]:
        """Every pair on the rail's device, those on ports outside the rail's too, as rail
        ports: a pair ``i -> N+j`` joins ports ``i`` and ``j`` (``(i, i)``: a port looped to
        itself); pairs off the ``1..N`` / ``N+1..2N`` numbering are left out."""
        link = self._link(rail)
        size = link.pm.size
        with link.lock:
            if link.dirty or not link.session.connected:
                self._resync(link)
            with self._faults(link):
                pairs = link.session.read_pairs()
        return frozenset((min(i, e - size), max(i, e - size)) for i, e in pairs.items()
                         if 1 <= i <= size and size < e <= 2 * size)

    def apply_many(self, reconfs: Sequence[ocs.Reconfiguration]) -> list[ocs.ApplyResult]:
        reconfs = list(reconfs)
        links = [self._links[r] for r in sorted({r.rail for r in reconfs}) if r in self._links]
        with contextlib.ExitStack() as stack:
            for link in links:  # sorted by rail: no lock-order deadlock between batches
                stack.enter_context(link.lock)
            for link in links:
                if link.dirty or not link.session.connected:
                    self._resync(link)
            with self._state_lock:
                self._state.check_all(reconfs)
            work = [r for r in reconfs if not r.is_empty]
            results: dict[int, ocs.ApplyResult] = {}
            errors: dict[int, BaseException] = {}
            if len(work) > 1:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(max_workers=len(self._links),
                                                    thread_name_prefix="polatis")
                futures = {r.rail: self._pool.submit(self._switch, r) for r in work}
                for rail, fut in futures.items():
                    try:
                        results[rail] = fut.result()
                    except BaseException as exc:
                        errors[rail] = exc
            else:
                for r in work:
                    try:
                        results[r.rail] = self._switch(r)
                    except BaseException as exc:
                        errors[r.rail] = exc
            if errors:
                first = errors[min(errors)]
                if results:
                    first.add_note(f"rails {sorted(results)} of the batch were switched; "
                                   f"rails {sorted(errors)} failed and were re-read")
                raise first
        now = self.clock()
        return [results.get(r.rail) or ocs.ApplyResult(r.rail, r.add, r.remove, now, now, now)
                for r in reconfs]

    def __enter__(self) -> PolatisDriver:
        return self

    def close(self) -> None:
        for link in self._links.values():
            link.session.close()
        if self._pool is not None:
            self._pool.shutdown(wait=False)
            self._pool = None

    # --- extras for the lab CLI --------------------------------------------------------------

    @property
    def rails(self) -> list[int]:
        return list(self._links)

    def device_info(self, rail: int) -> DeviceInfo:
        info = self._link(rail).info
        assert info is not None
        return info

    def device_name(self, rail: int) -> str:
        return self._link(rail).session.name

    def read_device(self, rail: int) -> DeviceView:
        """The rail's cross-connects as read from the device now, strays included."""
        link = self._link(rail)
        with link.lock:
            return self._read_pairs(link)

    def power_dbm(self, rail: int) -> dict[int, float]:
        """Monitor readings of the rail's device ports."""
        link = self._link(rail)
        with self._faults(link):
            return link.session.power_dbm()

    def known_circuits(self, rail: int) -> frozenset[ocs.Circuit]:
        """The controller's view of ``rail`` (what the last apply or re-read established)."""
        with self._state_lock:
            return self._state.circuits(rail)

    def is_dirty(self, rail: int) -> bool:
        """True until the rail is re-read after a fault."""
        return self._link(rail).dirty

    # --- internals ---------------------------------------------------------------------------

    def _link(self, rail: int) -> _Link:
        link = self._links.get(rail)
        if link is None:
            raise ocs.ReconfigurationRejected(rail, [], f"no such rail (rails: {self.rails})")
        return link

    def _open(self, link: _Link) -> None:
        dev = link.device
        info = link.session.open()
        try:
            if info.egress_ports != info.ingress_ports:
                raise DeviceMismatch(link.session.name, f"reports {info.model!r} "
                                     f"({info.ingress_ports}x{info.egress_ports or 'CC'}); only "
                                     "N x N switches are supported")
            if dev.expected_size is not None and info.size != dev.expected_size:
                raise DeviceMismatch(link.session.name, f"reports {info.model!r} "
                                     f"({info.size}x{info.size}) but rail {dev.rail} is "
                                     f"configured for {dev.expected_size}x{dev.expected_size}")
            ports = dev.ports if dev.ports is not None else tuple(range(1, info.size + 1))
            try:
                portmap = PortMap(dev.rail, info.size, tuple(ports))
            except ValueError as exc:
                raise DeviceMismatch(link.session.name, str(exc)) from None
            if link.portmap is not None and link.portmap != portmap:
                raise DeviceMismatch(link.session.name, "came back as a different switch "
                                     f"({info.model!r}); refusing to drive it")
        except PolatisError:
            link.session.close()
            raise
        link.info, link.portmap = info, portmap

    def _resync(self, link: _Link) -> None:
        """Reconnect if needed and re-read the device into the view (rail lock held)."""
        link.dirty = True
        if not link.session.connected:
            self._open(link)
        self._adopt(link, link.pm.decode(link.session.read_pairs()))
        link.dirty = False

    @contextlib.contextmanager
    def _reading(self, link: _Link) -> Iterator[bool]:
        """Hold the rail for a read; yields True (lock not taken) while an edit is in flight."""
        if not link.lock.acquire(blocking=False):
            yield True
            return
        try:
            yield False
        finally:
            link.lock.release()

    def _read_pairs(self, link: _Link) -> DeviceView:
        """Read the device and adopt what it says as the view (rail lock held)."""
        if link.dirty or not link.session.connected:
            self._resync(link)
        with self._faults(link):
            view = link.pm.decode(link.session.read_pairs())
        self._adopt(link, view)
        return view

    def _adopt(self, link: _Link, view: DeviceView) -> None:
        with self._state_lock:
            self._state.apply(self._state.diff_to(link.rail, view.circuits))
        link.stray = view.stray

    def _view(self, link: _Link) -> tuple[frozenset[ocs.Circuit], frozenset[int]]:
        """Circuits (lit or being switched on) and dark ports by the view, edit in flight."""
        with self._state_lock:
            circuits = self._state.circuits(link.rail)
        dark = set(link.stray)
        reconf = link.inflight
        if reconf is not None:
            circuits = (circuits - reconf.remove) | reconf.add
            dark |= reconf.touched_ports
        return circuits, frozenset(dark)

    @contextlib.contextmanager
    def _faults(self, link: _Link) -> Iterator[None]:
        try:
            yield
        except PolatisError:
            link.dirty = True
            raise

    def _switch(self, reconf: ocs.Reconfiguration) -> ocs.ApplyResult:
        """Send one rail's batch; on a fault, re-read the device and re-raise (lock held)."""
        link = self._links[reconf.rail]
        pm = link.pm
        delete = {pm.ingress(p) for c in reconf.remove for p in c.ports}
        delete |= {i for p in reconf.touched_ports for i, _e in link.stray.get(p, ())}
        add = pm.pairs_of_all(reconf.add)
        t_request = self.clock()
        link.inflight = reconf
        try:
            link.session.edit(sorted(delete), add)
        except BaseException as exc:
            link.inflight = None
            link.dirty = True  # whatever happened, the glass is re-read before the next send
            if not isinstance(exc, PolatisError):
                raise
            error: PolatisError = exc
            if isinstance(exc, DeviceRejected):
                ports = {rp for p in exc.ports if (rp := pm.rail_port(p)) is not None}
                error = DeviceRejected(exc.device, exc.reason, code=exc.code,
                                       ports=sorted(ports or reconf.touched_ports),
                                       rail=reconf.rail)
            try:
                self._resync(link)
            except PolatisError as again:
                error.add_note(f"rail {reconf.rail}: re-reading the device failed too "
                               f"({again}); it will be re-read before the next request")
            else:
                error.add_note(f"rail {reconf.rail}: re-read from the device; circuits now "
                               f"{sorted(str(c) for c in self.known_circuits(reconf.rail))}")
            if error is exc:
                raise
            raise error from exc
        t_light = self.clock()
        with self._state_lock:
            self._state.apply(reconf)
            link.inflight = None
        left = {p: tuple(x for x in v if x[0] not in delete) for p, v in link.stray.items()}
        link.stray = {p: v for p, v in left.items() if v}
        return ocs.ApplyResult(reconf.rail, reconf.add, reconf.remove, t_request, t_request,
                               t_light)
