"""A Polatis N x N switch as pure state: cross-connects, validation, light, switching time, faults.

The servers (:mod:`.netconf_server`, :mod:`.tl1_server`) are thin shells around one
:class:`PolatisDevice`; a NETCONF server and a TL1 server may share one device and then serve the
same glass. Ports: ingress ``1..N``, egress ``N+1..2N`` (see :mod:`controller.drivers.polatis.ports`
for how rail ports map onto them).

An edit is *planned* (validated against the current pairs, nothing changes; a refusal is a
:class:`DeviceError` with a NETCONF error-tag and a TL1 code), *committed* (the pairs change and
the egress ports whose light changes go dark), switched by a :class:`SwitchBackend` (the
simulator waits the switching time; the emulated OCS's front switches real OVS circuits), then
*settled* (light returns). :meth:`PolatisDevice.perform` runs the four steps, one edit at a time
across every session and protocol.

Light: every ingress carries ``input_power_dbm`` (the rank's transmitter is always on); an
egress reads its ingress's power minus ``insertion_loss_db`` when connected and settled, else
``DARK_DBM`` (about -60 dBm, a typical monitor floor). A FAILED port (fault injection) reads
dark, reports status FAILED and refuses new cross-connects (deleting the one it had is allowed).
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from controller.drivers.polatis.xml import CURRENT_REVISION, pair_list_name

DARK_DBM = -60.0
OPERATIONS = ("merge", "create", "replace", "delete", "remove")
#: NETCONF error-tag -> TL1 error code (GR-833 names)
TL1_CODES = {"invalid-value": "IIAC", "in-use": "SAAS", "data-exists": "SAAS",
             "data-missing": "IENE", "missing-element": "IIAC"}


class DeviceError(Exception):
    """An edit the device refuses: a NETCONF error-tag, a message, the error-path, the ports."""

    def __init__(self, tag: str, message: str, *, path: str | None = None,
                 ports: Sequence[int] = (), tl1_code: str | None = None) -> None:
        self.tag = tag
        self.message = message
        self.path = path
        self.ports = tuple(ports)
        self.tl1_code = tl1_code or TL1_CODES.get(tag, "SROF")
        super().__init__(f"{tag}: {message}")


@dataclass(frozen=True)
class EditOp:
    """One list-entry operation, keyed by ingress."""

    op: str  # one of OPERATIONS
    ingress: int
    egress: int | None = None


@dataclass(frozen=True)
class Change:
    """A validated edit: the pairs before and after, and the egress ports that go dark."""

    before: Mapping[int, int]
    after: Mapping[int, int]

    @property
    def removed(self) -> dict[int, int]:
        return {i: e for i, e in self.before.items() if self.after.get(i) != e}

    @property
    def added(self) -> dict[int, int]:
        return {i: e for i, e in self.after.items() if self.before.get(i) != e}

    @property
    def touched(self) -> frozenset[int]:
        """Ports whose light path changes (ingress and egress of every changed pair)."""
        return frozenset(p for pairs in (self.removed, self.added) for i, e in pairs.items()
                         for p in (i, e))

    @property
    def is_empty(self) -> bool:
        return dict(self.before) == dict(self.after)


@dataclass
class Faults:
    """Fault injection, settable while the servers run (thread-safe)."""

    #: the Nth edit from now is applied, then the session drops without a reply
    drop_after_edits: int | None = None
    #: every reply waits this long first (a slow or overloaded controller card)
    reply_delay_s: float = 0.0
    #: device ports that report FAILED and read dark
    failed_ports: set[int] = field(default_factory=set)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def take_drop(self) -> bool:
        """Count one applied edit; True when this one must drop the session."""
        with self._lock:
            if self.drop_after_edits is None:
                return False
            self.drop_after_edits -= 1
            if self.drop_after_edits <= 0:
                self.drop_after_edits = None
                return True
            return False


class SwitchBackend(Protocol):
    """What moves the light: waits the switching time, or drives real circuits."""

    #: seconds the touched ports stay dark after commit; None: until :meth:`switch` returns
    switching_s: float | None

    def validate(self, before: Mapping[int, int], after: Mapping[int, int]) -> None:
        """Raise :class:`DeviceError` for an edit this backend cannot realise."""

    def switch(self, change: Change) -> None:
        """Realise ``change``; blocks until the light is back. Raise DeviceError to refuse."""

    def current(self) -> Mapping[int, int] | None:
        """The pairs the backend really holds (read after a refused switch), or None."""


class TimedBackend:
    """The simulator's backend: the light returns after the switching time."""

    def __init__(self, switching_time_ms: float,
                 wait: Callable[[float], object] = time.sleep) -> None:
        self.switching_s: float | None = switching_time_ms / 1e3
        self._wait = wait

    def validate(self, before: Mapping[int, int], after: Mapping[int, int]) -> None:
        return None

    def switch(self, change: Change) -> None:
        if self.switching_s:
            self._wait(self.switching_s)

    def current(self) -> Mapping[int, int] | None:
        return None  # the device's own state is the truth


