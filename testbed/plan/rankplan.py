"""The plan a rank process starts from (``ranks/rank<R>.plan.json``), as one typed record.

Pure data with its JSON form, read and written on both sides of the process boundary:

* the emulated run's supervisor (:mod:`testbed.emulated.supervisor`) writes a replayed rank's
  :class:`RankPlan` (with :class:`ReplayPart`) and a standby spare's :class:`StandbyPlan`; the
  rank process (:mod:`testbed.emulated.replayer`) reads either with :func:`load_plan`;
* the torch runner (:mod:`testbed.torchjob.runner`) writes a torch rank's :class:`RankPlan`
  (with :class:`TorchPart`); its launcher (:mod:`testbed.torchjob.launcher`) reads it;
* the sim backend, which starts no rank process, keeps each rank's :class:`PlanRecord` (rank,
  iterations, ops) in its results; the results' readers (:mod:`testbed.studies.crossval`,
  :mod:`testbed.results.rankcompare`) take either form through :func:`plan_record`.

The JSON form is one flat object: the fields every rank process has (``rank``, ``job``,
``endpoint``, ``peers``, ``records``, ``ack_timeout_s``, ``io_timeout_s``, ``time_dilation``,
``failover``) beside those of what it runs (a replay's or a torch script's). The defaults live
here only; a missing required key or an unknown key is a :class:`RankPlanError` that names it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from testbed.plan.replay import PlanOp

#: a rank's transport address: a rail address (replay), ``(host, port)`` or a Unix socket path
Peer = str | tuple[str, int]

#: how long a replayed rank waits on a socket at the least (connect, receive)
MIN_IO_TIMEOUT_S = 30.0
#: a replayed rank's socket timeout in modelled iterations (it waits on its slowest peer)
IO_TIMEOUT_ITERATIONS = 10


class RankPlanError(ValueError):
    """A rank plan that cannot be read; the message names the key and the file when known."""


def replay_io_timeout_s(modeled_iteration_s: float) -> float:
    """The socket timeout of a replayed rank: ten modelled iterations, at least 30 s."""
    return max(MIN_IO_TIMEOUT_S, IO_TIMEOUT_ITERATIONS * modeled_iteration_s)


@dataclass(frozen=True)
class ReplayPart:
    """What a replayed rank runs: its ops for ``iterations`` iterations, listening on
    ``addr``:``port``; ``gate`` (the start gate's pipes, :class:`testbed.emulated.gate
    .GatePaths` in JSON form) and ``artifact`` (the artifact protocol's host, port, local rank
    and comms) when the run has them; ``phase_barrier``: the rank runs the artifact shim's
    phase barrier (:mod:`testbed.plan.phasebarrier`), with ``phase_barrier_provisioning`` in
    the provisioning order (it also waits for the answer to the rank's prediction);
    ``rail_state_ack_timeout_s``: a call goes on without its ack after this long (wall
    seconds: the run's ``ocs.rail_state_ack_timeout_s`` times its dilation; None: it waits for
    the light). Under the static plane (issue 40): ``routes`` maps a collective id and a peer
    rank to the stations a transfer crosses after this rank (each station's address, the
    peer's last; peers not named are reached directly; :mod:`testbed.emulated.relay`), and
    ``scale_up`` is the Unix socket this rank listens on for its server's other GPUs (empty:
    none)."""

    addr: str
    port: int
    iterations: int
    ops: tuple[PlanOp, ...]
    gate: dict[str, str] | None = None
    artifact: dict[str, Any] | None = None
    phase_barrier: bool = False
    rail_state_ack_timeout_s: float | None = None
    phase_barrier_provisioning: bool = False
    routes: dict[str, dict[int, tuple[Peer, ...]]] | None = None
    scale_up: str = ""

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"addr": self.addr, "port": self.port,
                               "iterations": self.iterations,
                               "ops": [op.to_json() for op in self.ops]}
        if self.gate is not None:
            out["gate"] = dict(self.gate)
        if self.artifact is not None:
            out["artifact"] = self.artifact
        if self.phase_barrier:
            out["phase_barrier"] = True
        if self.rail_state_ack_timeout_s is not None:
            out["rail_state_ack_timeout_s"] = self.rail_state_ack_timeout_s
        if self.phase_barrier_provisioning:
            out["phase_barrier_provisioning"] = True
        if self.routes is not None:
            out["routes"] = {cid: {str(r): [_peer_json(a) for a in via]
                                   for r, via in per.items()}
                             for cid, per in self.routes.items()}
        if self.scale_up:
            out["scale_up"] = self.scale_up
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> ReplayPart:
        return cls(str(d["addr"]), int(d["port"]), int(d["iterations"]),
                   tuple(PlanOp.from_json(o) for o in d["ops"]),
                   {str(k): str(v) for k, v in d["gate"].items()} if d.get("gate") else None,
                   dict(d["artifact"]) if d.get("artifact") else None,
                   bool(d.get("phase_barrier", False)),
                   None if d.get("rail_state_ack_timeout_s") is None
                   else float(d["rail_state_ack_timeout_s"]),
                   bool(d.get("phase_barrier_provisioning", False)),
                   {str(cid): {int(r): tuple(_peer(a) for a in via)
                               for r, via in per.items()}
                    for cid, per in d["routes"].items()}
                   if d.get("routes") is not None else None,
                   str(d.get("scale_up") or ""))


@dataclass(frozen=True)
class TorchPart:
    """What a torch rank runs: ``script`` with ``args`` as one of ``world_size`` ranks
    (``gpus_per_server`` per server), rendezvous at ``master_addr``:``master_port``,
    listening on ``listen``; ``log`` is its output, ``axes`` the script's parallel axes,
    ``gloo_ifname`` the interface gloo may use (empty: any), ``scale_up_dir`` the folder of
    its server's Unix sockets (empty: none)."""

    world_size: int
    gpus_per_server: int
    master_addr: str
    master_port: int
    listen: tuple[Peer, ...]
    log: str
    script: str
    args: tuple[str, ...]
    axes: dict[str, str] = field(default_factory=dict)
    gloo_ifname: str = ""
    scale_up_dir: str = ""

    def to_json(self) -> dict[str, Any]:
        return {"world_size": self.world_size, "gpus_per_server": self.gpus_per_server,
                "master_addr": self.master_addr, "master_port": self.master_port,
                "listen": [_peer_json(a) for a in self.listen], "log": self.log,
                "script": self.script, "args": list(self.args), "axes": dict(self.axes),
                "gloo_ifname": self.gloo_ifname, "scale_up_dir": self.scale_up_dir}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> TorchPart:
        return cls(int(d["world_size"]), int(d["gpus_per_server"]), str(d["master_addr"]),
                   int(d["master_port"]), tuple(_peer(a) for a in d["listen"]), str(d["log"]),
                   str(d["script"]), tuple(str(a) for a in d["args"]),
                   {str(k): str(v) for k, v in (d.get("axes") or {}).items()},
                   str(d.get("gloo_ifname") or ""),
                   str(d.get("scale_up_dir") or ""))


@dataclass(frozen=True)
class RankPlan:
    """One rank process's plan: rank ``rank`` of job ``job``, its calls asked of the Opus
    controller at ``endpoint`` (None: acknowledged at once, as in the torch job's loopback
    reference), reaching the other ranks at ``peers``, its records appended to the JSON-lines
    file ``records``; ``ack_timeout_s`` is its patience with the controller, ``io_timeout_s``
    with a socket, ``time_dilation`` the factor every modelled time runs at (1: none);
    ``failover`` the run's failover block (control file, host, faults, epoch, ...) when the run
    has spares or restarts ranks. Exactly one of ``replay`` and ``torch`` says what it runs."""

    rank: int
    job: str
    endpoint: str | None
    peers: dict[int, Peer]
    records: str
    ack_timeout_s: float
    io_timeout_s: float
    time_dilation: float = 1.0
    failover: dict[str, Any] | None = None
    replay: ReplayPart | None = None
    torch: TorchPart | None = None

    def __post_init__(self) -> None:
        if (self.replay is None) == (self.torch is None):
            raise RankPlanError(f"rank {self.rank}: a rank plan runs a replay or a torch "
                                "script: exactly one of them, got "
                                f"{'both' if self.replay is not None else 'neither'}")

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "rank": self.rank, "job": self.job, "endpoint": self.endpoint,
            "peers": {str(r): _peer_json(a) for r, a in self.peers.items()},
            "records": self.records, "ack_timeout_s": self.ack_timeout_s,
            "io_timeout_s": self.io_timeout_s, "time_dilation": self.time_dilation}
        if self.failover is not None:
            out["failover"] = self.failover
        part = self.replay if self.replay is not None else self.torch
        assert part is not None
        return {**out, **part.to_json()}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> RankPlan:
        """The plan in ``d`` (:meth:`to_json`'s form); :class:`RankPlanError` names a missing
        or unknown key, or a value of the wrong kind."""
        torch = any(k in d for k in _TORCH_REQUIRED)
        part: type[ReplayPart] | type[TorchPart] = TorchPart if torch else ReplayPart
        _check_keys(d, _COMMON, part, "a torch rank's" if torch else "a replayed rank's")
        try:
            return cls(
                int(d["rank"]), str(d["job"]),
                None if d["endpoint"] is None else str(d["endpoint"]),
                {int(r): _peer(a) for r, a in d["peers"].items()}, str(d["records"]),
                float(d["ack_timeout_s"]), float(d["io_timeout_s"]),
                float(d.get("time_dilation", 1.0)),
                dict(d["failover"]) if d.get("failover") else None,
                replay=None if torch else ReplayPart.from_json(d),
                torch=TorchPart.from_json(d) if torch else None)
        except RankPlanError:
            raise
        except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
            raise RankPlanError(f"rank plan: a value of the wrong kind ({type(exc).__name__}: "
                                f"{exc})") from exc


@dataclass(frozen=True)
class StandbyPlan:
    """A standby spare's plan: append records to ``records`` and wait, following the
    ``failover`` block, until a control names its host to take a rank over (that rank's
    :class:`RankPlan` is then read)."""

    records: str
    failover: dict[str, Any]

    def to_json(self) -> dict[str, Any]:
        return {"standby": True, "records": self.records, "failover": self.failover}

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> StandbyPlan:
        unknown = sorted(set(d) - {"standby", "records", "failover"})
        missing = [k for k in ("records", "failover") if d.get(k) is None]
        if unknown or missing:
            raise RankPlanError("standby plan: " + "; ".join(
                ([f"unknown key(s) {', '.join(unknown)}"] if unknown else [])
                + ([f"missing key(s) {', '.join(missing)}"] if missing else [])))
        return cls(str(d["records"]), dict(d["failover"]))


@dataclass(frozen=True)
class PlanRecord:
    """What a results directory keeps of a rank's plan where no rank process ran it (the sim
    backend writes it as ``ranks/rank<R>.plan.json``): its rank, iterations and ops."""

    rank: int
    iterations: int
    ops: tuple[PlanOp, ...]

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "iterations": self.iterations,
                "ops": [op.to_json() for op in self.ops]}


def plan_record(d: Mapping[str, Any], source: str = "rank plan") -> PlanRecord | None:
    """The rank, iterations and ops of a results directory's plan file: a replayed rank's
    :class:`RankPlan` or the sim backend's :class:`PlanRecord`; None for a plan with no ops (a
    torch rank's or a standby spare's). :class:`RankPlanError` names ``source`` and the key."""
    if set(d) == {"rank", "iterations", "ops"}:
        try:
            return PlanRecord(int(d["rank"]), int(d["iterations"]),
                              tuple(PlanOp.from_json(o) for o in d["ops"]))
        except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
            raise RankPlanError(f"{source}: a value of the wrong kind ({type(exc).__name__}: "
                                f"{exc})") from exc
    plan = load_plan(d, source)
    if not isinstance(plan, RankPlan) or plan.replay is None:
        return None
    return PlanRecord(plan.rank, plan.replay.iterations, plan.replay.ops)


def load_plan(d: Mapping[str, Any], source: str = "rank plan") -> RankPlan | StandbyPlan:
    """A rank process's plan from its JSON form: a standby spare's (``standby``) or a rank's;
    errors name ``source`` (the file)."""
    if not isinstance(d, Mapping):
        raise RankPlanError(f"{source}: must be a JSON object, got {type(d).__name__}")
    try:
        return StandbyPlan.from_json(d) if d.get("standby") else RankPlan.from_json(d)
    except RankPlanError as exc:
        raise RankPlanError(f"{source}: {exc}") from exc


def _required(cls: type[Any]) -> tuple[str, ...]:
    return tuple(f.name for f in fields(cls)
                 if f.default is MISSING and f.default_factory is MISSING)


_COMMON = tuple(f.name for f in fields(RankPlan) if f.name not in ("replay", "torch"))
_TORCH_REQUIRED = ("script", "world_size", "master_addr")


def _check_keys(d: Mapping[str, Any], common: tuple[str, ...],
                part: type[ReplayPart] | type[TorchPart], what: str) -> None:
    known = set(common) | {f.name for f in fields(part)}
    unknown = sorted(set(d) - known)
    missing = [k for k in (*_required(RankPlan), *_required(part)) if k not in d]
    problems = ([f"unknown key(s) {', '.join(unknown)}"] if unknown else []) + (
        [f"missing key(s) {', '.join(missing)}"] if missing else [])
    if problems:
        raise RankPlanError(f"{what} plan: {'; '.join(problems)} (known: "
                            f"{', '.join(sorted(known))})")


def _peer(value: Any) -> Peer:
    """An address from JSON: a string, or ``[host, port]``."""
    if isinstance(value, str):
        return value
    host, port = value
    return (str(host), int(port))


def _peer_json(value: Peer) -> Any:
    return value if isinstance(value, str) else [value[0], value[1]]
