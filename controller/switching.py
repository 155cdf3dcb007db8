"""The switching-model interface of the Opus core: the contract between the call book and a model.

The call book (:class:`controller.calls.CallBook`) keeps the jobs and their calls: it takes a
rank's asks, completions and losses, gathers the members of each call and acknowledges them.
A switching model decides how a gathered call is *served*: which circuits it needs, when they
are switched, what a switch's light or failure does. :class:`controller.core.OpusCore` is the
book with one model, picked at construction (``CoreConfig.semantics`` names one of
``controller.core.MODELS``, or the caller passes a factory). The two models of the product:

* ``port-exact``: :class:`controller.portexact.PortExactPlanner` (one-to-one port matchings,
  first-come-first-served, minimal change, eviction);
* ``rail-state``: :class:`controller.railstate_switching.RailStateSwitching` (the public
  artifact's bitmask per rail, :mod:`controller.railstate`).

``docs/switching-models.md`` explains this contract with a complete toy model
(``tests/controller/static_once.py``), driven through the core in
``tests/controller/test_switching_model.py``.

**What a model receives.** One :class:`BookView`, in its constructor, and nothing else: the
configuration, the rails, the crossconnect state, the counters, read-only views of the jobs and
of the port owners, and the book's actions a model may take (:attr:`BookView.ack`,
:attr:`~BookView.finish`, :attr:`~BookView.reject`, :attr:`~BookView.drop`, ...). A model never
reads or writes the book's private attributes.

**What a model returns.** Everything goes into the :class:`~controller.output.Output` that a
hook is handed (or that ``done`` returns): decisions with ``out.decisions.append``, events with
:meth:`Output.emit <controller.output.Output.emit>`, acks and rejects only through the view's
``ack`` and ``reject`` (they count, and log, as every ack and reject must).

**The life of a call** ``(job, group, seq)`` (a :class:`~controller.instances.Instance`)::

    asked ──every member asked──▶ gathered ──model──▶ served ──all completed──▶ released
      (GATHER)                    (asked hook)        QUEUED / SWITCHING / ACTIVE   (released hook)
                   withdrawn: a QUEUED call the book takes back (withdraw hook)

* *asked*: a member asks, really (an intent) or speculatively (a prediction, with
  provisioning). The book records it in ``inst.real`` (rank -> reply ref) or ``inst.spec`` and,
  while the call is GATHER, calls :meth:`SwitchingModel.asked`. That hook may see calls not
  gathered yet (a speculative ask calls it every time): it does nothing until
  ``inst.asked >= inst.group.n_members``.
* *gathered, then served*: the model decides. It may ack at once (the circuits are lit: set
  ``inst.state = ACTIVE`` and call ``view.ack``), queue the call (``QUEUED``,
  ``inst.in_queue = True`` and the call in :attr:`SwitchingModel.waiting`), or switch
  (``SWITCHING``: append a :class:`~controller.messages.Decision`, commit its
  reconfigurations to ``view.state`` at once, emit its ``decision`` and ``reconfig_start``
  events). The driver answers by decision id through :meth:`SwitchingModel.done` (lit: emit
  :func:`end_events`, then ack the call if every member asked really) or
  :meth:`SwitchingModel.failed` (undo the commit with :func:`undo`, reject the real askers
  with code ``reconfig_failed``, drop the call). A call is acked only once every member
  really asked and its circuits are lit; later asks of an ACTIVE call are acked by the book.
* *released*: every member completed its part; the book calls
  :meth:`SwitchingModel.released` (the circuits are idle now, no longer protected), forgets
  the call and logs ``collective_done``. A model that acks a call whose members all completed
  already (a lost rank counts as completed) ends it with ``view.finish``.
* *withdrawn*: the book takes back a call the model queued (``inst.in_queue`` true): a member
  was lost, a speculative ask turned out wrong, a failure. It calls
  :meth:`SwitchingModel.withdraw`, which must take the call out of the model's queue and
  clear ``inst.in_queue``.

**Rules every model keeps.**

1. Deterministic: the same inputs in the same order give the same outputs (the golden traces
   of ``tests/controller`` pin the product models' event logs byte for byte).
2. One-to-one on the switch: a reconfiguration leaves each port in at most one circuit
   (:class:`~controller.ocs.CrossconnectState` refuses anything else), and never touches a
   circuit :meth:`~SwitchingModel.active_circuits` returns.
3. ``view.state`` follows the decisions as dispatched: commit at dispatch, undo on failure.
4. ``waiting`` and ``gate`` are read once, at construction (the book keeps them, and the
   hooks, as its own attributes so that a hook costs what one of its own methods would):
   ``waiting`` is one mapping the model changes in place, for its whole life.
5. An unknown decision id in ``done`` / ``failed`` (a job unregistered since) is ignored.
6. Counters: a model adds its own keys to ``view.counters`` in its constructor and counts the
   shared ones it causes (``decisions``, ``reconfigurations``, ``speculative_decisions``,
   ``avoided_reconfigurations``); the book counts intents, acks, rejects and mispredictions.
7. The fields of an :class:`~controller.instances.Instance` that are the model's: ``state``
   once gathered, ``in_queue``, ``order``, ``circuits``, ``decision_id``, ``spec_tried``,
   ``in_ready``, ``settled_tick``; of a :class:`~controller.instances.Group`, its caches. The
   members' asks, acks and completions are the book's.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from controller.instances import Instance, JobEntry
from controller.job import JobSpec
from controller.messages import CoreConfig, Event, Intent
from controller.ocs import (
    ApplyResult,
    Circuit,
    CrossconnectState,
    RailDescription,
    Reconfiguration,
)
from controller.output import LazyEvent, Output

__all__ = ["BookView", "ModelFactory", "RequestGate", "SwitchingModel", "end_events", "undo"]


@dataclass(frozen=True, slots=True)
class BookView:
    """What a switching model gets from the call book, in its constructor: values and actions.

    The mappings are the book's live tables, handed as read-only views (a model reads them,
    never changes them); ``state`` and ``counters`` are shared and written by the model as the
    module docstring's rules say. The actions are the book's own, bound: calling one costs
    what a method call of the model's own would.
    """

    config: CoreConfig
    #: rail id -> its description (``mode`` ``ocs`` or electrical, its ports)
    rails: Mapping[int, RailDescription]
    #: the ids of the OCS rails (a group's demand lists these only)
    optical: frozenset[int]
    #: the crossconnect state: the model commits its reconfigurations here (rule 3)
    state: CrossconnectState
    counters: dict[str, int]
    #: job id -> the registered job (its spec, its groups, its ranks' ports, its lost ranks)
    jobs: Mapping[str, JobEntry]
    #: (rail, port) -> (job id, rank) that owns the port
    owners: Mapping[tuple[int, int], tuple[str, int]]
    #: ``ack(inst, out, now, reconfigured)``: ack every real asker of ``inst`` not acked yet
    #: (counts the acks, emits one ``ack`` event per rank with its wait)
    ack: Callable[[Instance, Output, float, bool], None]
    #: ``finish(inst, now, out)``: end a call all of whose members completed (calls the
    #: model's ``released``, forgets the call, emits ``collective_done``)
    finish: Callable[[Instance, float, Output], None]
    #: ``reject(out, now, ref, code, message, **fields)``: refuse the request ``ref`` (counts
    #: it, emits an ``error`` event with ``fields``); returns ``out``
    reject: Callable[..., Output]
    #: ``drop(inst)``: forget a call that will not be served (withdraws it if queued)
    drop: Callable[[Instance], None]
    #: ``lost_while_switching(inst, now, out)``: if a member of ``inst`` was lost, reject the
    #: other askers with ``peer_lost``, drop the call and return True; else False
    lost_while_switching: Callable[[Instance, float, Output], bool]
    #: ``intent(intent, now, ref)``: hand a held request back to the book (a gate's release)
    intent: Callable[[Intent, float, object], Output]
    #: ``predict(intent, now)``: hand a held prediction back to the book
    predict: Callable[[Intent, float], Output]


class RequestGate(Protocol):
    """Holds a rank's requests back while the model says its earlier one is unanswered."""

    def hold(self, intent: Intent, ref: object, now: float, out: Output, real: bool) -> bool:
        """Whether ``intent`` (``real``: an intent, else a prediction) waits (True: the gate
        keeps it and hands it back to the book later, through ``BookView.intent`` /
        ``predict``); False: the book serves it now."""
        ...


