"""NETCONF messages for the Polatis ``optical-switch`` YANG module: build and parse, nothing else.

Pure functions over strings and lxml elements, shared by the driver (:mod:`.netconf`) and checked
by tests against the forms the module defines:

* namespace ``http://www.polatis.com/yang/optical-switch``; the device announces the module in
  its hello as ``...optical-switch?module=optical-switch&revision=YYYY-MM-DD``;
* cross-connects are ``cross-connects/pair`` entries keyed by ``ingress`` with an ``egress``;
  revisions before 2017-08-04 call the list ``pairs`` (same leaves), hence
  :func:`pair_list_name`;
* a create is an ``edit-config`` merge on ``running``; a delete is
  ``<pair nc:operation="delete"><ingress>i</ingress></pair>``;
* ``product-information`` carries ``model-name``, which holds the size (``...16x16...``);
  ``port-config/port`` carries ``port-id`` and ``status``; ``opm-power/port`` carries
  ``port-id`` and ``power`` in dBm.

The field names follow the module as used by published clients (ONOS's Polatis driver, lab
scripts); enumeration values of ``status`` and any leaf beyond those above need a real switch to
confirm.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from urllib.parse import parse_qs, urlsplit

from lxml import etree

NC_NS = "urn:ietf:params:xml:ns:netconf:base:1.0"
OPSW_NS = "http://www.polatis.com/yang/optical-switch"
#: First revision whose cross-connect list is named ``pair`` (older: ``pairs``).
PAIR_REVISION = "2017-08-04"
CURRENT_REVISION = "2017-08-04"

_SIZE_RE = re.compile(r"(\d+)\s*[xX]\s*(\d+|CC)\b")
_REVISION_RE = re.compile(r"^\d{4}-\d{2}-\d{2}$")


def _q(tag: str, ns: str = OPSW_NS) -> str:
    return f"{{{ns}}}{tag}"


def capability(revision: str = CURRENT_REVISION) -> str:
    """The hello capability URI announcing the module at ``revision``."""
    return f"{OPSW_NS}?module=optical-switch&revision={revision}"


def optical_switch_revision(capabilities: Iterable[str]) -> str | None:
    """The ``optical-switch`` module revision announced in a hello, or None if absent."""
    for cap in capabilities:
        parts = urlsplit(str(cap).strip())
        if f"{parts.scheme}://{parts.netloc}{parts.path}" != OPSW_NS:
            continue
        query = parse_qs(parts.query.replace("&amp;", "&"))
        if query.get("module", ["optical-switch"])[0] != "optical-switch":
            continue
        revision = query.get("revision", [""])[0]
        return revision if _REVISION_RE.match(revision) else None
    return None


def pair_list_name(revision: str) -> str:
    """``pair`` from revision 2017-08-04 on, ``pairs`` before (ISO dates compare as text)."""
    if not _REVISION_RE.match(revision):
        raise ValueError(f"not a YANG revision date: {revision!r}")
    return "pair" if revision >= PAIR_REVISION else "pairs"


# --- filters -------------------------------------------------------------------------------

def crossconnects_filter() -> str:
    """Subtree filter selecting every cross-connect."""
    return f'<cross-connects xmlns="{OPSW_NS}"/>'


def product_information_filter() -> str:
    return f'<product-information xmlns="{OPSW_NS}"/>'


def port_config_filter() -> str:
    """Subtree filter for every port's id and status."""
    return f'<port-config xmlns="{OPSW_NS}"><port><port-id/><status/></port></port-config>'


def opm_power_filter() -> str:
    """Subtree filter for every port's measured optical power."""
    return f'<opm-power xmlns="{OPSW_NS}"><port><port-id/><power/></port></opm-power>'


# --- edits ---------------------------------------------------------------------------------

def edit_crossconnects(add: Sequence[tuple[int, int]], delete_ingress: Sequence[int],
                       list_name: str = "pair") -> str:
    """The ``<config>`` of one batched ``edit-config``: deletes first, then merges.

    Deletes are keyed by ingress alone, as the module keys the list; creates carry an explicit
    ``nc:operation="merge"``.
    """
    if list_name not in ("pair", "pairs"):
        raise ValueError(f"list name must be 'pair' or 'pairs', got {list_name!r}")
    config = etree.Element(_q("config", NC_NS), nsmap={"nc": NC_NS})
    cc = etree.SubElement(config, _q("cross-connects"), nsmap={None: OPSW_NS})
    for ingress in delete_ingress:
        entry = etree.SubElement(cc, _q(list_name))
        entry.set(_q("operation", NC_NS), "delete")
        etree.SubElement(entry, _q("ingress")).text = str(int(ingress))
    for ingress, egress in add:
        entry = etree.SubElement(cc, _q(list_name))
        entry.set(_q("operation", NC_NS), "merge")
        etree.SubElement(entry, _q("ingress")).text = str(int(ingress))
        etree.SubElement(entry, _q("egress")).text = str(int(egress))
    return etree.tostring(config).decode()


