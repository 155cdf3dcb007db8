"""The ``ocs:`` setting: defaults, one switch per rail, credentials, errors that name the key."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from controller.drivers.config import OcsConfigError, resolve_credentials
from controller.drivers.registry import load_ocs_config, make_driver, parse_ocs_config


def test_one_switch_gets_rail_0_and_protocol_defaults() -> None:
    cfg = parse_ocs_config({"driver": "polatis-tl1", "host": "10.0.0.7", "size": "16x16"})
    (dev,) = cfg.devices
    assert (cfg.protocol, dev.rail, dev.port, dev.size, dev.timeout_s) == (
        "tl1", 0, 3082, 16, 10.0)
    assert dev.password_env == "OPUS_OCS_PASSWORD" and dev.ports is None
    assert parse_ocs_config({"driver": "polatis-netconf", "host": "h"}).devices[0].port == 830


def test_rails_inherit_top_level_defaults() -> None:
    cfg = parse_ocs_config({"driver": "polatis-netconf", "username": "lab", "timeout_s": 3,
                            "rails": [{"host": "a"}, {"rail": 1, "host": "b", "port": 8830}]})
    assert [(d.rail, d.host, d.port, d.username, d.timeout_s) for d in cfg.devices] == [
        (0, "a", 830, "lab", 3.0), (1, "b", 8830, "lab", 3.0)]


@pytest.mark.parametrize(("data", "key"), [
    ({"driver": "calient"}, "ocs.driver"),
    ({"driver": "polatis-netconf"}, "ocs.host"),
    ({"driver": "polatis-netconf", "host": "h", "prot": 1}, "ocs.prot"),
    ({"driver": "polatis-netconf", "host": "h", "port": 70000}, "ocs.port"),
    ({"driver": "polatis-netconf", "host": "h", "size": "16x32"}, "ocs.size"),
    ({"driver": "polatis-netconf", "host": "h", "size": 4, "ports": [1, 5]}, "ocs.ports"),
    ({"driver": "polatis-netconf", "host": "h", "switching_delay": "warp"},
     "ocs.switching_delay"),
    ({"driver": "polatis-tl1", "rails": [{"host": "a"}, {"rail": 0, "host": "b"}]},
     "ocs.rails[1].rail"),
    ({"driver": "polatis-tl1", "rails": [{"host": "a", "colour": "red"}]},
     "ocs.rails[0].colour"),
    ({"driver": "polatis-tl1", "host": "a", "rails": [{"host": "b"}]}, "ocs.host"),
    ({"driver": "emulated", "host": "a"}, "ocs.host"),
])
def test_errors_name_the_key(data: dict[str, Any], key: str) -> None:
    with pytest.raises(OcsConfigError) as err:
        parse_ocs_config(data)
    assert err.value.key == key and str(err.value).startswith(f"{key}: ")
    assert isinstance(err.value, ValueError)


def test_emulated_takes_only_a_switching_delay() -> None:
    cfg = parse_ocs_config({"driver": "emulated", "switching_delay": "3d-mems"})
    assert not cfg.is_hardware and cfg.devices == () and cfg.switching_delay == "3d-mems"
    with pytest.raises(OcsConfigError, match="built by the runner"):
        make_driver({"driver": "emulated"})


def test_password_from_the_named_environment_variable() -> None:
    dev = parse_ocs_config({"driver": "polatis-netconf", "host": "h",
                            "password_env": "LAB_PW"}).devices[0]
    assert resolve_credentials(dev, {"LAB_PW": "s3cret"}) == ("admin", "s3cret")
    with pytest.raises(OcsConfigError) as err:
        resolve_credentials(dev, {})
    assert err.value.key == "ocs.password_env" and "LAB_PW is not set" in str(err.value)


def test_credentials_file_must_be_private(tmp_path: Path) -> None:
    cred = tmp_path / "ocs.yaml"
    cred.write_text("username: lab\npassword: pw\n")
    os.chmod(cred, 0o644)
    exp = tmp_path / "exp.yaml"
    exp.write_text("name: x\nocs:\n  driver: polatis-netconf\n  host: 10.1.1.1\n"
                   "  credentials_file: ocs.yaml\n")
    dev = load_ocs_config(exp).devices[0]
    assert dev.credentials_file == cred  # relative to the experiment file
    with pytest.raises(OcsConfigError, match="chmod 600"):
        resolve_credentials(dev, {})
    os.chmod(cred, 0o600)
    assert resolve_credentials(dev, {}) == ("lab", "pw")


def test_simulated_is_not_a_driver_setting() -> None:
    """The simulated driver comes with --backend sim, never from an ``ocs:`` mapping."""
    with pytest.raises(OcsConfigError) as err:
        parse_ocs_config({"driver": "simulated"})
    assert err.value.key == "ocs.driver"
    assert ("must be one of emulated, polatis-netconf, polatis-tl1, calient-tl1; got "
            "'simulated'") in str(err.value)