class SwitchingModel(Protocol):
    """What the call book asks of a switching model (the module docstring is the contract)."""

    @property
    def waiting(self) -> Mapping[Instance, None]:
        """Calls the model holds back (queued); the book pumps the model after a completion
        only when some wait (one check instead of one call per completion). One mapping for
        the model's whole life, changed in place."""
        ...

    #: a rank's real ask for another call withdraws its speculative asks (a misprediction)
    withdraws_predictions: bool
    #: with provisioning, a completion's predicted next call is a speculative ask
    predicts_on_completion: bool
    #: a prediction of a call its rank already asked for or finished is counted
    #: (``late_predictions``, a counter the model adds) and dropped
    counts_late_predictions: bool

    @property
    def gate(self) -> RequestGate | None:
        """Holds a rank's requests back (rail-state's per-rank serialisation), or None."""
        ...

    def prepare_job(self, job: JobSpec) -> Callable[[JobEntry, float, Output], None]:
        """Check that the model can serve ``job`` (else raise
        :class:`~controller.job.JobError`, which the book turns into a ``bad_job`` reject
        with nothing changed); the returned function takes the job in once the book has
        registered it (``job_registered`` is logged), and may emit into the registration's
        output (a model that lights a job's circuits up front decides here)."""
        ...

    def job_removed(self, job: JobEntry) -> None:
        """Forget an unregistered job (its port owners are gone already; its waiting ranks
        were told; its decisions in flight end later as unknown or orphaned ones)."""
        ...

    def asked(self, inst: Instance, now: float, out: Output) -> None:
        """A GATHER call got an ask (real or speculative): serve it once everyone asked."""
        ...

    def released(self, inst: Instance, now: float) -> None:
        """A running call ended (or its job went): its circuits are idle now."""
        ...

    def withdraw(self, inst: Instance) -> None:
        """Take a queued call (``inst.in_queue``) out of the queue (dropped, or no longer
        ready); clear ``inst.in_queue``."""
        ...

    def turned_real(self, inst: Instance) -> None:
        """A queued call that only speculative asks made ready got its first real ask."""
        ...

    def pump(self, now: float, out: Output) -> None:
        """Serve the queued calls that may go now (called after changes that may free them)."""
        ...

    def commit(self, rc: Reconfiguration) -> None:
        """Take a change of the switch into the crossconnect state (initial circuits too)."""
        ...

    def done(self, decision_id: int, results: Sequence[ApplyResult], now: float) -> Output:
        """The driver lit a decision's circuits: ack its call, serve what waited on it."""
        ...

    def failed(self, decision_id: int, error: str, now: float, out: Output,
               withdrawn: bool) -> None:
        """The driver refused or failed a decision (``withdrawn``: it never reached the
        switch); undo it and reject its real askers. The book pumps afterwards."""
        ...

    def active_circuits(self) -> frozenset[Circuit]:
        """Circuits running calls use now (never touched by a decision)."""
        ...

    def dark_ports(self) -> frozenset[tuple[int, int]]:
        """(rail, port) of every port a decision in flight is switching."""
        ...


