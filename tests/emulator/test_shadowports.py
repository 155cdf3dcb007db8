"""Rail-state's shadow ports as the wire check sees them (:mod:`emulator.shadowports`,
:func:`emulator.wirecap.shadow_captured_ports`): names, addresses, the commands that make them,
and a shadow rail's flip judged by the wire analysis from frames at those ports alone."""

from __future__ import annotations

import pytest

from controller.railstate import SHADOW_PORTS, flip_reconf
from emulator import naming, shadowports
from emulator.wirecap import shadow_captured_ports
from testbed.metrics.darktime import ExpectedDelay
from testbed.metrics.wire import (
    PROBE_ETHERTYPE,
    Commanded,
    Frame,
    WireCheck,
    forwarding,
    non_peer,
    wire_switches,
)

PREFIX = "ot1a2"
SHADOWS = range(4, 12)  # the demo: 4 data rails, 2 bits each


def test_every_shadow_port_is_captured_at_its_bridge_side_with_its_far_ends_address() -> None:
    ports = shadow_captured_ports(PREFIX, SHADOWS)
    assert [(p.rail, p.port) for p in ports] == [(r, q) for r in SHADOWS for q in SHADOW_PORTS]
    assert ports[0].intf == "ot1a2s4-eth1" and ports[0].mac == "02:0d:00:04:01:01"
    assert all(p.host == -1 for p in ports)
    assert len({p.intf for p in ports}) == len({p.mac for p in ports}) == len(ports) == 24
    assert all(naming.prefix_of(p.intf) == PREFIX and len(p.intf) <= 15 for p in ports)
    # no far end shares an address with a rank's or a spare's NIC
    nics = {naming.rail_mac(r, k) for r in range(64) for k in range(4)} | {
        naming.spare_rail_mac(j, k) for j in range(8) for k in range(4)}
    assert not nics & {p.mac for p in ports}


def test_the_shadow_namespace_is_ours_by_name_and_nothing_else_is() -> None:
    ns = naming.shadow_netns(PREFIX)
    assert ns == "ot1a2sh" and naming.OWNED_NETNS_RE.match(ns)
    assert not naming.OWNED_NAME_RE.match(ns)  # not taken for a bridge or link
    for foreign in ("ot1a2", "ot1a2s4", "myns", "ot1a2shx", "xot1a2sh"):
        assert not naming.OWNED_NETNS_RE.match(foreign), foreign


def test_the_veths_far_ends_are_made_inside_the_namespace_and_probed_there() -> None:
    batch = shadowports.veth_batch(PREFIX, [4]).splitlines()
    assert batch == [
        f"link add ot1a2s4-eth{p} type veth peer name s4p{p} address 02:0d:00:04:0{p}:01 "
        "netns ot1a2sh" for p in SHADOW_PORTS]
    assert shadowports.near_end_batch(PREFIX, [4]).splitlines() == [
        f"link set ot1a2s4-eth{p} up" for p in SHADOW_PORTS]
    assert shadowports.far_end_batch([4]).splitlines() == [
        "link set s4p1 up", "link set s4p2 up", "link set s4p3 up"]
    setup = shadowports.netns_setup_commands(PREFIX)
    assert setup[0] == ["ip", "netns", "add", "ot1a2sh"]
    assert "net.ipv6.conf.default.disable_ipv6=1" in setup[1]  # the kernel sends nothing
    assert shadowports.probe_targets(PREFIX, [4, 5]) == [
        ("/var/run/netns/ot1a2sh", f"s{r}p{p}") for r in (4, 5) for p in SHADOW_PORTS]


def _probe(rail: int, port: int, seq: int) -> bytes:
    mac = bytes.fromhex(naming.shadow_mac(rail, port).replace(":", ""))
    return b"\xff" * 6 + mac + PROBE_ETHERTYPE.to_bytes(2, "big") + seq.to_bytes(4, "big")


def _flip_frames(rail: int, t_request_s: float, dark_s: float, step_s: float,
                 end_s: float, lit_12_until_s: float | None = None) -> list[Frame]:
    """Probes from the three far ends every ``step_s`` from 0.5 s (1-2 lit long before);
    the switch carries 1-2 until the request (or ``lit_12_until_s``), nothing for
    ``dark_s``, then 1-3; every exit 0.1 ms after its entry."""
    frames = []
    dark_from = t_request_s if lit_12_until_s is None else lit_12_until_s
    seq = 0
    t = 0.5
    while t < end_s:
        for port in SHADOW_PORTS:
            head = _probe(rail, port, seq)
            frames.append(Frame(t, rail, port, True, head))
            peer = ({1: 2, 2: 1}.get(port) if t < dark_from else
                    None if t < dark_from + dark_s else {1: 3, 3: 1}.get(port))
            if peer is not None:
                frames.append(Frame(t + 1e-4, rail, peer, False, head))
            seq += 1
        t += step_s
    return frames


def _judge(frames: list[Frame], commanded: list[Commanded]) -> WireCheck:
    crossings, dropped, unmatched = forwarding(frames)
    assert unmatched == 0
    return WireCheck(ExpectedDelay(50.0), tuple(wire_switches(crossings, dropped, commanded)),
                     tuple(non_peer(crossings, commanded)), 0, len(frames), unmatched, 0, 0.5)


def _commanded(rail: int, t_request_s: float, t_end_s: float) -> list[Commanded]:
    """The controller's first two flips of shadow rail ``rail`` (railstate.flip_reconf):
    light 1-2 at 0, then 1-2 -> 1-3 at ``t_request_s``."""
    first = flip_reconf(rail, ())
    second = flip_reconf(rail, first.add)
    return [Commanded(rail, 0.0, 0.001, frozenset(), frozenset(
                frozenset((c.port_a, c.port_b)) for c in first.add)),
            Commanded(rail, t_request_s, t_end_s,
                      frozenset(frozenset((c.port_a, c.port_b)) for c in second.remove),
                      frozenset(frozenset((c.port_a, c.port_b)) for c in second.add))]


def test_a_shadow_rails_flip_is_measured_on_its_ports_with_no_frame_at_a_non_peer() -> None:
    rail = 5
    wire = _judge(_flip_frames(rail, 1.0, 0.050, 0.0005, 1.2), _commanded(rail, 1.0, 1.051))
    flip = wire.switches[-1]
    assert flip.measured and flip.port == 1  # the common end brackets both edges
    assert flip.t_light_s is not None and flip.t_dark_s is not None
    assert 1e3 * (flip.t_light_s - flip.t_dark_s) == pytest.approx(50.0, abs=1.0)
    assert wire.non_peer == () and wire.early() == []


def test_a_shadow_rail_lighting_early_or_out_of_turn_is_caught() -> None:
    rail = 5
    early = _judge(_flip_frames(rail, 1.0, 0.020, 0.0005, 1.2), _commanded(rail, 1.0, 1.051))
    assert len(early.early()) == 1  # 20 ms dark against 50 configured
    # the old circuit still carries light after the switch was confirmed: a non-peer frame
    late = _judge(_flip_frames(rail, 1.0, 0.050, 0.0005, 1.2, lit_12_until_s=1.1),
                  _commanded(rail, 1.0, 1.051))
    assert late.non_peer and {(x.src, x.dst) for x in late.non_peer} <= {(1, 2), (2, 1)}
