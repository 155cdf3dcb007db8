"""testbed.cost.model and ``opus-testbed cost``: bills of materials, savings, Table 3, errors."""

from __future__ import annotations

import argparse
import io
import json
from pathlib import Path

import pytest

from testbed.cost.cli import register, run
from testbed.cost.model import (
    PAPER_COST_SAVING_PCT,
    PAPER_POWER_SAVING_PCT,
    ClusterSpec,
    CostModelError,
    PartsError,
    clos_rail,
    compare,
    default_parts_path,
    load_parts,
    max_servers_per_ocs,
    parse_parts,
    table3,
)

# A small parts file whose totals are easy to compute by hand.
SMALL = """\
packet_switch: {name: sw, ports: 4, price_usd: 1000, power_w: 100, source: test}
transceiver: {name: xcvr, price_usd: 10, power_w: 2, source: test}
ocs: {name: ocs, ports: 16, price_usd: 2000, power_w: 20, source: test}
"""


@pytest.fixture
def small(tmp_path: Path) -> Path:
    path = tmp_path / "parts.yaml"
    path.write_text(SMALL)
    return path


def with_line(text: str, old: str, new: str) -> str:
    assert old in text
    return text.replace(old, new)


# --- the Clos count ----------------------------------------------------------------------------


@pytest.mark.parametrize(("endpoints", "ports", "tiers", "switches", "transceivers"), [
    (1, 64, 1, 1, 2),
    (64, 64, 1, 1, 128),
    (65, 64, 2, 3 + 2, 2 * 65 * 2),          # leaves ceil(65/32), spines ceil(65/64)
    (192, 64, 2, 6 + 3, 2 * 192 * 2),
    (2048, 64, 2, 64 + 32, 2 * 2048 * 2),    # the largest 2-tier Clos of 64-port switches
    (2049, 64, 3, 2 * 65 + 33, 2 * 2049 * 3),
    (16, 4, 3, 8 + 8 + 4, 2 * 16 * 3),       # the k=4 fat tree: 20 switches, 16 hosts
])
def test_clos_rail_counts_tiers_switches_and_both_ends(
        endpoints: int, ports: int, tiers: int, switches: int, transceivers: int) -> None:
    rail = clos_rail(endpoints, ports)
    assert (rail.tiers, rail.switches, rail.transceivers) == (tiers, switches, transceivers)


def test_clos_rail_rejects_odd_ports_and_empty_rails() -> None:
    with pytest.raises(CostModelError, match="even"):
        clos_rail(8, 5)
    with pytest.raises(CostModelError, match="endpoint"):
        clos_rail(0, 64)


# --- hand-computed bills from the small parts file ---------------------------------------------


def test_one_switch_per_rail_by_hand(small: Path) -> None:
    # 4 servers x 2 GPUs: 2 rails of 4 endpoints, one 4-port switch each.
    # electrical: 2 switches (2000 USD, 200 W) + 16 transceivers (160 USD, 32 W)
    # photonic:   2 OCS (4000 USD, 40 W) + 8 NIC transceivers (80 USD, 16 W)
    result = compare(load_parts(small), ClusterSpec(servers=4, gpus_per_server=2),
                     count_nic_transceivers=True)
    assert (result.electrical.price_usd, result.electrical.power_w) == (2160.0, 232.0)
    assert (result.photonic.price_usd, result.photonic.power_w) == (4080.0, 56.0)
    assert result.cost_saving_pct == pytest.approx(100 * (1 - 4080 / 2160))  # -88.9 %: worse
    assert result.power_saving_pct == pytest.approx(100 * (1 - 56 / 232))