#: How the core makes a model: called once, with the book's view.
ModelFactory = Callable[[BookView], SwitchingModel]


def _ev_reconfig_end(r: LazyEvent, into: list[Event]) -> None:
    """Builds the ``reconfig_end`` event of a lazily recorded ``(builder, t_s, did, result)``
    (:data:`controller.output.LazyEvent`: one tuple per rail of every decision until read)."""
    _, t_s, did, res = r
    into.append({"event": "reconfig_end", "t_s": t_s, "decision": did, "rail": res.rail,
                 "added": [c.to_json() for c in sorted(res.added)],
                 "removed": [c.to_json() for c in sorted(res.removed)],
                 "t_request_s": res.t_request_s, "t_dark_s": res.t_dark_s,
                 "t_light_s": res.t_light_s, "dark_ms": res.dark_ms})


def end_events(decision_id: int, results: Sequence[ApplyResult], now: float,
               out: Output) -> None:
    """One ``reconfig_end`` event per rail the driver reported."""
    emit = out.emit
    for res in results:
        emit((_ev_reconfig_end, now, decision_id, res))


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
    out.emit({
        "event": "state_diverged", "t_s": now, "decision": decision_id, "rail": rc.rail,
        "not_restored": [c.to_json() for c in sorted(rc.remove - restore)],
        "not_dropped": [c.to_json() for c in sorted(rc.add - present)],
        "error": error})
    return rc.remove - restore
