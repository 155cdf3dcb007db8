"""``opus-testbed ocs`` with ``--driver calient-tl1``: the simulator as a process, then
status/connect/disconnect against it (twins of tests/polatis/test_ocs_cli.py)."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from controller.drivers.registry import make_driver
from controller.ocs import Circuit
from emulator.calient.model import CalientDevice
from emulator.calient.tl1_server import CalientTl1Server
from testbed.cli import ocs as ocs_cli

from .conftest import ENV, SIZE

ROOT = Path(__file__).resolve().parents[2]


def test_simulate_runs_until_sigterm_and_serves_calient_tl1() -> None:
    with subprocess.Popen(
            [sys.executable, "-m", "testbed.cli.ocs", "simulate", "--driver", "calient-tl1",
             "--port", "0", "--size", str(SIZE), "--switching-ms", "1", "--json"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)}) as proc:
        try:
            assert proc.stdout is not None
            ready, _, _ = select.select([proc.stdout], [], [], 20)  # printed once listening
            assert ready, "the simulator printed nothing within 20 s"
            info = json.loads(proc.stdout.readline())
            assert info["driver"] == "calient-tl1" and info["size"] == f"{SIZE}x{SIZE}"
            with make_driver({"driver": "calient-tl1", "host": "127.0.0.1",
                              "port": info["port"], "size": SIZE}, env=ENV) as driver:
                driver.apply(0, add=[(1, 2)])
                assert driver.circuits(0) == {Circuit(0, 1, 2)}
        finally:
            os.kill(proc.pid, signal.SIGTERM)
            rc = proc.wait(timeout=10)
        assert rc == 0, proc.stderr.read() if proc.stderr else ""


def test_status_connect_disconnect_and_a_failed_port(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPUS_OCS_PASSWORD", "root")
    device = CalientDevice(SIZE, switching_time_ms=20.0)
    device.faults.failed_ports.add(5)  # as `ocs simulate --driver calient-tl1 --fail-port 5`
    with CalientTl1Server(device) as server:
        target = ["--driver", "calient-tl1", "--host", "127.0.0.1", "--port",
                  str(server.port), "--size", str(SIZE)]
        t0 = time.monotonic()
        assert ocs_cli.main(["connect", "1", "2", *target, "--json"]) == 0
        call_ms = (time.monotonic() - t0) * 1e3
        result = json.loads(capsys.readouterr().out)
        assert result["added"] == [[1, 2]]
        # one 2WAY connection: one switching time of the simulator, polled until in service
        assert 20.0 <= result["request_to_light_ms"] <= call_ms, (result, call_ms)
        assert ocs_cli.main(["status", *target, "--json"]) == 0
        (rail,) = json.loads(capsys.readouterr().out)["rails"]
        assert rail["circuits"] == [[1, 2]] and rail["port_states"]["1"] == "lit"
        assert rail["port_states"]["5"] == "failed" and rail["port_states"]["3"] == "idle"
        assert rail["power_dbm"][str(SIZE + 3)] is None  # NONE: no light, null in JSON
        assert rail["info"]["model"] == f"S{SIZE}-SIM"
        assert ocs_cli.main(["status", *target]) == 0
        assert "failed: 5;" in capsys.readouterr().out
        assert ocs_cli.main(["disconnect", "1", "2", *target]) == 0
        assert "disconnected 1<->2" in capsys.readouterr().out
        assert device.connections() == {}
        assert ocs_cli.main(["disconnect", "1", "2", *target]) == 1
        assert "cannot remove absent circuit" in capsys.readouterr().err
