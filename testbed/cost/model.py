"""Cost and power of rail fabrics: electrical (packet switches) against photonic (OCS).

The paper's §4.2 and Fig. 7 compare a cluster's GPU-backend network built from electrical rail
switches with the same rails built from optical circuit switches (DGX H200, 400 Gb/s
transceivers and switches, fibre excluded). This module is the pure part of
``opus-testbed cost``: it loads a parts file (unit price, unit power and source of a packet
switch, a transceiver and an OCS), builds both bills of materials for a cluster and compares
their totals. Table 3's scale per OCS technology comes from :data:`controller.ocs.TECHNOLOGIES`.

Counting, per rail (one rail per GPU index; ``servers`` endpoints per rail):

* electrical: a transceiver at the switch end of every NIC link; a rail larger than one switch
  is a non-blocking folded Clos of ``t`` tiers (see :func:`clos_rail`), with ``2 * servers * t``
  transceivers counting the NICs' own;
* photonic: one OCS of at least ``servers * nic_ports`` ports; it terminates no light.

The transceiver in each NIC is the same in both fabrics. By default it is left out of both
bills, as server equipment: the paper's 95.84 % power saving implies it. With one 12 W NIC
transceiver per GPU in the photonic bill, against about 83 W per GPU for a 2-tier electrical
rail (three more transceivers and 3/64 of a 750 W switch), no OCS could save more than 86 %.
``count_nic_transceivers=True`` (CLI ``--nic-optics count``) puts it in both.

The full rules, with the reasons, are in the comments of ``testbed/cost/parts.yaml``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from controller.ocs import TECHNOLOGIES

#: Fig. 7: savings of photonic over electrical rails, in percent.
PAPER_COST_SAVING_PCT = 70.5
PAPER_POWER_SAVING_PCT = 95.84

#: Table 3's scale-up domains: GPUs per server (NVLink domain).
SCALE_UP_GPUS = {"gb200": 72, "h200": 8}

#: Table 3 uses a 2-port NIC configuration: two OCS ports per GPU.
DEFAULT_NIC_PORTS = 2
#: Fig. 7 uses DGX H200 servers.
DEFAULT_GPUS_PER_SERVER = SCALE_UP_GPUS["h200"]

#: Table 3's names for :data:`controller.ocs.TECHNOLOGIES` keys (labels only).
TECHNOLOGY_LABELS = {
    "plzt": "PLZT (EpiPhotonics)",
    "sip": "SiP (Lightmatter)",
    "rotornet": "RotorNet (InFocus)",
    "3d-mems": "3D MEMS (Calient)",
    "piezo": "Piezo (Polatis)",
    "liquid-crystal": "Liquid crystal (Coherent)",
    "robotic": "Robotic (Telescent)",
}

PART_KEYS = ("packet_switch", "transceiver", "ocs")
_FIELDS = ("name", "price_usd", "power_w", "source")
_PORTED = ("packet_switch", "ocs")


class CostModelError(ValueError):
    """A cluster the model cannot build, or an invalid parts file."""


class PartsError(CostModelError):
    """An invalid parts file; the message names the file, the position and the key."""


@dataclass(frozen=True)
class Part:
    """One kind of part: unit price and power, where they come from, and its radix if any."""

    key: str
    name: str
    price_usd: float
    power_w: float
    source: str
    ports: int | None = None


@dataclass(frozen=True)
class Parts:
    """The three parts the comparison needs, and the file they came from."""

    packet_switch: Part
    transceiver: Part
    ocs: Part
    path: str

    @property
    def switch_ports(self) -> int:
        assert self.packet_switch.ports is not None
        return self.packet_switch.ports

    @property
    def ocs_ports(self) -> int:
        assert self.ocs.ports is not None
        return self.ocs.ports


@dataclass(frozen=True)
class ClusterSpec:
    """``servers`` servers of ``gpus_per_server`` GPUs (= rails); ``nic_ports`` per GPU."""

    servers: int
    gpus_per_server: int = DEFAULT_GPUS_PER_SERVER
    nic_ports: int = DEFAULT_NIC_PORTS

    def __post_init__(self) -> None:
        for name in ("servers", "gpus_per_server", "nic_ports"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise CostModelError(f"{name} must be a whole number >= 1, got {value!r}")

    @property
    def gpus(self) -> int:
        return self.servers * self.gpus_per_server


@dataclass(frozen=True)
class BomLine:
    """``quantity`` units of one part, for a whole fabric (all rails)."""

    item: str
    part: Part
    quantity: int

    @property
    def price_usd(self) -> float:
        return self.quantity * self.part.price_usd

    @property
    def power_w(self) -> float:
        return self.quantity * self.part.power_w

    def to_json(self) -> dict[str, Any]:
        return {"item": self.item, "part": self.part.name, "quantity": self.quantity,
                "unit_price_usd": self.part.price_usd, "unit_power_w": self.part.power_w,
                "price_usd": self.price_usd, "power_w": self.power_w}


@dataclass(frozen=True)
class Fabric:
    """A bill of materials for all rails of a cluster."""

    kind: str
    description: str
    lines: tuple[BomLine, ...]

    @property
    def price_usd(self) -> float:
        return sum(line.price_usd for line in self.lines)

    @property
    def power_w(self) -> float:
        return sum(line.power_w for line in self.lines)

    def to_json(self) -> dict[str, Any]:
        return {"description": self.description, "price_usd": self.price_usd,
                "power_w": self.power_w, "lines": [line.to_json() for line in self.lines]}


@dataclass(frozen=True)
class ClosRail:
    """One electrical rail: tiers, switches and transceivers (NIC-side ones included)."""

    tiers: int
    switches: int
    transceivers: int


@dataclass(frozen=True)
class Comparison:
    """Both fabrics for one cluster, and the photonic one's savings in percent."""

    cluster: ClusterSpec
    parts: Parts
    electrical: Fabric
    photonic: Fabric
    nic_transceivers_counted: bool = False

    @property
    def cost_saving_pct(self) -> float:
        return _saving_pct(self.electrical.price_usd, self.photonic.price_usd)

    @property
    def power_saving_pct(self) -> float:
        return _saving_pct(self.electrical.power_w, self.photonic.power_w)

    def to_json(self) -> dict[str, Any]:
        c = self.cluster
        return {
            "cost_saving_pct": round(self.cost_saving_pct, 2),
            "power_saving_pct": round(self.power_saving_pct, 2),
            "paper": {"cost_saving_pct": PAPER_COST_SAVING_PCT,
                      "power_saving_pct": PAPER_POWER_SAVING_PCT},
            "cluster": {"servers": c.servers, "gpus_per_server": c.gpus_per_server,
                        "gpus": c.gpus, "rails": c.gpus_per_server, "nic_ports": c.nic_ports},
            "parts_file": self.parts.path,
            "nic_transceivers_counted": self.nic_transceivers_counted,
            "electrical": self.electrical.to_json(),
            "photonic": self.photonic.to_json(),
        }


