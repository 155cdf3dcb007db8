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

from collections.abc import Callable, Sequence
from typing import Any

# The SwitchingModel protocol itself lives with the call book that uses it, so that the book
# needs nothing from here; it is re-exported for readers of this module.
from controller.calls import Event, LazyEvent, Output, SwitchingModel
from controller.ocs import ApplyResult, Circuit, CrossconnectState, Reconfiguration

__all__ = ["SwitchingModel", "end_events", "undo"]


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
