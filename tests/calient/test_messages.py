"""The CALIENT TL1 wire forms: commands as public clients send them, replies as switches print
them (the captured lines in QualiSystems/cloudshell-L1-calient's tests have this shape)."""

from __future__ import annotations

import math

import pytest

from controller.drivers.calient import wire
from controller.drivers.polatis.tl1 import Tl1Framer, format_reply, parse_reply


def test_port_names_follow_shelf_slot_port_and_sort_as_triples() -> None:
    assert [wire.port_name(i) for i in (1, 8, 9, 64, 65)] == [
        "1.1.1", "1.1.8", "1.2.1", "1.8.8", "2.1.1"]
    names = ["1.2.1", "1.10.1", "1.1.2"]
    assert sorted(names, key=wire.port_key) == ["1.1.2", "1.2.1", "1.10.1"]
    with pytest.raises(ValueError, match="not a CALIENT port name"):
        wire.port_key("1-1-1")
    with pytest.raises(ValueError, match="must be >= 1"):
        wire.port_name(0)


def test_connection_names_two_way_dash_one_way_arrow() -> None:
    assert wire.conn_name("1.1.1", "1.1.2", True) == "1.1.1-1.1.2"
    assert wire.conn_name("1.1.1", "1.1.2", False) == "1.1.1>1.1.2"
    assert wire.parse_conn_name("2.3.6-3.2.5") == ("2.3.6", "3.2.5", True)
    assert wire.parse_conn_name("2.8.5>2.3.3") == ("2.8.5", "2.3.3", False)
    assert wire.parse_conn_name("SYSTEM") is None


def test_command_forms() -> None:
    assert wire.ent_crs("1.1.1", "1.1.2", True, 7) == "ENT-CRS::1.1.1,1.1.2:7::,2WAY;"
    assert wire.ent_crs("1.1.1", "1.1.2", False, 7) == "ENT-CRS::1.1.1,1.1.2:7::,1WAY;"
    assert wire.act_crs("1.1.1", "1.1.2", True, 8) == "ACT-CRS::1.1.1,1.1.2:8::1.1.1-1.1.2;"
    assert wire.canc_crs("1.1.1", "1.1.2", False, 9) == "CANC-CRS::1.1.1,1.1.2:9::1.1.1>1.1.2;"
    assert (wire.dlt_crs("1.1.1", "1.1.2", True, 10)
            == "DLT-CRS::1.1.1,1.1.2:10::,SYSTEM,1.1.1-1.1.2;")
    assert wire.rtrv_crs(3) == "RTRV-CRS:::3::ALL;"
    assert wire.rtrv_port(3) == "RTRV-PORT::ALL:3;"
    assert wire.rtrv_port_sum(3) == "RTRV-PORT-SUM::ALL:3;"
    assert wire.rtrv_ne(3) == "RTRV-NE:::3;"


def test_rtrv_crs_lines_parse_into_connections() -> None:
    data = ("2.3.6-3.2.5:SRCPORT=2.3.6,DSTPORT=3.2.5,GRPNAME=LAB,CONNNAME=2.3.6-3.2.5,"
            "CONNTYPE=2WAY,AS=UMA,OS=RDY,OC=OK,PS=UPR,AL=CL",
            "2.8.5>2.3.3:SRCPORT=2.8.5,DSTPORT=2.3.3,GRPNAME=LAB,CONNNAME=2.8.5>2.3.3,"
            "CONNTYPE=1WAY,AS=IS,OS=IS,OC=FAIL,PS=UPR,AL=CL",
            "garbage without fields")
    a, b = wire.parse_crs(data)
    assert (a.name, a.two_way, a.admin, a.oper, a.in_service) == (
        "2.3.6-3.2.5", True, "UMA", "RDY", False)
    assert (b.name, b.two_way, b.capacity, b.in_service, b.group) == (
        "2.8.5>2.3.3", False, "FAIL", True, "LAB")
    assert wire.parse_crs([a.to_line()]) == [a]


def test_port_and_power_lines() -> None:
    ports = wire.parse_ports([
        "1.1.1:WX,NONE,NONE:INAS=OOS-NP,INOS=OOS,INOC=OK,INRS=NPR,OUTAS=OOS-NP,OUTOS=OOS,"
        "OUTOC=OK,OUTRS=NPR",
        wire.PortHealth("1.1.2", in_ok=False).to_line(connected=True)])
    assert [(p.name, p.in_ok, p.out_ok) for p in ports] == [
        ("1.1.1", True, True), ("1.1.2", False, True)]
    power = wire.parse_port_sum([
        "1.1.1:ALIAS=NONE,INPWR=NONE,OUTPWR=NONE,CONNNAME1=1.1.1>1.1.2,CONNSTATE1=ACT,"
        "CONNNAME2=NONE,CONNSTATE2=NONE",
        wire.port_sum_line("1.1.2", -3.0, -4.5, [("1.1.1>1.1.2", True)])])
    assert power["1.1.1"] == (-math.inf, -math.inf)  # NONE: no light, below any threshold
    assert power["1.1.2"] == (-3.0, -4.5)


def test_rtrv_ne_and_reply_framing() -> None:
    line = wire.ne_line("CALIENT01TS", {"SERIALNUMBER": "C0001", "SWPACKAGE": "6.0-3",
                                        "STATUS": "OK", "CHASSISTYPE": "S320"})
    text = format_reply("4", data=[line], sid="CALIENT01TS", now_s=0)
    assert text.splitlines()[2] == "   CALIENT01TS 70-01-01 00:00:00"
    (message,) = Tl1Framer().feed(text)
    reply = parse_reply(message)
    assert reply is not None and reply.ok and reply.ctag == "4"
    assert wire.parse_ne(reply.data)["CHASSISTYPE"] == "S320"
    deny = parse_reply(format_reply("5", ok=False, code="SAAS", comment="Invalid Connection"))
    assert deny is not None and not deny.ok and deny.code == "SAAS"
    assert deny.text == "Invalid Connection"
