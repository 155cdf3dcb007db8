"""Minimal client of ovs-vswitchd's unixctl socket (JSON-RPC 1.0 over a Unix socket).

``ovs-appctl`` is the same protocol; speaking it directly avoids a fork and exec (several ms in a
busy, multi-threaded process) where the OCS app needs a datapath command on its critical path.
"""

from __future__ import annotations

import glob
import json
import os
import socket
from typing import Any


class UnixctlError(RuntimeError):
    """ovs-vswitchd answered with an error, or could not be reached."""


def vswitchd_socket(rundir: str | None = None) -> str:
    """Path of ovs-vswitchd's control socket (from its pidfile, else the only one present)."""
    rundir = rundir or os.environ.get("OVS_RUNDIR", "/var/run/openvswitch")
    try:
        with open(os.path.join(rundir, "ovs-vswitchd.pid")) as fh:
            pid = fh.read().strip()
        path = os.path.join(rundir, f"ovs-vswitchd.{pid}.ctl")
        if os.path.exists(path):
            return path
    except OSError:
        pass
    found = glob.glob(os.path.join(rundir, "ovs-vswitchd.*.ctl"))
    if len(found) != 1:
        raise UnixctlError(f"cannot find ovs-vswitchd's control socket in {rundir}")
    return found[0]


class Unixctl:
    """One persistent connection to ovs-vswitchd's unixctl server."""

    def __init__(self, path: str | None = None, timeout_s: float = 5.0) -> None:
        self.path = path or vswitchd_socket()
        self.timeout_s = timeout_s
        self._sock: socket.socket | None = None
        self._ids = 0
        self._decoder = json.JSONDecoder()

    def _connect(self) -> socket.socket:
        if self._sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout_s)
            sock.connect(self.path)
            self._sock = sock
        return self._sock

    def call(self, method: str, *params: str) -> str:
        """Run one command (as ``ovs-appctl method params...``) and return its text result."""
        self._ids += 1
        request = json.dumps({"method": method, "params": list(params), "id": self._ids})
        sock = self._connect()
        try:
            sock.sendall(request.encode())
            buf = ""
            while True:
                chunk = sock.recv(65536)
                if not chunk:
                    raise UnixctlError("ovs-vswitchd closed the unixctl connection")
                buf += chunk.decode()
                try:
                    reply, _ = self._decoder.raw_decode(buf)
                    break
                except json.JSONDecodeError:
                    continue
        except OSError as exc:
            self.close()
            raise UnixctlError(f"unixctl {method}: {exc}") from exc
        if reply.get("error"):
            raise UnixctlError(f"unixctl {method}: {reply['error']}")
        result: Any = reply.get("result")
        return str(result or "")

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
