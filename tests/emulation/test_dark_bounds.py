"""The tests' own switching checks (:mod:`dark_bounds`) catch what they are there to catch:
a doubled delay at every delay the emulation tests use, a short delay, early light, a switch
never lit, a delay table that disagrees with the configuration. Pure: no network is built."""

from __future__ import annotations

import pytest
from dark_bounds import dark_bound_ms, overrun_allowance_ms, switching_problems

#: every switching delay an emulation test runs at (ms); 15 ms is 3D-MEMS's
DELAYS_MS = (10.0, 15.0, 20.0, 25.0, 50.0, 100.0)


def _log(dark_ms: list[float], applied_ms: float) -> list[dict[str, object]]:
    """An OCS app log of switches with these dark periods, each applying ``applied_ms``."""
    records: list[dict[str, object]] = []
    for k, d in enumerate(dark_ms):
        t = 10.0 + k
        records.append({"event": "dark", "rail": 0, "t_s": t, "delay_ms": applied_ms})
        records.append({"event": "light", "rail": 0, "t_request_s": t, "t_dark_s": t,
                        "t_light_s": t + d / 1e3})
    return records


# overruns as measured under two busy loops (dark_bounds' docstring): mostly ~1 ms, a tail
MEASURED_OVERRUNS_MS = [0.7, 0.8, 0.9, 1.0, 1.0, 1.1, 1.2, 1.3, 1.5, 2.0, 4.0, 12.0, 34.0]


@pytest.mark.parametrize("delay_ms", DELAYS_MS)
def test_a_right_switching_passes_under_load(delay_ms: float) -> None:
    log = _log([delay_ms + o for o in MEASURED_OVERRUNS_MS], delay_ms)
    assert switching_problems(log, delay_ms) == []


@pytest.mark.parametrize("delay_ms", DELAYS_MS)
def test_a_doubled_delay_fails_at_every_delay_the_tests_use(delay_ms: float) -> None:
    # the app sleeps twice but records the configured delay (its table is right)
    log = _log([2 * delay_ms + o for o in MEASURED_OVERRUNS_MS], delay_ms)
    assert any("median overrun" in p for p in switching_problems(log, delay_ms))
    # the app's table says twice the delay, and it sleeps that
    log = _log([2 * delay_ms + o for o in MEASURED_OVERRUNS_MS], 2 * delay_ms)
    assert any("applied a" in p for p in switching_problems(log, delay_ms))
    assert 2 * delay_ms > dark_bound_ms(delay_ms) > delay_ms  # one switch, doubled: fails
    for few in (1, 3):  # too few switches for a median: the smallest overrun tells
        log = _log([2 * delay_ms + o for o in MEASURED_OVERRUNS_MS[:few]], delay_ms)
        assert any("every one of" in p for p in switching_problems(log, delay_ms))


def test_few_switches_under_load_pass_at_the_algorithm_tests_delay() -> None:
    """One switch late by as much as the worst seen under two busy loops (50 ms over a 10 ms
    delay; 9.3 ms at 5 ms beside other tests) passes at 50 ms, the algorithm tests' delay."""
    assert switching_problems(_log([50.0 + 34.0], 50.0), 50.0) == []
    assert switching_problems(_log([50.0 + 9.3, 50.0 + 1.0], 50.0), 50.0) == []


@pytest.mark.parametrize("delay_ms", DELAYS_MS)
def test_a_short_delay_and_early_light_fail(delay_ms: float) -> None:
    short = 0.8 * delay_ms
    log = _log([short + o for o in MEASURED_OVERRUNS_MS[:3]], short)  # table 20 % short
    problems = switching_problems(log, delay_ms)
    assert any("applied a" in p for p in problems)
    assert any("before its" in p for p in problems)
    log = _log([delay_ms - 0.5, delay_ms + 1.0], delay_ms)  # right table, lit early once
    assert [p for p in switching_problems(log, delay_ms) if "before its" in p]


def test_a_switch_never_lit_fails() -> None:
    log = _log([11.0], 10.0)
    log.append({"event": "dark", "rail": 0, "t_s": 99.0, "delay_ms": 10.0})
    assert switching_problems(log, 10.0) == ["1 switches went dark and never lit"]


def test_jitter_widens_the_range_of_delays_only_by_its_own_width() -> None:
    log = _log([6.5, 13.9], 0.0)
    log[0]["delay_ms"], log[2]["delay_ms"] = 6.0, 13.0
    assert switching_problems(log, 10.0, jitter_ms=4.0) == []
    log[2]["delay_ms"] = 15.0
    assert any("applied a 15" in p for p in switching_problems(log, 10.0, jitter_ms=4.0))


def test_the_allowance_stays_below_the_delay() -> None:
    assert all(overrun_allowance_ms(d) < d for d in DELAYS_MS)
    assert overrun_allowance_ms(100.0) == 20.0 and overrun_allowance_ms(10.0) == 9.0
