"""What the start gate (``run.start_gate``) did, from the ranks' ``gate`` records (pure).

A rank's ``gate`` record holds ``t_loaded`` (set up: listening, greeted the controller) and
``t_go`` (released). The summary says when the last rank loaded, how long the ranks waited, how
far apart their releases were, and whether any rank's first op began before the last rank
loaded (it must not: that is the gate's whole point).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

Record = Mapping[str, Any]


def first_op_starts(records: Sequence[Record]) -> dict[int, float]:
    """Each rank's earliest op start in epoch 0: a call's intent or a compute's start."""
    out: dict[int, float] = {}
    for r in records:
        if int(r.get("epoch", 0)) != 0:
            continue
        if r.get("ev") == "call":
            t = float(r["t_intent"])
        elif r.get("ev") == "compute":
            t = float(r["t_start"])
        else:
            continue
        rank = int(r["rank"])
        out[rank] = min(out.get(rank, t), t)
    return out


def gate_summary(records: Sequence[Record]) -> dict[str, Any] | None:
    """The gate's figures (None: no rank passed a gate)."""
    gates = {int(r["rank"]): r for r in records if r.get("ev") == "gate"}
    if not gates:
        return None
    loaded = [float(g["t_loaded"]) for g in gates.values()]
    go = [float(g["t_go"]) for g in gates.values()]
    last_loaded = max(loaded)
    first = first_op_starts(records)
    early = sorted(rank for rank, t in first.items() if t < last_loaded)
    return {"ranks": len(gates), "loading_spread_s": last_loaded - min(loaded),
            "wait_max_s": max(g - t for g, t in zip(go, loaded, strict=True)),
            "release_after_last_loaded_s": min(go) - last_loaded,
            "release_skew_s": max(go) - min(go),
            "first_op_after_release_s": (min(first.values()) - min(go)) if first else None,
            "ranks_started_early": early}
