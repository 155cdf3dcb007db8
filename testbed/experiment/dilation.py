"""Time dilation of an emulated run: model time stretched by ``k`` on the wall (pure).

A run at dilation ``k`` (DieCast, Gupta et al. NSDI'08; Etalon, Mukerjee et al. NSDI'20) runs
every modelled time ``k`` times longer on the wall clock: the compute waits, the transfers
(emulated link rates divided by ``k``, the bytes unchanged), the OCS switching delay, and every
modelled timeout, heartbeat and injected fault time. The emulator's own costs (OpenFlow round
trips, ovs-vswitchd, Python, wake-ups, TCP connects) stay as they are, so their share of every
figure falls by ``k``. Every figure is reported in model time: wall time / ``k``
(:func:`to_model_time` rewrites the run's records before the metrics see them).

``run.time_dilation: auto`` (the default) takes the smallest ``k`` whose *predicted* bounds
(:func:`predict_bounds`) stay within half their limits, from the plan's switches and calls per
model second and this machine's recorded costs (:data:`RECORDED_COSTS`); the verdict still
judges the run it made. What does not dilate is in ``docs/validation.md`` ("Time dilation").
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from testbed.metrics import callcost
from testbed.metrics.darktime import ITERATION_LIMIT_PCT, OVERHEAD_LIMIT_PCT, Switch
from testbed.metrics.wire import WireVerdict

AUTO = "auto"
#: Largest factor a file may ask for; the links' floor (:data:`MIN_WALL_LINK_MBPS`) refuses any
#: factor past ``link_mbps / 0.1`` first (20 at the smallest calibrated rate, 2 Mbit/s), and
#: ``auto`` stops at :data:`AUTO_FACTORS`' last.
MAX_TIME_DILATION = 64.0
#: The lowest wall-clock link rate the shaping accepts (Mbit/s). HTB takes lower rates, but one
#: 1514-byte frame at 0.1 Mbit/s already takes 121 ms on the wire, within reach of TCP's 200 ms
#: minimum retransmission timeout, which does not dilate: below it a lost or delayed ACK would
#: stall a transfer for a time the model does not have.
MIN_WALL_LINK_MBPS = 0.1

#: This machine's costs behind ``auto``'s predictions, recorded (never measured at run start).
#: ``switch_call_ms``: what a call that waits for a switch costs the emulator beyond the control
#: round trip every call makes, the baseline's too (the controller's decision and its request
#: to the OCS driver: a guess of 0.2 ms, not yet measured apart; it moves the overhead).
#: ``late_base_ms`` and ``late_per_circuit_ms``: how late the OCS app confirms a switch's light
#: beyond its delay, a fixed part plus a part per circuit switched, fitted to the p50 lateness
#: of tiny.yaml's 2-circuit switches (0.20 ms, 2026-12-07, load 4) and emulator-32's 8-circuit
#: ones (0.61-0.68 ms, docs/performance.md, "Light confirmation"); emulator-32's late-light
#: bound at k = 1 then comes out near the 1.14-1.46 % measured there, tiny.yaml's above its
#: 0.97 % (on the safe side). Since the OCS app times the delay from the removal's barrier
#: reply (issue 37's dark edge), every switch also carries that confirmation lag: the wire's
#: median error on tiny.yaml moved by +0.26 ms (docs/wire.md), so the fixed part is
#: 0.05 + 0.25. ``call_ms`` and ``step_ms``: one call's fixed cost (control round trip,
#: connect, finish) and one step's with receptions, as the run's own per-call bound
#: measured them on tiny.yaml at
#: k = 1 (0.82 ms control, 0.06-2.09 ms transport per call by kind: 16.6 ms on 8 calls an
#: iteration; validation.md, "The testbed's own costs"), a little below the simulator's
#: ``EMULATOR_COSTS`` (control 0.4 + 0.7 ms jitter one way, connect 1 ms, finish 1 ms, step
#: 1 ms: testbed/simulator/network.py), which were fitted on 4-rank crossval runs.
RECORDED_COSTS: dict[str, float] = {"late_base_ms": 0.30, "late_per_circuit_ms": 0.075,
                                    "call_ms": 1.5, "step_ms": 0.5, "switch_call_ms": 0.2}

#: Limits of the testbed's own costs on a run's figures (docs/validation.md, "The testbed's own
#: costs"): late light (the existing verdict: 1 % of an iteration), and the per-call costs the
#: emulator adds, on the iteration time and on the overhead (percentage points).
LATE_LIGHT_LIMIT_PCT = ITERATION_LIMIT_PCT
LATE_LIGHT_EXPOSED_LIMIT_PCT = OVERHEAD_LIMIT_PCT
CALL_COST_ITERATION_LIMIT_PCT = callcost.ITERATION_LIMIT_PCT
CALL_COST_OVERHEAD_LIMIT_PTS = callcost.OVERHEAD_LIMIT_PTS


class DilationError(ValueError):
    """A time dilation this run cannot have; the message names the reason."""


def parse_time_dilation(value: Any) -> float | str:
    """``auto`` or a factor >= 1 (int or float); raises :class:`DilationError`."""
    if isinstance(value, str):
        text = value.strip().lower()
        if text == AUTO:
            return AUTO
        try:
            value = float(text)
        except ValueError as exc:
            raise DilationError(f"must be 'auto' or a number >= 1, got {value!r}") from exc
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(
            value):
        raise DilationError(f"must be 'auto' or a number >= 1, got {value!r}")
    if not 1 <= value <= MAX_TIME_DILATION:
        raise DilationError(f"must be in [1, {MAX_TIME_DILATION:g}], got {value:g}")
    return float(value)


@dataclass(frozen=True)
class PlanLoad:
    """What a plan asks of the emulator per iteration, in model time: the modelled iteration
    and the switching it is expected to wait for, the switches on the busiest rail and their
    circuits, the busiest rank's calls and steps with receptions, and the ranks sharing the
    machine's cores (their per-call work queues for a core)."""

    iteration_s: float
    switches: float
    circuits_per_switch: float
    calls: int
    steps: int
    exposed_s: float = 0.0
    contention: float = 1.0
    #: the overhead a run is predicted to carry against its baseline (model time, s) and the
    #: switches per iteration on every rail together: the fabric simulation's, where the
    #: caller could simulate it (:func:`testbed.studies.predict.fabric_overhead`); None: not
    #: predicted
    overhead: OverheadPrediction | None = None


