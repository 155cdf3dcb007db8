"""The rail-state model of Opus's public artifact (``ocs.semantics: rail-state``), pure.

The authors' public artifact (``opusfabric/Opus``, ``src/opus-controller``: ``controller.cpp``
and its per-rail worker ``config.py``) does not keep a port matching per rail. It keeps one
integer per rail, used as a bitmask with one bit per pipeline stage, and its evaluation (the
paper's step time against switching delay on GPUs) ran on that model. This module is that
model, written from a reading of the artifact (no code taken); it describes the artifact, not
the physics of an optical circuit switch: nothing in it stops a GPU port from holding its PP
and its FSDP circuit at once, which a one-to-one OCS (``port-exact``, the default) forbids.

Rules (per optical rail ``r``, two masks, ``requested[r]`` and ``completed[r]``, both 0 at start):

* a group's call is served once every member asked (:mod:`controller.calls`); serving applies the
  group's :class:`BitOp` to ``requested[r]`` on each rail of its demand: a send/recv pair of
  pipeline stages ``a`` and ``a + 1`` **sets** bits ``{a, a + 1}``; a data-parallel group
  (``fsdp``, ``dp``, ``edp``) of stage ``s`` **clears** bit ``s``; the pipeline ring (the
  grad-norm all-reduce) changes **nothing** (the artifact's shim never asks for it); any other
  axis on a rail cannot be expressed (:class:`~controller.job.JobError`);
* the bits that change are ``requested[r] XOR completed[r]`` against the *completed* mask as it
  is when the call is served (stale while switches are in flight); nothing changed: the call
  is acknowledged at once;
* a changed bit that a switch in flight or waiting already takes to the requested value (a
  *stale* bit) is, by ``inflight`` (:data:`INFLIGHT`): ``join`` (the default) not switched
  again: the call waits for that switch to end, as a real switch heading to a state delivers
  it once; ``reflip``: switched again, queued behind it (the artifact's controller compares
  with the completed mask only, so its worker sleeps again: a *stale re-flip*);
* each changed bit is one switch of one switching delay; the bits of one request switch in
  parallel (one request costs about one delay); a request starts once all its bits are free and
  bits are first-come-first-served (a bit stays blocked behind an earlier waiting request);
* when a request's own switches and the switches it joined have ended, ``completed[r]``
  becomes the target recorded when it was served (the last to finish wins) and the call is
  acknowledged; a joined switch that fails fails the call. No circuit is protected, no port is
  dark to the data plane: only acknowledgements wait.

Physical realisation (both backends): as in the artifact's measurements (NCCL over the cluster's
packet network, the switching only emulated), the data rails are packet-switched (electrical,
as the baseline's: one port per rank, every peer reachable), so data never waits for a circuit
and the data path is the baseline's; only acknowledgements wait. The switching of bit ``b`` of
rail ``r`` is a real break-before-make on its own small OCS, the *shadow rail*
``n_rails + r * n_bits + b`` (:func:`shadow_rail_id`) with three ports, whose circuit alternates
between ``1-2`` and ``1-3`` (:func:`flip_reconf`), so different bits switch in parallel and each
flip takes the rail's switching delay.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from controller.job import CommGroup, JobError, JobSpec
from controller.ocs import Circuit, Reconfiguration

PORT_EXACT = "port-exact"
RAIL_STATE = "rail-state"
SEMANTICS = (PORT_EXACT, RAIL_STATE)
#: What a request does with a bit already being switched to its value: join that switch, or
#: flip the bit again after it (:class:`RailStateModel`).
JOIN, REFLIP = "join", "reflip"
INFLIGHT = (JOIN, REFLIP)
#: Axes whose groups clear their stage's bit (the artifact's non-PP backends).
DP_AXES = frozenset({"fsdp", "dp", "edp"})
#: Ports of a shadow rail: 1 is the common end, the circuit alternates 1-2 / 1-3.
SHADOW_PORTS = (1, 2, 3)

Bit = tuple[int, int]  # (rail, bit)


@dataclass(frozen=True)
class BitOp:
    """What serving a group's call does to a rail's requested mask."""

    kind: str  # "set" | "clear" | "none"
    bits: frozenset[int] = frozenset()

    @property
    def mask(self) -> int:
        return sum(1 << b for b in self.bits)

    def apply(self, mask: int) -> int:
        if self.kind == "set":
            return mask | self.mask
        if self.kind == "clear":
            return mask & ~self.mask
        return mask


NO_OP = BitOp("none")


def bit_op_of(group: CommGroup, stage_of: Mapping[int, int]) -> BitOp:
    """The group's bit operation (see the module docstring); :class:`JobError` names the
    group when the model cannot express it."""
    missing = [r for r in group.ranks if r not in stage_of]
    if missing:
        raise JobError(f"group {group.group_id}: rail-state needs the pipeline stage of every "
                       f"rank; ranks {missing} have none")
    stages = sorted({stage_of[r] for r in group.ranks})
    if group.axis == "pp":
        if group.kind != "pairs":
            return NO_OP  # the pipeline ring: the grad-norm all-reduce never asks
        if len(stages) != 2 or stages[1] != stages[0] + 1:
            raise JobError(f"group {group.group_id}: rail-state sets the bits of two adjacent "
                           f"pipeline stages, but its ranks {list(group.ranks)} are in stages "
                           f"{stages} (an interleaved schedule cannot be expressed)")
        return BitOp("set", frozenset(stages))
    if group.axis in DP_AXES:
        if len(stages) != 1:
            raise JobError(f"group {group.group_id}: a data-parallel group clears its stage's "
                           f"bit, but its ranks span stages {stages}")
        return BitOp("clear", frozenset(stages))
    raise JobError(f"group {group.group_id}: axis {group.axis!r} on an optical rail cannot be "
                   "expressed in the rail-state model (one bit per pipeline stage: pipeline "
                   "pairs set, data-parallel groups clear)")


@dataclass(frozen=True)
class Request:
    """A served call that switches: its target, the bits it flips, and the requests whose
    switches it joined (``after``; ``join`` only)."""

    request_id: int
    target: Mapping[int, int]  # rail -> the requested mask when served (changed rails only)
    bits: frozenset[Bit]
    after: frozenset[int] = frozenset()


@dataclass(frozen=True)
class Served:
    """The outcome of serving a call: at once (``request`` None), or a request to switch;
    ``start`` lists the requests (this one or none) that may start switching now."""

    requested: Mapping[int, int]
    completed: Mapping[int, int]
    request: Request | None
    start: tuple[int, ...] = ()
    stale_bits: int = 0  # changed bits that a switch in flight or waiting already takes there
    joined_bits: int = 0  # of those, the bits joined instead of flipped again (``join``)
    early_bits: int = 0  # bits free now but held behind an earlier waiting request


@dataclass
class RailStateModel:
    """The masks of every rail and the first-come-first-served switching of their bits."""

    rails: Iterable[int]
    inflight: str = JOIN
    requested: dict[int, int] = field(init=False)
    completed: dict[int, int] = field(init=False)
    _busy: dict[Bit, int] = field(init=False, default_factory=dict)  # bit -> request switching
    _waiting: list[Request] = field(init=False, default_factory=list)
    _going: dict[Bit, tuple[int, int]] = field(init=False, default_factory=dict)  # last switch
    _requests: dict[int, Request] = field(init=False, default_factory=dict)  # not settled
    _open: dict[int, set[int]] = field(init=False, default_factory=dict)  # joined, not ended
    _switched: set[int] = field(init=False, default_factory=set)  # own switches ended
    _failed: set[int] = field(init=False, default_factory=set)

    def __post_init__(self) -> None:
        if self.inflight not in INFLIGHT:
            raise ValueError(f"inflight must be one of {', '.join(INFLIGHT)}, got "
                             f"{self.inflight!r}")
        self.requested = dict.fromkeys(self.rails, 0)
        self.completed = dict.fromkeys(self.rails, 0)

    def serve(self, request_id: int, ops: Mapping[int, BitOp]) -> Served:
        """Serve a call whose group does ``ops`` (rail -> operation)."""
        target: dict[int, int] = {}
        bits: set[Bit] = set()
        for rail, op in ops.items():
            mask = op.apply(self.requested[rail])
            self.requested[rail] = mask
            changed = mask ^ self.completed[rail]
            if changed:
                target[rail] = mask
                bits.update((rail, b) for b in range(changed.bit_length()) if changed >> b & 1)
        requested = {r: self.requested[r] for r in ops}
        completed = {r: self.completed[r] for r in ops}
        if not bits:
            return Served(requested, completed, None)
        stale = {(rail, b) for rail, b in bits if (g := self._going.get((rail, b))) is not None
                 and g[1] == (target[rail] >> b & 1)}
        joined = stale if self.inflight == JOIN else set()
        after = frozenset(self._going[bit][0] for bit in joined)
        bits -= joined
        held = {bit for w in self._waiting for bit in w.bits}
        early = sum(1 for bit in bits if bit not in self._busy and bit in held)
        req = Request(request_id, target, frozenset(bits), after)
        self._requests[request_id] = req
        self._open[request_id] = set(after)
        for rail, b in bits:
            self._going[(rail, b)] = (request_id, target[rail] >> b & 1)
        if bits:
            self._waiting.append(req)
        else:
            self._switched.add(request_id)
        return Served(requested, completed, req, self._start(), stale_bits=len(stale),
                      joined_bits=len(joined), early_bits=early)

    def finished(self, request_id: int, *, lit: bool = True) -> tuple[int, ...]:
        """A request's own switches ended (``lit``: the bits took their values; else they
        failed, and so do the requests that joined them); returns the requests that may start
        now. :meth:`settled` then gives the requests that are done."""
        req = self._requests[request_id]
        for bit in req.bits:
            if self._busy.get(bit) == request_id:
                del self._busy[bit]
            if self._going.get(bit, (None,))[0] == request_id:
                del self._going[bit]
        self._switched.add(request_id)
        if not lit:
            self._failed.add(request_id)
        for rid, waits in self._open.items():
            if request_id in waits:
                waits.discard(request_id)
                if not lit:
                    self._failed.add(rid)
        return self._start()

    def settled(self) -> list[tuple[int, bool]]:
        """The requests whose own and joined switches have all ended, in serving order, each
        with whether it succeeded; the completed mask takes each success's target."""
        done = sorted(rid for rid in self._switched if not self._open.get(rid))
        out = []
        for rid in done:
            req = self._requests.pop(rid)
            self._switched.discard(rid)
            self._open.pop(rid, None)
            ok = rid not in self._failed
            self._failed.discard(rid)
            if ok:
                self.completed.update(req.target)
            out.append((rid, ok))
        return out

    def request(self, request_id: int) -> Request:
        return self._requests[request_id]

    def _start(self) -> tuple[int, ...]:
        blocked = set(self._busy)
        started: list[int] = []
        still: list[Request] = []
        for req in self._waiting:
            if req.bits & blocked:
                blocked |= req.bits  # later requests on these bits stay behind this one
                still.append(req)
                continue
            for bit in req.bits:
                self._busy[bit] = req.request_id
            blocked |= req.bits
            started.append(req.request_id)
        self._waiting = still
        return tuple(started)


