"""No password, key or credentials-file content in output, logs, records or exceptions.

The lab CLI reads a password from a credentials file and drives a simulated switch over NETCONF
and TL1 (which sends it in clear text), with every logger at DEBUG; the Opus service refuses
clients and writes its event log into a run directory. Each secret is then searched for in
everything that came out.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import pytest

from controller.curve import ClientKeys, load_client_keys, load_server_keys, make_keys
from controller.drivers.sim import SimOcsDriver
from controller.events import EventLog
from controller.service import ControllerService
from controller.shim import ControllerUnavailable, Shim
from emulator.polatis import NetconfServer, PolatisDevice, Tl1Server
from testbed.cli import ocs as ocs_cli

from .conftest import FINGERPRINT, SIZE

SECRET = "Pa55-c0ffee-secret"


@pytest.mark.parametrize("protocol", ["netconf", "tl1"])
def test_the_password_and_credentials_file_stay_secret(
        protocol: str, tmp_path: Path, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    caplog.set_level(logging.DEBUG)
    for name in ("paramiko", "ncclient"):  # the CLI detaches these; watch them here too
        monkeypatch.setattr(logging.getLogger(name), "propagate", True)
    cred = tmp_path / "ocs.yaml"
    cred.write_text(f"username: admin\npassword: {SECRET}\n# note: {SECRET}-comment\n")
    cred.chmod(0o600)
    device = PolatisDevice(SIZE, switching_time_ms=1.0)
    server_cls = NetconfServer if protocol == "netconf" else Tl1Server
    pin = ["--host-key-fingerprint", FINGERPRINT] if protocol == "netconf" else []
    with server_cls(device, password=SECRET) as server:
        target = ["--protocol", protocol, "--host", "127.0.0.1", "--port", str(server.port),
                  "--credentials-file", str(cred), *pin]
        assert ocs_cli.main(["status", *target, "--json"]) == 0
        assert ocs_cli.main(["connect", "1", "2", *target, "--json"]) == 0
        assert ocs_cli.main(["connect", "1", "2", *target]) == 1  # a rule error
        server.password = "another"  # the switch now refuses this password
        assert ocs_cli.main(["status", *target, "--json"]) == 1
        cred.chmod(0o644)  # and a credentials file others can read is refused
        assert ocs_cli.main(["status", *target]) == 2
    printed = capsys.readouterr()
    assert "login as 'admin' refused" in printed.err and "chmod 600" in printed.err
    assert SECRET not in printed.out + printed.err
    assert SECRET not in caplog.text


def test_curve_secret_keys_stay_out_of_the_run_directory(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    keys, other = make_keys(tmp_path / "keys"), make_keys(tmp_path / "other")
    server_keys, client_keys = load_server_keys(keys), load_client_keys(keys)
    secrets = [server_keys.pair.secret.decode(), client_keys.pair.secret.decode(),
               load_client_keys(other).pair.secret.decode()]
    run_dir = tmp_path / "run"
    events = EventLog(run_dir / "controller-events.jsonl", keep=True)
    svc = ControllerService(SimOcsDriver({0: [1, 2]}, 0.0), bind="tcp://0.0.0.0:0",
                            event_log=events, curve_keys=server_keys,
                            client_keys=client_keys).start()
    try:
        endpoint = f"tcp://127.0.0.1:{svc.endpoint.rpartition(':')[2]}"
        stranger = ClientKeys(load_client_keys(other).pair, client_keys.server_public)
        with Shim(endpoint, "j", 0, connect_timeout_s=3.0, controller_silence_s=30,
                  curve=stranger) as shim, pytest.raises(ControllerUnavailable) as err:
            shim.connect()
        deadline = time.monotonic() + 30
        while not any(e["event"] == "client_refused" for e in events.records):
            assert time.monotonic() < deadline, "no refusal logged"
            time.sleep(0.02)
    finally:
        svc.stop()
    written = "".join(p.read_text() for p in run_dir.rglob("*") if p.is_file())
    assert "client_refused" in written
    for secret in secrets:
        assert secret not in written and secret not in caplog.text
        assert secret not in str(err.value) and secret not in repr(server_keys)
