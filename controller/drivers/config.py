"""The ``ocs:`` mapping of an experiment file, validated: what every OCS driver's settings share.

::

    ocs:
      driver: polatis-netconf      # a name of controller.drivers.registry.DRIVERS
      switching_delay: 25          # ms or a Table 3 technology (default: the driver's)
      host: 10.0.0.7               # one switch = rail 0; or `rails:`, one switch per rail
      port: 830                    # default: the driver's
      username: admin              # default: the credentials file's, else admin
      password_env: OPUS_OCS_PASSWORD   # default; or credentials_file: ~/.opus/ocs.yaml
      timeout_s: 10
      size: 16                     # N of N x N (or "16x16"); a switch of another size is refused
      ports: [1, 2, 3, 4]          # the rail's ports (default 1..N)
      dark_below_dbm: -40          # monitor reading under which a circuit is dark; null: no check
      host_key_fingerprint: "SHA256:..."   # NETCONF: the switch's SSH host key (or known_hosts:
      known_hosts: ~/.opus/known_hosts     #   FILE; or insecure_skip_host_key: true), see
                                           #   controller.drivers.hostkey
      rails:                       # instead of host: one entry per rail, same keys + `rail`
        - {rail: 0, host: 10.0.0.7}
        - {rail: 1, host: 10.0.0.8, size: 32}

A software driver (``emulated``) takes ``driver`` and ``switching_delay`` only
(:func:`parse_delay_only`); a hardware driver takes a switch per rail (:func:`parse_devices`,
with its own defaults). Top-level keys are defaults for every ``rails`` entry. Unknown keys are
refused, and every error is an :class:`OcsConfigError` (a ``ValueError``) naming the key, e.g.
``ocs.rails[1].port``. A credentials file is YAML with ``password`` (and optionally ``username``)
and must not be readable by group or others (as ssh demands of keys). Passwords are read only
when a driver is made (:func:`resolve_credentials`), never stored in the parsed config.

The host-key keys (``host_key_fingerprint``, ``known_hosts``, ``insecure_skip_host_key``)
are parsed here for every hardware driver; the registry refuses them for a driver whose
protocol has no host key (TL1 over TCP). ``ports`` are the ports the run owns on a shared
switch (:mod:`controller.drivers.guard`).

Which parser and factory a driver name takes, and whether it is hardware, is
:mod:`controller.drivers.registry`'s table (which also reads and parses whole mappings).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from controller.drivers.hostkey import HostKeyPolicy, parse_fingerprint
from controller.ocs import resolve_switching_delay_ms

DEFAULT_PASSWORD_ENV = "OPUS_OCS_PASSWORD"
DEFAULT_USERNAME = "admin"
DEFAULT_TIMEOUT_S = 10.0

_DEVICE_KEYS = ("host", "port", "username", "password_env", "credentials_file", "timeout_s",
                "size", "ports", "switching_delay", "dark_below_dbm")
#: how a NETCONF switch's SSH host key is checked (controller.drivers.hostkey)
HOST_KEY_KEYS = ("host_key_fingerprint", "known_hosts", "insecure_skip_host_key")
_DEVICE_KEYS_ALL = (*_DEVICE_KEYS, *HOST_KEY_KEYS)
_SOFT_KEYS = ("driver", "switching_delay")
_NOT_PINNED = HostKeyPolicy()  # all that a software driver takes here


class OcsConfigError(ValueError):
    """A bad ``ocs:`` setting; ``key`` is its dotted path."""

    def __init__(self, key: str, message: str) -> None:
        self.key = key
        super().__init__(f"{key}: {message}")


@dataclass(frozen=True)
class DeviceConfig:
    """One rail's switch. ``key`` is where it came from, for messages."""

    rail: int
    host: str
    port: int
    username: str | None
    password_env: str
    credentials_file: Path | None
    timeout_s: float
    size: int | None
    ports: tuple[int, ...] | None
    switching_delay: float | str
    dark_below_dbm: float | None
    key: str
    host_key: HostKeyPolicy = _NOT_PINNED

    def to_json(self) -> dict[str, object]:
        """Without secrets (there are none here: passwords are read at connect time)."""
        return {"rail": self.rail, "host": self.host, "port": self.port,
                "username": self.username, "password_env": self.password_env,
                "credentials_file": str(self.credentials_file) if self.credentials_file
                else None, "timeout_s": self.timeout_s, "size": self.size,
                "ports": list(self.ports) if self.ports is not None else None,
                "switching_delay": self.switching_delay, "dark_below_dbm": self.dark_below_dbm,
                **self.host_key.to_json()}