# ------------------------------------------------------------------ physical realisation


def shadow_rail_id(rail: int, bit: int, n_rails: int, n_bits: int) -> int:
    """The OCS rail that switches bit ``bit`` of data rail ``rail``."""
    return n_rails + rail * n_bits + bit


def shadow_rails(n_rails: int, n_bits: int) -> dict[int, Bit]:
    """Shadow rail id -> (data rail, bit), for ``n_rails`` data rails of ``n_bits`` stages."""
    return {shadow_rail_id(r, b, n_rails, n_bits): (r, b)
            for r in range(n_rails) for b in range(n_bits)}


def job_shape(job: JobSpec) -> tuple[int, int]:
    """(data rails, bits) of a rail-state job: rails 0.. of its ranks, one bit per stage."""
    if job.stages is None:
        raise JobError(f"job {job.job_id}: rail-state needs each rank's pipeline stage")
    return (1 + max(rp.rail for rp in job.ranks.values()),
            1 + max(job.stages.values(), default=0))


def flip_reconf(shadow: int, lit: Iterable[Circuit]) -> Reconfiguration:
    """The next flip of a shadow rail: light 1-2 first, then alternate 1-2 and 1-3."""
    one_two, one_three = Circuit(shadow, 1, 2), Circuit(shadow, 1, 3)
    present = set(lit)
    if one_two in present:
        return Reconfiguration(shadow, frozenset({one_three}), frozenset({one_two}))
    if one_three in present:
        return Reconfiguration(shadow, frozenset({one_two}), frozenset({one_three}))
    return Reconfiguration(shadow, frozenset({one_two}))
