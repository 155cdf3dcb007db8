"""The driver registry: one entry per ``ocs.driver`` name, its parser, factory and kind."""

from __future__ import annotations

import pytest

from controller.drivers.config import OcsConfigError
from controller.drivers.registry import (
    DRIVERS,
    HARDWARE_DRIVERS,
    REGISTRY,
    make_driver,
    parse_ocs_config,
)


def test_names_kinds_and_protocols_come_from_the_table() -> None:
    assert DRIVERS == ("emulated", "polatis-netconf", "polatis-tl1", "calient-tl1")
    assert HARDWARE_DRIVERS == ("polatis-netconf", "polatis-tl1", "calient-tl1")
    assert REGISTRY["emulated"].make is None
    for name in HARDWARE_DRIVERS:
        cfg = parse_ocs_config({"driver": name, "host": "10.0.0.7"})
        assert cfg.is_hardware and cfg.protocol == REGISTRY[name].protocol
        assert cfg.protocol == name.split("-")[1]
    soft = parse_ocs_config({"driver": "emulated", "switching_delay": 5})
    assert not soft.is_hardware and soft.protocol is None and soft.switching_delay == 5


def test_an_unknown_name_or_a_runner_built_driver_is_refused() -> None:
    with pytest.raises(OcsConfigError, match="must be one of emulated, polatis-netconf"):
        parse_ocs_config({"driver": ["emulated"]})
    with pytest.raises(OcsConfigError, match="make_driver builds polatis-netconf / polatis-tl1 "
                                             "/ calient-tl1"):
        make_driver({"driver": "emulated"})