@dataclass(frozen=True)
class OverheadPrediction:
    """The fabric's prediction of a run's overhead against its baseline (model time, s) and
    of its switches per iteration, over every rail, whose light some call waited for: the
    verdict's late light against the overhead is the union of every rail's late intervals
    while a call waited, which their sum bounds."""

    overhead_s: float
    switches: float


#: Ranks per core below which a call's CPU work does not wait for a core (the demo's 16 ranks
#: on 2 cores kept their per-call costs at tiny.yaml's 4-rank figures: validation.md).
UNCONTENDED_RANKS_PER_CORE = 8


def plan_load(programs: Mapping[int, Sequence[Any]], modeled_iteration_s: float,
              delay_ms: float, *, gpus_per_server: int, ports_per_rail: int,
              cores: int = 2, ports_per_rank: int = 1) -> PlanLoad:
    """:class:`PlanLoad` of a replay plan's ``programs`` (rank -> PlanOps; rank r on rail
    r mod ``gpus_per_server``). A rank's port is expected to move at every call whose lane
    differs from its previous call's, and a switch to move two ranks' ports: the busiest
    rail's switches are half its ranks' lane changes, times K (a prediction, not a count:
    tiny.yaml predicts 12 and makes 11-12; emulator-32 36 and makes 40-46)."""
    changes: dict[int, int] = {}
    calls = steps = 0
    for rank, ops in programs.items():
        rank_calls = [op for op in ops if op.is_call]
        rail = rank % max(1, gpus_per_server)
        changes[rail] = changes.get(rail, 0) + sum(
            1 for a, b in itertools.pairwise(rank_calls) if a.lane != b.lane)
        if len(rank_calls) > calls:
            calls = len(rank_calls)
            steps = sum(sum(1 for s in op.steps if s.recvs) for op in rank_calls)
    # with K ports a rank's groups take turns on each: fitted, emulator-32 (K = 2) makes 40-46
    switches = max(changes.values(), default=0) / 2 * max(1, ports_per_rank)
    # provisioning hides some of it, not all (tiny.yaml: 0.125 s of its 0.12 s predicted)
    exposed = switches * delay_ms / 1e3
    contention = max(1.0, len(programs) / (UNCONTENDED_RANKS_PER_CORE * max(1, cores)))
    return PlanLoad(modeled_iteration_s, switches, max(1.0, ports_per_rail / 2), calls, steps,
                    exposed, contention)


