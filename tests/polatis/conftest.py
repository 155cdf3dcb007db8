"""Fixtures: a simulated 8x8 Polatis switch served over NETCONF and TL1 on free local ports."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from controller.drivers.polatis.driver import PolatisDriver
from controller.drivers.registry import make_driver
from emulator.polatis import NetconfServer, PolatisDevice, Tl1Server
from emulator.polatis.netconf_server import host_key_fingerprint, process_host_key

SIZE = 8
PASSWORD = "root"
ENV = {"OPUS_OCS_PASSWORD": PASSWORD}


@pytest.fixture
def device() -> PolatisDevice:
    return PolatisDevice(SIZE, switching_time_ms=5.0)


@pytest.fixture
def netconf(device: PolatisDevice) -> Iterator[NetconfServer]:
    with NetconfServer(device, password=PASSWORD) as server:
        yield server


@pytest.fixture
def tl1(device: PolatisDevice) -> Iterator[Tl1Server]:
    with Tl1Server(device, password=PASSWORD) as server:
        yield server


#: what every simulator of this process presents (NetconfServer's default host key)
FINGERPRINT = host_key_fingerprint(process_host_key())


def ocs_config(protocol: str, port: int, **extra: Any) -> dict[str, Any]:
    """An ``ocs:`` mapping for one simulated switch on 127.0.0.1 (its host key pinned)."""
    pin = ({"host_key_fingerprint": FINGERPRINT} if protocol == "netconf"
           and not {"known_hosts", "insecure_skip_host_key"} & set(extra) else {})
    return {"driver": f"polatis-{protocol}", "host": "127.0.0.1", "port": port, "size": SIZE,
            "timeout_s": 5, **pin, **extra}


@pytest.fixture
def connect() -> Iterator[Callable[..., PolatisDriver]]:
    """``connect(protocol, port, **ocs_keys)`` -> a driver closed after the test."""
    drivers: list[PolatisDriver] = []

    def make(protocol: str, port: int, **extra: Any) -> PolatisDriver:
        driver = make_driver(ocs_config(protocol, port, **extra), env=ENV)
        drivers.append(driver)
        return driver

    yield make
    for d in drivers:
        d.close()
