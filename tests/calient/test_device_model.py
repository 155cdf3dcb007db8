"""emulator.calient.model: two-step connections, port use, light, faults (no network)."""

from __future__ import annotations

import pytest

from emulator.calient.model import CalientDevice
from emulator.polatis.model import DeviceError, TimedBackend


class Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_enter_reserves_then_activate_lights_after_the_switching_time() -> None:
    clock = Clock()
    dev = CalientDevice(8, switching_time_ms=200, clock=clock)
    name = dev.enter(1, 2, two_way=True)
    assert name == "1.1.1-1.1.2"
    state = dev.state_of(name, clock.t)
    assert (state.admin, state.oper, state.capacity) == ("UMA", "RDY", "OK")
    assert dev.pairs() == {} and dev.out_dbm(2, clock.t) is None  # reserved: nothing moved
    dev.activate(name)  # replies before the mirrors settle
    assert dev.pairs() == {1: 8 + 2, 2: 8 + 1}
    assert dev.state_of(name, clock.t).oper == "RDY" and dev.out_dbm(2, clock.t) is None
    clock.t += 0.2
    assert dev.state_of(name, clock.t).in_service
    assert dev.out_dbm(2, clock.t) == dev.out_dbm(1, clock.t) == -4.5
    assert dev.in_dbm(3) == -3.0  # the rank's transmitter is on, connected or not
    dev.cancel(name)
    assert dev.pairs() == {} and dev.out_dbm(2, clock.t) is None
    assert dev.state_of(name, clock.t).admin == "UMA"
    dev.delete(name)
    assert dev.connections() == {}


def test_ports_in_use_failed_or_unknown_are_refused_with_codes() -> None:
    dev = CalientDevice(8, switching_time_ms=0)
    dev.enter(1, 2, two_way=True)
    with pytest.raises(DeviceError, match=r"Invalid Connection: port 1\.1\.2 is in use") as err:
        dev.enter(3, 2, two_way=False)  # 2's output is taken
    assert err.value.tl1_code == "SAAS" and {1, 2, 3} <= set(err.value.ports)
    one_way = dev.enter(4, 5, two_way=False)  # 4's input, 5's output
    assert one_way == "1.1.4>1.1.5"
    dev.enter(5, 4, two_way=False)  # the reverse direction is free
    with pytest.raises(DeviceError) as err:
        dev.enter(9, 1, two_way=True)
    assert err.value.tl1_code == "IIAC"
    dev.faults.failed_ports.add(6)
    with pytest.raises(DeviceError, match=r"Failed: port 1\.1\.6 is failed") as err:
        dev.enter(6, 7, two_way=True)
    assert err.value.tl1_code == "SROF"
    with pytest.raises(DeviceError) as err:
        dev.activate("1.1.7-1.1.8")
    assert err.value.tl1_code == "IENE"


def test_refused_edits_change_nothing_and_a_failed_port_reads_no_light() -> None:
    clock = Clock()
    dev = CalientDevice(8, switching_time_ms=0, clock=clock)
    dev.load({1: 8 + 2, 2: 8 + 1, 3: 8 + 4})  # a duplex 1-2 and a one-way 3>4, lit
    assert sorted(dev.connections()) == ["1.1.1-1.1.2", "1.1.3>1.1.4"]
    dev.faults.refuse_edits = 1
    with pytest.raises(DeviceError, match="refused") as err:
        dev.cancel("1.1.1-1.1.2")
    assert err.value.tl1_code == "SROF" and dev.pairs()[1] == 8 + 2
    dev.faults.failed_ports.add(2)
    assert dev.out_dbm(1, clock.t) is None and dev.in_dbm(2) is None
    assert dev.state_of("1.1.1-1.1.2", clock.t).capacity == "FAIL"
    assert dev.out_dbm(4, clock.t) == -4.5


def test_delete_of_an_active_connection_cancels_it_first() -> None:
    dev = CalientDevice(4, switching_time_ms=0)
    dev.load({1: 4 + 2, 2: 4 + 1})
    dev.delete("1.1.1-1.1.2")
    assert dev.pairs() == {} and dev.connections() == {}


def test_activate_waits_for_the_backend_without_reply_before_settle() -> None:
    waited: list[float] = []
    dev = CalientDevice(4, backend=TimedBackend(30.0, wait=waited.append),
                        reply_before_settle=False)
    dev.activate(dev.enter(1, 2, two_way=True))
    assert waited == [0.03] and dev.state_of("1.1.1-1.1.2", dev.clock()).in_service
