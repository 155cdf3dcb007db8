"""``opus-testbed ocs``: run a Polatis or CALIENT simulator, and inspect or drive a lab switch by
hand.

``register(subparsers)`` adds the ``ocs`` command to the main parser; the handlers return an exit
code (0 ok, 1 device or rule error, 2 bad configuration). ``python -m testbed.cli.ocs ...`` runs
the same sub-commands on their own.
"""

from __future__ import annotations

import argparse
import json
import logging
import signal
import sys
from collections.abc import Callable, Sequence
from typing import Any

EPILOG = """\
examples:
  opus-testbed ocs simulate --protocol netconf --port 8830 --size 16x16 --host-key sim.key
  export OPUS_OCS_PASSWORD=root      # the simulator prints the host key fingerprint to pin:
  opus-testbed ocs status --host 127.0.0.1 --port 8830 --host-key-fingerprint SHA256:... --json
  opus-testbed ocs connect 1 2 --host 127.0.0.1 --port 8830 --ports 1-4   # + the same pin
  opus-testbed ocs disconnect 1 2 --host 127.0.0.1 --port 8830 --ports 1-4
  opus-testbed ocs simulate --protocol tl1 --port 3082 --fail-port 3
  opus-testbed ocs status --protocol tl1 --host 127.0.0.1 --port 3082
  opus-testbed ocs simulate --driver calient-tl1 --port 3083 --size 32
  opus-testbed ocs status --driver calient-tl1 --host 127.0.0.1 --port 3083
  opus-testbed ocs plan examples/tiny.yaml
--protocol netconf|tl1 and --driver polatis-netconf|polatis-tl1 are the same setting, on
every action; --driver calient-tl1 is a CALIENT switch over TL1.
"""
CALIENT = "calient-tl1"
PROTOCOLS = ("netconf", "tl1")

TARGET_HELP = """\
the switch: --config FILE (a YAML file with an `ocs:` mapping, e.g. the experiment file), or
--host/--port/... for one switch. The password comes from $OPUS_OCS_PASSWORD (or
--password-env NAME) or a credentials file (YAML with `password`, mode 600).
"""


def _driver(text: str) -> str:
    """``--driver polatis-netconf|polatis-tl1`` as its protocol (``netconf``/``tl1``);
    ``calient-tl1`` stays itself."""
    if text == CALIENT:
        return text
    protocol = text.removeprefix("polatis-")
    if protocol not in PROTOCOLS:
        raise argparse.ArgumentTypeError(
            f"invalid choice {text!r} (choose from polatis-netconf, polatis-tl1, {CALIENT})")
    return protocol


def _driver_name(protocol: str | None) -> str:
    """The ``ocs.driver`` name of ``--protocol``/``--driver`` (default polatis-netconf)."""
    return CALIENT if protocol == CALIENT else f"polatis-{protocol or 'netconf'}"


def _add_protocol(g: Any) -> None:
    """``--protocol``/``--driver``: one setting, spelled either way, on every action."""
    g.add_argument("--protocol", choices=PROTOCOLS, default=None,
                   help="management protocol (default netconf; same as --driver)")
    g.add_argument("--driver", dest="protocol", type=_driver, default=None,
                   metavar="{polatis-netconf,polatis-tl1,calient-tl1}",
                   help="the same as --protocol, as an experiment file's ocs.driver spells it; "
                   "calient-tl1: a CALIENT switch over TL1")


def _target_parent() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(add_help=False)
    g = p.add_argument_group("switch", TARGET_HELP)
    g.add_argument("--config", metavar="FILE",
                   help="YAML file holding an `ocs:` mapping (a hardware ocs.driver)")
    _add_protocol(g)
    g.add_argument("--host", help="switch address (one switch, rail 0)")
    g.add_argument("--port", type=int, help="management port (default 830 NETCONF, 3082 "
                   "Polatis TL1, 3083 CALIENT TL1)")
    g.add_argument("--username", help="login name (default: admin)")
    g.add_argument("--password-env", metavar="NAME",
                   help="environment variable holding the password (default OPUS_OCS_PASSWORD)")
    g.add_argument("--credentials-file", metavar="FILE",
                   help="YAML file with `password` (and `username`), mode 600")
    g.add_argument("--size", help="expected size N or NxN; a switch of another size is refused")
    g.add_argument("--timeout-s", type=float, help="per-request timeout in seconds (default 10)")
    g.add_argument("--ports", help="the rail ports this command may touch, e.g. 1-4,9 (default: "
                   "every port); a circuit of another user on one of them is refused")
    g.add_argument("--host-key-fingerprint", metavar="SHA256:...",
                   help="NETCONF: the switch's SSH host key fingerprint (a first connection "
                   "without a pin is refused and prints the fingerprint offered)")
    g.add_argument("--known-hosts", metavar="FILE",
                   help="NETCONF: an OpenSSH known_hosts file holding the switch's key")
    g.add_argument("--insecure-skip-host-key", action="store_true", default=None,
                   help="NETCONF: do not check the switch's host key (warned on every use)")
    return p


