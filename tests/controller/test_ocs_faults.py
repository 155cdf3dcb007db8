"""OCS faults under any driver: FAILED ports, refused reconfigurations, jittery switching."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from controller.clock import VirtualClock
from controller.drivers.faults import FaultInjectingDriver, OcsFaults
from controller.drivers.sim import SimOcsDriver
from controller.ocs import (
    ApplyResult,
    PortState,
    Reconfiguration,
    ReconfigurationRejected,
)


def test_a_failed_port_refuses_new_circuits_but_lets_its_old_one_go() -> None:
    faults = OcsFaults()
    faults.fail_port(0, 3)
    with pytest.raises(ReconfigurationRejected) as info:
        faults.check([Reconfiguration.of(0, add=[(1, 3)])])
    assert info.value.rail == 0 and list(info.value.ports) == [3]
    assert "port 3 is FAILED" in str(info.value)
    faults.check([Reconfiguration.of(0, add=[(1, 2)], remove=[(3, 4)])])  # removal is fine
    faults.check([Reconfiguration.of(1, add=[(3, 4)])])  # port 3 of another rail is fine
    assert faults.refused == 1


def test_refuse_refuses_the_next_requests_then_lets_them_through() -> None:
    faults = OcsFaults()
    faults.refuse(2)
    request = [Reconfiguration.of(0, add=[(1, 2)])]
    faults.check([Reconfiguration(0)])  # an empty request does not use up a refusal
    for _ in range(2):
        with pytest.raises(ReconfigurationRejected, match="injected fault"):
            faults.check(request)
    faults.check(request)
    assert faults.refused == 2


def test_jitter_draws_around_the_base_and_never_below_zero() -> None:
    faults, again = OcsFaults(seed=3), OcsFaults(seed=3)
    assert faults.delay_ms(10.0) == 10.0  # no jitter: the base
    faults.jitter_ms = again.jitter_ms = 4.0
    draws = [faults.delay_ms(10.0) for _ in range(200)]
    assert draws == [again.delay_ms(10.0) for _ in range(200)]  # seeded
    assert all(6.0 <= d <= 14.0 for d in draws) and min(draws) < 7 and max(draws) > 13
    assert all(faults.delay_ms(1.0) >= 0.0 for _ in range(50))


class RecordingDriver(SimOcsDriver):
    """A simulated OCS that notes every delay it is set to."""

    def __init__(self) -> None:
        super().__init__({0: [1, 2, 3, 4], 1: [1, 2]}, 10.0, clock=VirtualClock())
        self.delays: list[tuple[int, float]] = []

    def set_switching_delay_ms(self, rail: int, delay_ms: float) -> None:
        self.delays.append((rail, delay_ms))

    def apply_many(self, reconfs: Sequence[Reconfiguration]) -> list[ApplyResult]:
        return self.begin(reconfs)


def test_the_wrapper_refuses_without_touching_the_switch_and_jitters_each_request() -> None:
    inner = RecordingDriver()
    drv = FaultInjectingDriver(inner)
    drv.apply_many([Reconfiguration.of(0, add=[(1, 2)])])
    drv.faults.fail_port(0, 4)
    with pytest.raises(ReconfigurationRejected):
        drv.apply_many([Reconfiguration.of(0, add=[(3, 4)])])
    assert drv.circuits(0) == inner.circuits(0) and len(inner.circuits(0)) == 1
    assert drv.port_states(0)[4] is PortState.FAILED  # as a Polatis reports it
    assert inner.delays == []  # no jitter configured: the delay is never touched
    drv.faults.jitter_ms = 3.0
    drv.apply_many([Reconfiguration.of(0, add=[(3, 2)], remove=[(1, 2)]),
                    Reconfiguration.of(1, add=[(1, 2)])])
    assert [rail for rail, _ in inner.delays] == [0, 1]
    assert all(7.0 <= d <= 13.0 for _, d in inner.delays)


def test_the_simulated_ocs_checks_its_faults_first() -> None:
    faults = OcsFaults()
    drv = SimOcsDriver({0: [1, 2, 3, 4]}, 10.0, clock=VirtualClock(), faults=faults)
    faults.refuse(1)
    with pytest.raises(ReconfigurationRejected):
        drv.begin([Reconfiguration.of(0, add=[(1, 2)])])
    assert drv.circuits(0) == frozenset()
    drv.begin([Reconfiguration.of(0, add=[(1, 2)])])
    assert len(drv.circuits(0)) == 1
