"""Where a rank talks to the controller under rail-state semantics: request points (pure).

The public Opus artifact's shim (``src/opus-shim``) does not ask at every collective. It asks at
every pipeline send/recv and at the first collective of each *phase*, a phase being a run of
same-family collectives (pipeline or data-parallel) in the order the rank's **main thread**
issues them; FSDP's backward all-gathers run on autograd's thread, so they never ask and never
split a phase, and the pipeline's grad-norm all-reduce never asks but ends a data-parallel
phase. With provisioning, the call that closes a phase asks for the next phase's first call
when it completes, and every pipeline op asks for the next one.

Here that is a property of the plan, computed per rank (``points``):

* ``every``: every call asks (the default for ``port-exact``, where a call must hold lit and
  protected circuits);
* ``phase``: the artifact's points above. The main-thread calls are taken in plan order,
  cyclically (the first data-parallel call of an iteration follows the last pipeline call of
  the one before); a plan without pipeline calls asks at its first call only;
* ``none``: no call asks: a run without a controller, as the artifact's baseline ran (used by
  :mod:`testbed.studies.ladder` for the electrical baseline only; an experiment file cannot
  ask for it, since OCS modes need their calls to ask).

:func:`with_request_points` sets :attr:`~testbed.plan.replay.PlanOp.gated` and, with
provisioning, :attr:`~testbed.plan.replay.PlanOp.predict`: the plan index of the gated call
that the next visible call is, on the call right before it. Members of a group must agree on
which of its calls ask; a plan where they do not is refused.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from testbed.plan.replay import PlanError, PlanOp, ReplayPlan
from workloads.steps import P2P_KINDS
from workloads.threads import MAIN_THREAD

POINTS = ("every", "phase", "none")


def _visible(ops: Sequence[PlanOp], points: str) -> list[PlanOp]:
    """The calls whose order defines the phases: the main thread's (all, with ``every``)."""
    return [op for op in ops if op.is_call and (points == "every" or op.thread == MAIN_THREAD)]


def gated_calls(ops: Sequence[PlanOp], points: str) -> dict[int, bool]:
    """Plan index -> whether the call asks the controller (see the module docstring)."""
    if points not in POINTS:
        raise PlanError(f"request points must be one of {', '.join(POINTS)}, got {points!r}")
    if points in ("every", "none"):
        return {op.index: points == "every" for op in ops if op.is_call}
    gated = {op.index: False for op in ops if op.is_call}
    visible = _visible(ops, points)
    has_pp = any(op.axis == "pp" for op in visible)
    for i, op in enumerate(visible):
        if op.axis == "pp":
            gated[op.index] = op.kind in P2P_KINDS  # the pipeline ring's all-reduce never asks
        elif has_pp:
            gated[op.index] = visible[i - 1].axis == "pp"  # cyclic: i - 1 = -1 wraps around
        else:
            gated[op.index] = i == 0
    return gated


def predict_targets(ops: Sequence[PlanOp], gated: Mapping[int, bool], points: str
                    ) -> dict[int, int]:
    """Plan index of a call -> plan index of the gated call right after it (cyclic)."""
    visible = _visible(ops, points)
    out = {}
    for i, op in enumerate(visible):
        nxt = visible[(i + 1) % len(visible)]
        if gated[nxt.index]:
            out[op.index] = nxt.index
    return out


def lane_positions(ops: Sequence[PlanOp]) -> dict[int, tuple[int, int]]:
    """Plan index of a call -> (its position among its lane's calls, the lane's call count)."""
    counts: dict[str, int] = {}
    position: dict[int, int] = {}
    for op in ops:
        if op.is_call:
            position[op.index] = counts.get(op.lane, 0)
            counts[op.lane] = position[op.index] + 1
    return {i: (p, counts[ops[i].lane]) for i, p in position.items()}


def predicted_call(positions: Mapping[int, tuple[int, int]], current: int, target: int,
                   iteration: int) -> tuple[int, int]:
    """(sequence number, iteration) of call ``target`` predicted after call ``current`` of
    ``iteration``: a lane numbers its calls across iterations, so call ``p`` of ``n`` in
    iteration ``i`` is number ``i * n + p``; a target not after the current call is in the
    next iteration."""
    it = iteration + (1 if target <= current else 0)
    p, n = positions[target]
    return it * n + p, it


def with_request_points(plan: ReplayPlan, points: str, *, predict: bool) -> ReplayPlan:
    """``plan`` with every call's ``gated`` (and, with ``predict``, ``predict``) set."""
    programs: dict[int, list[PlanOp]] = {}
    asks: dict[str, tuple[int, tuple[bool, ...]]] = {}  # lane -> (a rank, its calls' gating)
    for rank, ops in plan.programs.items():
        gated = gated_calls(ops, points)
        targets = predict_targets(ops, gated, points) if predict else {}
        programs[rank] = [dataclasses.replace(op, gated=gated[op.index],
                                              predict=targets.get(op.index, -1))
                          if op.is_call else op for op in ops]
        by_lane: dict[str, list[bool]] = {}
        for op in ops:
            if op.is_call:
                by_lane.setdefault(op.lane, []).append(gated[op.index])
        for lane, flags in by_lane.items():
            seen = asks.setdefault(lane, (rank, tuple(flags)))
            if seen[1] != tuple(flags):
                raise PlanError(f"group {lane}: ranks {seen[0]} and {rank} disagree on which of "
                                f"its calls ask the controller under {points} request points; "
                                "use ocs.request_points: every")
    return dataclasses.replace(plan, programs=programs)
