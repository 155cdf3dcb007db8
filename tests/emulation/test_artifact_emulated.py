"""A run whose ranks speak the public Opus artifact's line protocol (``artifact_protocol``):
examples/tiny.yaml on real Mininet/OVS rails, every replayed rank a client of
:mod:`controller.artifact_client` talking TCP to the controller's gateway on the run's frontend
network. Every byte is delivered, the switch log passes the fidelity gate, and each call's
``CONFIG_ACK`` reached its rank only after the controller acknowledged it, which is after the
light of every switch decided for that call."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from testbed.emulated.runner import run_emulated
from testbed.experiment.config import load_experiment
from testbed.experiment.prepare import prepare

TINY = Path(__file__).resolve().parents[2] / "examples" / "tiny.yaml"


def _lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.open() if line.strip()]


@pytest.mark.parametrize(("semantics", "mode", "delay_ms", "k"), [
    ("rail-state", "provisioning", 50.0, 1), ("port-exact", "on-demand", 20.0, 2)])
def test_artifact_clients_drive_an_emulated_run(
        semantics: str, mode: str, delay_ms: float, k: int, tmp_path: Path,
        no_leftovers: list[str], fidelity_gate: Callable[..., None]) -> None:
    """Port-exact runs with K=2: the protocol reports no call's end, so a rank's call counts as
    ended at its next request, and with K=1 a rank whose FSDP and pipeline calls overlap (as the
    replayer's lanes do) would hold a port its own pending request needs
    (docs/artifact-protocol.md)."""
    cfg = load_experiment(TINY).replace(mode=mode, semantics=semantics, switching_delay=delay_ms,
                                        artifact_port=0, ports_per_rank=k)
    out = tmp_path / semantics
    summary = run_emulated(prepare(cfg), out, say=lambda _m: None)
    no_leftovers.append(str(json.loads((out / "manifest.json").read_text())["prefix"]))
    assert summary["all_iterations_completed"], summary
    assert summary["calls"] == summary["calls_delivered"] > 0
    assert summary["bytes_received_scaled"] == summary["bytes_expected_scaled"] > 0
    gateway = json.loads((out / "artifact-protocol.json").read_text())
    assert gateway["refused"] == [], gateway["refused"][:3]
    events = _lines(out / "controller-events.jsonl")
    acks = {(e["rank"], e["group"], e["seq"]): e["t_s"] for e in events if e["event"] == "ack"}
    intents = [e for e in events if e["event"] == "intent"]
    assert intents and len(acks) == len(intents) == gateway["counters"]["config_acks"]
    light: dict[tuple[str, int], float] = {}
    decided = {e["decision"]: (e["group"], e["seq"]) for e in events if e["event"] == "decision"}
    for end in (e for e in events if e["event"] == "reconfig_end"):
        key = decided[end["decision"]]
        light[key] = max(light.get(key, 0.0), end["t_light_s"])
    assert light, "the run switched nothing"
    for (rank, group, seq), t_core in acks.items():
        assert t_core >= light.get((group, seq), 0.0), (rank, group, seq)
    asked = 0
    for rank in range(4):
        for rec in _lines(out / "ranks" / f"rank{rank}.jsonl"):
            key = (rank, rec.get("lane"), rec.get("seq"))
            if rec.get("ev") == "call" and key in acks:
                asked += 1  # the rank went on only once its CONFIG_ACK had come
                assert rec["t_ack"] >= acks[key] >= light.get(key[1:], 0.0), rec
    assert asked == len(acks)
    fidelity_gate(summary, out, delay_ms=cfg.switching_delay_ms)