def register(subparsers: Any) -> argparse.ArgumentParser:
    """Add ``ocs`` with ``simulate``, ``status``, ``connect``, ``disconnect`` and ``plan``."""
    p = subparsers.add_parser(
        "ocs", help="lab OCS (Polatis, CALIENT): run a simulator, or inspect and drive a switch",
        description="Hardware-in-the-loop tools for Polatis optical circuit switches (NETCONF "
        "or TL1) and CALIENT ones (TL1, --driver calient-tl1). Polatis: rail port p is ingress "
        "p and egress N+p of an N x N switch; a circuit a<->b is the pairs a->N+b and b->N+a. "
        "CALIENT: rail port p is the switch's p-th duplex port (1 = 1.1.1, 9 = 1.2.1); a "
        "circuit a<->b is one 2WAY connection.",
        epilog=EPILOG, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="ocs_command", required=True, metavar="ACTION")

    s = sub.add_parser(
        "simulate", help="run a simulated Polatis or CALIENT switch on 127.0.0.1 until Ctrl-C",
        description="Run a simulated Polatis N x N switch in the foreground on 127.0.0.1: "
        "NETCONF over SSH (optical-switch YANG) or TL1 over TCP. It validates edits, models "
        "the switching time (touched egress ports read about -60 dBm meanwhile) and can inject "
        "faults. --driver calient-tl1 runs a CALIENT switch of N duplex ports over TL1 instead "
        "(ENT-CRS/ACT-CRS connections; no light reads NONE). Stop it with Ctrl-C or SIGTERM.")
    _add_protocol(s)
    s.add_argument("--port", type=int, default=0,
                   help="TCP port on 127.0.0.1 (default 0: a free port, printed at start)")
    s.add_argument("--size", default="16x16", help="switch size NxN (default 16x16)")
    s.add_argument("--user", default="admin", help="login name (default admin)")
    s.add_argument("--password", default="root",
                   help="login password (default root, the factory default)")
    s.add_argument("--revision", default=None,
                   help="optical-switch YANG revision to announce (default 2017-08-04; an "
                   "earlier one makes the cross-connect list `pairs`)")
    s.add_argument("--switching-ms", type=float, default=None,
                   help="switching time in ms (default 25, a piezo-beam switch; CALIENT 200, "
                   "a bulk switch on an S320)")
    s.add_argument("--fail-port", type=int, action="append", default=[], metavar="PORT",
                   help="report this device port FAILED (repeatable)")
    s.add_argument("--reply-delay-ms", type=float, default=0.0,
                   help="delay every reply (a slow device)")
    s.add_argument("--no-base11", action="store_true",
                   help="NETCONF: announce base:1.0 only (end-of-message framing)")
    s.add_argument("--host-key", metavar="FILE",
                   help="NETCONF: the SSH host key (OpenSSH private key), created there (mode "
                   "600) if absent, so clients can keep their pin across restarts (default: a "
                   "new key per simulator process)")
    s.add_argument("--json", action="store_true",
                   help="print the listening address as one JSON line")
    s.set_defaults(func=cmd_simulate)

    parent = _target_parent()
    s = sub.add_parser(
        "status", parents=[parent], help="show a switch: model, size, circuits, port light",
        description="Connect to the configured switch(es) and show model, size, YANG revision, "
        "the rail circuits read from the device, one-way (stray) pairs, and each rail port's "
        "light (lit, dark, idle, or failed as the switch reports it).")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=cmd_status)

    for name, verb in (("connect", "set up"), ("disconnect", "take down")):
        s = sub.add_parser(
            name, parents=[parent], help=f"{verb} one duplex circuit between two rail ports",
            description=f"{verb.capitalize()} the duplex circuit between rail ports A and B "
            "(pairs A->N+B and B->N+A), checked against the device's current cross-connects "
            "first; prints the time from request to light.")
        s.add_argument("a", type=int, help="rail port A")
        s.add_argument("b", type=int, help="rail port B")
        s.add_argument("--rail", type=int, default=0, help="rail (default 0)")
        s.add_argument("--json", action="store_true", help="print the result as JSON")
        s.set_defaults(func=cmd_connect if name == "connect" else cmd_disconnect)

    s = sub.add_parser(
        "plan", help="list what a run will do to the switch, without touching it",
        description="Play the experiment's first iteration on the virtual clock (the sim "
        "backend's engine and the same Opus core) and list, per rail, the ports the run owns "
        "and every cross-connect it makes and removes, in order. No switch is contacted.")
    s.add_argument("config", metavar="CONFIG", help="experiment file (YAML)")
    s.add_argument("--json", action="store_true", help="machine-readable output")
    s.set_defaults(func=cmd_plan)
    return p