def _saving_pct(electrical: float, photonic: float) -> float:
    if electrical <= 0:
        raise CostModelError("the electrical fabric costs nothing; cannot compute a saving")
    return 100.0 * (1.0 - photonic / electrical)


# --- the parts file ---------------------------------------------------------------------------


def default_parts_path() -> Path:
    """The shipped parts file, ``testbed/cost/parts.yaml``."""
    return Path(str(resources.files("testbed.cost").joinpath("parts.yaml")))


def load_parts(path: str | Path | None = None) -> Parts:
    """Load and validate a parts file (the shipped one when ``path`` is None)."""
    file = Path(path) if path is not None else default_parts_path()
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise PartsError(f"{file}: cannot read the parts file: {exc.strerror or exc}") from exc
    except UnicodeDecodeError as exc:
        raise PartsError(f"{file}: the parts file is not UTF-8 text: {exc.reason}") from exc
    return parse_parts(text, str(file))


def parse_parts(text: str, source: str = "<parts>") -> Parts:
    """Validate a parts document; errors name ``source:line:column`` and the key."""
    try:
        root = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        raise PartsError(f"{where}: invalid YAML: {exc.problem}") from exc
    except yaml.YAMLError as exc:
        raise PartsError(f"{source}: invalid YAML: {exc}") from exc
    if root is None:
        raise PartsError(f"{source}: empty parts file; expected keys {', '.join(PART_KEYS)}")
    top = _mapping(root, "", source)
    _check_keys(top, root, "", PART_KEYS, source)
    parts = {key: _part(key, top[key][1], source) for key in PART_KEYS}
    return Parts(parts["packet_switch"], parts["transceiver"], parts["ocs"], source)


