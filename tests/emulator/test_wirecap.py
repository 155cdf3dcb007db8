"""The wire capture's pure parts (:mod:`emulator.wirecap`): the probe interval a run's
switching delay calls for, tcpdump's closing counters, and each probe target's counter."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from emulator.topo import RailSpec
from emulator.wirecap import (
    PROBE_BUDGET_FPS,
    PROBE_INTERVAL_MAX_MS,
    PROBE_INTERVAL_MS,
    captured_ports,
    parse_tcpdump_stats,
    probe_counters,
    probe_interval_ms,
    probe_targets,
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


@pytest.mark.parametrize("spec", [RailSpec(servers=2, gpus_per_server=2, ports_per_rank=2,
                                           spares_per_server=1),
                                  RailSpec(servers=2, gpus_per_server=2, mode="electrical",
                                           shadow_rails=2)])
def test_each_probe_target_has_its_own_ports_counter_in_order(spec: RailSpec) -> None:
    """The sender skips a target's probe by the counter at the same position: the bridge side
    of the very port the target sends into (ranks' and spares' ports: spares probe too)."""
    net = SimpleNamespace(spec=spec, prefix="otx", node=lambda h: SimpleNamespace(pid=100 + h))
    targets, counters = probe_targets(net), probe_counters(net)  # type: ignore[arg-type]
    sending = [p for p in captured_ports(net) if p.host < spec.num_hosts]  # type: ignore[arg-type]
    assert len(counters) == len(targets) == len(sending) > 0
    assert counters == [f"/sys/class/net/{p.intf}/statistics/rx_packets" for p in sending]
