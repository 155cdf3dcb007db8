"""The simulated OCS driver: switching time, dark time, light, the one-to-one rule, jitter."""

from __future__ import annotations

import pytest

from controller.clock import VirtualClock
from controller.drivers.sim import SimOcsDriver
from controller.ocs import Reconfiguration, ReconfigurationRejected, light_at_s
from emulator.ocs_core import WaitDelay, switch_operations


def test_sim_driver_switching_model_and_dark_time() -> None:
    clock = VirtualClock()
    drv = SimOcsDriver({0: [1, 2, 3, 4]}, "piezo", clock=clock)
    (res,) = drv.apply_many([Reconfiguration.of(0, add=[(1, 2)])])
    assert res.dark_ms == pytest.approx(25.0) and clock.now() == pytest.approx(0.025)
    results = drv.begin([Reconfiguration.of(0, add=[(3, 4)], remove=[(1, 2)])])
    assert drv.port_states(0)[1].value == "dark"
    clock.advance_to(results[0].t_light_s)
    assert drv.port_states(0)[3].value == "lit" and drv.port_states(0)[1].value == "idle"
    assert drv.dark_s_by_port(0) == pytest.approx({1: 0.05, 2: 0.05, 3: 0.025, 4: 0.025})
    with pytest.raises(ReconfigurationRejected):
        drv.begin([Reconfiguration.of(0, add=[(3, 1)])])  # port 3 already has a peer
    a = SimOcsDriver({0: [1, 2]}, 10, clock=VirtualClock(), jitter_ms=2, seed=7)
    b = SimOcsDriver({0: [1, 2]}, 10, clock=VirtualClock(), jitter_ms=2, seed=7)
    da = [a.switching_delay_ms(0) for _ in range(5)]
    assert da == [b.switching_delay_ms(0) for _ in range(5)]
    assert all(8 <= d <= 12 for d in da) and len(set(da)) > 1


def test_simulated_and_emulated_ocs_count_the_delay_from_the_removal() -> None:
    """One rule for both OCS models: light = removal time + switching delay."""
    clock = VirtualClock()
    clock.advance_to(1.5)
    drv = SimOcsDriver({0: [1, 2, 3, 4]}, 25.0, clock=clock)
    (res,) = drv.begin([Reconfiguration.of(0, add=[(1, 2)])])
    assert res.t_dark_s == 1.5 and res.t_light_s == light_at_s(1.5, 25.0)
    waits = [op for op in switch_operations(Reconfiguration.of(0, add=[(3, 4)]), 25.0)
             if isinstance(op, WaitDelay)]
    assert [w.until_s(1.5) for w in waits] == [light_at_s(1.5, 25.0)] == [1.525]


def test_lit_peer_is_the_peer_once_both_ports_are_lit() -> None:
    clock = VirtualClock()
    drv = SimOcsDriver({0: [1, 2, 3, 4]}, 10, clock=clock)
    assert drv.lit_peer(0, 1) is None  # no circuit
    drv.begin([Reconfiguration.of(0, add=[(1, 2), (3, 4)])])
    assert drv.lit_peer(0, 1) is None and drv.lit_peer(0, 1, 0.009) is None  # switching
    assert drv.lit_peer(0, 1, 0.010) == 2 and drv.lit_peer(0, 2, 0.010) == 1
    clock.advance_to(0.010)
    drv.begin([Reconfiguration.of(0, remove=[(3, 4)])])
    assert drv.lit_peer(0, 1) == 2  # untouched: keeps its light
    assert drv.lit_peer(0, 3) is None and drv.lit_peer(0, 3, 1.0) is None  # removed
