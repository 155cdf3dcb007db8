"""`opus-testbed clean` removes what a killed run left behind, and nothing of live runs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from emulator.network import emulated_rails, wait_for
from emulator.runstate import clean, leftovers
from emulator.topo import RailSpec

ROOT = Path(__file__).resolve().parents[2]
CRASHING_RUN = """
import sys, time
from emulator.network import emulated_rails
from emulator.topo import RailSpec
# rail-state's network: electrical data rails and two shadow rails, whose veth ports' far ends
# sit in the run's shadow namespace (emulator.shadowports)
with emulated_rails(RailSpec(servers=2, gpus_per_server=2, link_mbps=100, mode="electrical",
                             shadow_rails=2)) as net:
    net.popen(0, ["sleep", "600"])
    print(net.prefix, net.instances.base if net.instances else "", flush=True)
    time.sleep(600)
"""


def test_clean_after_a_killed_run_spares_live_runs() -> None:
    with emulated_rails(RailSpec(servers=2, gpus_per_server=1, link_mbps=None)) as live:
        env = dict(os.environ, PYTHONPATH=str(ROOT))
        proc = subprocess.Popen([sys.executable, "-c", CRASHING_RUN], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, env=env)
        try:
            assert proc.stdout is not None
            prefix, _, instances_dir = proc.stdout.readline().strip().partition(" ")
            assert prefix.startswith("ot"), proc.stderr.read() if proc.stderr else ""
            os.kill(proc.pid, signal.SIGKILL)  # no finally, no teardown: a crash
            proc.wait(timeout=10)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait(timeout=10)
        left = leftovers(prefix)
        # per-rail Open vSwitch instances (emulator.ovs_instance) hold the bridges: then the
        # instances' daemons are what the crash left
        assert (left["bridges"] or left["processes"]) and left["records"], \
            f"the crash left nothing to clean: {left}"
        assert left["namespaces"] == [f"{prefix}sh"], left
        assert len([x for x in left["links"]
                    if x.startswith(f"{prefix}s") and "-eth" in x]) == 6, left

        removed = clean()

        assert f"{prefix}sh" in removed["namespaces"]
        assert prefix in removed["records"]
        wait_for(lambda: not any(leftovers(prefix).values()), 10, f"run {prefix} to be gone")
        assert not instances_dir or not Path(instances_dir).exists(), "instances' files left"
        assert not any(live.prefix in r for r in removed["records"] + removed["bridges"])
        assert live.driver.health()["connected_rails"] == [0], "clean touched a live run"
        assert set(live.dump_flows(0)) == {"priority=0 actions=drop"}
