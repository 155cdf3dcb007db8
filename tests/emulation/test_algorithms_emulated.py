"""Collective algorithms on a small emulated rail, byte for byte: real payloads over real TCP.

Four single-GPU servers on one rail (K = 2), each run a verify plan (:mod:`testbed.plan.verify`):
every transfer carries the blocks it moves, every rank checks at each call's end that it holds
the sum of the contributors' values of each block it owns (the all-to-all blocks sent to it,
the fully reduced buffer, the gathered inputs, its reduced chunk). One run per algorithm set:
the defaults on electrical rails, matchings and StragglAR (straggler rank 3, 50 ms late) on
switched circuits, multihop on the lit ring. The test checks data, not timing, so a busy
machine (the fidelity guard's concern) does not excuse or skip it. Its few switches wait 50 ms:
long enough that the fidelity gate's few-switch check tells a doubled delay from load.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from testbed.emulated.runner import run_emulated
from testbed.experiment.config import ExperimentConfig
from testbed.experiment.prepare import prepare
from workloads.config import Straggler
from workloads.hardware import Cluster
from workloads.micro import collectives_schedule

LINK_MBPS = 20.0
BLOCK = 4096  # bytes of an all-to-all block (scale 1)

CASES = {
    "defaults-electrical": ("baseline", ()),
    "matchings-stragglar": ("on-demand", (("all_to_all", "", "matchings"),
                                          ("all_reduce", "", "stragglar"))),
    "multihop": ("on-demand", (("all_to_all", "", "multihop"),)),
}


def _records(out: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for f in sorted((out / "ranks").glob("rank*.jsonl"))
            for line in f.read_text().splitlines()]


@pytest.mark.parametrize("case", sorted(CASES))
def test_every_rank_receives_and_ends_with_exactly_its_bytes(
        case: str, tmp_path: Path, no_leftovers: list[str],
        fidelity_gate: Callable[..., None]) -> None:
    mode, algorithms = CASES[case]
    sched = collectives_schedule(
        Cluster(4, 1), [("all_to_all", 4 * BLOCK), ("all_reduce", 3 * 5000),
                        ("all_gather", 3000), ("reduce_scatter", 8000)],
        algorithms=algorithms, stragglers=(Straggler(3, 0.05),))
    cfg = ExperimentConfig(workload=sched.config, name=case, mode=mode, switching_delay=50.0,
                           ports_per_rank=2, rail_gbps=LINK_MBPS / 1e3, link_mbps=LINK_MBPS,
                           iterations=1, warmup=1)
    out = tmp_path / case
    summary = run_emulated(prepare(cfg, schedule=sched, verify=True), out, say=lambda _m: None)
    no_leftovers.append(str(json.loads((out / "manifest.json").read_text())["prefix"]))
    calls = [r for r in _records(out) if r["ev"] == "call"]
    assert len(calls) == 2 * 4 * 4  # iterations x ranks x collectives
    for c in calls:
        assert c["verified"] is True, c
        assert c["received"] == c["expected"] > 0, c
        if c["kind"] == "all_to_all":
            assert c["owned_bytes"] == 3 * BLOCK  # one block from each other rank
    kinds = {c["kind"]: c.get("segments", 1) for c in calls if c["rank"] == 0}
    if case == "matchings-stragglar":
        assert kinds["all_to_all"] == 2  # three rounds, two per switch at K = 2
        assert kinds["all_reduce"] == 1 + 2  # reduce-scatter, then 4 rounds two by two
    else:
        assert kinds == dict.fromkeys(kinds, 1)
    assert summary["calls"] == summary["calls_delivered"]
    fidelity_gate(summary, out, delay_ms=cfg.switching_delay_ms)
