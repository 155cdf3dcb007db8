"""The wire capture's pure parts (:mod:`emulator.wirecap`): the probe interval a run's
switching delay calls for, and tcpdump's closing counters."""

from __future__ import annotations

import pytest

from emulator.wirecap import (
    PROBE_BUDGET_FPS,
    PROBE_INTERVAL_MAX_MS,
    PROBE_INTERVAL_MS,
    parse_tcpdump_stats,
    probe_interval_ms,
)


@pytest.mark.parametrize("delay_ms, interval_ms", [(1, PROBE_INTERVAL_MS), (10, PROBE_INTERVAL_MS),
                                                    (25, PROBE_INTERVAL_MS), (50, 1.0),
                                                    (100, PROBE_INTERVAL_MAX_MS),
                                                    (1000, PROBE_INTERVAL_MAX_MS)])
def test_probe_interval_is_a_share_of_the_delay_within_its_bounds(delay_ms: float,
                                                                   interval_ms: float) -> None:
    # short delays keep the 0.5 ms resolution the wire's figures were validated at; a 100 ms
    # delay probes four times less often (the probes' forwarding is most of the check's cost)
    assert probe_interval_ms(delay_ms) == pytest.approx(interval_ms)


@pytest.mark.parametrize("delay_ms, ports, interval_ms", [
    (10, 4, PROBE_INTERVAL_MS),  # tiny.yaml: 4 ports keep 0.5 ms
    (100, 16, PROBE_INTERVAL_MAX_MS),  # the demo's rows
    (10, 16, 2.0),  # the demo at 10 ms: 16 ports every 0.5 ms saturated the machine
    (100, 32, 4.0),  # degree-aware K=2: 32 ports every 2 ms cost the row its ok
    (100, 128, 16.0)])
def test_more_ports_probe_less_often_within_the_frame_budget(delay_ms: float, ports: int,
                                                             interval_ms: float) -> None:
    got = probe_interval_ms(delay_ms, ports)
    assert got == pytest.approx(interval_ms)
    assert ports * 1e3 / got <= PROBE_BUDGET_FPS + 1e-9


def test_tcpdump_counters_are_read_from_its_closing_lines() -> None:
    err = ("tcpdump: listening on x, link-type EN10MB\n12 packets captured\n"
           "13 packets received by filter\n1 packet dropped by kernel\n")
    assert parse_tcpdump_stats(err) == {"captured": 12, "received by filter": 13,
                                        "dropped by kernel": 1}
