"""A CALIENT switch as pure state: duplex dotted ports, two-step connections, light, faults.

:class:`CalientDevice` holds N duplex ports (named as :func:`controller.drivers.calient.wire.
port_name` lays them out) and connections. A connection is *entered* (``ENT-CRS``: reserved,
``AS=UMA,OS=RDY``; it holds its ports, nothing moves), *activated* (``ACT-CRS``: ``AS=IS``;
the mirrors move and light arrives after the switching time, then ``OS=IS``), *cancelled*
(``CANC-CRS``: out of service, dark at once) and *deleted* (``DLT-CRS``; an active one is
cancelled first, as MonALISA's client deleted without cancelling).

A port's input is used by the connection whose source it is (and by a ``2WAY`` connection's
destination); its output likewise. An entry that needs a used input or output is refused
(``SAAS``, "Invalid Connection", the text public clients look for), as is one on a failed port.

Switching goes through a :class:`~emulator.polatis.model.SwitchBackend` that sees the *lit*
pairs in the ``ingress -> egress`` view (port ``p`` = ingress ``p``, egress ``N+p``): the
simulator's :class:`~emulator.polatis.model.TimedBackend`, or the emulated OCS's front backend,
which switches real OVS circuits. With a timed backend and ``reply_before_settle`` (default),
``ACT-CRS`` returns at once and the connection reads ``OS=RDY`` until its switching time has
passed (so activations sent back to back switch together, as a bulk switch); otherwise
``ACT-CRS`` returns once the backend has switched.

Light: a port's input reads ``input_power_dbm`` (the rank's transmitter is always on); its
output reads that minus ``insertion_loss_db`` when an in-service, settled connection brings
light to it, else ``None`` (``NONE``: no light). A failed port reads ``None`` both ways and shows
``INOC=FAIL,OUTOC=FAIL``; its connections show ``OC=FAIL``.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass

from controller.drivers.calient import wire
from emulator.polatis.model import (
    Change,
    DeviceError,
    Faults,
    SimulatedSwitch,
    SwitchBackend,
)


@dataclass
class Conn:
    """One connection, by port index."""

    src: int
    dst: int
    two_way: bool
    group: str = wire.DEFAULT_GROUP
    active: bool = False

    def pairs(self, n: int) -> dict[int, int]:
        out = {self.src: n + self.dst}
        if self.two_way:
            out[self.dst] = n + self.src
        return out

    @property
    def inputs(self) -> set[int]:
        return {self.src, self.dst} if self.two_way else {self.src}

    @property
    def outputs(self) -> set[int]:
        return {self.src, self.dst} if self.two_way else {self.dst}


@dataclass
class CalientFaults(Faults):
    """Fault injection, settable while the server runs (thread-safe): the Polatis knobs, where
    an edit is an ENT/ACT/CANC/DLT-CRS command and a failed port reads INOC/OUTOC=FAIL, has no
    light and takes no new connection, plus refused edits."""

    #: the next N edit commands are refused (DENY SROF) and change nothing
    refuse_edits: int = 0

    def take_refusal(self) -> bool:
        with self._lock:
            if self.refuse_edits > 0:
                self.refuse_edits -= 1
                return True
            return False


class CalientDevice(SimulatedSwitch):
    """One simulated CALIENT switch of ``size`` duplex ports."""

    def __init__(self, size: int, *, switching_time_ms: float = 200.0,
                 input_power_dbm: float = -3.0, insertion_loss_db: float = 1.5,
                 model: str | None = None, serial: str = "SIM000001",
                 software: str = "opus-sim-1.0", backend: SwitchBackend | None = None,
                 reply_before_settle: bool = True,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(size, switching_time_ms=switching_time_ms,
                         input_power_dbm=input_power_dbm, insertion_loss_db=insertion_loss_db,
                         model=model or f"S{size}-SIM", serial=serial, software=software,
                         backend=backend, clock=clock)
        self.names = [wire.port_name(i) for i in range(1, size + 1)]
        self.index = {name: i for i, name in enumerate(self.names, start=1)}
        self.reply_before_settle = reply_before_settle
        self.faults = CalientFaults()
        self.edits = 0  # edit commands applied, for tests
        self._conns: dict[str, Conn] = {}
        self._light_at: dict[str, float] = {}
        self._lock = threading.RLock()
        self._edit_lock = threading.Lock()  # one edit at a time, across sessions

    # --- reading -----------------------------------------------------------------------------

    def name_of(self, conn: Conn) -> str:
        return wire.conn_name(self.names[conn.src - 1], self.names[conn.dst - 1], conn.two_way)

    def connections(self) -> dict[str, Conn]:
        with self._lock:
            return {k: Conn(c.src, c.dst, c.two_way, c.group, c.active)
                    for k, c in self._conns.items()}

    def pairs(self) -> dict[int, int]:
        """The in-service connections as ``ingress -> egress`` pairs (what carries light)."""
        with self._lock:
            out: dict[int, int] = {}
            for c in self._conns.values():
                if c.active:
                    out.update(c.pairs(self.size))
            return out

    def is_failed(self, port: int) -> bool:
        return port in self.faults.failed_ports

    def settled(self, name: str, now_s: float) -> bool:
        with self._lock:
            return now_s >= self._light_at.get(name, math.inf)

    def state_of(self, name: str, now_s: float) -> wire.Connection:
        """The connection as RTRV-CRS shows it at ``now_s``."""
        with self._lock:
            c = self._conns[name]
            src, dst = self.names[c.src - 1], self.names[c.dst - 1]
            admin = "IS" if c.active else "UMA"
            oper = "IS" if c.active and now_s >= self._light_at.get(name, math.inf) else "RDY"
        cap = "FAIL" if self.is_failed(c.src) or self.is_failed(c.dst) else "OK"
        return wire.Connection(src, dst, c.two_way, c.group, admin, oper, cap)

    def in_dbm(self, port: int) -> float | None:
        return None if self.is_failed(port) else self.input_power_dbm

    def out_dbm(self, port: int, now_s: float) -> float | None:
        """What port ``port``'s output monitor reads: None is no light."""
        if self.is_failed(port):
            return None
        with self._lock:
            for name, c in self._conns.items():
                if not c.active or port not in c.outputs:
                    continue
                source = c.src if c.dst == port else c.dst
                if self.is_failed(source) or now_s < self._light_at.get(name, math.inf):
                    return None
                return self.input_power_dbm - self.insertion_loss_db
        return None

    def conns_on(self, port: int) -> list[tuple[str, bool]]:
        with self._lock:
            return [(n, c.active) for n, c in self._conns.items()
                    if port in (c.src, c.dst)]

    # --- editing -----------------------------------------------------------------------------

    def load(self, pairs: Mapping[int, int]) -> None:
        """Set the initial connections from lit pairs (a pair and its reverse: one 2WAY)."""
        n = self.size
        with self._lock:
            self._conns.clear()
            self._light_at.clear()
            for i, e in sorted(pairs.items()):
                j = e - n
                if not (1 <= i <= n and 1 <= j <= n):
                    raise ValueError(f"pair {i}->{e} does not fit {n} ports")
                if pairs.get(j) == n + i:
                    if i > j:
                        continue
                    conn = Conn(i, j, True, active=True)
                else:
                    conn = Conn(i, j, False, active=True)
                name = self.name_of(conn)
                self._conns[name] = conn
                self._light_at[name] = -math.inf

    def enter(self, src: int, dst: int, two_way: bool, group: str = wire.DEFAULT_GROUP
              ) -> str:
        """ENT-CRS: reserve a connection; returns its name. Raises :class:`DeviceError`."""
        with self._edit_lock:
            self._refusal()
            n = self.size
            for p in (src, dst):
                if not 1 <= p <= n:
                    raise DeviceError("invalid-value", f"port index {p} is out of range "
                                      f"1..{n}", ports=(p,), tl1_code="IIAC")
            if src == dst and two_way:
                raise DeviceError("invalid-value", f"a 2WAY connection needs two ports, got "
                                  f"{self.names[src - 1]} twice", ports=(src,),
                                  tl1_code="IIAC")
            for p in (src, dst):
                if self.is_failed(p):
                    raise DeviceError("operation-failed", f"Failed: port {self.names[p - 1]} "
                                      "is failed", ports=(p,), tl1_code="SROF")
            conn = Conn(src, dst, two_way, group)
            with self._lock:
                for name, other in self._conns.items():
                    clash = (conn.inputs & other.inputs) | (conn.outputs & other.outputs)
                    if clash:
                        ports = sorted({src, dst, *clash, other.src, other.dst})
                        raise DeviceError(
                            "in-use", f"Invalid Connection: port "
                            f"{self.names[min(clash) - 1]} is in use by {name}",
                            ports=ports, tl1_code="SAAS")
                name = self.name_of(conn)
                self._conns[name] = conn
            self.edits += 1
            return name

    def activate(self, name: str) -> None:
        """ACT-CRS: put a reserved connection in service (the mirrors move)."""
        with self._edit_lock:
            self._refusal()
            conn = self._get(name)
            if conn.active:
                return
            for p in (conn.src, conn.dst):
                if self.is_failed(p):
                    raise DeviceError("operation-failed", f"Failed: port {self.names[p - 1]} "
                                      "is failed", ports=(p,), tl1_code="SROF")
            before = self.pairs()
            after = {**before, **conn.pairs(self.size)}
            self.backend.validate(before, after)
            switching_s = self.backend.switching_s
            with self._lock:
                conn.active = True
                self._light_at[name] = (self.clock() + switching_s if switching_s is not None
                                        else math.inf)
            self.edits += 1
            if switching_s is not None and self.reply_before_settle:
                return
            try:
                self.backend.switch(Change(before, after))
            except Exception as exc:
                with self._lock:
                    conn.active = False
                    self._light_at.pop(name, None)
                self._adopt_backend()
                if isinstance(exc, DeviceError):
                    raise
                raise DeviceError("operation-failed", f"switching failed: {exc}") from exc
            with self._lock:
                self._light_at[name] = min(self._light_at[name], self.clock())

    def cancel(self, name: str) -> None:
        """CANC-CRS: take a connection out of service (dark at once; a reserved one: no-op)."""
        with self._edit_lock:
            self._refusal()
            self._cancel(self._get(name), name)
            self.edits += 1

    def delete(self, name: str) -> None:
        """DLT-CRS: delete a connection (cancelling it first if in service)."""
        with self._edit_lock:
            self._refusal()
            conn = self._get(name)
            self._cancel(conn, name)
            with self._lock:
                del self._conns[name]
                self._light_at.pop(name, None)
            self.edits += 1

    def find(self, src: int, dst: int) -> str | None:
        """The connection from ``src`` to ``dst`` (either way round for a 2WAY one)."""
        with self._lock:
            for name, c in self._conns.items():
                if (c.src, c.dst) == (src, dst) or (c.two_way and (c.dst, c.src) == (src, dst)):
                    return name
        return None

    def _cancel(self, conn: Conn, name: str) -> None:
        if not conn.active:
            return
        before = self.pairs()
        after = {i: e for i, e in before.items() if i not in conn.pairs(self.size)}
        if self.backend.switching_s is None:  # the front: the emulated OCS darkens the circuit
            try:
                self.backend.switch(Change(before, after))
            except Exception as exc:
                self._adopt_backend()
                if isinstance(exc, DeviceError):
                    raise
                raise DeviceError("operation-failed", f"switching failed: {exc}") from exc
        with self._lock:
            conn.active = False
            self._light_at.pop(name, None)

    def _adopt_backend(self) -> None:
        """After a refused switch: a connection whose light the backend does not carry (its
        circuit changed behind the front's back) is out of service, as the glass says."""
        try:
            real = self.backend.current()
        except Exception:  # best effort: the refusal is what gets reported
            return
        if real is None:
            return
        with self._lock:
            for name, c in self._conns.items():
                if c.active and any(real.get(i) != e for i, e in c.pairs(self.size).items()):
                    c.active = False
                    self._light_at.pop(name, None)

    def _get(self, name: str) -> Conn:
        with self._lock:
            conn = self._conns.get(name)
        if conn is None:
            raise DeviceError("data-missing", f"no connection {name}", tl1_code="IENE")
        return conn

    def _refusal(self) -> None:
        if self.faults.take_refusal():
            raise DeviceError("operation-failed", "Failed: edit refused (fault injection)",
                              tl1_code="SROF")