def test_two_tier_rail_by_hand(small: Path) -> None:
    # 8 servers x 2 GPUs; a rail of 8 on 4-port switches is a 2-tier Clos:
    # 4 leaves + 2 spines = 6 switches and 2 * 8 * 2 = 32 transceivers per rail.
    # electrical: 12 switches (12000 USD, 1200 W) + 64 transceivers (640 USD, 128 W)
    # photonic:   2 OCS, 16 of 16 ports used (4000 USD, 40 W) + 16 transceivers (160, 32 W)
    result = compare(load_parts(small), ClusterSpec(servers=8, gpus_per_server=2),
                     count_nic_transceivers=True)
    lines = {line.item: line.quantity for line in result.electrical.lines}
    assert lines == {"packet switches": 12, "transceivers, NIC side": 16,
                     "transceivers, switch side": 48}
    assert (result.electrical.price_usd, result.electrical.power_w) == (12640.0, 1328.0)
    assert (result.photonic.price_usd, result.photonic.power_w) == (4160.0, 72.0)
    assert result.cost_saving_pct == pytest.approx(100 * (1 - 4160 / 12640))  # 67.09 %
    assert result.power_saving_pct == pytest.approx(100 * (1 - 72 / 1328))    # 94.58 %


def test_nic_transceivers_are_left_out_of_both_bills_by_default(small: Path) -> None:
    result = compare(load_parts(small), ClusterSpec(servers=8, gpus_per_server=2))
    assert not result.nic_transceivers_counted
    assert {line.item for line in result.electrical.lines} == {"packet switches",
                                                               "transceivers, switch side"}
    assert (result.electrical.price_usd, result.electrical.power_w) == (12480.0, 1296.0)
    assert (result.photonic.price_usd, result.photonic.power_w) == (4000.0, 40.0)


def test_a_rail_larger_than_one_ocs_is_rejected_with_the_limit(small: Path) -> None:
    parts = load_parts(small)
    assert max_servers_per_ocs(parts) == 8
    with pytest.raises(CostModelError, match="at most 8 servers"):
        compare(parts, ClusterSpec(servers=9, gpus_per_server=2))


@pytest.mark.parametrize("field", ["servers", "gpus_per_server", "nic_ports"])
def test_cluster_sizes_must_be_positive(field: str) -> None:
    values = {"servers": 1, "gpus_per_server": 1, "nic_ports": 1, field: 0}
    with pytest.raises(CostModelError, match=field):
        ClusterSpec(**values)


# --- the shipped parts file and the paper ------------------------------------------------------


def test_shipped_parts_file_is_package_data_with_sources() -> None:
    path = default_parts_path()
    assert path.is_file() and path.parent.name == "cost" and path.parent.parent.name == "testbed"
    parts = load_parts()
    for part in (parts.packet_switch, parts.transceiver, parts.ocs):
        assert part.source and part.price_usd > 0 and part.power_w > 0


def test_shipped_figures_match_a_hand_count_of_the_shipped_file() -> None:
    parts = load_parts()
    sw, xc, ocs = parts.packet_switch, parts.transceiver, parts.ocs
    assert (sw.ports, ocs.ports) == (64, 384)  # the counts below assume these radixes
    # DGX H200, 8 rails of 384/2 = 192 servers; 192 > 64: 2-tier Clos per rail,
    # 6 leaves + 3 spines, 2 * 192 * 2 = 768 transceivers per rail (192 of them at NICs).
    electrical_usd = 8 * (9 * sw.price_usd + 768 * xc.price_usd)
    electrical_w = 8 * (9 * sw.power_w + 768 * xc.power_w)
    photonic_usd = 8 * (ocs.price_usd + 192 * xc.price_usd)
    photonic_w = 8 * (ocs.power_w + 192 * xc.power_w)
    result = compare(parts, ClusterSpec(servers=max_servers_per_ocs(parts)),
                     count_nic_transceivers=True)
    assert result.cluster.gpus == 1536
    assert result.electrical.price_usd == pytest.approx(electrical_usd)
    assert result.electrical.power_w == pytest.approx(electrical_w)
    assert result.photonic.price_usd == pytest.approx(photonic_usd)
    assert result.photonic.power_w == pytest.approx(photonic_w)


@pytest.mark.xfail(strict=True, reason=(
    "the shipped parts give 73.7 % / 99.3 % against the paper's 70.5 % / 95.84 % (3.2 and "
    "3.5 points); the paper's part figures are not published and ours are unverified "
    "estimates (the OCS's are 2010 per-port figures from Helios)"))
