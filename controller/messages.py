"""What the Opus core takes and gives: its configuration, a rank's intent, and the acks,
rejections and decisions it answers with.

A leaf module (it imports only the circuit types and the semantics' names), so the call book
(:mod:`controller.calls`), the switching models (:mod:`controller.portexact`,
:mod:`controller.railstate_switching`) and every shell can import these values without cycles;
:mod:`controller.core` re-exports them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from controller.ocs import Reconfiguration
from controller.railstate import INFLIGHT, JOIN, PORT_EXACT, RAIL_STATE, SEMANTICS

Event = dict[str, object]


@dataclass(frozen=True)
class CoreConfig:
    """Scheduling modes: provisioning (paper §4.1) and degree-aware assignment (ours), and the
    controller semantics: ``port-exact`` (one-to-one port matchings) or ``rail-state`` (the
    public artifact's bitmask per rail, :mod:`controller.railstate`), and under rail-state
    what a request does with a bit already being switched to its value (``rail_state_inflight``:
    ``join`` that switch, the default, or ``reflip`` as the artifact's controller does) and
    whether a rank's next request waits until its request that started a switch is answered
    (``rail_state_serialize_per_rank``: off by default; on, as the artifact's controller reads
    each rank's socket, :class:`controller.railstate_switching.RankSockets`)."""

    provisioning: bool = False
    degree_aware: bool = False
    semantics: str = PORT_EXACT
    rail_state_inflight: str = JOIN
    rail_state_serialize_per_rank: bool = False

    def __post_init__(self) -> None:
        if self.semantics not in SEMANTICS:
            raise ValueError(f"semantics must be one of {', '.join(SEMANTICS)}, got "
                             f"{self.semantics!r}")
        if self.degree_aware and self.semantics == RAIL_STATE:
            raise ValueError("degree-aware assignment keeps port matchings; rail-state has "
                             "none (use port-exact semantics)")
        if self.rail_state_inflight not in INFLIGHT:
            raise ValueError(f"rail_state_inflight must be one of {', '.join(INFLIGHT)}, got "
                             f"{self.rail_state_inflight!r}")
        if not isinstance(self.rail_state_serialize_per_rank, bool):
            raise ValueError("rail_state_serialize_per_rank must be true or false, got "
                             f"{self.rail_state_serialize_per_rank!r}")
        if self.rail_state_serialize_per_rank and self.semantics != RAIL_STATE:
            raise ValueError("rail_state_serialize_per_rank is a rail-state option (semantics "
                             f"is {self.semantics})")

    @classmethod
    def for_mode(cls, mode: str, semantics: str = PORT_EXACT,
                 rail_state_inflight: str = JOIN,
                 rail_state_serialize_per_rank: bool = False) -> CoreConfig:
        """The configuration of an experiment mode (``on-demand``: neither option)."""
        return cls(provisioning=mode == "provisioning", degree_aware=mode == "degree-aware",
                   semantics=semantics, rail_state_inflight=rail_state_inflight,
                   rail_state_serialize_per_rank=rail_state_serialize_per_rank
                   and semantics == RAIL_STATE)


@dataclass(frozen=True, slots=True, init=False)
class Intent:
    """One rank's request for the circuits of one collective call."""

    job_id: str
    rank: int
    group_id: str
    seq: int
    kind: str = ""
    size_bytes: int = 0
    axis: str = ""

    def __init__(self, job_id: str, rank: int, group_id: str, seq: int, kind: str = "",
                 size_bytes: int = 0, axis: str = "") -> None:
        # the generated __init__ of a frozen class, at half its cost (one per intent); slots,
        # not a __dict__: one object fewer for the garbage collector per intent
        s_job, s_rank, s_group, s_seq, s_kind, s_size, s_axis = _INTENT_SETTERS
        s_job(self, job_id)
        s_rank(self, rank)
        s_group(self, group_id)
        s_seq(self, seq)
        s_kind(self, kind)
        s_size(self, size_bytes)
        s_axis(self, axis)

    def to_json(self) -> dict[str, object]:
        return {"job": self.job_id, "rank": self.rank, "group": self.group_id, "seq": self.seq,
                "kind": self.kind, "size_bytes": self.size_bytes, "axis": self.axis}


@dataclass(frozen=True, slots=True, init=False)
class Ack:
    """The circuits of ``group_id``'s call ``seq`` are lit: ``rank`` may start."""

    ref: object
    job_id: str
    rank: int
    group_id: str
    seq: int
    reconfigured: bool

    def __init__(self, ref: object, job_id: str, rank: int, group_id: str, seq: int,
                 reconfigured: bool) -> None:
        # the generated __init__ of a frozen class, at half its cost (one per acked rank)
        s_ref, s_job, s_rank, s_group, s_seq, s_reconfigured = _ACK_SETTERS
        s_ref(self, ref)
        s_job(self, job_id)
        s_rank(self, rank)
        s_group(self, group_id)
        s_seq(self, seq)
        s_reconfigured(self, reconfigured)


def _slot_setters(cls: type, names: str) -> tuple[Any, ...]:
    """The ``__set__`` of each named slot of ``cls``: how a frozen class sets its own fields."""
    return tuple(cls.__dict__[name].__set__ for name in names.split())


_INTENT_SETTERS = _slot_setters(Intent, "job_id rank group_id seq kind size_bytes axis")
_ACK_SETTERS = _slot_setters(Ack, "ref job_id rank group_id seq reconfigured")


@dataclass(frozen=True, slots=True)
class Reject:
    """A request refused (bad input, lost peer, failed switch); nothing changed for others."""

    ref: object
    code: str
    message: str


@dataclass(frozen=True, init=False)
class Decision:
    """Reconfigure these rails as one ``apply_many`` call; report back with its id."""

    decision_id: int
    job_id: str
    group_id: str
    seq: int
    reconfs: tuple[Reconfiguration, ...]
    speculative: bool

    def __init__(self, decision_id: int, job_id: str, group_id: str, seq: int,
                 reconfs: tuple[Reconfiguration, ...], speculative: bool) -> None:
        # the generated __init__ of a frozen class, without its object.__setattr__ calls
        d = self.__dict__
        d["decision_id"] = decision_id
        d["job_id"] = job_id
        d["group_id"] = group_id
        d["seq"] = seq
        d["reconfs"] = reconfs
        d["speculative"] = speculative