def _where(node: yaml.Node, source: str) -> str:
    return f"{source}:{node.start_mark.line + 1}:{node.start_mark.column + 1}"


def _mapping(node: yaml.Node, path: str, source: str) -> dict[str, tuple[yaml.Node, yaml.Node]]:
    """Key -> (key node, value node), rejecting non-mappings and duplicate keys."""
    if not isinstance(node, yaml.MappingNode):
        what = f"'{path}'" if path else "the top level"
        raise PartsError(f"{_where(node, source)}: {what} must be a mapping of keys to values")
    out: dict[str, tuple[yaml.Node, yaml.Node]] = {}
    for key_node, value_node in node.value:
        key = str(key_node.value)
        full = f"{path}.{key}" if path else key
        if key in out:
            raise PartsError(f"{_where(key_node, source)}: duplicate key '{full}'")
        out[key] = (key_node, value_node)
    return out


def _check_keys(found: dict[str, tuple[yaml.Node, yaml.Node]], node: yaml.Node, path: str,
                keys: tuple[str, ...], source: str) -> None:
    """Every one of ``keys`` and nothing else."""
    prefix = f"{path}." if path else ""
    for key, (key_node, _value) in found.items():
        if key not in keys:
            raise PartsError(f"{_where(key_node, source)}: unknown key '{prefix}{key}'; "
                             f"allowed: {', '.join(keys)}")
    missing = [k for k in keys if k not in found]
    if missing:
        raise PartsError(f"{_where(node, source)}: missing key(s) "
                         f"{', '.join(prefix + k for k in missing)}")


def _part(key: str, node: yaml.Node, source: str) -> Part:
    fields = _FIELDS + (("ports",) if key in _PORTED else ())
    found = _mapping(node, key, source)
    _check_keys(found, node, key, fields, source)
    values: dict[str, Any] = {}
    for name in fields:
        value_node = found[name][1]
        value = _scalar(value_node, source)
        where = f"{_where(value_node, source)}: '{key}.{name}'"
        if name in ("name", "source"):
            if not isinstance(value, str) or not value.strip():
                raise PartsError(f"{where} must be a non-empty text")
            values[name] = value.strip()
        elif name == "ports":
            if isinstance(value, bool) or not isinstance(value, int) or value < 2:
                raise PartsError(f"{where} must be a whole number >= 2, got {value!r}")
            if key == "packet_switch" and value % 2:
                raise PartsError(f"{where} must be even (a Clos tier uses half the ports up), "
                                 f"got {value}")
            values[name] = value
        else:
            if (isinstance(value, bool) or not isinstance(value, int | float)
                    or not math.isfinite(value) or value < 0):
                raise PartsError(f"{where} must be a finite number >= 0, got {value!r}")
            values[name] = float(value)
    return Part(key=key, **values)


def _scalar(node: yaml.Node, source: str) -> Any:
    """The Python value of a scalar node (YAML 1.1 safe types)."""
    if not isinstance(node, yaml.ScalarNode):
        raise PartsError(f"{_where(node, source)}: expected a single value, not a "
                         f"{'list' if isinstance(node, yaml.SequenceNode) else 'mapping'}")
    return yaml.SafeLoader("").construct_object(node)


# --- bills of materials -----------------------------------------------------------------------


