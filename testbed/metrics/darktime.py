"""Did the emulated OCS keep the configured switching delay, and what did its misses cost?

The OCS app (:mod:`emulator.ocs_app`) logs, for every rail reconfiguration, a ``dark`` record
(rail, ports, ``t_s``, the ``delay_ms`` it waited) and a ``light`` record (rail,
``t_request_s``, ``t_dark_s``, ``t_light_s``) to ``ocs-events.jsonl``. The achieved dark period
of a switch is ``t_light_s - t_dark_s``: from the removal of the old circuits to the confirmed
light of the new ones. It is judged against the delay the *experiment* configured
(:class:`ExpectedDelay`: ``ocs.switching_delay``, per rail where the network sets one, widened
to ``base +- jitter_ms`` by a ``jitter`` fault), never against the app's own record, so a wrong
delay table in the app cannot pass. The error of a switch is how far its dark period falls
outside that range: positive when the light came late (an overrun), negative when it came
early. What every emulated run checks (:mod:`testbed.metrics.fidelity` turns it into reasons):

* **no early light**, on every switch: a dark period shorter than the configured delay by more
  than :func:`early_slack_ms` is the run's fault (the app sleeps until the delay has passed, so
  only the clock's resolution and slew can make it look shorter);
* **the app's record agrees with the configuration**: a ``dark`` record whose ``delay_ms`` lies
  outside the configured range is the run's fault (a doubled or shortened delay table);
* **no switch missing**: every switch the controller saw end (its ``reconfig_end`` records that
  change a circuit) has its ``light`` in the app's log, and no ``dark`` is left without its
  ``light``; through a Polatis front (whose counts may differ) a controller that reconfigured
  while the app logged no dark period at all is a missing log;
* **overruns, by their effect on the figures** (:class:`OverrunBound`): only the late part of
  switches inside the measured iterations counts; its length, per iteration, bounds what late
  light can have added to that iteration's time and to its exposed switching. The run is
  degraded when that bound passes :data:`ITERATION_LIMIT_PCT` of an iteration or
  :data:`OVERHEAD_LIMIT_PCT` of the exposed switching (``docs/validation.md``, "The fidelity
  verdict"). Switches of the start-up and the warm-up are reported on their own, not judged.

The errors' p50, p99 and maximum are report lines (:func:`dark_text`). Pure: the runner reads
the files (:func:`check_dark_periods` takes the parsed records).
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from controller.stats import percentiles

Record = Mapping[str, Any]
Interval = tuple[float, float]

#: Slack on early light: the app's dark period cannot be shorter than its delay but for the
#: float resolution of its wall-clock stamps (0.24 us at today's epoch) and the clock's slew
#: (NTP slews at most 500 ppm: :data:`EARLY_SLACK_SHARE` of the delay); 0.2 ms is far above
#: the first and covers the second up to a 400 ms delay on its own.
EARLY_SLACK_MS = 0.2
EARLY_SLACK_SHARE = 0.0005
#: A recorded delay within this much of the configured range agrees with it (float rounding).
RECORD_EPSILON_MS = 1e-6
#: Limits on the bound that late light puts on the figures (``docs/validation.md``): the share
#: of a measured iteration's time, and of the run's exposed switching per iteration.
ITERATION_LIMIT_PCT = 1.0
OVERHEAD_LIMIT_PCT = 5.0
#: The former per-switch tolerance (max(1 ms, 5 % of the delay)), now only a reference line
#: for ``opus-testbed bench fidelity``; the verdict is :class:`OverrunBound`'s.
DARK_TOLERANCE_MIN_MS = 1.0
DARK_TOLERANCE_SHARE = 0.05

#: How every dark-period overrun reason begins (the emulation tests recognise it by this).
OVERRUN_REASON = "dark periods overran"


def dark_tolerance_ms(delay_ms: float) -> float:
    """``bench fidelity``'s reference tolerance on a p99 error at ``delay_ms`` (not a verdict)."""
    return max(DARK_TOLERANCE_MIN_MS, DARK_TOLERANCE_SHARE * delay_ms)


