"""Did the emulated OCS keep its switching delay? Dark periods of a run against the injection.

The OCS app (:mod:`emulator.ocs_app`) logs, for every rail reconfiguration, a ``dark`` record
(rail, ports, ``t_s``) and a ``light`` record (rail, ``t_request_s``, ``t_dark_s``,
``t_light_s``) to ``ocs-events.jsonl``. The achieved dark period of a switch is
``t_light_s - t_dark_s``: from the removal of the old circuits to the confirmed light of the new
ones; its error is that minus the delay injected on the rail. Every emulated run checks them:

* the errors' p99 must stay within ``max(1 ms, 5 % of the delay)``
  (:func:`dark_tolerance_ms`), or the OCS stretched the switching the run measures;
* every switch the controller saw end (its ``reconfig_end`` records that change a circuit)
  must have its ``light`` in the app's log, and no ``dark`` may be left without its ``light``.

A run with no switches (the electrical baseline) has nothing to check. Pure: the runner reads
the files (:func:`check_dark_periods` takes the parsed records).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

Record = Mapping[str, Any]

#: The tolerance on the dark-period error's p99: this many ms, or this share of the delay.
DARK_TOLERANCE_MIN_MS = 1.0
DARK_TOLERANCE_SHARE = 0.05


#: How every dark-period overrun reason begins (the emulation tests recognise it by this).
OVERRUN_REASON = "dark periods overran"


def dark_tolerance_ms(delay_ms: float) -> float:
    """The largest p99 dark-period error a run at ``delay_ms`` may show."""
    return max(DARK_TOLERANCE_MIN_MS, DARK_TOLERANCE_SHARE * delay_ms)


def dark_errors_ms(ocs_events: Sequence[Record], delay_ms: float) -> list[float]:
    """Achieved dark period minus the injected delay (ms) of every ``light`` record, in order.
    The injected delay is the one its ``dark`` record names when it does (a jittery switch,
    fault injection: each switch draws its own), else ``delay_ms``."""
    injected = {(int(e["rail"]), float(e["t_s"])): float(e["delay_ms"]) for e in ocs_events
                if e.get("event") == "dark" and e.get("delay_ms") is not None}
    return [(float(e["t_light_s"]) - float(e["t_dark_s"])) * 1e3
            - injected.get((int(e["rail"]), float(e["t_dark_s"])), delay_ms)
            for e in ocs_events if e.get("event") == "light"]


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
class DarkCheck:
    """The dark periods of one run: error statistics (ms) and the switch counts."""

    delay_ms: float
    count: int
    p50_ms: float | None
    p99_ms: float | None
    max_ms: float | None
    unfinished: int = 0
    controller_switches: int | None = None  # None: not comparable (e.g. a Polatis front)
    lit_after_log: int = 0  # switches the app lit after the controller's log ended

    @property
    def tolerance_ms(self) -> float:
        return dark_tolerance_ms(self.delay_ms)

    def overrun(self) -> str | None:
        """Why the dark periods stretched beyond the tolerance, or None."""
        if self.p99_ms is None or self.p99_ms <= self.tolerance_ms:
            return None
        return (f"{OVERRUN_REASON} the {self.delay_ms:g} ms switching delay: error p99 "
                f"{self.p99_ms:.2f} ms (max {self.max_ms:.2f} ms) over {self.count} switches, "
                f"tolerance {self.tolerance_ms:.2f} ms")

    def missing(self) -> str | None:
        """Switches the OCS app did not finish or did not log, or None."""
        texts = []
        if self.unfinished:
            texts.append(f"{self.unfinished} switches went dark and never lit")
        logged = self.count - self.lit_after_log
        if self.controller_switches is not None and self.controller_switches != logged:
            texts.append(f"the controller saw {self.controller_switches} switches end but the "
                         f"OCS app logged {logged}")
        return "; ".join(texts) or None

    def to_summary(self) -> dict[str, Any]:
        """``summary.json``'s ``dark_error_ms``."""
        return {"count": self.count, "p50": self.p50_ms, "p99": self.p99_ms,
                "max": self.max_ms, "tolerance": self.tolerance_ms,
                "unfinished": self.unfinished}


def check_dark_periods(ocs_events: Sequence[Record], delay_ms: float,
                       controller_events: Sequence[Record] | None = None) -> DarkCheck:
    """The :class:`DarkCheck` of a run (``controller_events`` None: counts not compared)."""
    errors = np.asarray(dark_errors_ms(ocs_events, delay_ms), dtype=float)
    p50 = p99 = worst = None
    if errors.size:
        p50, p99 = (float(v) for v in np.percentile(errors, [50, 99]))
        worst = float(errors.max())
    # a provisioning switch asked at the run's end can light after the controller's log closed:
    # the controller never saw it end, so it is left out of the comparison (its error counts)
    t_log_end_s = max((float(e["t_s"]) for e in controller_events or () if "t_s" in e),
                      default=None)
    lit_after = 0 if t_log_end_s is None else sum(
        1 for e in ocs_events if e.get("event") == "light" and float(e["t_s"]) > t_log_end_s)
    return DarkCheck(delay_ms, int(errors.size), p50, p99, worst,
                     unfinished=unfinished_switches(ocs_events),
                     controller_switches=(None if controller_events is None
                                          else controller_switches(controller_events)),
                     lit_after_log=lit_after)


def dark_text(dark: Mapping[str, Any] | None) -> str:
    """The summary's one line on dark periods (``summary["dark_error_ms"]``)."""
    if not dark:
        return "not checked (no emulated OCS)"
    if not dark.get("count"):
        return "no switches"
    return (f"error p50 {dark['p50']:+.2f} ms, p99 {dark['p99']:+.2f} ms, max "
            f"{dark['max']:+.2f} ms over {dark['count']} switches (tolerance "
            f"{dark['tolerance']:.2f} ms)")
