"""The Polatis drivers' ``ocs:`` settings and factory (``polatis-netconf``, ``polatis-tl1``).

The keys are every hardware driver's (:mod:`controller.drivers.config`); what is Polatis's
own are the defaults (the protocol's port, 830 for NETCONF and 3082 for TL1; a piezo switching
time, Table 3's ``polatis``; a circuit dark below -40 dBm on the power monitors) and the
sessions :func:`make_driver` opens. :mod:`controller.drivers.registry` names these functions.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from controller.drivers.config import (
    DeviceDefaults,
    OcsConfig,
    parse_devices,
    resolve_credentials,
)
from controller.drivers.polatis.driver import PolatisDriver, RailDevice
from controller.drivers.polatis.session import DeviceSession

DEFAULT_PORTS = {"netconf": 830, "tl1": 3082}
DEFAULT_SWITCHING_DELAY = "polatis"  # Table 3: piezo, 25 ms
DEFAULT_DARK_BELOW_DBM = -40.0


def parse_config(driver: str, data: Mapping[str, Any], key: str,
                 base_dir: Path | None) -> OcsConfig:
    """A Polatis ``ocs:`` mapping: one switch per rail, with the protocol's defaults."""
    protocol = driver.removeprefix("polatis-")
    defaults = DeviceDefaults(DEFAULT_PORTS[protocol], DEFAULT_SWITCHING_DELAY,
                              DEFAULT_DARK_BELOW_DBM)
    return parse_devices(driver, data, key, base_dir, defaults)


def make_driver(cfg: OcsConfig, *, env: Mapping[str, str] | None = None,
                clock: Callable[[], float] = time.time) -> PolatisDriver:
    """A connected :class:`PolatisDriver` over one session per rail's switch.

    Raises :class:`~controller.drivers.config.OcsConfigError` for missing credentials and
    :class:`~controller.drivers.polatis.errors.PolatisError` subclasses when a switch cannot be
    reached, refuses the login, or is not the configured size.
    """
    # the sessions load here, not at import: the registry (which every experiment file's
    # check reads) then does not load the wire formats (lxml) with it
    from controller.drivers.polatis.netconf import NetconfSession
    from controller.drivers.polatis.tl1 import Tl1Session

    devices = []
    for dev in cfg.devices:
        user, password = resolve_credentials(dev, env)
        session: DeviceSession
        if cfg.protocol == "netconf":
            session = NetconfSession(dev.host, dev.port, username=user, password=password,
                                     timeout_s=dev.timeout_s, host_key=dev.host_key,
                                     config_key=dev.key)
        else:
            session = Tl1Session(dev.host, dev.port, username=user, password=password,
                                 timeout_s=dev.timeout_s)
        devices.append(RailDevice(dev.rail, session, dev.ports, dev.size, dev.switching_delay,
                                  dev.dark_below_dbm))
    return PolatisDriver(devices, clock=clock)
