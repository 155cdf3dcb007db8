"""Fixtures: a simulated 8-port CALIENT switch served over TL1 on a free local port."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from controller.drivers.polatis.driver import PolatisDriver
from controller.drivers.registry import make_driver
from emulator.calient.model import CalientDevice
from emulator.calient.tl1_server import CalientTl1Server

SIZE = 8
PASSWORD = "root"
ENV = {"OPUS_OCS_PASSWORD": PASSWORD}


@pytest.fixture
def device() -> CalientDevice:
    return CalientDevice(SIZE, switching_time_ms=5.0)


@pytest.fixture
def tl1(device: CalientDevice) -> Iterator[CalientTl1Server]:
    with CalientTl1Server(device, password=PASSWORD) as server:
        yield server


def ocs_config(port: int, **extra: Any) -> dict[str, Any]:
    """An ``ocs:`` mapping for one simulated switch on 127.0.0.1."""
    return {"driver": "calient-tl1", "host": "127.0.0.1", "port": port, "size": SIZE,
            "timeout_s": 5, **extra}


@pytest.fixture
def connect() -> Iterator[Callable[..., PolatisDriver]]:
    """``connect(port, **ocs_keys)`` -> a driver closed after the test (some tests stop
    their switch first: closing does not restore what the driver found)."""
    drivers: list[PolatisDriver] = []

    def make(port: int, **extra: Any) -> PolatisDriver:
        driver = make_driver(ocs_config(port, **extra), env=ENV, restore_on_close=False)
        drivers.append(driver)
        return driver

    yield make
    for d in drivers:
        d.close()
