"""The emulated OCS as a process: os-ken app + a JSON-over-HTTP management API.

Run as ``python -m emulator.ocs_service --config ocs.json``. The config names the OpenFlow
listen port, the management port (both on 127.0.0.1), the rails (dpid, ports, switching delay,
mode; with ``mgmt_socket`` and ``unixctl_socket`` for a rail in its own Open vSwitch,
:mod:`emulator.ovs_instance`) and the event log. The management API (stdlib
``http.server``, HTTP/1.1 keep-alive):

====== ============================ ========================================================
GET    /v1/health                   ``{"connected_rails": [...], "rails": N}``
GET    /v1/switch                   ``{"rails": [RailDescription...]}``
GET    /v1/rails/<r>/circuits       ``{"circuits": [[a, b], ...]}``
GET    /v1/rails/<r>/ports          ``{"ports": {"<port>": "lit" | "dark" | "idle"}}``
PUT    /v1/rails/<r>/delay          body ``{"switching_delay_ms": D}``
POST   /v1/reconfigure              body ``{"reconfigurations": [Reconfiguration...]}`` ->
                                    ``{"results": [ApplyResult...]}``; a rejected request
                                    answers 409 with ``{"error", "rail", "ports", "reason"}``
POST   /v1/submit                   same body; answers once the batch is checked and queued:
                                    ``{"ticket": T}`` (or 409); the switching goes on
GET    /v1/tickets/<T>              waits for ticket ``T``: ``{"results": [...]}``
====== ============================ ========================================================
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import os
import re
import signal
import socket
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from controller.ocs import ApplyResult, RailDescription, Reconfiguration, ReconfigurationRejected

_RAIL_PATH = re.compile(r"^/v1/rails/(\d+)/(circuits|ports|delay)$")
_TICKET_PATH = re.compile(r"^/v1/tickets/(\d+)$")


Reply = tuple[int, dict[str, Any]]


class OcsApi:
    """The management API's resources over ``fabric`` (an :class:`emulator.ocs_app.OcsFabric`),
    apart from HTTP: each method takes the request path (and, for writes, a reader of the JSON
    body, read only once the path is known) and returns the status and the JSON body."""

    def __init__(self, fabric: Any) -> None:
        self.fabric = fabric
        self.tickets: dict[int, list[Future[ApplyResult]]] = {}
        self._ticket_ids = itertools.count(1)

    def get(self, path: str) -> Reply:
        fabric = self.fabric
        if path == "/v1/health":
            return HTTPStatus.OK, {"connected_rails": fabric.connected_rails(),
                                   "rails": len(fabric.rails), "pid": os.getpid()}
        if path == "/v1/switch":
            return HTTPStatus.OK, {"rails": [d.to_json() for d in fabric.describe()]}
        t = _TICKET_PATH.match(path)
        if t:
            futures = self.tickets.pop(int(t.group(1)), None)
            if futures is None:
                return HTTPStatus.NOT_FOUND, {"error": f"no pending ticket {t.group(1)}"}
            return HTTPStatus.OK, {"results": [f.result().to_json() for f in futures]}
        m = _RAIL_PATH.match(path)
        if m and m.group(2) == "circuits":
            circuits = fabric.circuits(int(m.group(1)))
            return HTTPStatus.OK, {"circuits": [c.to_json() for c in sorted(circuits)]}
        if m and m.group(2) == "ports":
            states = fabric.port_states(int(m.group(1)))
            return HTTPStatus.OK, {"ports": {str(p): s.value for p, s in states.items()}}
        return HTTPStatus.NOT_FOUND, {"error": f"no such resource {path}"}

    def post(self, path: str, read_body: Callable[[], Any]) -> Reply:
        """``/v1/reconfigure`` (wait for the results) or ``/v1/submit`` (a ticket to fetch
        them with later)."""
        if path not in ("/v1/reconfigure", "/v1/submit"):
            return HTTPStatus.NOT_FOUND, {"error": f"no such resource {path}"}
        body = read_body()
        items = body.get("reconfigurations") if isinstance(body, dict) else None
        if not isinstance(items, list):
            raise ValueError("body needs a 'reconfigurations' list")
        futures = self.fabric.submit([Reconfiguration.from_json(item) for item in items])
        if path == "/v1/submit":
            ticket = next(self._ticket_ids)
            self.tickets[ticket] = futures
            return HTTPStatus.OK, {"ticket": ticket}
        return HTTPStatus.OK, {"results": [f.result().to_json() for f in futures]}

    def put(self, path: str, read_body: Callable[[], Any]) -> Reply:
        """A rail's switching delay."""
        m = _RAIL_PATH.match(path)
        if not m or m.group(2) != "delay":
            return HTTPStatus.NOT_FOUND, {"error": f"no such resource {path}"}
        body = read_body()
        rail = int(m.group(1))
        self.fabric.set_delay_ms(rail, float(body["switching_delay_ms"]))
        return HTTPStatus.OK, {"rail": rail, "switching_delay_ms": self.fabric.delay_ms[rail]}


