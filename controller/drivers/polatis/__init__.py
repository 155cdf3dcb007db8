"""Polatis optical circuit switches as Opus OCS back ends: NETCONF and TL1 drivers.

* :mod:`.ports` -- how rail ports map onto an N x N switch (rail port ``p`` = ingress ``p`` and
  egress ``N+p``; a duplex circuit ``a <-> b`` = pairs ``a -> N+b`` and ``b -> N+a``);
* :mod:`.xml` and :mod:`.tl1` -- the wire formats, pure;
* :mod:`.netconf` / :mod:`.tl1` -- one management session per switch;
* :mod:`.driver` -- :class:`PolatisDriver`, the :class:`~controller.ocs.OcsDriver` over one
  switch per rail (checks first, re-reads the glass after every fault);
* :mod:`.config` -- the ``ocs:`` experiment setting and :func:`make_driver`.

The device simulator and the emulated OCS's NETCONF front live in :mod:`emulator.polatis`.
"""

from controller.drivers.polatis.config import (
    DeviceConfig,
    OcsConfig,
    OcsConfigError,
    load_ocs_config,
    make_driver,
    parse_ocs_config,
)
from controller.drivers.polatis.driver import PolatisDriver, RailDevice
from controller.drivers.polatis.errors import (
    DeviceAuthError,
    DeviceMismatch,
    DeviceProtocolError,
    DeviceRejected,
    DeviceSessionLost,
    DeviceTimeout,
    DeviceUnreachable,
    PolatisError,
)

__all__ = [
    "DeviceAuthError",
    "DeviceConfig",
    "DeviceMismatch",
    "DeviceProtocolError",
    "DeviceRejected",
    "DeviceSessionLost",
    "DeviceTimeout",
    "DeviceUnreachable",
    "OcsConfig",
    "OcsConfigError",
    "PolatisDriver",
    "PolatisError",
    "RailDevice",
    "load_ocs_config",
    "make_driver",
    "parse_ocs_config",
]
