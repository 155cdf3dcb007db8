"""``opus-testbed ocs``: help, the simulator as a process, status/connect/disconnect."""

from __future__ import annotations

import argparse
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
from emulator.polatis import NetconfServer, PolatisDevice, Tl1Server
from testbed.cli import ocs as ocs_cli

from .conftest import ENV, FINGERPRINT, SIZE

ROOT = Path(__file__).resolve().parents[2]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="opus-testbed")
    register_into = parser.add_subparsers(dest="command", required=True)
    ocs_cli.register(register_into)
    return parser


@pytest.mark.parametrize("action", ["simulate", "status", "connect", "disconnect"])
def test_every_action_has_help_that_explains(action: str,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        _parser().parse_args(["ocs", action, "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and f"usage: opus-testbed ocs {action}" in out
    assert "--json" in out and len(out.split()) > 40


def test_simulate_runs_until_sigterm_and_serves_netconf() -> None:
    with subprocess.Popen(
            [sys.executable, "-m", "testbed.cli.ocs", "simulate", "--protocol", "netconf",
             "--port", "0", "--size", f"{SIZE}x{SIZE}", "--json"],
            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            env={**os.environ, "PYTHONPATH": str(ROOT)}) as proc:
        try:
            assert proc.stdout is not None
            ready, _, _ = select.select([proc.stdout], [], [], 20)  # printed once listening
            assert ready, "the simulator printed nothing within 20 s"
            info = json.loads(proc.stdout.readline())
            assert info["host"] == "127.0.0.1" and info["size"] == f"{SIZE}x{SIZE}"
            with make_driver({"driver": "polatis-netconf", "host": "127.0.0.1",
                              "port": info["port"], "size": SIZE,
                              "host_key_fingerprint": info["host_key_fingerprint"]},
                             env=ENV) as driver:
                driver.apply(0, add=[(1, 2)])
                assert driver.circuits(0) == {Circuit(0, 1, 2)}
        finally:
            os.kill(proc.pid, signal.SIGTERM)
            rc = proc.wait(timeout=10)
        assert rc == 0, proc.stderr.read() if proc.stderr else ""


def test_status_connect_disconnect_against_a_simulator(
        capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPUS_OCS_PASSWORD", "root")
    device = PolatisDevice(SIZE, switching_time_ms=1.0)
    with Tl1Server(device) as server:
        target = ["--driver", "polatis-tl1", "--host", "127.0.0.1", "--port", str(server.port),
                  "--size", str(SIZE)]
        t0 = time.monotonic()
        assert ocs_cli.main(["connect", "1", "2", *target, "--json"]) == 0
        call_ms = (time.monotonic() - t0) * 1e3
        result = json.loads(capsys.readouterr().out)
        assert result["added"] == [[1, 2]]
        # TL1 switches a duplex circuit pair by pair: two of the device's 1 ms switches at least;
        # at most the whole command as this test's own clock saw it (an observer the CLI does
        # not control: a unit error or a made-up figure falls outside)
        assert 2 * 1.0 <= result["request_to_light_ms"] <= call_ms, (result, call_ms)
        assert ocs_cli.main(["status", *target, "--json"]) == 0
        (rail,) = json.loads(capsys.readouterr().out)["rails"]
        assert rail["circuits"] == [[1, 2]] and rail["port_states"]["1"] == "lit"
        assert rail["info"]["size"] == f"{SIZE}x{SIZE}"
        assert ocs_cli.main(["disconnect", "1", "2", *target]) == 0
        assert "disconnected 1<->2" in capsys.readouterr().out
        assert device.pairs() == {}
        assert ocs_cli.main(["disconnect", "1", "2", *target]) == 1
        assert "cannot remove absent circuit" in capsys.readouterr().err


def test_status_reports_config_and_device_errors_with_exit_codes(
        tmp_path: Path, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPUS_OCS_PASSWORD", "wrong")
    device = PolatisDevice(SIZE)
    with NetconfServer(device) as server:
        cfg = tmp_path / "lab.yaml"
        cfg.write_text(f"ocs:\n  driver: polatis-netconf\n  host: 127.0.0.1\n"
                       f"  port: {server.port}\n  host_key_fingerprint: {FINGERPRINT}\n")
        assert ocs_cli.main(["status", "--config", str(cfg)]) == 1
        assert "login as 'admin' refused" in capsys.readouterr().err
        cfg.write_text("ocs:\n  driver: polatis-netconf\n  hots: 127.0.0.1\n")
        assert ocs_cli.main(["status", "--config", str(cfg)]) == 2
        assert "ocs.hots: unknown key" in capsys.readouterr().err
        assert ocs_cli.main(["status"]) == 2
        assert "--host" in capsys.readouterr().err


@pytest.mark.parametrize("protocol", ["netconf", "tl1"])
def test_status_shows_a_failed_port_as_failed(protocol: str, capsys: pytest.CaptureFixture[str],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPUS_OCS_PASSWORD", "root")
    device = PolatisDevice(SIZE, switching_time_ms=1.0)
    device.faults.failed_ports.add(3)  # as `ocs simulate --fail-port 3`
    server_cls = NetconfServer if protocol == "netconf" else Tl1Server
    with server_cls(device) as server:
        target = ["--protocol", protocol, "--host", "127.0.0.1", "--port", str(server.port),
                  "--size", str(SIZE),
                  *(["--host-key-fingerprint", FINGERPRINT] if protocol == "netconf" else [])]
        assert ocs_cli.main(["status", *target, "--json"]) == 0
        (rail,) = json.loads(capsys.readouterr().out)["rails"]
        assert rail["port_states"]["3"] == "failed"
        assert {rail["port_states"][str(p)] for p in (1, 2, 4)} == {"idle"}
        assert ocs_cli.main(["status", *target]) == 0
        assert "failed: 3;" in capsys.readouterr().out
