"""The ``calient-tl1`` driver's ``ocs:`` settings and factory.

The keys are every hardware driver's (:mod:`controller.drivers.config`); CALIENT's own are the
defaults: TL1 on TCP port 3083 (as MonALISA's client of real switches used), a switching delay
of 200 ms (a bulk switch on an S320, as issue 38 quotes the hardware guide: up to 200 ms, 500 ms
worst; measure your unit and set ``switching_delay``), and a circuit dark below -40 dBm (a port
without light reads ``NONE``, which is always dark). Rail port ``p`` is the switch's ``p``-th
port in (shelf, slot, port) order (:mod:`controller.drivers.calient.session`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from controller.drivers.calient.wire import DEFAULT_PORT
from controller.drivers.config import (
    DeviceDefaults,
    OcsConfig,
    parse_devices,
    resolve_credentials,
)
from controller.drivers.polatis.driver import PolatisDriver, RailDevice

DEFAULT_SWITCHING_DELAY_MS = 200.0
DEFAULT_DARK_BELOW_DBM = -40.0


def parse_config(driver: str, data: Mapping[str, Any], key: str,
                 base_dir: Path | None) -> OcsConfig:
    """A CALIENT ``ocs:`` mapping: one switch per rail, with CALIENT's defaults."""
    defaults = DeviceDefaults(DEFAULT_PORT, DEFAULT_SWITCHING_DELAY_MS, DEFAULT_DARK_BELOW_DBM)
    return parse_devices(driver, data, key, base_dir, defaults)


def make_driver(cfg: OcsConfig, *, env: Mapping[str, str] | None = None,
                clock: Callable[[], float] = time.time) -> PolatisDriver:
    """A connected driver over one :class:`~controller.drivers.calient.session.CalientSession`
    per rail's switch (the device-neutral engine of :mod:`controller.drivers.polatis.driver`).

    Raises :class:`~controller.drivers.config.OcsConfigError` for missing credentials and the
    device errors of :mod:`controller.drivers.polatis.errors` when a switch cannot be reached,
    refuses the login, or is not the configured size.
    """
    from controller.drivers.calient.session import CalientSession

    devices = []
    for dev in cfg.devices:
        user, password = resolve_credentials(dev, env)
        session = CalientSession(dev.host, dev.port, username=user, password=password,
                                 timeout_s=dev.timeout_s)
        devices.append(RailDevice(dev.rail, session, dev.ports, dev.size, dev.switching_delay,
                                  dev.dark_below_dbm))
    return PolatisDriver(devices, clock=clock)