def with_tolerances(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``bench fidelity``'s rows with each delay's reference tolerance and whether the app's
    p99 error is within it: a reference line only, since runs are judged by the bound late
    light puts on their figures (:class:`OverrunBound`), not by a per-switch tolerance."""
    for row in rows:
        row["tolerance_ms"] = dark_tolerance_ms(row["delay_ms"])
        row["app_within_tolerance"] = row["app_error_ms"]["p99"] <= row["tolerance_ms"]
    return rows


def early_slack_ms(delay_ms: float) -> float:
    """How much shorter than ``delay_ms`` a dark period may look before it is early light."""
    return EARLY_SLACK_MS + EARLY_SLACK_SHARE * delay_ms


@dataclass(frozen=True)
class ExpectedDelay:
    """The switching delay the experiment configured: ``base_ms`` on every rail unless
    ``per_rail_ms`` names the rail, and ``jitter_ms`` from the fault plan (each switch then
    draws ``base +- jitter_ms``, never below 0, as :class:`controller.drivers.faults.OcsFaults`
    does)."""

    base_ms: float
    per_rail_ms: Mapping[int, float] = field(default_factory=dict)
    jitter_ms: float = 0.0

    def base(self, rail: int) -> float:
        return float(self.per_rail_ms.get(rail, self.base_ms))

    def range_ms(self, rail: int) -> Interval:
        """The (shortest, longest) delay a switch of ``rail`` may be configured to take."""
        base = self.base(rail)
        return max(0.0, base - self.jitter_ms), base + self.jitter_ms

    def shortest_ms(self) -> float:
        """The shortest delay any switch may be configured to take (the early-light check's
        slack is smallest there)."""
        return max(0.0, min([self.base_ms, *self.per_rail_ms.values()]) - self.jitter_ms)

    def text(self) -> str:
        """``100 ms``, ``10 +- 5 ms``, ``100 ms (rail 1: 50 ms)``."""
        out = f"{self.base_ms:g}"
        if self.jitter_ms:
            out += f" +- {self.jitter_ms:g}"
        out += " ms"
        if self.per_rail_ms:
            out += " (" + ", ".join(f"rail {r}: {v:g} ms"
                                    for r, v in sorted(self.per_rail_ms.items())) + ")"
        return out

    def to_summary(self) -> dict[str, Any]:
        return {"base_ms": self.base_ms, "jitter_ms": self.jitter_ms,
                "per_rail_ms": {str(r): v for r, v in sorted(self.per_rail_ms.items())}}


def _expected(delay: float | ExpectedDelay) -> ExpectedDelay:
    return delay if isinstance(delay, ExpectedDelay) else ExpectedDelay(float(delay))


@dataclass(frozen=True)
class Switch:
    """One switch the app lit: when, how long it was dark, and what the configuration allows."""

    rail: int
    t_dark_s: float
    t_light_s: float
    low_ms: float  # the configured range of its delay
    high_ms: float
    recorded_delay_ms: float | None = None  # what the app's ``dark`` record says it waited

    @property
    def dark_ms(self) -> float:
        return (self.t_light_s - self.t_dark_s) * 1e3

    @property
    def error_ms(self) -> float:
        """How far the dark period falls outside the configured range (ms): > 0 late, < 0
        early, 0 inside it (without jitter: the dark period minus the delay)."""
        dark = self.dark_ms
        if dark > self.high_ms:
            return dark - self.high_ms
        return min(0.0, dark - self.low_ms)

    @property
    def early(self) -> bool:
        """Lit before the configured delay had passed (beyond the clock's slack)."""
        return self.dark_ms < self.low_ms - early_slack_ms(self.low_ms)

    @property
    def record_disagrees(self) -> bool:
        """The app's record names a delay outside the configured range."""
        rec = self.recorded_delay_ms
        return rec is not None and not (self.low_ms - RECORD_EPSILON_MS <= rec
                                         <= self.high_ms + RECORD_EPSILON_MS)

    @property
    def late_interval(self) -> Interval | None:
        """The part of the dark period past the longest configured delay, or None."""
        t_due = self.t_dark_s + self.high_ms / 1e3
        return (t_due, self.t_light_s) if self.t_light_s > t_due else None

    def overlaps(self, windows: Sequence[Interval]) -> bool:
        return any(self.t_dark_s < b and self.t_light_s > a for a, b in windows)


def switches(ocs_events: Sequence[Record], delay: float | ExpectedDelay) -> list[Switch]:
    """Every ``light`` record as a :class:`Switch`, in order, judged against ``delay``."""
    expected = _expected(delay)
    recorded = {(int(e["rail"]), float(e["t_s"])): float(e["delay_ms"]) for e in ocs_events
                if e.get("event") == "dark" and e.get("delay_ms") is not None}
    out = []
    for e in ocs_events:
        if e.get("event") != "light":
            continue
        rail, t_dark = int(e["rail"]), float(e["t_dark_s"])
        low, high = expected.range_ms(rail)
        out.append(Switch(rail, t_dark, float(e["t_light_s"]), low, high,
                          recorded.get((rail, t_dark))))
    return out


def dark_errors_ms(ocs_events: Sequence[Record], delay: float | ExpectedDelay) -> list[float]:
    """The error (ms) of every ``light`` record against the configured ``delay``, in order."""
    return [s.error_ms for s in switches(ocs_events, delay)]


def unfinished_switches(ocs_events: Sequence[Record]) -> int:
    """``dark`` records without their ``light`` (same rail, same ``t_dark_s``)."""
    lit = Counter((int(e["rail"]), float(e["t_dark_s"])) for e in ocs_events
                  if e.get("event") == "light")
    dark = Counter((int(e["rail"]), float(e["t_s"])) for e in ocs_events
                   if e.get("event") == "dark")
    return sum((dark - lit).values())


def controller_switches(controller_events: Sequence[Record]) -> int:
    """Switches the controller saw end: ``reconfig_end`` records that change a circuit (a
    request with nothing to change never reaches the switch). Decisions the controller applied
    together (:mod:`controller.batching`) end in one switch of their rail, which the app logs
    once: their records share the rail and ``t_dark_s`` and count once."""
    switched: set[object] = set()
    for k, e in enumerate(controller_events):
        if e.get("event") == "reconfig_end" and (e.get("added") or e.get("removed")):
            switched.add((e.get("rail"), e["t_dark_s"]) if "t_dark_s" in e else k)
    return len(switched)


@dataclass(frozen=True)
class ErrorStats:
    """Statistics of some switches' errors (ms); None where there is no switch."""

    count: int
    p50_ms: float | None = None
    p99_ms: float | None = None
    max_ms: float | None = None
    min_ms: float | None = None

    @classmethod
    def of(cls, errors_ms: Iterable[float]) -> ErrorStats:
        errors = [float(e) for e in errors_ms]
        if not errors:
            return cls(0)
        p50, p99 = percentiles(errors, (50, 99))
        return cls(len(errors), p50, p99, max(errors), min(errors))

    def to_summary(self) -> dict[str, Any]:
        return {"count": self.count, "p50": self.p50_ms, "p99": self.p99_ms,
                "max": self.max_ms, "min": self.min_ms}


def union_intervals(intervals: Iterable[Interval]) -> list[Interval]:
    """Sorted, disjoint intervals covering the same time as ``intervals``."""
    out: list[Interval] = []
    for a, b in sorted(i for i in intervals if i[1] > i[0]):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _intersect(xs: Sequence[Interval], ys: Sequence[Interval]) -> list[Interval]:
    """The time two sorted, disjoint interval lists have in common."""
    out, i, j = [], 0, 0
    while i < len(xs) and j < len(ys):
        a, b = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
        if b > a:
            out.append((a, b))
        if xs[i][1] < ys[j][1]:
            i += 1
        else:
            j += 1
    return out


def _overlaps_sorted(xs: Sequence[Interval], ends: Sequence[float], y: Interval) -> bool:
    """Whether ``y`` shares time with any of the sorted, disjoint ``xs`` (``ends``: their ends)."""
    k = bisect.bisect_right(ends, y[0])
    return k < len(xs) and xs[k][0] < y[1]


def _length(intervals: Iterable[Interval]) -> float:
    return sum(b - a for a, b in intervals)


@dataclass(frozen=True)
class OverrunBound:
    """What late light can have added to each measured iteration (s), beside that iteration's
    time and its exposed switching (the time some collective waited on light).

    The bound of an iteration is the length of the time, inside it, during which some switch
    was dark past its longest configured delay *and* some collective waited on light: late
    light stretches an iteration only where the work waits on it, and a stretch of wall time
    is counted once however many rails were late in it. It is at most the plain sum of the
    overruns, and at most the exposed switching.
    """

    per_iteration_s: tuple[float, ...] = ()
    iteration_times_s: tuple[float, ...] = ()
    exposed_per_iteration_s: tuple[float, ...] = ()
    late_switches: int = 0  # switches inside the measured iterations that lit late

    @property
    def max_s(self) -> float | None:
        return max(self.per_iteration_s) if self.per_iteration_s else None

    @property
    def mean_s(self) -> float | None:
        n = len(self.per_iteration_s)
        return sum(self.per_iteration_s) / n if n else None

    @property
    def iteration_pct(self) -> float | None:
        """The largest share (%) of a measured iteration's time the bound takes."""
        shares = [100.0 * b / t for b, t in zip(self.per_iteration_s, self.iteration_times_s,
                                                 strict=True) if t > 0]
        return max(shares) if shares else None

    @property
    def overhead_pct(self) -> float | None:
        """The share (%) of the exposed switching per iteration (the mean the summary prints
        as ``exposed_reconfig_s``) the bound takes; None when nothing waited on light."""
        exposed = sum(self.exposed_per_iteration_s)
        return 100.0 * sum(self.per_iteration_s) / exposed if exposed > 0 else None

    def exceeded(self) -> str | None:
        """Why the bound passes its limits, or None."""
        over = []
        it_pct, oh_pct = self.iteration_pct, self.overhead_pct
        if it_pct is not None and it_pct > ITERATION_LIMIT_PCT:
            over.append(f"{it_pct:.2f} % of an iteration (limit {ITERATION_LIMIT_PCT:g} %)")
        if oh_pct is not None and oh_pct > OVERHEAD_LIMIT_PCT:
            over.append(f"{oh_pct:.1f} % of the exposed switching (limit "
                        f"{OVERHEAD_LIMIT_PCT:g} %)")
        if not over:
            return None
        return (f"{OVERRUN_REASON} the configured delay inside the measured iterations: late "
                f"light may have added up to {1e3 * (self.max_s or 0.0):.1f} ms to an "
                f"iteration ({self.late_switches} late switches), " + " and ".join(over))

    def to_summary(self) -> dict[str, Any]:
        """``summary.json``'s ``dark_overrun_bound`` (``baseline_overhead_pct`` is added once
        a baseline is known: :func:`overhead_exceeded`)."""
        return {"per_iteration_s": list(self.per_iteration_s), "max_s": self.max_s,
                "mean_s": self.mean_s, "iteration_pct": self.iteration_pct,
                "overhead_pct": self.overhead_pct, "late_switches": self.late_switches,
                "iteration_limit_pct": ITERATION_LIMIT_PCT,
                "overhead_limit_pct": OVERHEAD_LIMIT_PCT}


def overhead_exceeded(bound: dict[str, Any], iteration_s: float, baseline_s: float
                      ) -> str | None:
    """With a baseline: record in ``bound`` (a ``dark_overrun_bound`` summary) the share (%) of
    the overhead itself (iteration minus baseline, s) that its mean takes, and say why it
    passes :data:`OVERHEAD_LIMIT_PCT`, or None. An overhead of 0 or less cannot absorb any late
    light: with late light in the measured iterations it passes the limit."""
    mean_s = bound.get("mean_s")
    if mean_s is None:
        return None
    overhead_s = iteration_s - baseline_s
    pct = 100.0 * mean_s / overhead_s if overhead_s > 0 else None
    bound["baseline_overhead_pct"] = pct
    if mean_s <= 0 or (pct is not None and pct <= OVERHEAD_LIMIT_PCT):
        return None
    share = ("more than the whole overhead against the baseline (none)" if pct is None else
             f"{pct:.1f} % of the overhead against the baseline")
    return (f"{OVERRUN_REASON} the configured delay inside the measured iterations: late light "
            f"may have added {1e3 * mean_s:.1f} ms to the mean iteration, {share} (limit "
            f"{OVERHEAD_LIMIT_PCT:g} %)")


def overrun_bound(sws: Sequence[Switch], windows: Sequence[Interval],
                  waiting: Iterable[Interval] | None = None) -> OverrunBound:
    """The :class:`OverrunBound` of ``sws`` over the measured iterations ``windows`` (start,
    end), given the intervals during which some collective waited on light (``waiting``; None:
    unknown, every late instant counts)."""
    late = union_intervals(i for s in sws if (i := s.late_interval) is not None)
    waits = union_intervals(waiting) if waiting is not None else None
    if waits is not None:
        late = _intersect(late, waits)
    bounds, exposed = [], []
    for a, b in windows:
        bounds.append(_length(_intersect(late, [(a, b)])))
        exposed.append(_length(_intersect(waits, [(a, b)])) if waits is not None else 0.0)
    # a switch counts as late when its late part lies inside a measured iteration while some
    # collective waited (the part the bound counts), not merely when it overlaps an iteration
    counted = _intersect(late, union_intervals(windows))
    ends = [b for _a, b in counted]
    late_switches = sum(1 for s in sws if (i := s.late_interval) is not None
                        and _overlaps_sorted(counted, ends, i))
    return OverrunBound(tuple(bounds), tuple(b - a for a, b in windows), tuple(exposed),
                        late_switches=late_switches)


@dataclass(frozen=True)
class DarkCheck:
    """The dark periods of one run against the configured delay, and the switch counts."""

    expected: ExpectedDelay
    switches: tuple[Switch, ...] = ()
    unfinished: int = 0
    controller_switches: int | None = None  # None: the controller's log was not read
    counts_compared: bool = True  # False through a Polatis front (it may split or merge)
    lit_after_log: int = 0  # switches the app lit after the controller's log ended
    log_found: bool = True  # whether the app's ocs-events.jsonl existed

    @property
    def delay_ms(self) -> float:
        return self.expected.base_ms

    @property
    def count(self) -> int:
        return len(self.switches)

    def stats(self, windows: Sequence[Interval] | None = None) -> ErrorStats:
        """Error statistics of every switch, or of those overlapping ``windows``."""
        return ErrorStats.of(s.error_ms for s in self.switches
                             if windows is None or s.overlaps(windows))

    def outside_stats(self, windows: Sequence[Interval]) -> ErrorStats:
        """Error statistics of the switches outside ``windows`` (start-up, warm-up)."""
        return ErrorStats.of(s.error_ms for s in self.switches if not s.overlaps(windows))

    @property
    def p50_ms(self) -> float | None:
        return self.stats().p50_ms

    @property
    def p99_ms(self) -> float | None:
        return self.stats().p99_ms

    @property
    def max_ms(self) -> float | None:
        return self.stats().max_ms

    def early(self) -> str | None:
        """Switches that lit before the configured delay had passed, or None."""
        early = [s for s in self.switches if s.early]
        if not early:
            return None
        worst = min(early, key=lambda s: s.error_ms)
        return (f"{len(early)} of {self.count} switches lit early: dark {worst.dark_ms:.2f} ms "
                f"against the configured {self.expected.text()} (rail {worst.rail}); light "
                "before the switching delay has passed is not an OCS")

    def disagreements(self) -> str | None:
        """Switches whose ``dark`` record names a delay the configuration does not, or None."""
        bad = [s for s in self.switches if s.record_disagrees]
        if not bad:
            return None
        first = bad[0]
        return (f"the OCS app waited a delay the experiment did not configure on {len(bad)} of "
                f"{self.count} switches: {first.recorded_delay_ms:g} ms on rail {first.rail} "
                f"against the configured {self.expected.text()}")

    def missing(self) -> str | None:
        """Switches the OCS app did not finish or did not log, or None."""
        texts = []
        if self.unfinished:
            texts.append(f"{self.unfinished} switches went dark and never lit")
        logged = self.count - self.lit_after_log
        where = "" if self.log_found else " (its ocs-events.jsonl is missing)"
        switched = self.controller_switches
        if switched is not None and self.counts_compared and switched != logged:
            texts.append(f"the controller saw {switched} switches end but the "
                         f"OCS app logged {logged}{where}")
        elif switched and not self.counts_compared and not self.count and not self.unfinished:
            texts.append(f"the controller reconfigured {switched} times through the "
                         f"hardware driver's front but the OCS app logged no dark period"
                         f"{where or ' (its log is empty)'}")
        return "; ".join(texts) or None

    def run_faults(self) -> list[str]:
        """Everything wrong with the switching whatever the machine's load: early light, a
        delay the configuration does not name, missing switches."""
        return [t for t in (self.early(), self.disagreements(), self.missing()) if t]

    def to_summary(self, windows: Sequence[Interval] | None = None) -> dict[str, Any]:
        """``summary.json``'s ``dark_error_ms``: every switch's error statistics (ms), then
        those of the switches inside the measured iterations (``windows``) and outside them."""
        out: dict[str, Any] = {
            **self.stats().to_summary(), "unfinished": self.unfinished,
            "early": sum(1 for s in self.switches if s.early),
            "record_disagrees": sum(1 for s in self.switches if s.record_disagrees),
            "expected": self.expected.to_summary(),
            "early_slack_ms": early_slack_ms(self.expected.shortest_ms())}
        if windows is not None:
            out["measured"] = self.stats(windows).to_summary()
            out["unmeasured"] = self.outside_stats(windows).to_summary()
        return out


def check_dark_periods(ocs_events: Sequence[Record], delay: float | ExpectedDelay,
                       controller_events: Sequence[Record] | None = None, *,
                       counts_compared: bool = True, log_found: bool = True) -> DarkCheck:
    """The :class:`DarkCheck` of a run (``controller_events`` None: counts not compared;
    ``counts_compared`` False: only a controller that switched against an empty log is)."""
    # a provisioning switch asked at the run's end can light after the controller's log closed:
    # the controller never saw it end, so it is left out of the comparison (its error counts)
    t_log_end_s = max((float(e["t_s"]) for e in controller_events or () if "t_s" in e),
                      default=None)
    lit_after = 0 if t_log_end_s is None else sum(
        1 for e in ocs_events if e.get("event") == "light" and float(e["t_s"]) > t_log_end_s)
    return DarkCheck(_expected(delay), tuple(switches(ocs_events, delay)),
                     unfinished=unfinished_switches(ocs_events),
                     controller_switches=(None if controller_events is None
                                          else controller_switches(controller_events)),
                     counts_compared=counts_compared, lit_after_log=lit_after,
                     log_found=log_found)


def _stat_text(stats: Mapping[str, Any]) -> str:
    return (f"error p50 {stats['p50']:+.2f} ms, p99 {stats['p99']:+.2f} ms, max "
            f"{stats['max']:+.2f} ms over {stats['count']} switches")


def dark_text(dark: Mapping[str, Any] | None,
              bound: Mapping[str, Any] | None = None) -> str:
    """The summary's line on dark periods (``summary["dark_error_ms"]`` and
    ``summary["dark_overrun_bound"]``): the errors as report lines, and the bound."""
    if not dark:
        return "not checked (no emulated OCS)"
    if not dark.get("count"):
        return "no switches"
    measured, unmeasured = dark.get("measured"), dark.get("unmeasured")
    if measured is None or unmeasured is None:
        text = _stat_text(dark)
    else:
        parts = [f"measured iterations: {_stat_text(measured)}" if measured["count"]
                 else "measured iterations: no switches"]
        if unmeasured["count"]:
            parts.append(f"start-up and warm-up (not judged): {_stat_text(unmeasured)}")
        text = "; ".join(parts)
    if dark.get("early"):
        text += f"; {dark['early']} lit early"
    if bound and bound.get("max_s") is not None:
        it_pct, oh_pct = bound.get("iteration_pct"), bound.get("overhead_pct")
        text += (f"; late light bounds an iteration's time by {1e3 * bound['max_s']:.1f} ms ("
                 + ("n/a" if it_pct is None else f"{it_pct:.2f} %")
                 + f" of it, limit {bound['iteration_limit_pct']:g} %; "
                 + ("nothing waited on light" if oh_pct is None
                    else f"{oh_pct:.1f} % of the exposed switching")
                 + f", limit {bound['overhead_limit_pct']:g} %)")
    return text