# --- handlers ------------------------------------------------------------------------------

def _parse_size(text: str) -> int:
    a, sep, b = text.lower().partition("x")
    if not a.isdigit() or (sep and b != a) or int(a) < 1:
        print(f"opus-testbed ocs: error: --size must be NxN (square), got {text!r}",
              file=sys.stderr)
        raise SystemExit(2)
    return int(a)


def cmd_simulate(args: argparse.Namespace) -> int:
    from controller.drivers.polatis.xml import CURRENT_REVISION
    from emulator.polatis.model import PolatisDevice
    from emulator.polatis.netconf_server import NetconfServer
    from emulator.polatis.server import BackgroundServer
    from emulator.polatis.tl1_server import Tl1Server

    size = _parse_size(args.size)
    if args.protocol == CALIENT:
        return _simulate_calient(args, size)
    args.protocol = args.protocol or "netconf"
    if args.switching_ms is None:
        args.switching_ms = 25.0
    try:
        device = PolatisDevice(size, revision=args.revision or CURRENT_REVISION,
                               switching_time_ms=args.switching_ms)
    except ValueError as exc:
        print(f"opus-testbed ocs: error: {exc}", file=sys.stderr)
        return 2
    device.faults.failed_ports.update(args.fail_port)
    device.faults.reply_delay_s = args.reply_delay_ms / 1e3
    server: BackgroundServer
    if args.protocol == "netconf":
        server = NetconfServer(device, port=args.port, username=args.user,
                               password=args.password, base11=not args.no_base11,
                               host_key=args.host_key)
    else:
        server = Tl1Server(device, port=args.port, username=args.user, password=args.password)
    def describe(server: Any) -> tuple[dict[str, Any], list[str]]:
        fingerprint = getattr(server, "host_key_fingerprint", None)
        info = {"protocol": args.protocol, "host": server.host, "port": server.port,
                "size": f"{size}x{size}", "username": args.user, "revision": device.revision,
                "switching_ms": args.switching_ms, "host_key_fingerprint": fingerprint}
        lines = [f"simulated Polatis {size}x{size} ({args.protocol}, revision "
                 f"{device.revision}) listening on {server.host}:{server.port}; login "
                 f"{args.user}; Ctrl-C to stop"]
        if fingerprint:
            lines.append(f"SSH host key {fingerprint}: pin it with host_key_fingerprint: "
                         f"\"{fingerprint}\" (or --host-key-fingerprint)")
        return info, lines

    return _serve(args, server, device, describe)


def _serve(args: argparse.Namespace, server: Any, device: Any,
           describe: Callable[[Any], tuple[dict[str, Any], list[str]]]) -> int:
    """Serve a simulated switch until Ctrl-C, announcing it first (its JSON line with
    ``--json``, else its banner lines); 1 when it cannot listen."""
    try:
        server.start()
    except OSError as exc:
        print(f"opus-testbed ocs: error: cannot listen on 127.0.0.1:{args.port}: "
              f"{exc.strerror or exc}", file=sys.stderr)
        return 1
    try:
        info, lines = describe(server)
        if args.json:
            print(json.dumps(info), flush=True)
        else:
            for line in lines:
                print(line, flush=True)
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    if not args.json:
        print(f"simulator stopped after {device.edits} edit(s)", file=sys.stderr)
    return 0