def clos_rail(endpoints: int, ports: int) -> ClosRail:
    """A non-blocking folded Clos for ``endpoints`` hosts built from ``ports``-port switches.

    ``t`` tiers hold ``ports * (ports/2)**(t-1)`` endpoints. Tiers below the top have
    ``ceil(endpoints / (ports/2))`` switches (half the ports down, half up), the top tier
    ``ceil(endpoints / ports)``. Each of the ``t`` link levels carries ``endpoints`` links with
    a transceiver at both ends.
    """
    if endpoints < 1:
        raise CostModelError(f"a rail needs at least one endpoint, got {endpoints}")
    if ports < 2 or ports % 2:
        raise CostModelError(f"a Clos switch needs an even number of ports >= 2, got {ports}")
    half = ports // 2
    tiers, capacity = 1, ports
    while endpoints > capacity:
        if half == 1:
            raise CostModelError(f"{ports}-port switches cannot build a Clos of {endpoints}")
        tiers += 1
        capacity *= half
    switches = (tiers - 1) * math.ceil(endpoints / half) + math.ceil(endpoints / ports)
    return ClosRail(tiers=tiers, switches=switches, transceivers=2 * endpoints * tiers)


def max_servers_per_ocs(parts: Parts, nic_ports: int = DEFAULT_NIC_PORTS) -> int:
    """Servers one OCS per rail can serve: ``ocs ports // nic_ports``."""
    return parts.ocs_ports // nic_ports


def compare(parts: Parts, cluster: ClusterSpec, *,
            count_nic_transceivers: bool = False) -> Comparison:
    """Both fabrics for ``cluster`` and their totals.

    ``count_nic_transceivers=True`` adds the NIC-side transceivers (the same in both fabrics)
    to both bills; by default they are server parts (see the module docstring).
    """
    limit = max_servers_per_ocs(parts, cluster.nic_ports)
    if cluster.servers > limit:
        raise CostModelError(
            f"{cluster.servers} servers need {cluster.servers * cluster.nic_ports} OCS ports per "
            f"rail ({cluster.nic_ports} per GPU), more than the {parts.ocs_ports}-port OCS "
            f"'{parts.ocs.name}' has; at most {limit} servers")
    rails = cluster.gpus_per_server
    nic_side = cluster.gpus
    clos = clos_rail(cluster.servers, parts.switch_ports)

    electrical_lines = [
        BomLine("packet switches", parts.packet_switch, rails * clos.switches),
        BomLine("transceivers, switch side", parts.transceiver,
                rails * clos.transceivers - nic_side),
    ]
    photonic_lines = [BomLine("optical circuit switches", parts.ocs, rails)]
    if count_nic_transceivers:
        electrical_lines.insert(1, BomLine("transceivers, NIC side", parts.transceiver,
                                           nic_side))
        photonic_lines.append(BomLine("transceivers, NIC side", parts.transceiver, nic_side))
    tiers = "1 switch" if clos.tiers == 1 else f"{clos.tiers}-tier Clos"
    electrical = Fabric("electrical", f"{rails} rails, each a {tiers} of {parts.switch_ports}-port "
                        f"switches ({clos.switches} per rail)", tuple(electrical_lines))
    used = cluster.servers * cluster.nic_ports
    photonic = Fabric("photonic", f"{rails} rails, each one {parts.ocs_ports}-port OCS "
                      f"({used} ports used)", tuple(photonic_lines))
    return Comparison(cluster, parts, electrical, photonic, count_nic_transceivers)


# --- Table 3 ----------------------------------------------------------------------------------


def table3(gpus_per_server: int = DEFAULT_GPUS_PER_SERVER,
           nic_ports: int = DEFAULT_NIC_PORTS) -> list[dict[str, Any]]:
    """Table 3: GPUs one OCS per rail connects, per technology (GPUs per server x radix / 2).

    ``gpus_gb200`` and ``gpus_h200`` are the paper's columns (72 and 8 GPUs per server, two NIC
    ports per GPU); ``gpus`` is for ``gpus_per_server`` and ``nic_ports``.
    """
    rows = []
    for key, (switching_ms, radix) in TECHNOLOGIES.items():
        rows.append({
            "technology": key,
            "label": TECHNOLOGY_LABELS.get(key, key),
            "switching_ms": switching_ms,
            "radix": radix,
            "gpus_gb200": SCALE_UP_GPUS["gb200"] * radix // DEFAULT_NIC_PORTS,
            "gpus_h200": SCALE_UP_GPUS["h200"] * radix // DEFAULT_NIC_PORTS,
            "gpus": gpus_per_server * (radix // nic_ports),
        })
    return rows