@dataclass(frozen=True)
class OcsConfig:
    """The parsed ``ocs:`` mapping; ``devices`` is empty for a software driver.

    ``is_hardware`` and ``protocol`` come from the driver's registry entry
    (:func:`controller.drivers.registry.parse_ocs_config` sets them)."""

    driver: str
    devices: tuple[DeviceConfig, ...] = ()
    switching_delay: float | str | None = None
    is_hardware: bool = False
    protocol: str | None = None  # the wire protocol of a hardware driver (netconf, tl1)

    def to_json(self) -> dict[str, object]:
        return {"driver": self.driver, "devices": [d.to_json() for d in self.devices],
                "switching_delay": self.switching_delay}


# --- parsing -------------------------------------------------------------------------------

def parse_delay_only(driver: str, data: Mapping[str, Any], key: str) -> OcsConfig:
    """A software driver's settings: the switching delay, nothing else."""
    for k in data:
        if k not in _SOFT_KEYS:
            raise OcsConfigError(f"{key}.{k}", f"unknown key for driver {driver} (it takes "
                                 f"{', '.join(_SOFT_KEYS)}; host and the rest are for the "
                                 "hardware drivers)")
    delay = data.get("switching_delay")
    if delay is not None:
        _delay(delay, f"{key}.switching_delay")
    return OcsConfig(driver, (), delay)


@dataclass(frozen=True)
class DeviceDefaults:
    """A hardware driver's defaults for the settings a device leaves out."""

    port: int
    switching_delay: float | str
    dark_below_dbm: float | None


def parse_devices(driver: str, data: Mapping[str, Any], key: str, base_dir: Path | None,
                  defaults: DeviceDefaults) -> OcsConfig:
    """A hardware driver's settings: one switch (``host``) or one per rail (``rails``);
    relative ``credentials_file`` paths use ``base_dir``."""
    for k in data:
        if k not in (*_DEVICE_KEYS_ALL, "driver", "rails"):
            raise OcsConfigError(f"{key}.{k}", f"unknown key (known: driver, rails, "
                                 f"{', '.join(_DEVICE_KEYS_ALL)})")
    top = {k: v for k, v in data.items() if k in _DEVICE_KEYS_ALL}
    rails = data.get("rails")
    if rails is None:
        if "host" not in data:
            raise OcsConfigError(f"{key}.host", f"driver {driver} needs a host (or a 'rails' "
                                 "list with one switch per rail)")
        devices = [_device({"rail": 0, **top}, key, base_dir, defaults)]
    else:
        if "host" in data:
            raise OcsConfigError(f"{key}.host", "give either 'host' (one switch) or 'rails' "
                                 "(one switch per rail), not both")
        if not isinstance(rails, list) or not rails:
            raise OcsConfigError(f"{key}.rails", "must be a non-empty list of switches")
        devices = []
        for i, entry in enumerate(rails):
            where = f"{key}.rails[{i}]"
            if not isinstance(entry, Mapping):
                raise OcsConfigError(where, "must be a mapping (rail, host, ...)")
            for k in entry:
                if k not in (*_DEVICE_KEYS_ALL, "rail"):
                    raise OcsConfigError(f"{where}.{k}", "unknown key (known: rail, "
                                         f"{', '.join(_DEVICE_KEYS_ALL)})")
            devices.append(_device({"rail": i, **top, **entry}, where, base_dir, defaults))
        seen: dict[int, str] = {}
        for d in devices:
            if d.rail in seen:
                raise OcsConfigError(f"{d.key}.rail", f"rail {d.rail} already served by "
                                     f"{seen[d.rail]}; one switch per rail")
            seen[d.rail] = d.key
    return OcsConfig(driver, tuple(devices), data.get("switching_delay"))