def test_shipped_parts_reproduce_fig7_within_3_points() -> None:
    parts = load_parts()
    result = compare(parts, ClusterSpec(servers=max_servers_per_ocs(parts)))
    assert result.cost_saving_pct == pytest.approx(PAPER_COST_SAVING_PCT, abs=3)
    assert result.power_saving_pct == pytest.approx(PAPER_POWER_SAVING_PCT, abs=3)


def test_table3_gpu_counts_match_the_paper() -> None:
    paper = {  # Table 3: technology -> (radix, # GPUs GB200, # GPUs H200)
        "plzt": (16, 576, 64), "sip": (32, 1152, 128), "rotornet": (128, 4608, 512),
        "3d-mems": (320, 11520, 1280), "piezo": (576, 20736, 2304),
        "liquid-crystal": (512, 18432, 2048), "robotic": (1008, 36288, 4032),
    }
    rows = {r["technology"]: r for r in table3()}
    assert set(rows) == set(paper)
    for tech, (radix, gb200, h200) in paper.items():
        row = rows[tech]
        assert (row["radix"], row["gpus_gb200"], row["gpus_h200"], row["gpus"]) == (
            radix, gb200, h200, h200), tech


def test_table3_scales_with_gpus_per_server_and_nic_ports() -> None:
    rows = {r["technology"]: r for r in table3(gpus_per_server=4, nic_ports=1)}
    assert rows["piezo"]["gpus"] == 4 * 576


# --- bad parts files ---------------------------------------------------------------------------


@pytest.mark.parametrize(("old", "new", "message"), [
    ("power_w: 2,", "power_w: 2, colour: blue,", r":2:\d+: unknown key 'transceiver.colour'"),
    ("price_usd: 10, ", "", r":2:\d+: missing key\(s\) transceiver.price_usd"),
    ("price_usd: 10,", "price_usd: -10,", r":2:\d+: 'transceiver.price_usd' must be a finite"),
    ("price_usd: 10,", "price_usd: ten,", r"'transceiver.price_usd' must be a finite.*'ten'"),
    ("power_w: 20,", "power_w: .nan,", r"'ocs.power_w' must be a finite"),
    ("ports: 4,", "ports: 5,", r":1:\d+: 'packet_switch.ports' must be even"),
    ("ports: 16,", "ports: 1.5,", r"'ocs.ports' must be a whole number"),
    ("source: test}\nocs", "source: ''}\nocs", r"'transceiver.source' must be a non-empty"),
    ("name: xcvr", "name: [a, b]", r"expected a single value, not a list"),
    ("ocs: {", "oc: {", r":3:1: unknown key 'oc'"),
    ("transceiver: {", "packet_switch: {", r":2:1: duplicate key 'packet_switch'"),
    ("ocs: {name", "ocs: {name: [", r"invalid YAML"),
])
def test_bad_parts_are_rejected_naming_file_position_and_key(
        tmp_path: Path, old: str, new: str, message: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text(with_line(SMALL, old, new))
    with pytest.raises(PartsError, match=message) as info:
        load_parts(path)
    assert str(info.value).startswith(str(path))


@pytest.mark.parametrize(("text", "message"), [
    ("", "empty parts file"),
    ("- a\n- b\n", "the top level must be a mapping"),
    ("packet_switch: 3\ntransceiver: 4\nocs: 5\n", "'packet_switch' must be a mapping"),
])
def test_parts_documents_of_the_wrong_shape(text: str, message: str) -> None:
    with pytest.raises(PartsError, match=message):
        parse_parts(text, "x.yaml")


def test_a_missing_parts_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(PartsError, match=r"nope\.yaml: cannot read the parts file"):
        load_parts(tmp_path / "nope.yaml")


# --- the command -------------------------------------------------------------------------------


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="opus-testbed")
    register(parser.add_subparsers(dest="command", required=True))
    return parser.parse_args(["cost", *argv])


