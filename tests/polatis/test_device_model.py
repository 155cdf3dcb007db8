"""The simulated device as pure state: validation, switching time, faults, datastore."""

from __future__ import annotations

import pytest
from lxml import etree

from emulator.polatis.datastore import parse_edit, render, subtree_filter
from emulator.polatis.model import DARK_DBM, DeviceError, EditOp, PolatisDevice

OPSW = "http://www.polatis.com/yang/optical-switch"
NC = "urn:ietf:params:xml:ns:netconf:base:1.0"


def _device() -> PolatisDevice:
    device = PolatisDevice(4, switching_time_ms=25.0)
    device.load({1: 6, 2: 5})
    return device


@pytest.mark.parametrize(("ops", "tag", "named"), [
    ([EditOp("merge", 9, 5)], "invalid-value", "ingress port 9"),
    ([EditOp("merge", 3, 2)], "invalid-value", "egress port 2"),
    ([EditOp("merge", 3, 6)], "in-use", "egress port 6 is already in use by ingress 1"),
    ([EditOp("delete", 4)], "data-missing", "ingress port 4"),
    ([EditOp("create", 1, 7)], "data-exists", "ingress port 1"),
    ([EditOp("merge", 3, None)], "missing-element", "ingress 3"),
])
def test_invalid_edits_are_refused_naming_the_port_and_change_nothing(
        ops: list[EditOp], tag: str, named: str) -> None:
    device = _device()
    with pytest.raises(DeviceError) as err:
        device.perform(ops)
    assert err.value.tag == tag and named in err.value.message
    assert device.pairs() == {1: 6, 2: 5} and device.edits == 0


def test_a_freed_egress_can_be_reused_in_the_same_edit() -> None:
    device = _device()
    change = device.perform([EditOp("delete", 1), EditOp("merge", 3, 6)])
    assert device.pairs() == {2: 5, 3: 6}
    assert change.removed == {1: 6} and change.added == {3: 6}


def test_touched_egress_ports_read_dark_for_the_switching_time() -> None:
    device = _device()
    lit = device.input_power_dbm - device.insertion_loss_db
    change = device.plan([EditOp("delete", 1), EditOp("merge", 3, 6)])
    light_at = device.commit(change, now_s=100.0)
    assert light_at == pytest.approx(100.025)
    assert device.power_dbm(6, 100.010) == DARK_DBM  # being switched
    assert device.power_dbm(5, 100.010) == lit  # untouched circuit keeps its light
    assert device.power_dbm(3, 100.010) == device.input_power_dbm  # ingress light arrives
    assert device.power_dbm(6, 100.030) == lit
    assert device.power_dbm(7, 100.030) == DARK_DBM  # unconnected egress


def test_a_failed_port_reports_failed_and_reads_dark() -> None:
    device = _device()
    device.faults.failed_ports.add(6)
    assert device.port_status(6) == "FAILED" and device.port_status(5) == "ENABLED"
    assert device.power_dbm(6, 0.0) == DARK_DBM


def test_drop_fault_fires_once_on_the_nth_edit() -> None:
    device = _device()
    device.faults.drop_after_edits = 2
    assert [device.faults.take_drop() for _ in range(3)] == [False, True, False]


def test_subtree_filter_selects_containment_selection_and_content_matches() -> None:
    device = _device()
    nodes = render(device, 0.0, config_only=False)
    filt = etree.fromstring(
        f'<filter xmlns="{NC}"><opm-power xmlns="{OPSW}"><port><port-id>6</port-id><power/>'
        f'</port></opm-power><cross-connects xmlns="{OPSW}"/></filter>')
    out = subtree_filter(nodes, filt)
    assert [etree.QName(n).localname for n in out] == ["opm-power", "cross-connects"]
    ports = out[0].findall(f"{{{OPSW}}}port")
    assert len(ports) == 1 and ports[0].findtext(f"{{{OPSW}}}port-id") == "6"
    assert len(out[1]) == 2  # both pairs, whole subtree
    config = render(device, 0.0, config_only=True)
    assert [etree.QName(n).localname for n in config] == ["cross-connects", "port-config"]


@pytest.mark.parametrize("attr", [f'nc:operation="delete" xmlns:nc="{NC}"', 'operation="delete"'])
def test_edit_accepts_prefixed_and_bare_operation_attributes(attr: str) -> None:
    config = etree.fromstring(
        f'<config xmlns="{NC}"><cross-connects xmlns="{OPSW}"><pair {attr}><ingress>1</ingress>'
        f'</pair><pair><ingress>3</ingress><egress>8</egress></pair></cross-connects></config>')
    ops, clear = parse_edit(config, list_name="pair", revision="2017-08-04")
    assert ops == [EditOp("delete", 1), EditOp("merge", 3, 8)] and not clear


def test_edit_with_the_wrong_list_name_for_the_revision_is_refused() -> None:
    config = etree.fromstring(f'<config xmlns="{NC}"><cross-connects xmlns="{OPSW}"><pair>'
                              "<ingress>1</ingress><egress>5</egress></pair></cross-connects>"
                              "</config>")
    with pytest.raises(DeviceError) as err:
        parse_edit(config, list_name="pairs", revision="2016-03-11")
    assert err.value.tag == "unknown-element" and "'pairs'" in err.value.message


def test_replace_on_the_container_replaces_every_pair() -> None:
    device = _device()
    config = etree.fromstring(
        f'<config xmlns="{NC}"><cross-connects xmlns="{OPSW}" operation="replace"><pair>'
        "<ingress>4</ingress><egress>5</egress></pair></cross-connects></config>")
    ops, clear = parse_edit(config, list_name="pair", revision="2017-08-04")
    device.perform(ops, clear_first=clear)
    assert device.pairs() == {4: 5}


def test_a_failed_port_refuses_new_cross_connects_but_deletes_its_own() -> None:
    device = _device()  # pairs 1->6 and 2->5 on a 4x4 switch
    device.faults.failed_ports.add(7)
    with pytest.raises(DeviceError) as err:
        device.perform([EditOp("merge", 3, 7)])
    assert err.value.tag == "operation-failed" and "port 7 is FAILED" in err.value.message
    assert device.pairs() == {1: 6, 2: 5}
    device.faults.failed_ports.add(1)
    device.perform([EditOp("delete", 1)])  # taking a failed port's pair down is allowed
    assert device.pairs() == {2: 5}