def read_ocs_mapping(path: str | Path) -> tuple[Any, str, Path]:
    """The ``ocs:`` mapping of a YAML file (an experiment file, or the mapping alone), the key
    to name in errors and the folder relative paths start from."""
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise OcsConfigError(str(path), f"cannot read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise OcsConfigError(str(path), f"not valid YAML: {exc}") from None
    if isinstance(data, Mapping) and "ocs" in data:
        data = data["ocs"]
    return data, f"{path}: ocs", path.parent


def _device(d: Mapping[str, Any], key: str, base_dir: Path | None,
            defaults: DeviceDefaults) -> DeviceConfig:
    rail = d["rail"]
    if not _is_int(rail) or rail < 0:
        raise OcsConfigError(f"{key}.rail", f"must be an integer >= 0, got {rail!r}")
    host = d.get("host")
    if not isinstance(host, str) or not host.strip():
        raise OcsConfigError(f"{key}.host", f"must be a host name or address, got {host!r}")
    port = d.get("port", defaults.port)
    if not _is_int(port) or not 1 <= port <= 65535:
        raise OcsConfigError(f"{key}.port", f"must be a TCP port 1..65535, got {port!r}")
    username = d.get("username")
    if username is not None and (not isinstance(username, str) or not username):
        raise OcsConfigError(f"{key}.username", f"must be a non-empty string, got {username!r}")
    password_env = d.get("password_env", DEFAULT_PASSWORD_ENV)
    if not isinstance(password_env, str) or not password_env.replace("_", "").isalnum():
        raise OcsConfigError(f"{key}.password_env", "must name an environment variable, got "
                             f"{password_env!r}")
    cred = d.get("credentials_file")
    cred_path: Path | None = None
    if cred is not None:
        if not isinstance(cred, str) or not cred:
            raise OcsConfigError(f"{key}.credentials_file", f"must be a path, got {cred!r}")
        cred_path = Path(cred).expanduser()
        if not cred_path.is_absolute() and base_dir is not None:
            cred_path = base_dir / cred_path
    timeout_s = d.get("timeout_s", DEFAULT_TIMEOUT_S)
    if not _is_number(timeout_s) or not 0 < timeout_s <= 3600:
        raise OcsConfigError(f"{key}.timeout_s", f"must be a number of seconds in (0, 3600], "
                             f"got {timeout_s!r}")
    size = _size(d.get("size"), f"{key}.size")
    ports = d.get("ports")
    port_tuple: tuple[int, ...] | None = None
    if ports is not None:
        if (not isinstance(ports, list) or not ports
                or not all(_is_int(p) and p >= 1 for p in ports)):
            raise OcsConfigError(f"{key}.ports", f"must be a list of port numbers >= 1, "
                                 f"got {ports!r}")
        if len(set(ports)) != len(ports):
            raise OcsConfigError(f"{key}.ports", f"lists a port twice: {ports}")
        if size is not None and max(ports) > size:
            raise OcsConfigError(f"{key}.ports", f"port {max(ports)} does not fit a "
                                 f"{size}x{size} switch (ports 1..{size})")
        port_tuple = tuple(int(p) for p in ports)
    delay = d.get("switching_delay", defaults.switching_delay)
    _delay(delay, f"{key}.switching_delay")
    dark = d.get("dark_below_dbm", defaults.dark_below_dbm)
    if dark is not None and not _is_number(dark):
        raise OcsConfigError(f"{key}.dark_below_dbm", f"must be a number of dBm or null, "
                             f"got {dark!r}")
    return DeviceConfig(int(rail), host.strip(), int(port), username, password_env, cred_path,
                        float(timeout_s), size, port_tuple, delay,
                        float(dark) if dark is not None else None, key,
                        _host_key(d, key, base_dir))


def _host_key(d: Mapping[str, Any], key: str, base_dir: Path | None) -> HostKeyPolicy:
    """The host-key keys of one device: at most one way of checking."""
    given = [k for k in HOST_KEY_KEYS if d.get(k) not in (None, False)]
    if len(given) > 1:
        raise OcsConfigError(f"{key}.{given[1]}", f"give one of {', '.join(HOST_KEY_KEYS)}, "
                             f"not {' and '.join(given)}")
    fingerprint = d.get("host_key_fingerprint")
    if fingerprint is not None:
        if not isinstance(fingerprint, str):
            raise OcsConfigError(f"{key}.host_key_fingerprint", "must be a string such as "
                                 f"'SHA256:...', got {fingerprint!r}")
        try:
            return HostKeyPolicy(fingerprint=parse_fingerprint(fingerprint))
        except ValueError as exc:
            raise OcsConfigError(f"{key}.host_key_fingerprint", str(exc)) from None
    known = d.get("known_hosts")
    if known is not None:
        if not isinstance(known, str) or not known:
            raise OcsConfigError(f"{key}.known_hosts", f"must be a path, got {known!r}")
        path = Path(known).expanduser()
        if not path.is_absolute() and base_dir is not None:
            path = base_dir / path
        return HostKeyPolicy(known_hosts=path)
    skip = d.get("insecure_skip_host_key", False)
    if not isinstance(skip, bool):
        raise OcsConfigError(f"{key}.insecure_skip_host_key", f"must be true or false, got "
                             f"{skip!r}")
    return HostKeyPolicy(insecure_skip=skip)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_number(v: Any) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool)


