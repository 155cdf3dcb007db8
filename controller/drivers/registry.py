"""OCS drivers by name: each name's ``ocs:`` config parser, its factory, whether it is hardware.

An experiment's ``ocs.driver`` takes one of :data:`DRIVERS`. Adding a driver means one module
(its :class:`~controller.ocs.OcsDriver`, a parser of its ``ocs:`` settings built on
:mod:`controller.drivers.config`, and a factory) and one line in :data:`REGISTRY`. The
simulated driver is not among them: it comes with the sim backend (``--backend sim``), never
from a file.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Protocol

from controller.drivers import emulated
from controller.drivers.calient import config as calient_config
from controller.drivers.config import OcsConfig, OcsConfigError, read_ocs_mapping
from controller.drivers.guard import PortGuard
from controller.drivers.hostkey import HostKeyPolicy
from controller.drivers.polatis import config as polatis_config
from controller.ocs import OcsDriver

#: ``parse(driver name, ocs mapping, key for errors, folder of relative paths)``
ConfigParser = Callable[[str, Mapping[str, Any], str, Path | None], OcsConfig]


class DriverFactory(Protocol):
    """Makes a connected driver from parsed settings (credentials from ``env``)."""

    def __call__(self, cfg: OcsConfig, *, env: Mapping[str, str] | None = None,
                 clock: Callable[[], float] = time.time) -> OcsDriver: ...


@dataclass(frozen=True)
class DriverEntry:
    """One driver name: ``make`` is None where the runner builds the driver (emulated)."""

    name: str
    parse: ConfigParser
    make: DriverFactory | None
    hardware: bool
    protocol: str | None = None  # a hardware driver's wire protocol


REGISTRY: dict[str, DriverEntry] = {e.name: e for e in (
    DriverEntry("emulated", emulated.parse_config, None, hardware=False),
    DriverEntry("polatis-netconf", polatis_config.parse_config, polatis_config.make_driver,
                hardware=True, protocol="netconf"),
    DriverEntry("polatis-tl1", polatis_config.parse_config, polatis_config.make_driver,
                hardware=True, protocol="tl1"),
    DriverEntry("calient-tl1", calient_config.parse_config, calient_config.make_driver,
                hardware=True, protocol="tl1"),
)}

#: every value of an experiment's ``ocs.driver``
DRIVERS = tuple(REGISTRY)
#: drivers that talk to a switch (a lab switch, or the emulated OCS's fronts)
HARDWARE_DRIVERS = tuple(name for name, e in REGISTRY.items() if e.hardware)


def parse_ocs_config(data: Any, *, key: str = "ocs", base_dir: Path | None = None) -> OcsConfig:
    """Validate an ``ocs:`` mapping with its driver's parser; relative ``credentials_file``
    paths use ``base_dir``."""
    if not isinstance(data, Mapping):
        raise OcsConfigError(key, f"must be a mapping, got {type(data).__name__}")
    name = data.get("driver")
    entry = REGISTRY.get(name) if isinstance(name, str) else None
    if entry is None:
        raise OcsConfigError(f"{key}.driver", f"must be one of {', '.join(DRIVERS)}; "
                             f"got {name!r}")
    cfg = entry.parse(entry.name, data, key, base_dir)
    if entry.protocol != "netconf":  # only an SSH transport has a host key to check
        for dev in cfg.devices:
            policy = dev.host_key
            if policy.pinned or policy.insecure_skip:
                raise OcsConfigError(f"{dev.key}.{_host_key_setting(policy)}", "applies to "
                                     f"NETCONF (SSH) only; {entry.name} speaks "
                                     f"{entry.protocol} over plain TCP, which has no host key")
    return replace(cfg, is_hardware=entry.hardware, protocol=entry.protocol)


def _host_key_setting(policy: HostKeyPolicy) -> str:
    if policy.fingerprint is not None:
        return "host_key_fingerprint"
    return "known_hosts" if policy.known_hosts is not None else "insecure_skip_host_key"


def load_ocs_config(path: str | Path) -> OcsConfig:
    """Read a YAML file holding an ``ocs:`` mapping (an experiment file) or the mapping alone."""
    data, key, base_dir = read_ocs_mapping(path)
    return parse_ocs_config(data, key=key, base_dir=base_dir)


def make_driver(ocs_config: OcsConfig | Mapping[str, Any], *,
                env: Mapping[str, str] | None = None, base_dir: Path | None = None,
                clock: Callable[[], float] = time.time, claim: bool = True,
                restore_on_close: bool = True) -> PortGuard:
    """A connected driver for an ``ocs:`` config (parsed or raw) that names a switch, inside
    a :class:`~controller.drivers.guard.PortGuard` that keeps it to the config's ``ports``:
    it has read the switch, and (``claim``) refused to start if another user's cross-connect
    uses one of them; ``restore_on_close``: closing it puts back what it found there.
    The vendor's driver is ``.inner``.

    Raises :class:`OcsConfigError` for a driver the runner builds (emulated) and for bad
    settings, :class:`~controller.drivers.guard.PortConflict`, and the driver's own errors
    when a switch cannot be reached or refuses.
    """
    cfg = ocs_config if isinstance(ocs_config, OcsConfig) else parse_ocs_config(
        ocs_config, base_dir=base_dir)
    entry = REGISTRY[cfg.driver]
    if entry.make is None:
        makers = " / ".join(n for n, e in REGISTRY.items() if e.make is not None)
        raise OcsConfigError("ocs.driver", f"make_driver builds {makers}; driver {cfg.driver} "
                             "is built by the runner")
    driver = entry.make(cfg, env=env, clock=clock)
    try:
        return PortGuard(driver, claim=claim, restore_on_close=restore_on_close)
    except BaseException:
        driver.close()
        raise
