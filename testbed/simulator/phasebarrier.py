"""The artifact shim's phase barrier (``ocs.rail_state_phase_barrier``, sim backend, on demand).

In the public Opus artifact's shim (``src/opus-shim/src/opus.cpp`` and ``include/opus.hpp`` at
``53f8d51``, read, no code taken) every collective of a rank, whatever its communicator and
stream, first runs ``pre_coll_callback_helper`` in a CUDA host function on its stream, and that
helper waits until the flag ``topo_ready`` is set. The flag is one per process (a ``static``
member shared by all the rank's backends). With ``MODE=baseline`` (the artifact's on-demand
runs) the helper of the **last call of a phase** (a "comm stage" of the rank's pattern file)
clears the flag after its own request, if any, was acknowledged; the helper that runs when that
call has **completed** on the GPU (``post_coll_callback_helper``, queued behind it on the same
stream) sets it again. So no call of the rank starts its helper, and so no first call of the
next phase sends its request, before the previous phase's last call has finished: the next
phase's switch cannot overlap the end of the previous phase. Calls whose helper already ran go
on.

Here (pure bookkeeping; :class:`~testbed.simulator.engine.PlanSimulation` drives it): the phases
are those of :mod:`testbed.plan.requestpoints` (the rank's main-thread calls, the pipeline's
against the others); a phase's last call *closes* the rank's barrier once it is acknowledged (at
once if it does not ask) and *opens* it when it ends; a call of that rank that would start while
the barrier is closed is held and started, in order, when it opens. Default off: the model of
sections 3 and 8 of ``docs/validation.md`` without it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from testbed.plan.replay import PlanOp
from testbed.plan.requestpoints import _visible

__all__ = ["PhaseBarrier", "phase_end_calls"]


def _family(op: PlanOp) -> str:
    return "pp" if op.axis == "pp" else "dp"


def phase_end_calls(ops: Sequence[PlanOp]) -> frozenset[int]:
    """Plan indices of the calls that end a phase: main-thread calls whose next main-thread call
    (cyclically) asks the controller and is of the other family (pipeline or not)."""
    visible = _visible(ops, "phase")
    out = set()
    for i, op in enumerate(visible):
        nxt = visible[(i + 1) % len(visible)]
        if nxt.gated and _family(nxt) != _family(op) and nxt is not op:
            out.add(op.index)
    return frozenset(out)


class PhaseBarrier:
    """Per rank: which call holds the barrier closed and the call starts held behind it."""

    def __init__(self, programs: Mapping[int, Sequence[PlanOp]]) -> None:
        self.ends = {rank: phase_end_calls(ops) for rank, ops in programs.items()}
        self.holder: dict[int, Any] = {}
        self.held: dict[int, list[tuple[Any, ...]]] = {}
        self.holds = 0  # call starts held, over the run

    def hold(self, rank: int, start: tuple[Any, ...]) -> bool:
        """Whether ``start`` (the args of a call start) must wait; if so it is kept."""
        if rank not in self.holder:
            return False
        self.held.setdefault(rank, []).append(start)
        self.holds += 1
        return True

    def acked(self, rank: int, index: int, call: Any) -> None:
        """The call's request was answered (or it asks none): a phase's last call closes."""
        if index in self.ends.get(rank, ()):
            self.holder[rank] = call

    def ended(self, rank: int, call: Any) -> Iterable[tuple[Any, ...]]:
        """The call ended: if it held the barrier, open it and give back the held starts."""
        if self.holder.get(rank) is not call:
            return ()
        del self.holder[rank]
        return self.held.pop(rank, [])