def _simulate_calient(args: argparse.Namespace, size: int) -> int:
    from emulator.calient.model import CalientDevice
    from emulator.calient.tl1_server import CalientTl1Server

    switching_ms = 200.0 if args.switching_ms is None else args.switching_ms
    device = CalientDevice(size, switching_time_ms=switching_ms)
    bad = [p for p in args.fail_port if not 1 <= p <= size]
    if bad:
        print(f"opus-testbed ocs: error: --fail-port {bad[0]} is not a port 1..{size}",
              file=sys.stderr)
        return 2
    device.faults.failed_ports.update(args.fail_port)
    device.faults.reply_delay_s = args.reply_delay_ms / 1e3
    server = CalientTl1Server(device, port=args.port, username=args.user,
                              password=args.password)

    def describe(server: Any) -> tuple[dict[str, Any], list[str]]:
        info = {"driver": CALIENT, "protocol": "tl1", "host": server.host, "port": server.port,
                "size": f"{size}x{size}", "username": args.user, "model": device.model,
                "switching_ms": switching_ms}
        return info, [f"simulated CALIENT {device.model} ({size} ports {device.names[0]}.."
                      f"{device.names[-1]}, TL1) listening on {server.host}:{server.port}; "
                      f"login {args.user}; Ctrl-C to stop"]

    return _serve(args, server, device, describe)


def _ocs_config(args: argparse.Namespace) -> Any:
    from controller.drivers.config import OcsConfigError
    from controller.drivers.registry import load_ocs_config, parse_ocs_config

    if args.config:
        if args.host:
            raise OcsConfigError("--host", "give either --config or --host, not both")
        if args.protocol:
            raise OcsConfigError("--protocol", "the --config file's ocs.driver names the "
                                 "protocol; give --protocol/--driver with --host only")
        return load_ocs_config(args.config)
    if not args.host:
        raise OcsConfigError("--host", "give --host HOST (or --config FILE)")
    mapping: dict[str, Any] = {"driver": _driver_name(args.protocol), "host": args.host}
    for key, value in (("port", args.port), ("username", args.username),
                       ("password_env", args.password_env),
                       ("credentials_file", args.credentials_file), ("size", args.size),
                       ("timeout_s", args.timeout_s), ("ports", _port_list(args.ports)),
                       ("host_key_fingerprint", args.host_key_fingerprint),
                       ("known_hosts", args.known_hosts),
                       ("insecure_skip_host_key", args.insecure_skip_host_key)):
        if value is not None:
            mapping[key] = value
    return parse_ocs_config(mapping, key="ocs (command line)")


def _port_list(text: str | None) -> list[int] | None:
    """``--ports 1-4,9`` as ``[1, 2, 3, 4, 9]``."""
    from controller.drivers.config import OcsConfigError

    if text is None:
        return None
    ports: list[int] = []
    try:
        for part in text.split(","):
            a, sep, b = part.strip().partition("-")
            ports.extend(range(int(a), int(b) + 1) if sep else [int(a)])
    except ValueError:
        raise OcsConfigError("--ports", f"must be ports and ranges such as 1-4,9, got "
                             f"{text!r}") from None
    return ports


def _with_driver(args: argparse.Namespace, body: Callable[[Any], int], *,
                 claim: bool = True) -> int:
    """Run ``body`` with the configured switch's driver (a port guard: ``claim`` refuses a
    switch where another user's cross-connect uses one of ``--ports``; a hand-made edit
    stays when the command ends)."""
    from controller.drivers.config import OcsConfigError
    from controller.drivers.guard import PortConflict
    from controller.drivers.polatis.errors import PolatisError
    from controller.drivers.registry import make_driver
    from controller.ocs import ReconfigurationRejected

    # paramiko logs a failed handshake's traceback from its transport thread, on ncclient's
    # logger; the error printed below says what went wrong
    for name in ("paramiko", "ncclient"):
        logging.getLogger(name).addHandler(logging.NullHandler())
        logging.getLogger(name).propagate = False
    try:
        cfg = _ocs_config(args)
        if not cfg.is_hardware:
            raise OcsConfigError("ocs.driver", f"driver {cfg.driver} has no switch to talk to; "
                                 "use polatis-netconf, polatis-tl1 or calient-tl1")
        with make_driver(cfg, claim=claim, restore_on_close=False) as driver:
            return body(driver)
    except OcsConfigError as exc:
        print(f"opus-testbed ocs: error: {exc}", file=sys.stderr)
        return 2
    except (PolatisError, ReconfigurationRejected, PortConflict) as exc:
        print(f"opus-testbed ocs: error: {exc}", file=sys.stderr)
        if "host_key_fingerprint" in str(exc) and not args.config:
            print("  on the command line: --host-key-fingerprint SHA256:..., --known-hosts FILE "
                  "or --insecure-skip-host-key", file=sys.stderr)
        if "SSH protocol banner" in str(exc):
            print("  the port does not speak SSH: if it is a TL1 port, add --protocol tl1",
                  file=sys.stderr)
        for note in getattr(exc, "__notes__", []):
            print(f"  {note}", file=sys.stderr)
        return 1


