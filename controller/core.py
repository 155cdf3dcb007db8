"""The Opus scheduler: a pure core that turns events into decisions.

Every public method takes the current time ``now`` (seconds) and returns an :class:`Output`:
acknowledgements and rejections to send to shims, reconfiguration decisions for the OCS driver
and event-log records. The core never sleeps and never does I/O; the service, the simulator and
the tests are shells around it.

Where each part lives:

* :mod:`controller.messages` -- :class:`CoreConfig`, :class:`Intent`, :class:`Ack`,
  :class:`Reject`, :class:`Decision` (re-exported here);
* :mod:`controller.calls` -- the calls: gathering, acks and completions, lost ranks,
  speculation (:class:`~controller.calls.CallBook`); their records in
  :mod:`controller.instances`, :class:`Output` and its events in :mod:`controller.output`;
* :mod:`controller.switching` -- the interface of a switching model, its contract
  (:class:`~controller.switching.SwitchingModel`, the
  :class:`~controller.switching.BookView` a model gets) and what the models share;
* :mod:`controller.portexact` (with its FCFS queue, :mod:`controller.fcfs`) -- the port-exact
  planner (``port-exact``, the default): circuits are port matchings under the one-to-one
  rule, as on a real OCS; its module docstring states the scheduling rules;
* :mod:`controller.railstate_switching` -- the public artifact's model (``rail-state``): a
  bitmask per rail, switched per bit (:mod:`controller.railstate` states its rules).

:class:`OpusCore` is the call book with the model that ``CoreConfig.semantics`` names (or the
factory passed as ``model``), picked once at construction: no method here asks which model it
runs.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from controller.calls import CallBook
from controller.instances import CallState
from controller.messages import Ack, CoreConfig, Decision, Event, Intent, Reject
from controller.ocs import ApplyResult, Circuit, RailDescription, Reconfiguration
from controller.output import LazyEvent, Output
from controller.portexact import PortExactPlanner
from controller.railstate import PORT_EXACT, RAIL_STATE
from controller.railstate_switching import RailStateSwitching
from controller.switching import ModelFactory

__all__ = ["Ack", "CoreConfig", "Decision", "Event", "Intent", "LazyEvent", "OpusCore", "Output",
           "Reject"]

#: the switching model of each ``CoreConfig.semantics``
MODELS: dict[str, ModelFactory] = {
    PORT_EXACT: PortExactPlanner,
    RAIL_STATE: RailStateSwitching,
}


class OpusCore(CallBook):
    """The pure Opus scheduler for one set of rails (one OCS driver)."""

    def __init__(
        self,
        rails: Sequence[RailDescription],
        config: CoreConfig | None = None,
        circuits: Iterable[Circuit] = (),
        model: ModelFactory | None = None,
    ) -> None:
        """``model``: the switching model's factory (:mod:`controller.switching`); None, the
        default, takes the one of ``MODELS`` that ``config.semantics`` names. ``circuits``
        are lit on the switch already (committed through the model)."""
        config = config or CoreConfig()
        super().__init__(rails, config, model or MODELS[config.semantics])
        model_ = self._model
        initial: dict[int, set[Circuit]] = {}
        for c in circuits:
            initial.setdefault(c.rail, set()).add(c)
        for rail, cs in initial.items():
            model_.commit(Reconfiguration(rail, add=frozenset(cs)))

    # ------------------------------------------------------- driver feedback

    def reconfig_done(self, decision_id: int, results: Sequence[ApplyResult],
                      now: float) -> Output:
        """The driver lit the circuits of a decision: ack its waiting ranks, serve the queue."""
        return self._model.done(decision_id, results, now)

    def reconfig_failed(self, decision_id: int, error: str, now: float) -> Output:
        """The driver refused or failed one decision; see :meth:`reconfigs_failed`."""
        return self.reconfigs_failed((decision_id,), error, now)

    def reconfigs_failed(self, decision_ids: Iterable[int], error: str, now: float,
                         withdrawn: Iterable[int] = ()) -> Output:
        """The driver refused or failed these decisions (a request carries several): undo
        their plans, tell the waiting ranks, then serve the queue once.

        ``withdrawn`` are further decisions that never reached the switch because they were
        planned on the failed ones' circuits (:meth:`controller.batching.RailBatcher.failed`):
        they fail too, their events marked ``withdrawn``. Plans are committed at dispatch, in
        decision order, so they are undone newest first: each undo then finds the state its
        decision left, and the core ends with what the switch holds. Serving the queue only
        after every undo keeps a new plan from resting on a circuit about to be undone.

        A later decision may still hold a port that a failed plan freed (one that does not
        fail with it); then that undo cannot apply whole, and it is applied circuit by circuit
        instead: every circuit the plan added that is still there is dropped, and every
        circuit it removed comes back if both its ports are free. Each circuit left over (not
        restored: its port is held; not dropped: already gone) is named in a
        ``state_diverged`` event with the rail and the error, so the divergence from the
        driver is in the log, not silent; the ports stay with whichever decision holds them
        now. The waiting ranks are rejected as for any failed decision.
        """
        out = Output()
        withdrawn = set(withdrawn)
        failed = self._model.failed
        for did in sorted({*decision_ids, *withdrawn}, reverse=True):
            text = (f"withdrawn: planned on the circuits of a switch that failed ({error})"
                    if did in withdrawn else error)
            failed(did, text, now, out, did in withdrawn)
        self._pump(now, out)
        return out

    # ---------------------------------------------------------------- views

    def call_ready(self, job_id: str, group_id: str, seq: int, rank: int) -> bool:
        """Whether call ``seq`` of the group may run for ``rank`` without waiting for the
        switch: it is active (lit, or acked at once), or the rank finished it, or the core
        holds nothing for it (an ignored prediction). For a shell that waits, as the
        artifact's shim's provisioning request does, until a predicted call is answered."""
        job = self._jobs.get(job_id)
        grp = job.groups.get(group_id) if job is not None else None
        if grp is None or seq <= grp.done_seq.get(rank, -1):
            return True
        inst = grp.instances.get(seq)
        return inst is None or inst.state is CallState.ACTIVE

    def active_circuits(self) -> frozenset[Circuit]:
        """Circuits that running calls use now (never touched by a decision)."""
        return self._model.active_circuits()

    def dark_ports(self) -> frozenset[tuple[int, int]]:
        return self._model.dark_ports()