def _size(value: Any, key: str) -> int | None:
    if value is None:
        return None
    if _is_int(value) and value >= 1:
        return int(value)
    if isinstance(value, str):
        a, sep, b = value.lower().partition("x")
        if a.strip().isdigit() and (not sep or a.strip() == b.strip()) and int(a) >= 1:
            return int(a)
    raise OcsConfigError(key, f"must be N or 'NxN' (an N x N switch), got {value!r}")


def _delay(value: Any, key: str) -> float:
    try:
        return resolve_switching_delay_ms(value)
    except ValueError as exc:
        raise OcsConfigError(key, str(exc)) from None


# --- credentials ---------------------------------------------------------------------------

def resolve_credentials(dev: DeviceConfig,
                        env: Mapping[str, str] | None = None) -> tuple[str, str]:
    """``(username, password)`` for ``dev``, from its credentials file or environment."""
    env = os.environ if env is None else env
    if dev.credentials_file is not None:
        key = f"{dev.key}.credentials_file"
        path = dev.credentials_file
        try:
            mode = path.stat().st_mode
            text = path.read_text()
        except OSError as exc:
            raise OcsConfigError(key, f"cannot read {path}: {exc.strerror or exc}") from None
        if mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise OcsConfigError(key, f"{path} is accessible by group or others (mode "
                                 f"{stat.S_IMODE(mode):o}); run `chmod 600 {path}`")
        import yaml

        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError:
            data = None
        if not isinstance(data, Mapping) or not isinstance(data.get("password"), str):
            raise OcsConfigError(key, f"{path} must be YAML with a 'password' (and optionally "
                                 "'username')")
        user = dev.username or data.get("username") or DEFAULT_USERNAME
        return str(user), str(data["password"])
    password = env.get(dev.password_env)
    if password is None:
        raise OcsConfigError(f"{dev.key}.password_env", f"environment variable "
                             f"{dev.password_env} is not set; export it or give a "
                             "credentials_file")
    return dev.username or DEFAULT_USERNAME, password
