"""ncclient, used directly as an independent client, against the simulated switch."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from ncclient import manager
from ncclient.operations.rpc import RPCError
from ncclient.transport.session import NetconfBase

from emulator.polatis import NetconfServer, PolatisDevice

from .conftest import PASSWORD, SIZE

OPSW = "http://www.polatis.com/yang/optical-switch"
NC = "urn:ietf:params:xml:ns:netconf:base:1.0"
CC_FILTER = f'<cross-connects xmlns="{OPSW}"/>'


def _connect(server: NetconfServer) -> Any:
    return manager.connect(host="127.0.0.1", port=server.port, username="admin",
                           password=PASSWORD, hostkey_verify=False, look_for_keys=False,
                           allow_agent=False, timeout=5)


@pytest.fixture
def m(netconf: NetconfServer) -> Iterator[Any]:
    with _connect(netconf) as mgr:
        yield mgr


def _pairs(mgr: Any) -> dict[int, int]:
    data = mgr.get(filter=("subtree", CC_FILTER)).data_ele
    return {int(p.findtext(f"{{{OPSW}}}ingress")): int(p.findtext(f"{{{OPSW}}}egress"))
            for p in data.iter(f"{{{OPSW}}}pair")}


def _edit(mgr: Any, body: str, **kw: Any) -> Any:
    return mgr.edit_config(target="running", config=(
        f'<nc:config xmlns:nc="{NC}"><cross-connects xmlns="{OPSW}">{body}</cross-connects>'
        "</nc:config>"), **kw)


def test_hello_announces_the_module_revision_and_base11_chunked_framing(m: Any) -> None:
    caps = list(m.server_capabilities)
    assert f"{OPSW}?module=optical-switch&revision=2017-08-04" in caps
    assert "urn:ietf:params:netconf:base:1.1" in caps
    assert m._session._base == NetconfBase.BASE_11  # both spoke 1.1: chunked framing
    assert m.session_id


def test_base10_only_device_uses_end_of_message_framing(device: PolatisDevice) -> None:
    with NetconfServer(device, password=PASSWORD, base11=False) as server, \
            _connect(server) as mgr:
        assert mgr._session._base == NetconfBase.BASE_10
        _edit(mgr, "<pair><ingress>1</ingress><egress>9</egress></pair>")
        assert _pairs(mgr) == {1: 9}


def test_merge_then_delete_with_prefixed_and_bare_operation(m: Any) -> None:
    _edit(m, f'<pair xmlns:nc="{NC}" nc:operation="merge"><ingress>1</ingress>'
             "<egress>10</egress></pair><pair><ingress>2</ingress><egress>9</egress></pair>")
    assert _pairs(m) == {1: 10, 2: 9}
    _edit(m, f'<pair xmlns:nc="{NC}" nc:operation="delete"><ingress>1</ingress></pair>')
    _edit(m, '<pair operation="delete"><ingress>2</ingress></pair>')  # as ONOS sends it
    assert _pairs(m) == {}


def test_remove_of_an_absent_pair_is_fine_and_replace_swaps_everything(m: Any) -> None:
    _edit(m, '<pair operation="remove"><ingress>3</ingress></pair>')
    _edit(m, "<pair><ingress>1</ingress><egress>10</egress></pair>")
    m.edit_config(target="running", config=(
        f'<config xmlns="{NC}"><cross-connects xmlns="{OPSW}" operation="replace"><pair>'
        "<ingress>4</ingress><egress>12</egress></pair></cross-connects></config>"))
    assert _pairs(m) == {4: 12}


def test_get_config_has_no_state_and_get_filters_by_content(m: Any) -> None:
    _edit(m, "<pair><ingress>1</ingress><egress>10</egress></pair>")
    config = m.get_config(source="running").data_ele
    assert config.find(f"{{{OPSW}}}cross-connects") is not None
    assert config.find(f"{{{OPSW}}}opm-power") is None
    data = m.get(filter=("subtree", f'<opm-power xmlns="{OPSW}"><port><port-id>10</port-id>'
                                    "<power/></port></opm-power>")).data_ele
    ports = list(data.iter(f"{{{OPSW}}}port"))
    assert len(ports) == 1 and float(ports[0].findtext(f"{{{OPSW}}}power")) > -10
    info = m.get(filter=("subtree", f'<product-information xmlns="{OPSW}"/>')).data_ele
    assert f"{SIZE}x{SIZE}" in info.findtext(f".//{{{OPSW}}}model-name")


@pytest.mark.parametrize(("body", "tag", "words"), [
    ("<pair><ingress>99</ingress><egress>10</egress></pair>", "invalid-value", "ingress port 99"),
    ("<pair><ingress>2</ingress><egress>10</egress></pair>", "in-use",
     "egress port 10 is already in use by ingress 1"),
    ('<pair operation="delete"><ingress>5</ingress></pair>', "data-missing", "ingress port 5"),
    ("<pairs><ingress>3</ingress><egress>11</egress></pairs>", "unknown-element", "pair"),
])
def test_rpc_errors_name_the_port_and_the_reason(m: Any, body: str, tag: str,
                                                 words: str) -> None:
    _edit(m, "<pair><ingress>1</ingress><egress>10</egress></pair>")
    with pytest.raises(RPCError) as err:
        _edit(m, body)
    assert err.value.tag == tag and words in err.value.message
    assert _pairs(m) == {1: 10}  # nothing changed
    if tag in ("invalid-value", "in-use"):
        assert "ingress=" in (err.value.path or "")


def test_old_revision_device_serves_pairs(device: PolatisDevice) -> None:
    old = PolatisDevice(SIZE, revision="2016-03-11", switching_time_ms=0.0)
    with NetconfServer(old, password=PASSWORD) as server, _connect(server) as mgr:
        assert f"{OPSW}?module=optical-switch&revision=2016-03-11" in list(
            mgr.server_capabilities)
        _edit(mgr, "<pairs><ingress>1</ingress><egress>9</egress></pairs>")
        data = mgr.get(filter=("subtree", CC_FILTER)).data_ele
        assert [e.findtext(f"{{{OPSW}}}egress") for e in data.iter(f"{{{OPSW}}}pairs")] == ["9"]