def test_cost_json_has_the_promised_keys(small: Path) -> None:
    out = io.StringIO()
    assert run(parse("--parts", str(small), "--servers", "8", "--gpus-per-server", "2",
                     "--json"), out) == 0
    data = json.loads(out.getvalue())
    assert {"cost_saving_pct", "power_saving_pct", "table3"} <= set(data)
    assert data["nic_transceivers_counted"] is False
    assert data["cost_saving_pct"] == pytest.approx(100 * (1 - 4000 / 12480), abs=0.01)
    assert data["power_saving_pct"] == pytest.approx(100 * (1 - 40 / 1296), abs=0.01)
    assert len(data["table3"]) == 7 and data["table3"][0]["gpus"] == 2 * 16 // 2
    assert data["cluster"] == {"servers": 8, "gpus_per_server": 2, "gpus": 16, "rails": 2,
                               "nic_ports": 2}


def test_cost_nic_optics_count_puts_the_nic_transceivers_in_both_bills(small: Path) -> None:
    out = io.StringIO()
    assert run(parse("--parts", str(small), "--servers", "8", "--gpus-per-server", "2",
                     "--nic-optics", "count", "--json"), out) == 0
    data = json.loads(out.getvalue())
    assert data["nic_transceivers_counted"] is True
    assert data["cost_saving_pct"] == pytest.approx(100 * (1 - 4160 / 12640), abs=0.01)
    assert data["power_saving_pct"] == pytest.approx(100 * (1 - 72 / 1328), abs=0.01)


def test_cost_default_is_a_table_for_the_shipped_parts() -> None:
    out = io.StringIO()
    assert run(parse(), out) == 0
    text = out.getvalue()
    assert "192 servers x 8 GPUs = 1536 GPUs" in text
    assert "NIC transceivers: server parts" in text
    assert "electrical rails:" in text and "photonic rails:" in text
    assert "Piezo (Polatis)" in text and "20736" in text


def _table3_header(text: str) -> list[str]:
    lines = text.splitlines()
    return lines[next(i for i, line in enumerate(lines) if line.startswith("Table 3")) + 2].split()


def test_table3_shows_the_clusters_column_only_when_it_differs() -> None:
    out = io.StringIO()
    assert run(parse(), out) == 0  # 8 GPUs per server, 2 ports: the H200 column
    assert _table3_header(out.getvalue()) == ["technology", "switch", "ms", "radix", "GB200",
                                              "H200"]
    assert "this cluster (8 GPUs, 2 ports) is the H200 column" in out.getvalue()
    out = io.StringIO()
    assert run(parse("--gpus-per-server", "4", "--servers", "2"), out) == 0
    assert _table3_header(out.getvalue())[-2:] == ["this", "cluster"]
    assert "Piezo (Polatis)                     25    576   20736   2304         1152" in (
        out.getvalue())


@pytest.mark.parametrize(("argv", "message"), [
    (("--servers", "0"), "--servers must be >= 1"),
    (("--gpus-per-server", "-1"), "--gpus-per-server must be >= 1"),
    (("--servers", "193"), "at most 192 servers"),
    (("--parts", "/nonexistent/parts.yaml"), "/nonexistent/parts.yaml: cannot read"),
])
def test_cost_errors_exit_2_with_the_reason(
        argv: tuple[str, ...], message: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert run(parse(*argv), io.StringIO()) == 2
    assert message in capsys.readouterr().err


def test_cost_error_names_the_bad_key(small: Path, capsys: pytest.CaptureFixture[str]) -> None:
    small.write_text(with_line(SMALL, "power_w: 2,", "watts: 2,"))
    assert run(parse("--parts", str(small)), io.StringIO()) == 2
    err = capsys.readouterr().err
    assert f"{small}:2:" in err and "'transceiver.watts'" in err


def test_a_parts_file_that_is_not_text_is_named(tmp_path: Path) -> None:
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"\xff\xfe\x00bad")
    with pytest.raises(PartsError, match=r"binary\.yaml: the parts file is not UTF-8"):
        load_parts(path)