@dataclass(frozen=True)
class Bounds:
    """Predicted bounds of the testbed's own costs at one factor, in % of a model-time
    iteration (late light, per-call costs) and overhead points (per-call costs)."""

    k: float
    late_light_pct: float
    call_cost_pct: float
    call_cost_overhead_pts: float
    late_light_exposed_pct: float = 0.0  # of the switching an iteration waits for
    late_light_overhead_pct: float = 0.0  # of the predicted overhead (0: not predicted)

    def within(self, share: float = 0.5) -> bool:
        """Whether every bound is within ``share`` of its limit."""
        return (self.late_light_pct <= share * LATE_LIGHT_LIMIT_PCT
                and self.late_light_exposed_pct <= share * LATE_LIGHT_EXPOSED_LIMIT_PCT
                and self.late_light_overhead_pct <= share * LATE_LIGHT_EXPOSED_LIMIT_PCT
                and self.call_cost_pct <= share * CALL_COST_ITERATION_LIMIT_PCT
                and self.call_cost_overhead_pts <= share * CALL_COST_OVERHEAD_LIMIT_PTS)

    def to_json(self) -> dict[str, float]:
        return {"k": self.k, "late_light_pct": round(self.late_light_pct, 3),
                "late_light_exposed_pct": round(self.late_light_exposed_pct, 3),
                "late_light_overhead_pct": round(self.late_light_overhead_pct, 3),
                "call_cost_pct": round(self.call_cost_pct, 3),
                "call_cost_overhead_pts": round(self.call_cost_overhead_pts, 3)}


def predict_bounds(load: PlanLoad, k: float, costs: Mapping[str, float] = RECORDED_COSTS
                   ) -> Bounds:
    """The bounds the testbed's own costs are predicted to put on a run of ``load`` at ``k``:
    each cost is fixed on the wall, so in model time it is divided by ``k``. The per-call
    costs move the overhead by what the run's switching-bound calls add beyond the baseline's
    (the calls are the same; the control round trips that wait on light are not): taken as
    the control-round-trip share of the per-call cost on the calls that switch. Late light's
    share of the overhead is predicted where the overhead is (``load.overhead_s``): the
    verdict bounds it at 5 % of the overhead against the baseline, which provisioning can make
    far smaller than the switching it overlaps; it counts every rail's switches (the
    verdict's bound is the union of their late intervals)."""
    iteration_ms = 1e3 * (load.iteration_s + load.exposed_s)
    if iteration_ms <= 0:
        return Bounds(k, 0.0, 0.0, 0.0)
    late_ms = load.switches * (costs["late_base_ms"]
                               + costs["late_per_circuit_ms"] * load.circuits_per_switch)
    call_ms = load.contention * (load.calls * costs["call_ms"] + load.steps * costs["step_ms"])
    base_ms = 1e3 * load.iteration_s
    # what the calls that switch cost beyond the baseline's calls (whose round trips they share)
    overhead_ms = load.contention * load.switches * costs["switch_call_ms"]
    exposed_ms = 1e3 * load.exposed_s
    of_overhead_pct = 0.0
    if load.overhead is not None and load.overhead.overhead_s > 0:
        late_all_ms = load.overhead.switches * (
            costs["late_base_ms"] + costs["late_per_circuit_ms"] * load.circuits_per_switch)
        of_overhead_pct = 100 * late_all_ms / k / (1e3 * load.overhead.overhead_s)
    return Bounds(k, 100 * late_ms / k / iteration_ms, 100 * call_ms / k / iteration_ms,
                  100 * overhead_ms / k / base_ms if base_ms > 0 else 0.0,
                  100 * late_ms / k / exposed_ms if exposed_ms > 0 else 0.0,
                  of_overhead_pct)


