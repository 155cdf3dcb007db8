"""``controller.plane: static`` on real Mininet/OVS (issue 40): the plane's circuits installed
once on the OCS bridges, Opus switching nothing, and every byte between servers without their
own circuit forwarded by the rank processes (over the circuits and the scale-up Unix sockets).

A tiny DeepSeek-like job (8 ranks: TP 2 inside each of 4 servers, FSDP 4 and EP 4 across them,
one port per rank): the EP all-to-all needs every server pair, two switches hold two matchings,
so some transfers cross a relay server and most cross another rail's GPU of their server.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

from testbed.emulated.runner import run_emulated
from testbed.experiment.config import load_experiment
from testbed.experiment.prepare import prepare
from testbed.metrics.wire import wire_text

TINY_EP = """\
name: tiny-ep-static
cluster: {servers: 4, gpus_per_server: 2}
workload:
  model: {base: deepseek-v3-16b, name: tiny-moe, n_layers: 2}
  gpu: a100
  seq_len: 512
  micro_batch_size: 1
  num_microbatches: 1
  activation_checkpointing: none
  algorithms: {all_to_all: matchings}
  parallelism: {tp: 2, fsdp: 4, pp: 1, ep: 4, fsdp_unit: block}
mode: on-demand
controller: {plane: static}
ocs: {switching_delay: 1, ports_per_rank: 1}
network: {rail_gbps: 200, link_mbps: auto}
run: {warmup: 0, iterations: 1}
"""


def test_static_plane_relays_every_byte_one_to_one(tmp_path: Path, no_leftovers: list[str],
                                                   fidelity_gate: Callable[..., None]) -> None:
    path = tmp_path / "tiny-ep.yaml"
    path.write_text(TINY_EP)
    cfg = load_experiment(path).replace(wire_check=True)
    out = tmp_path / "run"
    said: list[str] = []
    summary = run_emulated(prepare(cfg), out, say=said.append)
    no_leftovers.append(str(json.loads((out / "manifest.json").read_text())["prefix"]))
    stats = summary["plane_stats"]
    assert summary["plane"] == "static" and stats["problems"] == [], stats["problems"]
    # the relays forwarded exactly the plan's bytes (counted by each relay rank)
    assert stats["relay_forwarded_bytes"] == stats["relay_forwarded_bytes_planned"] > 0
    assert stats["relayed_share"] > 0  # some transfers cross a relay server
    assert stats["one_to_one"] and not stats["reconfigured_during_run"]
    assert stats["circuits"] == 4  # two switches, each a perfect matching of 4 servers
    assert summary["reconfigurations"] == 0  # Opus switched nothing
    assert summary["bytes_received_scaled"] == summary["bytes_expected_scaled"] > 0
    assert any("plane static" in line for line in said)
    # the wire, which the OCS app does not control, saw every port and no frame at a non-peer
    wire = summary["wire"]
    assert wire["ports"] == wire["ports_seen"] == 8, wire
    assert wire["standing_circuits"] == 4 and wire["commanded"] == 0, wire
    assert wire["non_peer_frames"] == 0 and wire["lost_frames"] == 0, wire
    assert wire_text(wire).startswith("watched 4 circuits installed before the ranks started")
    fidelity_gate(summary, out, delay_ms=cfg.switching_delay_ms)
