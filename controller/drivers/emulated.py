"""The emulated OCS driver: :class:`controller.ocs.OcsDriver` over the OCS management API.

It speaks HTTP/JSON to :mod:`emulator.ocs_service` (stdlib ``http.client``, one keep-alive
connection per thread), so the controller never imports os-ken or Mininet. An optional
``on_circuits`` hook runs while the touched ports are dark (the emulator uses it to point the
ranks' routes at their new circuit peers): the request is first submitted (checked and queued;
a rejected one changes nothing, host routes included), the hook runs while the switch works,
then the driver waits for the result. Host-side updates thus cost no extra time whenever the
switching delay is longer than they take.
"""

from __future__ import annotations

import http.client
import json
import socket
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from controller.drivers.config import OcsConfig, parse_delay_only
from controller.ocs import (
    ApplyResult,
    Circuit,
    OcsDriver,
    PortState,
    RailDescription,
    Reconfiguration,
    ReconfigurationRejected,
)

CircuitsHook = Callable[[Sequence[Reconfiguration]], None]


class OcsManagementError(RuntimeError):
    """The OCS management API failed (not a rule violation)."""


class EmulatedOcsDriver(OcsDriver):
    """Drives the emulated OCS (os-ken app on OVS) through its management API."""

    def __init__(self, host: str, port: int, *, timeout_s: float = 600.0,
                 on_circuits: CircuitsHook | None = None) -> None:
        self.host = host
        self.port = port
        self.timeout_s = timeout_s
        self.on_circuits = on_circuits
        self._local = threading.local()

    def _conn(self) -> http.client.HTTPConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
            conn.connect()
            assert conn.sock is not None
            conn.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self._local.conn = conn
        return conn

    def request(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        """One API call. Reads and PUTs retry once on a dropped keep-alive connection; a POST
        never does, since the switch may have accepted it before the connection dropped."""
        payload = json.dumps(body).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if payload is not None else {}
        attempts = (1,) if method == "POST" else (1, 2)
        for attempt in attempts:
            conn = self._conn()
            try:
                conn.request(method, path, body=payload, headers=headers)
                resp = conn.getresponse()
                data = json.loads(resp.read() or b"{}")
                break
            except (ConnectionError, http.client.HTTPException, OSError) as exc:
                conn.close()
                self._local.conn = None
                if attempt == attempts[-1]:
                    raise OcsManagementError(
                        f"OCS management API at {self.host}:{self.port} unreachable: {exc}"
                    ) from exc
        if resp.status == 409:
            raise ReconfigurationRejected(int(data.get("rail", -1)), data.get("ports", []),
                                          str(data.get("reason", data.get("error"))))
        if resp.status >= 400:
            raise OcsManagementError(f"{method} {path}: HTTP {resp.status}: {data.get('error')}")
        return dict(data)

    def health(self) -> dict[str, Any]:
        return self.request("GET", "/v1/health")

    def describe(self) -> list[RailDescription]:
        return [RailDescription.from_json(r) for r in self.request("GET", "/v1/switch")["rails"]]

    def circuits(self, rail: int) -> frozenset[Circuit]:
        pairs = self.request("GET", f"/v1/rails/{rail}/circuits")["circuits"]
        return frozenset(Circuit(rail, a, b) for a, b in pairs)

    def port_states(self, rail: int) -> dict[int, PortState]:
        ports = self.request("GET", f"/v1/rails/{rail}/ports")["ports"]
        return {int(p): PortState(s) for p, s in ports.items()}

    def set_switching_delay_ms(self, rail: int, delay_ms: float) -> None:
        self.request("PUT", f"/v1/rails/{rail}/delay", {"switching_delay_ms": delay_ms})

    def apply_many(self, reconfs: Sequence[Reconfiguration]) -> list[ApplyResult]:
        body = {"reconfigurations": [r.to_json() for r in reconfs]}
        if self.on_circuits is None or all(r.is_empty for r in reconfs):
            results = self.request("POST", "/v1/reconfigure", body)["results"]
        else:
            ticket = self.request("POST", "/v1/submit", body)["ticket"]
            try:
                self.on_circuits(list(reconfs))
            finally:
                results = self.request("GET", f"/v1/tickets/{ticket}")["results"]
        return [ApplyResult.from_json(r) for r in results]

    def close(self) -> None:
        conn = getattr(self._local, "conn", None)
        if conn is not None:
            conn.close()
            self._local.conn = None


def parse_config(driver: str, data: Mapping[str, Any], key: str,
                 base_dir: Path | None) -> OcsConfig:
    """The emulated OCS's ``ocs:`` settings: its switching delay only (the runner builds the
    driver, on the emulated network's management port)."""
    return parse_delay_only(driver, data, key)