@dataclass(frozen=True)
class Choice:
    """The factor a run uses, how it was chosen, and the predictions behind it."""

    k: float
    how: str  # "auto" | "file" (the experiment or the command line)
    predicted: tuple[Bounds, ...] = ()
    capped: bool = False  # auto found no factor within half the limits up to its cap

    def text(self) -> str:
        """One line for the run's log: the factor and the figures behind it."""
        if self.how != AUTO:
            chosen = next((b for b in self.predicted if b.k == self.k), None)
            tail = "" if chosen is None else f" (predicted: {_bounds_text(chosen)})"
            return f"time dilation {self.k:g} (as configured){tail}"
        tried = "; ".join(f"k={b.k:g}: {_bounds_text(b)}" for b in self.predicted)
        cap = (f"; no factor up to {self.k:g} keeps them within half their limits: the run "
               "goes at the cap and the verdict judges it") if self.capped else ""
        return (f"time dilation {self.k:g} (auto: the smallest factor whose predicted bounds "
                f"stay within half their limits, {LATE_LIGHT_LIMIT_PCT:g} % late light "
                f"({LATE_LIGHT_EXPOSED_LIMIT_PCT:g} % of the exposed switching and of the "
                "overhead), "
                f"{CALL_COST_ITERATION_LIMIT_PCT:g} % per-call costs, "
                f"{CALL_COST_OVERHEAD_LIMIT_PTS:g} overhead points; {tried}{cap})")

    def to_json(self) -> dict[str, Any]:
        return {"k": self.k, "how": self.how, "capped": self.capped,
                "predicted": [b.to_json() for b in self.predicted]}


def _bounds_text(b: Bounds) -> str:
    of_overhead = (f", of the predicted overhead {b.late_light_overhead_pct:.1f} %"
                   if b.late_light_overhead_pct else "")
    return (f"late light {b.late_light_pct:.2f} % (of the exposed switching "
            f"{b.late_light_exposed_pct:.1f} %{of_overhead}), per-call costs "
            f"{b.call_cost_pct:.1f} % of the iteration and {b.call_cost_overhead_pts:.2f} "
            "overhead points")


#: The factors ``auto`` tries, in order.
AUTO_FACTORS = (1.0, 2.0, 4.0, 8.0, 16.0)


def choose(setting: float | str, load: PlanLoad, costs: Mapping[str, float] = RECORDED_COSTS,
           max_k: float = AUTO_FACTORS[-1], min_k: float = 1.0) -> Choice:
    """The factor of a run: ``setting`` when it is a number, else the smallest of
    :data:`AUTO_FACTORS` from ``min_k`` (what the machine's cores need) up to ``max_k`` whose
    predicted bounds stay within half their limits (the cap when none does)."""
    if setting != AUTO:
        k = float(setting)
        return Choice(k, "file", (predict_bounds(load, k, costs),))
    tried: list[Bounds] = []
    factors = [f for f in AUTO_FACTORS if min_k <= f <= max_k] or [max(1.0, min(min_k, max_k))]
    for k in factors:
        tried.append(predict_bounds(load, k, costs))
        if tried[-1].within(0.5):
            return Choice(k, AUTO, tuple(tried))
    return Choice(tried[-1].k, AUTO, tuple(tried), capped=True)


def max_factor_for_link(link_mbps: float) -> float:
    """The largest factor whose wall link rate (``link_mbps / k``) stays shapeable."""
    return max(1.0, link_mbps / MIN_WALL_LINK_MBPS)


def wall_link_mbps(link_mbps: float, k: float) -> float:
    """The emulated (wall-clock) link rate of a model-time rate at ``k``; refuses rates below
    :data:`MIN_WALL_LINK_MBPS`."""
    wall = link_mbps / k
    if wall < MIN_WALL_LINK_MBPS:
        raise DilationError(
            f"time dilation {k:g} runs the {link_mbps:g} Mbit/s links at {wall:.3g} Mbit/s, "
            f"below the {MIN_WALL_LINK_MBPS:g} Mbit/s the emulator shapes (one frame would "
            "take longer on the wire than TCP's minimum retransmission timeout, which does not "
            f"dilate); use a factor <= {max_factor_for_link(link_mbps):g} or faster links "
            "(network.link_mbps)")
    return wall


