"""The device's NETCONF datastore view: rendering, subtree filtering, edit-config parsing, errors.

Pure functions over lxml elements and a :class:`~emulator.polatis.model.PolatisDevice`:

* :func:`render` builds ``cross-connects`` (list ``pair`` or ``pairs`` by revision),
  ``port-config`` (configuration: ``port-id``, ``label``; state: ``status``) and, for ``get``
  only, ``product-information`` and ``opm-power``;
* :func:`subtree_filter` implements RFC 6241 section 6 (namespace, containment, selection and
  content-match nodes; attribute matches are not supported);
* :func:`parse_edit` turns an ``edit-config``'s ``<config>`` into :class:`EditOp` values,
  accepting the ``operation`` attribute both prefixed with the NETCONF namespace and bare (real
  clients send both), inherited from ``cross-connects`` to its entries.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence

from lxml import etree

from controller.drivers.polatis.xml import NC_NS, OPSW_NS
from emulator.polatis.model import OPERATIONS, DeviceError, EditOp, PolatisDevice

NC_OPERATION = f"{{{NC_NS}}}operation"


def _q(tag: str, ns: str = OPSW_NS) -> str:
    return f"{{{ns}}}{tag}"


def _leaf(parent: etree._Element, tag: str, text: object) -> None:
    etree.SubElement(parent, _q(tag)).text = str(text)


def render(device: PolatisDevice, now_s: float, *, config_only: bool) -> list[etree._Element]:
    """The top-level data nodes of the running datastore (with state unless ``config_only``)."""
    nodes = []
    cc = etree.Element(_q("cross-connects"), nsmap={None: OPSW_NS})
    for ingress, egress in sorted(device.pairs().items()):
        entry = etree.SubElement(cc, _q(device.list_name))
        _leaf(entry, "ingress", ingress)
        _leaf(entry, "egress", egress)
    nodes.append(cc)
    ports = etree.Element(_q("port-config"), nsmap={None: OPSW_NS})
    for p in range(1, 2 * device.size + 1):
        port = etree.SubElement(ports, _q("port"))
        _leaf(port, "port-id", p)
        _leaf(port, "label", f"{'in' if device.is_ingress(p) else 'out'}{p}")
        if not config_only:
            _leaf(port, "status", device.port_status(p))
    nodes.append(ports)
    if config_only:
        return nodes
    info = etree.Element(_q("product-information"), nsmap={None: OPSW_NS})
    _leaf(info, "manufacturer", "Polatis (simulated)")
    _leaf(info, "serial-number", device.serial)
    _leaf(info, "model-name", device.model)
    _leaf(info, "software-version", device.software)
    nodes.append(info)
    opm = etree.Element(_q("opm-power"), nsmap={None: OPSW_NS})
    for p, dbm in device.opm_power(now_s).items():
        port = etree.SubElement(opm, _q("port"))
        _leaf(port, "port-id", p)
        _leaf(port, "power", f"{dbm:.2f}")
    nodes.append(opm)
    return nodes


# --- subtree filtering (RFC 6241 section 6) ------------------------------------------------

def _children(elem: etree._Element) -> list[etree._Element]:
    return [c for c in elem if isinstance(c.tag, str)]


def _same_node(filt: etree._Element, data: etree._Element) -> bool:
    f, d = etree.QName(filt), etree.QName(data)
    return f.localname == d.localname and (f.namespace is None or f.namespace == d.namespace)


def _text(elem: etree._Element) -> str:
    return (elem.text or "").strip()


def _filter_node(data: etree._Element, filt: etree._Element) -> etree._Element | None:
    children = _children(filt)
    if not children:
        if _text(filt):  # content match on a leaf
            return copy.deepcopy(data) if _text(data) == _text(filt) else None
        return copy.deepcopy(data)  # selection node: the whole subtree
    content = [c for c in children if not _children(c) and _text(c)]
    others = [c for c in children if c not in content]
    data_children = _children(data)
    for c in content:
        if not any(_same_node(c, d) and _text(d) == _text(c) for d in data_children):
            return None
    out = etree.Element(data.tag, attrib=dict(data.attrib), nsmap=data.nsmap)
    if not others:  # only content matches: the whole entry
        for d in data_children:
            out.append(copy.deepcopy(d))
        return out
    for d in data_children:
        if any(_same_node(c, d) for c in content):
            out.append(copy.deepcopy(d))
            continue
        for c in others:
            if _same_node(c, d):
                picked = _filter_node(d, c)
                if picked is not None:
                    out.append(picked)
                break
    if not _children(out) and not content:
        return None
    return out


def subtree_filter(nodes: Sequence[etree._Element],
                   filt: etree._Element | None) -> list[etree._Element]:
    """The parts of ``nodes`` a ``<filter type="subtree">`` selects (all if no filter)."""
    if filt is None:
        return list(nodes)
    out = []
    for f in _children(filt):
        for node in nodes:
            if _same_node(f, node):
                picked = _filter_node(node, f)
                if picked is not None:
                    out.append(picked)
    return out


# --- edit-config -------------------------------------------------------------------------

def _operation(elem: etree._Element) -> str | None:
    op = elem.get(NC_OPERATION) or elem.get("operation")
    if op is not None and op not in OPERATIONS:
        raise DeviceError("bad-attribute", f"unknown operation {op!r} on "
                          f"{etree.QName(elem).localname}")
    return op


def parse_edit(config: etree._Element, *, list_name: str, revision: str,
               default_operation: str = "merge") -> tuple[list[EditOp], bool]:
    """``(ops, clear_first)`` from the ``<config>`` of an edit-config."""
    if default_operation not in ("merge", "replace", "none"):
        raise DeviceError("invalid-value", f"default-operation {default_operation!r} is not "
                          "merge, replace or none")
    ops: list[EditOp] = []
    clear_first = False
    for top in _children(config):
        name = etree.QName(top)
        if name.localname != "cross-connects":
            raise DeviceError("operation-not-supported", f"editing {name.localname} is not "
                              "supported by this simulator (only cross-connects)")
        if name.namespace != OPSW_NS:
            raise DeviceError("unknown-namespace", f"cross-connects must be in {OPSW_NS}, "
                              f"got {name.namespace!r}")
        container_op = _operation(top)
        entries = _children(top)
        if container_op in ("delete", "remove") and not entries:
            clear_first = True  # every cross-connect goes
            continue
        if container_op == "replace" or (container_op is None
                                         and default_operation == "replace"):
            clear_first = True
        inherited = container_op or ("merge" if default_operation == "replace"
                                     else default_operation)
        for entry in entries:
            local = etree.QName(entry).localname
            if local != list_name or etree.QName(entry).namespace != OPSW_NS:
                hint = (f"; optical-switch revision {revision} names the list {list_name!r}"
                        if local in ("pair", "pairs") else "")
                raise DeviceError("unknown-element", f"unknown element {local!r} in "
                                  f"cross-connects{hint}")
            op = _operation(entry) or inherited
            ingress_elem = entry.find(_q("ingress"))
            if ingress_elem is None:
                raise DeviceError("missing-element", f"a {list_name} entry without its key "
                                  "'ingress'")
            ingress = _port(ingress_elem, "ingress")
            egress_elem = entry.find(_q("egress"))
            egress = _port(egress_elem, "egress") if egress_elem is not None else None
            if op == "none":
                continue
            ops.append(EditOp(op, ingress, egress))
    return ops, clear_first


def _port(elem: etree._Element, what: str) -> int:
    text = _text(elem)
    if not text.isdigit():
        raise DeviceError("invalid-value", f"{what} must be a port number, got {text!r}")
    return int(text)


# --- replies -------------------------------------------------------------------------------

def rpc_error(err: DeviceError) -> etree._Element:
    """An ``<rpc-error>`` element for ``err``."""
    elem = etree.Element(_q("rpc-error", NC_NS), nsmap={None: NC_NS})
    kind = "protocol" if err.tag in ("malformed-message", "unknown-element",
                                     "unknown-namespace", "bad-attribute",
                                     "operation-not-supported", "missing-attribute") \
        else "application"
    etree.SubElement(elem, _q("error-type", NC_NS)).text = kind
    etree.SubElement(elem, _q("error-tag", NC_NS)).text = err.tag
    etree.SubElement(elem, _q("error-severity", NC_NS)).text = "error"
    if err.path:
        path = etree.SubElement(elem, _q("error-path", NC_NS), nsmap={"opsw": OPSW_NS})
        path.text = err.path
    msg = etree.SubElement(elem, _q("error-message", NC_NS))
    msg.set("{http://www.w3.org/XML/1998/namespace}lang", "en")
    msg.text = err.message
    return elem