def make_handler(fabric: Any) -> type[BaseHTTPRequestHandler]:
    """An HTTP handler class serving :class:`OcsApi` over ``fabric``."""
    from emulator.ocs_app import SwitchUnavailable

    api = OcsApi(fabric)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def setup(self) -> None:
            super().setup()
            # Replies are small: without NODELAY, Nagle and delayed ACKs add ~40 ms per call.
            self.connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)

        def log_message(self, format: str, *args: Any) -> None:
            logging.getLogger("opus.ocs.http").debug(format, *args)

        def _reply(self, status: int, body: dict[str, Any]) -> None:
            data = json.dumps(body).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def _body(self) -> Any:
            length = int(self.headers.get("Content-Length") or 0)
            raw = self.rfile.read(length) if length else b"{}"
            return json.loads(raw)

        def _guard(self, fn: Callable[[], Reply]) -> None:
            try:
                status, body = fn()
            except ReconfigurationRejected as exc:
                status, body = HTTPStatus.CONFLICT, exc.to_json()
            except SwitchUnavailable as exc:
                status, body = HTTPStatus.SERVICE_UNAVAILABLE, {"error": str(exc)}
            except (ValueError, KeyError, TypeError) as exc:
                status, body = HTTPStatus.BAD_REQUEST, {"error": f"bad request: {exc}"}
            self._reply(status, body)

        def do_GET(self) -> None:
            self._guard(lambda: api.get(self.path))

        def do_POST(self) -> None:
            self._guard(lambda: api.post(self.path, self._body))

        def do_PUT(self) -> None:
            self._guard(lambda: api.put(self.path, self._body))

    return Handler


def serve(config: dict[str, Any]) -> None:
    """Start os-ken and the management server; block until SIGTERM/SIGINT."""
    from os_ken import cfg
    from os_ken.base.app_manager import AppManager

    from emulator.ocs_app import OcsApp, OcsFabric

    # Barrier replies hop os-ken's receive thread -> app thread -> rail worker; with the default
    # 5 ms GIL switch interval each hop can wait that long behind a busy thread.
    sys.setswitchinterval(0.0002)
    rails = [RailDescription.from_json(r) for r in config["rails"]]
    dpids = {int(r["rail"]): int(str(r["dpid"]), 16) for r in config["rails"]}
    log_path = Path(config["event_log"]) if config.get("event_log") else None
    bridges = {int(r["rail"]): str(r["bridge"]) for r in config["rails"] if r.get("bridge")}
    sockets = {int(r["rail"]): (str(r["mgmt_socket"]), str(r["unixctl_socket"]))
               for r in config["rails"] if r.get("mgmt_socket")}
    fabric = OcsFabric(rails, dpids, event_log=log_path, bridges=bridges, sockets=sockets)
    OcsApp.fabric = fabric

    cfg.CONF(args=[f"--ofp-tcp-listen-port={int(config['of_port'])}",
                   "--ofp-listen-host=127.0.0.1"], project="os_ken")
    manager = AppManager.get_instance()
    manager.load_apps(["emulator.ocs_app"])
    services = manager.instantiate_apps(**manager.create_contexts())

    httpd = ThreadingHTTPServer(("127.0.0.1", int(config["mgmt_port"])), make_handler(fabric))
    httpd.daemon_threads = True
    stop = threading.Event()

    def _stop(signum: int, _frame: Any) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, _stop)
    signal.signal(signal.SIGINT, _stop)
    threading.Thread(target=httpd.serve_forever, name="ocs-mgmt", daemon=True).start()
    print(f"ready mgmt=127.0.0.1:{httpd.server_address[1]} of=127.0.0.1:{config['of_port']}",
          flush=True)
    stop.wait()
    httpd.shutdown()
    fabric.close()
    # os-ken's native hub threads are not daemons and have no stop flag: leave without them.
    del services, manager
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m emulator.ocs_service",
        description="Emulated OCS: os-ken OpenFlow 1.3 app with a JSON/HTTP management API.")
    parser.add_argument("--config", required=True, type=Path, help="JSON config written by "
                        "the network (ports, rails, event log)")
    parser.add_argument("--log-level", default="WARNING")
    args = parser.parse_args(argv)
    logging.basicConfig(level=args.log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    serve(json.loads(args.config.read_text()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