class SimulatedSwitch:
    """What every vendor's simulated switch is given: its size, optics, identity, the backend
    that realises edits and the clock it reads (both vendors' devices subclass it)."""

    def __init__(self, size: int, *, switching_time_ms: float, input_power_dbm: float,
                 insertion_loss_db: float, model: str, serial: str, software: str,
                 backend: SwitchBackend | None, clock: Callable[[], float]) -> None:
        if size < 1:
            raise ValueError(f"size must be >= 1, got {size}")
        self.size = size
        self.switching_time_ms = switching_time_ms
        self.input_power_dbm = input_power_dbm
        self.insertion_loss_db = insertion_loss_db
        self.model = model
        self.serial = serial
        self.software = software
        self.backend: SwitchBackend = backend or TimedBackend(switching_time_ms)
        self.clock = clock


class PolatisDevice(SimulatedSwitch):
    """The state of one simulated switch. Plan/commit/settle take ``now_s`` explicitly."""

    def __init__(self, size: int, *, revision: str = CURRENT_REVISION,
                 switching_time_ms: float = 25.0, input_power_dbm: float = -3.0,
                 insertion_loss_db: float = 1.5, model: str | None = None,
                 serial: str = "SIM000001", software: str = "opus-sim-1.0",
                 backend: SwitchBackend | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__(size, switching_time_ms=switching_time_ms,
                         input_power_dbm=input_power_dbm, insertion_loss_db=insertion_loss_db,
                         model=model or f"OST-{size}x{size}-SIM", serial=serial,
                         software=software, backend=backend, clock=clock)
        self.revision = revision
        self.list_name = pair_list_name(revision)
        self.faults = Faults()
        self.edits = 0  # edits applied, for tests and the CLI
        self._pairs: dict[int, int] = {}
        self._dark_until: dict[int, float] = {}
        self._lock = threading.RLock()  # state
        self._edit_lock = threading.Lock()  # one edit at a time, across sessions

    # --- reading -----------------------------------------------------------------------------

    def pairs(self) -> dict[int, int]:
        with self._lock:
            return dict(self._pairs)

    def is_ingress(self, port: int) -> bool:
        return 1 <= port <= self.size

    def is_egress(self, port: int) -> bool:
        return self.size < port <= 2 * self.size

    def port_status(self, port: int) -> str:
        return "FAILED" if port in self.faults.failed_ports else "ENABLED"

    def is_dark(self, port: int, now_s: float) -> bool:
        with self._lock:
            return now_s < self._dark_until.get(port, -math.inf)

    def power_dbm(self, port: int, now_s: float) -> float:
        """What the port's monitor reads at ``now_s``."""
        failed = self.faults.failed_ports
        with self._lock:
            if port in failed:
                return DARK_DBM
            if self.is_ingress(port):
                return self.input_power_dbm
            ingress = next((i for i, e in self._pairs.items() if e == port), None)
            if ingress is None or ingress in failed or self.is_dark(port, now_s):
                return DARK_DBM
            return self.input_power_dbm - self.insertion_loss_db

    def opm_power(self, now_s: float) -> dict[int, float]:
        return {p: self.power_dbm(p, now_s) for p in range(1, 2 * self.size + 1)}

    # --- editing -----------------------------------------------------------------------------

    def load(self, pairs: Mapping[int, int]) -> None:
        """Set the initial cross-connects (validated like an edit, lit at once)."""
        change = self.plan([EditOp("merge", i, e) for i, e in pairs.items()], clear_first=True)
        with self._lock:
            self._pairs = dict(change.after)

    def plan(self, ops: Iterable[EditOp], *, clear_first: bool = False) -> Change:
        """Validate ``ops`` (in order) against the current pairs; nothing changes."""
        with self._lock:
            before = dict(self._pairs)
        work: dict[int, int] = {} if clear_first else dict(before)
        for op in ops:
            self._check_op(op, work)
            if op.op in ("delete", "remove"):
                work.pop(op.ingress, None)
            else:
                assert op.egress is not None
                work[op.ingress] = op.egress
        holders: dict[int, list[int]] = {}
        for i, e in sorted(work.items()):
            holders.setdefault(e, []).append(i)
        for egress, ingresses in sorted(holders.items()):
            if len(ingresses) > 1:
                keep = next((i for i in ingresses if before.get(i) == egress), ingresses[0])
                other = next(i for i in ingresses if i != keep)
                raise DeviceError(
                    "in-use", f"egress port {egress} is already in use by ingress {keep}",
                    path=_path(self.list_name, other, "egress"), ports=(other, egress, keep))
        failed = self.faults.failed_ports
        for i, e in sorted(work.items()):
            if before.get(i) != e and (i in failed or e in failed):
                port = i if i in failed else e
                raise DeviceError("operation-failed", f"port {port} is FAILED: no "
                                  "cross-connect can use it",
                                  path=_path(self.list_name, i), ports=(i, e))
        self.backend.validate(before, work)
        return Change(before, work)

    def commit(self, change: Change, now_s: float) -> float:
        """Make ``change`` the current state; its touched egress ports go dark. Returns when the
        light is due back (``inf`` while the backend decides)."""
        switching_s = self.backend.switching_s
        light_at = now_s + switching_s if switching_s is not None else math.inf
        with self._lock:
            if self._pairs != dict(change.before):
                raise DeviceError("operation-failed", "the cross-connects changed while the "
                                  "edit was being validated; retry")
            self._pairs = dict(change.after)
            for p in change.touched:
                if self.is_egress(p):
                    self._dark_until[p] = light_at
            self.edits += 1
        return light_at

    def settle(self, change: Change, now_s: float) -> None:
        """The backend is done: light returns on the touched ports."""
        with self._lock:
            for p in change.touched:
                if self._dark_until.get(p, -math.inf) > now_s:
                    self._dark_until[p] = now_s

    def rollback(self, change: Change) -> None:
        """The backend refused: restore the pairs from before ``change`` (then
        :meth:`perform` adopts the backend's real pairs, when it knows them)."""
        with self._lock:
            self._pairs = dict(change.before)
            for p in change.touched:
                self._dark_until.pop(p, None)

    def perform(self, ops: Sequence[EditOp], *, clear_first: bool = False) -> Change:
        """Plan, commit, switch and settle one edit (blocking; one edit at a time)."""
        with self._edit_lock:
            change = self.plan(ops, clear_first=clear_first)
            if change.is_empty:
                return change
            self.commit(change, self.clock())
            try:
                self.backend.switch(change)
            except Exception as exc:
                self.rollback(change)
                with contextlib.suppress(Exception):  # best effort: the backend's real state
                    real = self.backend.current()
                    if real is not None:
                        with self._lock:
                            self._pairs = dict(real)
                if isinstance(exc, DeviceError):
                    raise
                raise DeviceError("operation-failed", f"switching failed: {exc}") from exc
            self.settle(change, self.clock())
            return change

    def _check_op(self, op: EditOp, work: Mapping[int, int]) -> None:
        if op.op not in OPERATIONS:
            raise DeviceError("bad-attribute", f"unknown operation {op.op!r}")
        n = self.size
        if not self.is_ingress(op.ingress):
            raise DeviceError("invalid-value", f"ingress port {op.ingress} is out of range "
                              f"1..{n}", path=_path(self.list_name, op.ingress, "ingress"),
                              ports=(op.ingress,))
        if op.op in ("merge", "create", "replace") and op.egress is None:
            raise DeviceError("missing-element", f"ingress {op.ingress}: an egress is needed "
                              f"to {op.op} a cross-connect",
                              path=_path(self.list_name, op.ingress, "egress"),
                              ports=(op.ingress,))
        if op.egress is not None and not self.is_egress(op.egress):
            raise DeviceError("invalid-value", f"egress port {op.egress} is out of range "
                              f"{n + 1}..{2 * n}", path=_path(self.list_name, op.ingress,
                                                              "egress"),
                              ports=(op.ingress, op.egress))
        if op.op == "create" and op.ingress in work:
            raise DeviceError("data-exists", f"ingress port {op.ingress} is already connected "
                              f"to egress {work[op.ingress]}",
                              path=_path(self.list_name, op.ingress), ports=(op.ingress,))
        if op.op == "delete" and op.ingress not in work:
            raise DeviceError("data-missing", f"no cross-connect on ingress port {op.ingress}",
                              path=_path(self.list_name, op.ingress), ports=(op.ingress,))


def _path(list_name: str, ingress: int, leaf: str | None = None) -> str:
    path = f"/opsw:cross-connects/opsw:{list_name}[opsw:ingress='{ingress}']"
    return f"{path}/opsw:{leaf}" if leaf else path