# --- parsing replies -----------------------------------------------------------------------

def _element(data: etree._Element | str | bytes) -> etree._Element:
    if isinstance(data, str | bytes):
        parser = etree.XMLParser(resolve_entities=False, no_network=True)
        return etree.fromstring(data.encode() if isinstance(data, str) else data, parser)
    return data


def _int(elem: etree._Element | None, what: str) -> int:
    text = (elem.text or "").strip() if elem is not None else ""
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{what} is not an integer: {text!r}") from None


def parse_pairs(data: etree._Element | str | bytes) -> dict[int, int]:
    """``ingress -> egress`` from a reply's data (either list name, any nesting)."""
    root = _element(data)
    out: dict[int, int] = {}
    for name in ("pair", "pairs"):
        for entry in root.iter(_q(name)):
            if entry.getparent() is None or entry.getparent().tag != _q("cross-connects"):
                continue
            ingress = _int(entry.find(_q("ingress")), "cross-connect ingress")
            out[ingress] = _int(entry.find(_q("egress")), f"egress of ingress {ingress}")
    return out


@dataclass(frozen=True)
class ProductInfo:
    """What ``product-information`` says; ``ingress_ports``/``egress_ports`` from the model."""

    manufacturer: str
    model: str
    serial: str
    software: str
    ingress_ports: int
    egress_ports: int  # 0 for an N x CC (any-to-any) switch


def size_from_model(model: str) -> tuple[int, int] | None:
    """``(ingress, egress)`` counts from a model name such as ``N-VST-48x48-HU1``."""
    m = _SIZE_RE.search(model)
    if not m:
        return None
    return int(m.group(1)), 0 if m.group(2) == "CC" else int(m.group(2))


def parse_product_information(data: etree._Element | str | bytes) -> ProductInfo:
    root = _element(data)
    info = next(root.iter(_q("product-information")), None)
    if info is None:
        raise ValueError("reply has no product-information")

    def text(tag: str) -> str:
        elem = info.find(_q(tag))
        return (elem.text or "").strip() if elem is not None else ""

    model = text("model-name")
    size = size_from_model(model)
    if size is None:
        raise ValueError(f"cannot read the switch size from model-name {model!r}")
    return ProductInfo(text("manufacturer"), model, text("serial-number"),
                       text("software-version"), size[0], size[1])


def parse_port_status(data: etree._Element | str | bytes) -> dict[int, str]:
    """``port-id -> status`` (e.g. ENABLED, DISABLED, FAILED) from ``port-config``."""
    root = _element(data)
    out: dict[int, str] = {}
    for cfg in root.iter(_q("port-config")):
        for port in cfg.iter(_q("port")):
            status = port.find(_q("status"))
            if status is None:
                status = port.find(_q("port-status"))
            if status is not None and status.text:
                out[_int(port.find(_q("port-id")), "port-id")] = status.text.strip().upper()
    return out


def parse_opm_power(data: etree._Element | str | bytes) -> dict[int, float]:
    """``port-id -> power in dBm`` from ``opm-power``."""
    root = _element(data)
    out: dict[int, float] = {}
    for opm in root.iter(_q("opm-power")):
        for port in opm.iter(_q("port")):
            power = port.find(_q("power"))
            if power is not None and power.text:
                out[_int(port.find(_q("port-id")), "port-id")] = float(power.text)
    return out


_PATH_PORT_RE = re.compile(r"(ingress|egress|port-id)\s*=\s*['\"]?(\d+)")
_MSG_PORT_RE = re.compile(r"\b(ingress|egress|port)(?:\s+port)?\s+(\d+)", re.IGNORECASE)


def ports_in_error(path: str | None, message: str | None) -> list[tuple[str, int]]:
    """``(kind, device port)`` named by an rpc-error's path and message (kind: ingress/egress/
    port), in order of appearance and without duplicates."""
    found: list[tuple[str, int]] = []
    for m in [*_PATH_PORT_RE.finditer(path or ""), *_MSG_PORT_RE.finditer(message or "")]:
        kind = m.group(1).lower()
        item = ("port" if kind == "port-id" else kind, int(m.group(2)))
        if item not in found:
            found.append(item)
    return found
