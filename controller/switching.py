"""The interface between the Opus core's call book and a switching model, and what both models
share.

A switching model decides how a gathered call is served: which circuits it needs, when they are
switched, what a switch's light or failure does. :class:`controller.calls.CallBook` keeps the
calls; :class:`controller.core.OpusCore` picks the model at construction from
``CoreConfig.semantics``:

* ``port-exact``: :class:`controller.portexact.PortExactPlanner` (one-to-one port matchings,
  first-come-first-served, minimal change, eviction);
* ``rail-state``: :class:`controller.railstate_switching.RailStateSwitching` (the public
  artifact's bitmask per rail, :mod:`controller.railstate`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Protocol

from controller.calls import Event, Instance, JobEntry, LazyEvent, Output
from controller.job import JobSpec
from controller.ocs import ApplyResult, Circuit, CrossconnectState, Reconfiguration


class SwitchingModel(Protocol):
    """What the call book asks of a switching model (each model's docstring says how)."""

    @property
    def waiting(self) -> Mapping[Instance, None]:
        """Calls the model holds back; the book pumps it after a completion only when some
        wait (one check instead of one call per completion)."""
        ...

    #: a rank's real ask for another call withdraws its speculative asks (a misprediction)
    withdraws_predictions: bool
    #: with provisioning, a completion's predicted next call is a speculative ask
    predicts_on_completion: bool
    #: a prediction of a call its rank already asked for or finished is counted and dropped
    counts_late_predictions: bool

    def prepare_job(self, job: JobSpec) -> Callable[[JobEntry], None]:
        """Check that the model can serve ``job`` (else :class:`~controller.job.JobError`);
        the returned function takes the job in once the book has registered it."""
        ...

    def job_removed(self, job: JobEntry) -> None:
        """Forget an unregistered job (its port owners are gone already)."""
        ...

    def asked(self, inst: Instance, now: float, out: Output) -> None:
        """A gathering call got an ask (real or speculative): serve it once everyone asked."""
        ...

    def released(self, inst: Instance, now: float) -> None:
        """A running call ended (or its job went): its circuits are idle now."""
        ...

    def withdraw(self, inst: Instance) -> None:
        """Take a queued call out of the queue (dropped, or no longer ready)."""
        ...

    def turned_real(self, inst: Instance) -> None:
        """A queued call that only speculative asks made ready got its first real ask."""
        ...

    def pump(self, now: float, out: Output) -> None:
        """Serve the calls that may go now."""
        ...

    def commit(self, rc: Reconfiguration) -> None:
        """Take a change of the switch into the crossconnect state (initial circuits too)."""
        ...

    def done(self, decision_id: int, results: Sequence[ApplyResult], now: float) -> Output:
        """The driver lit a decision's circuits."""
        ...

    def failed(self, decision_id: int, error: str, now: float, out: Output,
               withdrawn: bool) -> None:
        """The driver refused or failed a decision (the book pumps afterwards)."""
        ...

    def active_circuits(self) -> frozenset[Circuit]:
        """Circuits running calls use now (never touched by a decision)."""
        ...

    def dark_ports(self) -> frozenset[tuple[int, int]]:
        """(rail, port) of every port a decision in flight is switching."""
        ...


def _ev_reconfig_end(r: LazyEvent, into: list[Event]) -> None:
    """Builds the ``reconfig_end`` event of a lazily recorded ``(builder, t_s, did, result)``
    (:data:`controller.calls.LazyEvent`: one tuple per rail of every decision until read)."""
    _, t_s, did, res = r
    into.append({"event": "reconfig_end", "t_s": t_s, "decision": did, "rail": res.rail,
                 "added": [c.to_json() for c in sorted(res.added)],
                 "removed": [c.to_json() for c in sorted(res.removed)],
                 "t_request_s": res.t_request_s, "t_dark_s": res.t_dark_s,
                 "t_light_s": res.t_light_s, "dark_ms": res.dark_ms})


def end_events(decision_id: int, results: Sequence[ApplyResult], now: float,
               out: Output) -> None:
    """One ``reconfig_end`` event per rail the driver reported."""
    events = out._events
    for res in results:
        events.append((_ev_reconfig_end, now, decision_id, res))


def undo(state: CrossconnectState, commit: Callable[[Reconfiguration], Any], decision_id: int,
         rc: Reconfiguration, now: float, out: Output) -> frozenset[Circuit]:
    """Revert ``rc`` (committed at dispatch) through ``commit``; what cannot be reverted is
    reported in a ``state_diverged`` event and returned: the removed circuits not restored
    (their port is held by a later decision)."""
    try:
        commit(Reconfiguration(rc.rail, add=rc.remove, remove=rc.add))
        return frozenset()
    except ValueError as exc:
        error = str(exc)
    present = state.circuits(rc.rail)
    commit(Reconfiguration(rc.rail, remove=rc.add & present))
    peer = state.peer
    restore = frozenset(c for c in rc.remove
                        if peer(rc.rail, c.port_a) is None and peer(rc.rail, c.port_b) is None)
    commit(Reconfiguration(rc.rail, add=restore))
    out._events.append({
        "event": "state_diverged", "t_s": now, "decision": decision_id, "rail": rc.rail,
        "not_restored": [c.to_json() for c in sorted(rc.remove - restore)],
        "not_dropped": [c.to_json() for c in sorted(rc.add - present)],
        "error": error})
    return rc.remove - restore
