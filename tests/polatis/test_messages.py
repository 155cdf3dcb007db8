"""Wire formats, checked against the forms the optical-switch YANG module and TL1 define."""

from __future__ import annotations

import pytest
from lxml import etree

from controller.drivers.polatis import tl1, xml
from controller.drivers.polatis.ports import PortMap
from controller.ocs import Circuit
from emulator.polatis.framing import EOM, FrameError, Framer, encode

NC = "urn:ietf:params:xml:ns:netconf:base:1.0"
OPSW = "http://www.polatis.com/yang/optical-switch"


def _entries(config: str, name: str = "pair") -> list[etree._Element]:
    root = etree.fromstring(config.encode())
    assert root.tag == f"{{{NC}}}config"
    (cc,) = list(root)
    assert cc.tag == f"{{{OPSW}}}cross-connects"
    assert all(e.tag == f"{{{OPSW}}}{name}" for e in cc)
    return list(cc)


def test_create_is_a_merge_of_pair_entries_with_ingress_and_egress() -> None:
    (entry,) = _entries(xml.edit_crossconnects(add=[(1, 10)], delete_ingress=[]))
    assert entry.get(f"{{{NC}}}operation") == "merge"
    assert [(c.tag.split("}")[1], c.text) for c in entry] == [("ingress", "1"), ("egress", "10")]


def test_delete_is_keyed_by_ingress_alone_and_comes_before_creates() -> None:
    first, second = _entries(xml.edit_crossconnects(add=[(3, 12)], delete_ingress=[3]))
    assert first.get(f"{{{NC}}}operation") == "delete"
    assert [(c.tag.split("}")[1], c.text) for c in first] == [("ingress", "3")]
    assert second.get(f"{{{NC}}}operation") == "merge"


def test_old_revisions_name_the_list_pairs() -> None:
    caps = ["urn:ietf:params:netconf:base:1.0",
            f"{OPSW}?module=optical-switch&amp;revision=2016-03-11"]
    revision = xml.optical_switch_revision(caps)
    assert revision == "2016-03-11"
    assert xml.pair_list_name(revision) == "pairs"
    assert xml.pair_list_name("2017-08-04") == "pair"
    assert xml.pair_list_name("2021-01-01") == "pair"
    _entries(xml.edit_crossconnects([(1, 9)], [2], "pairs"), "pairs")


def test_revision_is_none_without_the_optical_switch_capability() -> None:
    assert xml.optical_switch_revision(["urn:ietf:params:netconf:base:1.1"]) is None
    assert xml.optical_switch_revision([f"{OPSW}-other?module=x&revision=2017-08-04"]) is None


def test_read_filter_is_the_cross_connects_subtree() -> None:
    elem = etree.fromstring(xml.crossconnects_filter().encode())
    assert elem.tag == f"{{{OPSW}}}cross-connects" and len(elem) == 0


def test_size_comes_from_the_model_name() -> None:
    data = (f'<data xmlns="{NC}"><product-information xmlns="{OPSW}"><manufacturer>Polatis'
            "</manufacturer><model-name>N-VST-48x48-HU1-DMHNV-405</model-name>"
            "<serial-number>123</serial-number></product-information></data>")
    info = xml.parse_product_information(data)
    assert (info.ingress_ports, info.egress_ports, info.serial) == (48, 48, "123")
    assert xml.size_from_model("POL-192xCC") == (192, 0)
    assert xml.size_from_model("no size here") is None


def test_pairs_parse_from_either_list_name() -> None:
    for name in ("pair", "pairs"):
        data = (f'<data xmlns="{NC}"><cross-connects xmlns="{OPSW}"><{name}><ingress>2'
                f"</ingress><egress>9</egress></{name}></cross-connects></data>")
        assert xml.parse_pairs(data) == {2: 9}


def test_rpc_error_ports_come_from_the_path_and_the_message() -> None:
    found = xml.ports_in_error("/opsw:cross-connects/opsw:pair[opsw:ingress='5']/opsw:egress",
                              "egress port 12 is already in use by ingress 4")
    assert found == [("ingress", 5), ("egress", 12), ("ingress", 4)]