def wall_settings(cfg: Any, k: float) -> Any:
    """``cfg`` (a RunSettings) as the emulator runs it at ``k``: the switching delay, the
    acknowledgement timeouts (the shim's patience and the rail-state one), the failover
    timings and the injected faults' times ``k`` times longer. The link rate and the compute
    are dilated where they are applied (the network's spec, the replayer)."""
    if k == 1:
        return cfg
    from controller.ocs import resolve_switching_delay_ms

    changes: dict[str, Any] = {"ack_timeout_s": cfg.ack_timeout_s * k}
    if getattr(cfg, "rail_state_ack_timeout_s", None) is not None:
        changes["rail_state_ack_timeout_s"] = cfg.rail_state_ack_timeout_s * k
    if cfg.mode != "baseline":
        changes["switching_delay"] = resolve_switching_delay_ms(cfg.switching_delay) * k
    failover = getattr(cfg, "failover", None)
    if failover is not None:
        changes["failover"] = dataclasses.replace(
            failover, **{f.name: getattr(failover, f.name) * k
                         for f in dataclasses.fields(failover) if f.name.endswith("_s")
                         and isinstance(getattr(failover, f.name), int | float)})
    faults = getattr(cfg, "faults", None)
    if faults:
        changes["faults"] = tuple(dataclasses.replace(
            f, at_s=None if f.at_s is None else f.at_s * k, jitter_ms=f.jitter_ms * k)
            for f in faults)
    return dataclasses.replace(cfg, **changes)


def dilated_costs(costs: Mapping[str, float], k: float) -> dict[str, float]:
    """A simulator cost table (``testbed.simulator.network``'s ``EMULATOR_COSTS``: seconds,
    and a goodput ratio) as the emulator's costs look in model time at ``k``: every time
    divided by ``k``. What ``bench crossval`` sets a dilated emulated run against."""
    return {key: (value / k if key.endswith("_s") else value) for key, value in costs.items()}


def _is_time_key(key: str) -> bool:
    """Whether a record's field holds a time: ``t``, ``t_*``, ``*_s``, ``*_ms`` (not a rate)."""
    if key.endswith("_per_s"):
        return False
    return key == "t" or key.startswith("t_") or key.endswith(("_s", "_ms"))


def to_model_time(records: Iterable[Mapping[str, Any]], k: float) -> list[dict[str, Any]]:
    """The records with every time field (timestamps and durations alike) divided by ``k``:
    a timestamp ``t`` becomes ``t / k``, so differences, and durations, are divided by ``k``
    and every stream converted so still compares with the others."""
    if k == 1:
        return [dict(r) for r in records]
    out = []
    for rec in records:
        out.append({key: (value / k if _is_time_key(key) and isinstance(value, int | float)
                          and not isinstance(value, bool) else value)
                    for key, value in rec.items()})
    return out


def scaled_switch(sw: Switch, factor: float) -> Switch:
    """``sw`` with its times and delays multiplied by ``factor`` (k: model to wall time)."""
    rec = sw.recorded_delay_ms
    return Switch(sw.rail, sw.t_dark_s * factor, sw.t_light_s * factor, sw.low_ms * factor,
                  sw.high_ms * factor, None if rec is None else rec * factor)


@dataclass(frozen=True)
class ModelTimeWire(WireVerdict):
    """A dilated run's wire check: judged on the wall clock (the capture's stamps, the
    controller's events as logged, the delay ``k`` times longer), its switches handed to the
    late-light bound in model time. Its summary's milliseconds are the wall clock's."""

    time_dilation: float = 1.0

    def bound_switches(self, app: Sequence[Switch]) -> list[Switch]:
        k = self.time_dilation
        wall = super().bound_switches([scaled_switch(s, k) for s in app])
        return [scaled_switch(s, 1 / k) for s in wall]

    def to_summary(self) -> dict[str, Any]:
        return {**super().to_summary(), "time_dilation": self.time_dilation,
                "clock": "wall (its ms are wall-clock ms)"}
