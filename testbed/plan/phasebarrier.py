"""The artifact shim's phase barrier (``ocs.rail_state_phase_barrier``).

In the public Opus artifact's shim (``src/opus-shim/src/opus.cpp`` and ``include/opus.hpp`` at
``53f8d51``, read, no code taken) every collective of a rank, whatever its communicator and
thread, first runs ``pre_coll_callback_helper``, and that helper waits until the flag
``topo_ready`` is set. The flag is one per process (a ``static`` member shared by all the rank's
backends). The **last call of a phase** (a "comm stage" of the rank's pattern file) clears it;
the post helper of that call, which runs once the call has **completed** on the GPU, sets it
again. So no call of the rank starts before the previous phase's last call has finished. Calls
whose helper already ran go on. How it differs by mode:

* ``MODE=baseline`` (the artifact's on-demand runs): the helpers run in CUDA host functions on
  the call's stream; the last call clears the flag after its own request, if any, was
  acknowledged, and its post helper sets it as soon as it runs.
* ``MODE=provision`` without ``USE_CUDA_STREAM`` (the artifact's Llama provisioning runs): the
  pre helper runs synchronously on the thread that issues the call, so the last call clears the
  flag when it is issued (it asks nothing); its post helper runs on the backend's post thread
  after the call's CUDA event, first sends the blocking provisioning request for the next
  phase's first call (``topoprovision``: answered only once the controller's switch is done)
  and only then sets the flag. So the next phase cannot start, and no other call of the rank
  (an FSDP backward all-gather on autograd's thread too) can start, before the previous phase's
  last call has ended *and* the next phase's switch is done.

Here (pure bookkeeping, driven by :class:`~testbed.simulator.engine.PlanSimulation` and, on
demand, by the emulated replayer, :mod:`testbed.emulated.replayer`): the phases
are those of :mod:`testbed.plan.requestpoints` (the rank's main-thread calls, the pipeline's
against the others); a phase's last call *closes* the rank's barrier (on demand: once it is
acknowledged, at once if it does not ask; with provisioning: when it starts) and *opens* it (on
demand: when it ends; with provisioning: when it has ended and the rank's prediction of the next
phase's first call was answered, :meth:`PhaseBarrier.answered`); a call of that rank that would
start while the barrier is closed is held and started, in order, when it opens. Default off:
the model of sections 3 and 8 of ``docs/validation.md`` without it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
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
    """Per rank: which call holds the barrier closed and the call starts held behind it.

    ``provisioning``: the shim's ``MODE=provision`` order (closed when the phase's last call
    starts, open once it ended and its prediction was answered); else ``MODE=baseline``'s
    (closed at the last call's ack, open when it ends).
    """

    def __init__(self, programs: Mapping[int, Sequence[PlanOp]], *,
                 provisioning: bool = False) -> None:
        self.provisioning = provisioning
        self.ends = {rank: phase_end_calls(ops) for rank, ops in programs.items()}
        self.holder: dict[int, Any] = {}
        self.held: dict[int, list[tuple[Any, ...]]] = {}
        self._waits: dict[int, int] = {}  # rank -> conditions left before it opens
        # (provisioning) rank -> (group, seq) its closing call predicted, and that call
        self.waiting: dict[int, tuple[str, int, Any]] = {}
        self.holds = 0  # call starts held, over the run

    def hold(self, rank: int, start: tuple[Any, ...]) -> bool:
        """Whether ``start`` (the args of a call start) must wait; if so it is kept."""
        if rank not in self.holder:
            return False
        self.held.setdefault(rank, []).append(start)
        self.holds += 1
        return True

    def _close(self, rank: int, index: int, call: Any) -> None:
        if index in self.ends.get(rank, ()):
            self.holder[rank] = call
            self._waits[rank] = 2 if self.provisioning else 1

    def started(self, rank: int, index: int, call: Any) -> None:
        """The call started (was issued): with provisioning, a phase's last call closes."""
        if self.provisioning:
            self._close(rank, index, call)

    def acked(self, rank: int, index: int, call: Any) -> None:
        """The call's request was answered (or it asks none): on demand, a phase's last call
        closes."""
        if not self.provisioning:
            self._close(rank, index, call)

    def _met(self, rank: int, call: Any) -> Iterable[tuple[Any, ...]]:
        """One of the holder's conditions is met: open when none is left."""
        if self.holder.get(rank) is not call:
            return ()
        self._waits[rank] -= 1
        if self._waits[rank]:
            return ()
        del self.holder[rank], self._waits[rank]
        return self.held.pop(rank, [])

    def ended(self, rank: int, call: Any) -> Iterable[tuple[Any, ...]]:
        """The call ended: if it holds the barrier, one condition is met (the only one on
        demand: open and give back the held starts)."""
        return self._met(rank, call)

    def answered(self, rank: int, call: Any) -> Iterable[tuple[Any, ...]]:
        """(provisioning) the rank's prediction made after ``call`` ended was answered (its
        switch is done, or none was needed or made): the other condition."""
        return self._met(rank, call) if self.provisioning else ()

    def poll(self, job_id: str, ready: Callable[[str, str, int, int], bool]
             ) -> list[tuple[int, Any]]:
        """(provisioning) the (rank, closing call) whose predicted call ``ready(job, group, seq,
        rank)`` says may run now; they no longer wait (:meth:`answered` follows)."""
        out = [(rank, call) for rank, (group, seq, call) in self.waiting.items()
               if ready(job_id, group, seq, rank)]
        for rank, _call in out:
            del self.waiting[rank]
        return out

    def closed_by(self, rank: int, call: Any) -> bool:
        """Whether ``call`` holds the rank's barrier now."""
        return self.holder.get(rank) is call