def test_tl1_commands_have_the_documented_forms() -> None:
    assert tl1.act_user("admin", "root", 7) == "ACT-USER::admin:7::root;"
    assert tl1.ent_patch(1, 17, 8) == "ENT-PATCH::1,17:8:;"
    assert tl1.dlt_patch(1, 9) == "DLT-PATCH::1:9:;"
    assert tl1.rtrv_patch(10) == "RTRV-PATCH:::10:;"
    assert tl1.canc_user("admin", 11) == "CANC-USER::admin:11:;"
    assert tl1.rtrv_port_shutter(1, 16, 12) == "RTRV-PORT-SHUTTER::1&&16:12:;"


def test_tl1_shutter_states_read_as_port_status() -> None:
    # OPEN/CLOSED as public Polatis TL1 clients read them; other states pass through
    data = ["1:OPEN", "2:CLOSED", " 3 : failed ", "junk"]
    assert tl1.parse_port_shutter(data) == {1: "ENABLED", 2: "DISABLED", 3: "FAILED"}
    assert [tl1.shutter_state(s) for s in ("ENABLED", "DISABLED", "FAILED")] == [
        "OPEN", "CLOSED", "FAILED"]


REPLY_OK = '\r\n\n   POLATIS 24-05-01 10:00:00\r\nM  12 COMPLD\r\n   "1,17"\r\n   "2,18"\r\n;\r\n'
REPLY_DENY = ("\r\n\n   POLATIS 24-05-01 10:00:01\r\nM  13 DENY\r\n   SAAS\r\n"
              "   /* egress port 18 is already in use by ingress 2 */\r\n;\r\n")


def test_tl1_replies_parse_compld_data_and_deny_codes() -> None:
    ok = tl1.parse_reply(REPLY_OK)
    assert ok is not None and ok.ok and ok.ctag == "12"
    assert tl1.parse_patches(ok.data) == {1: 17, 2: 18}
    deny = tl1.parse_reply(REPLY_DENY)
    assert deny is not None and not deny.ok and deny.code == "SAAS"
    assert "in use" in deny.text


def test_tl1_framing_handles_split_and_joined_messages() -> None:
    autonomous = "\r\n\n   POLATIS 24-05-01 10:00:00\r\nA  1 REPT ALM\r\n;\r\n"
    stream = autonomous + REPLY_OK + REPLY_DENY
    framer = tl1.Tl1Framer()
    messages = []
    for i in range(0, len(stream), 7):  # arbitrary cuts
        messages += framer.feed(stream[i:i + 7])
    assert len(messages) == 3
    assert tl1.parse_reply(messages[0]) is None  # autonomous: not a reply
    assert [r.ctag for r in map(tl1.parse_reply, messages[1:]) if r] == ["12", "13"]


def test_tl1_server_side_round_trip() -> None:
    cmd = tl1.parse_command("ENT-PATCH::1,17:42:")
    assert (cmd.verb, cmd.aid, cmd.ctag) == ("ENT-PATCH", "1,17", "42")
    reply = tl1.parse_reply(tl1.format_reply("42", ok=False, code="IIAC", comment="port 99"))
    assert reply is not None and (reply.ok, reply.code, reply.text) == (False, "IIAC", "port 99")
    with pytest.raises(ValueError):
        tl1.parse_command("RTRV-PATCH")


def test_rfc6242_chunked_and_end_of_message_framing() -> None:
    framer = Framer()
    framer.feed(b"<hello/>" + EOM + b"\n#4\n<rpc\n#3\n/>x\n##\n" + encode(b"<b/>", chunked=True))
    assert framer.pop() == b"<hello/>"
    assert framer.pop() is None  # still end-of-message mode: no EOM yet
    framer.chunked = True
    assert framer.pop() == b"<rpc/>x"
    assert framer.pop() == b"<b/>"
    assert framer.pop() is None
    framer.feed(b"\n#x\n")
    with pytest.raises(FrameError):
        framer.pop()


def test_duplex_circuit_maps_to_two_pairs_and_back() -> None:
    pm = PortMap(rail=0, size=8, ports=(1, 2, 3, 4))
    assert pm.pairs_of(Circuit(0, 3, 1)) == ((1, 11), (3, 9))
    view = pm.decode({1: 11, 3: 9, 2: 12, 7: 15})  # 2->4 is one-way; 7->7 is foreign
    assert view.circuits == {Circuit(0, 1, 3)}
    assert set(view.stray) == {2, 4}
    assert view.stray_pairs == {(2, 12)}
    with pytest.raises(ValueError, match="do not fit"):
        PortMap(rail=1, size=4, ports=(1, 5))