def cmd_status(args: argparse.Namespace) -> int:
    def body(driver: Any) -> int:
        rails = []
        for rail in driver.rails:
            view = driver.read_device(rail)
            states = driver.port_states(rail)
            rails.append({
                "rail": rail, "device": driver.device_name(rail),
                "info": driver.device_info(rail).to_json(),
                "circuits": [c.to_json() for c in sorted(view.circuits)],
                "stray_pairs": [list(p) for p in sorted(view.stray_pairs)],
                "port_states": {str(p): s.value for p, s in states.items()},
                # a reading of no light (-inf, CALIENT's NONE) is null in JSON
                "power_dbm": {str(p): v if v > float("-inf") else None
                              for p, v in sorted(driver.power_dbm(rail).items())},
                "conflicts": [list(c) for c in driver.conflicts.get(rail, [])],
            })
        if args.json:
            print(json.dumps({"rails": rails}, indent=1))
            return 0
        for r in rails:
            info = r["info"]
            print(f"rail {r['rail']}: {r['device']}  {info['model']} ({info['size']}), "
                  f"revision {info['revision'] or '-'}, serial {info['serial'] or '-'}")
            circuits = ", ".join(f"{a}<->{b}" for a, b in r["circuits"]) or "none"
            print(f"  circuits: {circuits}")
            if r["stray_pairs"]:
                stray = ", ".join(f"{i}->{e}" for i, e in r["stray_pairs"])
                print(f"  one-way pairs (cleared when their ports are next set): {stray}")
            if r["conflicts"]:
                taken = ", ".join(f"{a}<->{b}" for a, b in r["conflicts"])
                print(f"  cross-connects joining --ports to other ports (another user's?): "
                      f"{taken}; an edit here is refused while they stand")
            counts: dict[str, list[str]] = {}
            for port, state in r["port_states"].items():
                counts.setdefault(state, []).append(port)
            print("  ports: " + "; ".join(f"{state}: {' '.join(ports)}"
                                          for state, ports in sorted(counts.items())))
        return 0

    return _with_driver(args, body, claim=False)


def _apply(args: argparse.Namespace, connect: bool) -> int:
    from controller.ocs import Circuit

    def body(driver: Any) -> int:
        circuit = Circuit(args.rail, args.a, args.b)
        if connect:
            result = driver.apply(args.rail, add=[circuit])
        else:
            result = driver.apply(args.rail, remove=[circuit])
        elapsed_ms = (result.t_light_s - result.t_request_s) * 1e3
        if args.json:
            print(json.dumps({**result.to_json(), "request_to_light_ms": elapsed_ms},
                             indent=1))
        else:
            print(f"rail {args.rail}: {'connected' if connect else 'disconnected'} "
                  f"{circuit.port_a}<->{circuit.port_b} in {elapsed_ms:.1f} ms "
                  f"(request to confirmed {'light' if connect else 'dark'})")
        return 0

    return _with_driver(args, body)


def cmd_connect(args: argparse.Namespace) -> int:
    return _apply(args, connect=True)


def cmd_disconnect(args: argparse.Namespace) -> int:
    return _apply(args, connect=False)


def cmd_plan(args: argparse.Namespace) -> int:
    from testbed.errors import RunRefused
    from testbed.experiment.config import load_experiment
    from testbed.studies.ocsplan import ocs_plan, plan_text
    from workloads.errors import WorkloadConfigError

    try:
        plan = ocs_plan(load_experiment(args.config))
    except (WorkloadConfigError, RunRefused) as exc:
        print(f"opus-testbed ocs: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(plan, indent=1) if args.json else plan_text(plan))
    return 0


# --- standalone entry point ----------------------------------------------------------------

def _raise_interrupt(_signum: int, _frame: object) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m testbed.cli.ocs ACTION ...`` (the same as ``opus-testbed ocs ACTION ...``)."""
    parser = argparse.ArgumentParser(prog="opus-testbed")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    register(sub)
    args = parser.parse_args(["ocs", *(argv if argv is not None else sys.argv[1:])])
    signal.signal(signal.SIGTERM, _raise_interrupt)
    try:
        return int(args.func(args))
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
