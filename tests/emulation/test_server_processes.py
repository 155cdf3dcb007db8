"""``run.ranks_per_process: server`` on real Mininet/OVS: 2 servers x 2 GPUs, one process each.

Every byte must arrive, each rank must write its own records, and each rank's sockets must be in
its own host's network namespace: while the run is under way, ``ss`` inside each rank's namespace
must show the server's process listening on that rank's rail address (and on no other rank's)
and connected to the Opus controller.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

from emulator import naming
from testbed.emulated.runner import run_emulated
from testbed.emulated.supervisor import REPLAYER_PORT
from testbed.experiment.config import parse_experiment
from testbed.experiment.prepare import prepare

CONFIG = """\
name: tiny-2x2
cluster: {servers: 2, gpus_per_server: 2}
workload:
  model: {base: llama3-8b, name: tiny-llama, hidden_size: 2048, n_layers: 8, n_heads: 16,
          n_kv_heads: 8, ffn_hidden_size: 5632}
  gpu: h100
  seq_len: 2048
  num_microbatches: 2
  parallelism: {tp: 2, pp: 2}
mode: on-demand
ocs: {switching_delay: 10}
network: {rail_gbps: 400}
run: {warmup: 1, iterations: 80, ranks_per_process: server, wire_check: false}
"""
# wire_check off: the test is of the process layout, not the switching, and its 80 iterations'
# capture (0.5 ms probes at 10 ms) doubled its time (19 -> 37 s, loaded); the wire has its own
# tests (test_wire_check.py)
FidelityGate = Callable[..., None]


def _sockets(netns: str, state: str) -> list[str]:
    """``ss`` lines of TCP sockets in ``state`` inside namespace ``netns``, with their
    processes."""
    done = subprocess.run(["nsenter", f"--net={netns}", "ss", "-Htnp", "state", state],
                          capture_output=True, text=True, timeout=10, check=True)
    return done.stdout.splitlines()


def _pid_of(line: str) -> set[int]:
    return {int(p) for p in re.findall(r"pid=(\d+)", line)}


def test_one_process_per_server_keeps_each_rank_in_its_namespace(
        tmp_path: Path, no_leftovers: list[str], fidelity_gate: FidelityGate) -> None:
    cfg = parse_experiment(CONFIG, "tiny-2x2.yaml")
    out = tmp_path / "server"
    seen: dict[int, dict[str, Any]] = {}

    def probe(message: str) -> None:
        """At the first progress line after every rank finished an iteration (the runner
        reports every 0.5 s, so that line may say 1 or 12: ~40 ms an iteration on a quiet
        machine). The run goes on for 80 iterations, ~3 s, for the eight ``ss`` probes, which
        take ~0.3 s."""
        done = re.match(r"  iterations done: (\d+)/(\d+)", message)
        if seen or done is None or not 1 <= int(done[1]) < int(done[2]):
            return
        for server in sorted((out / "ranks").glob("server*.json")):
            for entry in json.loads(server.read_text())["ranks"]:
                seen[int(entry["rank"])] = {
                    "listening": _sockets(entry["netns"], "listening"),
                    "established": _sockets(entry["netns"], "established"),
                    "endpoint": json.loads(Path(entry["plan"]).read_text())["endpoint"]}

    summary = run_emulated(prepare(cfg), out, say=probe)
    no_leftovers.append(json.loads((out / "manifest.json").read_text())["prefix"])
    assert summary["calls"] == summary["calls_delivered"] > 0, summary
    assert summary["bytes_received_scaled"] == summary["bytes_expected_scaled"] > 0, summary
    launch = json.loads((out / "ranks" / "launch.json").read_text())
    assert launch["processes"] == 2 and launch["ranks_per_process"] == "server"
    assert json.loads((out / "manifest.json").read_text())["rank_processes"] == "server"
    for rank in range(4):  # each rank's own records, as with a process per rank
        records = [json.loads(line) for line in (out / "ranks" / f"rank{rank}.jsonl").open()]
        assert {r["rank"] for r in records} == {rank}
        assert sum(r["ev"] == "iteration" for r in records) == cfg.total_iterations
        assert records[-1]["ev"] == "finished"
    assert sorted(seen) == [0, 1, 2, 3], "the run ended before the sockets were probed"
    server_pids: set[int] = set()
    for rank, found in seen.items():
        own = f"{naming.rank_address(rank)}:{REPLAYER_PORT}"
        listening = [line for line in found["listening"] if f":{REPLAYER_PORT} " in line]
        assert len(listening) == 1 and own in listening[0], (rank, found["listening"])
        server_pids |= _pid_of(listening[0])
        host, port = found["endpoint"].removeprefix("tcp://").rsplit(":", 1)
        to_opus = [line for line in found["established"] if f"{host}:{port}" in line]
        assert to_opus, (rank, found["established"])
        assert all(_pid_of(line) == _pid_of(listening[0]) for line in to_opus), to_opus
    assert len(server_pids) == 2, server_pids  # ranks 0-1 in one process, 2-3 in another
    for log in sorted((out / "ranks").glob("server*.log")):
        lines = [m.groups() for m in re.finditer(r"thread in netns (\d+) \(host's (\d+)\)",
                                                 log.read_text())]
        assert len(lines) == 2 and all(a == b for a, b in lines), log.read_text()
    fidelity_gate(summary, out, delay_ms=cfg.switching_delay_ms)
