"""The per-call costs the emulator adds to a run, measured on the run, and their bound (pure).

Besides late light (:mod:`testbed.metrics.darktime`), the emulator puts costs of its own on
every call that no datacenter has: the control round trip between the rank and the Opus
controller (ZeroMQ, Python), the TCP connect and hello of each peer connection, the framing and
wake-ups of every step, the shutdown at the end. They are fixed on the wall clock, so at time
dilation ``k`` they shrink by ``k`` in model time (:mod:`testbed.experiment.dilation`).

Measured from the ranks' records (model time):

* **control round trip**: the intent's way to the controller plus the ack's way back, from
  the controller's own ``intent`` and ``ack`` records (:func:`control_round_trips_s`: no
  waiting for light or for peers in it); its median;
* **transport excess**: ``t_end - t_ack`` minus the call's ideal transfer time (the scaled
  bytes it sends at the configured link rate), on the calls whose ideal transfer is short
  (:data:`SHORT_CALL_S`: what is left is connect, framing and finish, not the link, whose
  speed the throughput check judges); its median per collective kind (the median, as a late
  peer lengthens a few calls by time the model has too), the pooled median for a kind
  without short calls.

The bound (:class:`CallCostBound`) charges every call of the busiest rank's iteration with both
medians, as if no two calls overlapped: an upper bound on what these costs add to an
iteration. Its share of the iteration is judged against :data:`ITERATION_LIMIT_PCT`; with a
baseline, the difference of the two runs' bounds, in points of the baseline's iteration, is
their effect on the overhead, judged against :data:`OVERHEAD_LIMIT_PTS`
(``docs/validation.md``, "The testbed's own costs").
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

#: Limits of the per-call costs (docs/validation.md, "The testbed's own costs"): their bound's
#: share of a measured iteration, and their effect on the overhead in percentage points.
ITERATION_LIMIT_PCT = 10.0
OVERHEAD_LIMIT_PTS = 1.5


@dataclass(frozen=True)
class CallCostBound:
    """The measured per-call costs (model ms) and the bound they put on an iteration."""

    control_ms: float | None  # median control round trip of the calls that did not switch
    excess_ms: dict[str, float]  # median transport excess per collective kind
    calls_per_iteration: int  # the busiest rank's
    per_iteration_s: float  # the bound: every call of that rank charged with both medians
    iteration_s: float | None  # the run's mean measured iteration

    @property
    def iteration_pct(self) -> float | None:
        if not self.iteration_s:
            return None
        return 100.0 * self.per_iteration_s / self.iteration_s

    def exceeded(self) -> str | None:
        pct = self.iteration_pct
        if pct is None or pct <= ITERATION_LIMIT_PCT:
            return None
        return (f"the emulator's per-call costs (control round trip "
                f"{self.control_ms or 0.0:.2f} ms, transport "
                f"{_excess_text(self.excess_ms)}) may add up to "
                f"{1e3 * self.per_iteration_s:.1f} ms to an iteration, {pct:.1f} % of it "
                f"(limit {ITERATION_LIMIT_PCT:g} %); a larger time dilation shrinks them")

    def to_summary(self) -> dict[str, Any]:
        return {"control_ms": _r(self.control_ms),
                "excess_ms": {k: _r(v) for k, v in sorted(self.excess_ms.items())},
                "calls_per_iteration": self.calls_per_iteration,
                "per_iteration_s": _r(self.per_iteration_s, 6),
                "iteration_pct": _r(self.iteration_pct),
                "iteration_limit_pct": ITERATION_LIMIT_PCT,
                "overhead_limit_pts": OVERHEAD_LIMIT_PTS}


def _r(value: float | None, digits: int = 4) -> float | None:
    return None if value is None else round(value, digits)


def _excess_text(excess_ms: Mapping[str, float]) -> str:
    if not excess_ms:
        return "n/a"
    return ", ".join(f"{kind} {ms:.2f} ms" for kind, ms in sorted(excess_ms.items()))


#: A call whose ideal transfer is shorter than this (model time) measures the fixed transport
#: cost: its time beyond the acknowledgement is the connect, framing and finish, not the link.
SHORT_CALL_S = 2e-3


def control_round_trips_s(calls: Sequence[Mapping[str, Any]],
                          events: Sequence[Mapping[str, Any]]) -> list[float]:
    """Each call's control round trip without any waiting the model has: its intent's way to
    the controller (the controller's ``intent`` record's time minus the rank's ``t_intent``)
    plus the ack's way back (the rank's ``t_ack`` minus the controller's ``ack`` record's time;
    one machine, one clock). Without the controller's records: ``t_ack - t_intent`` of the
    calls that did not switch (an upper bound: such a call may still wait for its peers)."""
    at: dict[tuple[str, tuple[Any, Any, Any]], float] = {}
    for e in events:
        if e.get("event") in ("intent", "ack") and "t_s" in e:
            at[(str(e["event"]), (e.get("rank"), e.get("group"), e.get("seq")))] = float(
                e["t_s"])
    out = []
    for r in calls:
        key = (r.get("rank"), r.get("lane"), r.get("seq"))
        if ("intent", key) in at and ("ack", key) in at:
            out.append((at[("intent", key)] - float(r["t_intent"]))
                       + (float(r["t_ack"]) - at[("ack", key)]))
    if out:
        return out
    return [float(r["t_ack"]) - float(r["t_intent"]) for r in calls if not r.get("reconfigured")]


def call_cost_bound(records: Sequence[Mapping[str, Any]], *, warmup: int, link_mbps: float,
                    scale: float, iteration_s: float | None,
                    events: Sequence[Mapping[str, Any]] = ()) -> CallCostBound | None:
    """The bound of a run's ``records`` (model time; the measured iterations only, those from
    ``warmup`` on; ``events``: the controller's, for the control round trips), or None without
    calls."""
    calls = [r for r in records if r.get("ev") == "call" and int(r.get("it", -1)) >= warmup
             and all(isinstance(r.get(k), int | float) for k in ("t_intent", "t_ack", "t_end"))]
    if not calls or link_mbps <= 0:
        return None
    control = control_round_trips_s(calls, events)
    control_ms = 1e3 * statistics.median(control) if control else None
    short: dict[str, list[float]] = defaultdict(list)
    for r in calls:
        ideal_s = float(r.get("wire_bytes", 0)) * scale * 8 / (link_mbps * 1e6)
        if ideal_s < SHORT_CALL_S:
            short[str(r.get("kind", ""))].append(
                max(0.0, float(r["t_end"]) - float(r["t_ack"]) - ideal_s))
    excess_ms = {k: 1e3 * statistics.median(v) for k, v in short.items()}
    # a kind without short calls pays the short calls' median: fixed costs do not grow with
    # the bytes (a slow link is the throughput check's to judge)
    pooled = [x for v in short.values() for x in v]
    default_ms = 1e3 * statistics.median(pooled) if pooled else 0.0
    per_rank_it: Counter[tuple[int, int]] = Counter()
    kinds: dict[tuple[int, int], Counter[str]] = defaultdict(Counter)
    for r in calls:
        key = (int(r.get("rank", -1)), int(r["it"]))
        per_rank_it[key] += 1
        kinds[key][str(r.get("kind", ""))] += 1
    worst_s, worst_calls = 0.0, 0
    for key, n in per_rank_it.items():
        cost_ms = n * (control_ms or 0.0) + sum(c * excess_ms.get(k, default_ms)
                                                for k, c in kinds[key].items())
        if cost_ms / 1e3 > worst_s:
            worst_s, worst_calls = cost_ms / 1e3, n
    return CallCostBound(control_ms, excess_ms, worst_calls, worst_s, iteration_s)


def overhead_effect_pts(run: Mapping[str, Any], baseline: Mapping[str, Any]) -> float | None:
    """The per-call costs' effect on a run's overhead (percentage points of the baseline's
    iteration): the difference of the two runs' bounds. None without both."""
    a, b = run.get("call_cost_bound"), baseline.get("call_cost_bound")
    base_it = baseline.get("iteration_time_s")
    if not a or not b or not base_it:
        return None
    return 100.0 * abs(float(a["per_iteration_s"]) - float(b["per_iteration_s"])) / base_it


def overhead_exceeded(pts: float | None) -> str | None:
    """Why the per-call costs' effect on the overhead passes its limit, or None."""
    if pts is None or pts <= OVERHEAD_LIMIT_PTS:
        return None
    return (f"the emulator's per-call costs differ between the run and its baseline by "
            f"{pts:.2f} points of the overhead (limit {OVERHEAD_LIMIT_PTS:g}); a larger time "
            "dilation shrinks them")
