"""One private Open vSwitch (``ovsdb-server`` + userspace ``ovs-vswitchd``) per OCS bridge.

Why (issue 29): with the userspace datapath, the one system ``ovs-vswitchd``'s main thread
polls every port of every bridge on each wake-up and forwards every packet, so its cost grows
with ports x wake-ups and the OCS app's light barrier and datapath purge wait behind it
(``docs/performance.md``, "32 emulated ranks"). With one daemon per rail bridge each main
thread polls only its rail's ports, and the rails forward on every core.

Each instance is a child process of the run, held by pid (not ``--detach``ed), recorded in the
run record (:mod:`emulator.runstate`) with its directory as the marker, and stopped by pid at
teardown or by ``opus-testbed clean``. Its directory ``<base>/<bridge>/`` holds the database,
the database socket, both pid files and control sockets, and the bridge's ``<bridge>.mgmt``
(vswitchd puts management sockets in ``OVS_RUNDIR``, set to that directory); the logs go to
``<log dir>/ovs-<bridge>.log`` so they outlive it.

Why the ``dummy`` datapath type: a userspace vswitchd opens its ``netdev`` datapath's local
port as a tap device named ``ovs-netdev`` in the root namespace, which a second daemon cannot
open (the system daemon holds it: "creating tap device failed: Device or resource busy"), so
its bridges fail. ``--enable-dummy`` registers the same userspace datapath (``dpif-netdev``:
the same forwarding, flow cache and ``revalidator/purge``) under the type ``dummy``, whose
internal ports live in the process instead of being tap devices. So internal ports (a
bridge's local port) have no kernel device; the testbed uses none as one (the shadow rails'
ports are veths, :mod:`emulator.shadowports`). ``--disable-system`` keeps each daemon off the
kernel datapath, which is one per machine.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from emulator import runstate
from emulator.ovs_unixctl import Unixctl, UnixctlError

SCHEMA = Path("/usr/share/openvswitch/vswitch.ovsschema")
DATAPATH_TYPE = "dummy"
#: Longest path a Unix socket address holds (``sun_path`` is 108 bytes with its NUL).
UNIX_PATH_MAX = 107
#: Binaries an instance needs besides ``ovs-vsctl``/``ovs-ofctl`` (``opus-testbed check``).
BINARIES = ("ovsdb-tool", "ovsdb-server", "ovs-vswitchd")


#: Environment variable that picks the mode where a caller does not (``1``/``0``).
PER_RAIL_ENV = "OPUS_OVS_PER_RAIL"
#: The mode when neither the caller nor :data:`PER_RAIL_ENV` picks one.
DEFAULT_PER_RAIL = True
_TRUE = ("1", "true", "yes", "on")
_FALSE = ("0", "false", "no", "off")


def per_rail_default(env: Mapping[str, str] | None = None,
                     kernel_datapath: bool | None = None) -> bool:
    """One Open vSwitch per rail unless :data:`PER_RAIL_ENV` (in ``env``, default
    ``os.environ``) says otherwise; when unset or unreadable, :data:`DEFAULT_PER_RAIL`, except
    where the kernel datapath is loaded (``kernel_datapath``, default: the ``openvswitch``
    module is there, as in the Vagrant VM): per-rail instances run the userspace datapath
    only, and the kernel's takes forwarding off vswitchd's main thread altogether."""
    value = (os.environ if env is None else env).get(PER_RAIL_ENV, "").strip().lower()
    if value in _TRUE:
        return True
    if value in _FALSE:
        return False
    if kernel_datapath is None:
        kernel_datapath = Path("/sys/module/openvswitch").exists()
    return DEFAULT_PER_RAIL and not kernel_datapath


def missing_programs(schema: Path = SCHEMA) -> list[str]:
    """What per-rail instances need and this machine lacks (programs, the database schema)."""
    missing = [b for b in (*BINARIES, "ovs-vsctl", "ovs-ofctl") if shutil.which(b) is None]
    return missing + ([] if schema.is_file() else [str(schema)])


class InstanceError(RuntimeError):
    """An instance could not be created or did not become ready (names the instance)."""


@dataclass(frozen=True)
class InstancePaths:
    """Where one instance keeps its files (pure: nothing is created)."""

    bridge: str
    directory: Path
    log_file: Path

    @property
    def db_file(self) -> Path:
        return self.directory / "conf.db"

    @property
    def db_socket(self) -> Path:
        return self.directory / "db.sock"

    @property
    def db_target(self) -> str:
        """What ``ovs-vsctl --db=`` and ``ovs-vswitchd`` take."""
        return f"unix:{self.db_socket}"

    @property
    def ovsdb_pidfile(self) -> Path:
        return self.directory / "ovsdb-server.pid"

    @property
    def ovsdb_ctl(self) -> Path:
        return self.directory / "ovsdb-server.ctl"

    @property
    def vswitchd_pidfile(self) -> Path:
        return self.directory / "ovs-vswitchd.pid"

    @property
    def vswitchd_ctl(self) -> Path:
        """vswitchd's unixctl socket (``ovs-appctl -t`` and :mod:`emulator.ovs_unixctl`)."""
        return self.directory / "ovs-vswitchd.ctl"

    @property
    def mgmt_socket(self) -> Path:
        """The bridge's OpenFlow management socket (``ovs-ofctl``, :mod:`emulator.ofchannel`)."""
        return self.directory / f"{self.bridge}.mgmt"

    @property
    def marker(self) -> str:
        """In both daemons' command lines: identifies them for :func:`runstate.stop_process`."""
        return str(self.directory)

    def sockets(self) -> tuple[Path, ...]:
        return (self.db_socket, self.ovsdb_ctl, self.vswitchd_ctl, self.mgmt_socket,
                self.directory / f"{self.bridge}.snoop")


def instance_paths(bridge: str, base: Path, log_dir: Path) -> InstancePaths:
    return InstancePaths(bridge, base / bridge, log_dir / f"ovs-{bridge}.log")


def fits_unix_paths(paths: InstancePaths) -> bool:
    """True if every socket path of the instance fits a Unix socket address."""
    return all(len(os.fsencode(p)) <= UNIX_PATH_MAX for p in paths.sockets())


def create_db_command(paths: InstancePaths, schema: Path = SCHEMA) -> list[str]:
    return ["ovsdb-tool", "create", str(paths.db_file), str(schema)]


#: Log levels: the log file as the system daemons' (``ovs-ctl``), nothing to syslog, and on
#: stderr (the same file) emergencies only, so lines are not written twice. Unlike ``ovs-ctl``,
#: no ``--mlockall``: with no swap in use it changes nothing, and a dozen instances would each
#: lock their whole address space.
LOG_LEVELS = ("-vconsole:emer", "-vsyslog:off", "-vfile:info")


def ovsdb_server_command(paths: InstancePaths) -> list[str]:
    return ["ovsdb-server", str(paths.db_file), f"--remote=punix:{paths.db_socket}",
            f"--pidfile={paths.ovsdb_pidfile}", f"--unixctl={paths.ovsdb_ctl}",
            f"--log-file={paths.log_file}", *LOG_LEVELS, "--no-chdir"]


def vswitchd_command(paths: InstancePaths) -> list[str]:
    return ["ovs-vswitchd", paths.db_target, f"--pidfile={paths.vswitchd_pidfile}",
            f"--unixctl={paths.vswitchd_ctl}", f"--log-file={paths.log_file}", *LOG_LEVELS,
            "--no-chdir", "--disable-system", "--enable-dummy"]


def instance_env(paths: InstancePaths, base: Mapping[str, str]) -> dict[str, str]:
    """The daemons' environment: their run, database and log directories are the instance's
    (vswitchd creates ``<bridge>.mgmt`` in ``OVS_RUNDIR``)."""
    return {**base, "OVS_RUNDIR": str(paths.directory), "OVS_DBDIR": str(paths.directory),
            "OVS_LOGDIR": str(paths.log_file.parent)}


def vsctl_command(paths: InstancePaths, *args: str, timeout_s: float = 10.0) -> list[str]:
    return ["ovs-vsctl", f"--db={paths.db_target}", f"--timeout={timeout_s:g}", *args]


def ofctl_target(paths: InstancePaths) -> str:
    """What ``ovs-ofctl`` takes for the instance's bridge."""
    return f"unix:{paths.mgmt_socket}"


class OvsInstances:
    """The run's instances, one per bridge: started together, stopped by pid."""

    def __init__(self, bridges: Iterable[str], base: Path, log_dir: Path,
                 record: runstate.RunRecord) -> None:
        self.paths = {b: instance_paths(b, base, log_dir) for b in bridges}
        self.base = base
        self.record = record
        self._procs: list[subprocess.Popen[Any]] = []
        self._logs: list[IO[str]] = []
        self.vswitchd_pids: list[int] = []

    def start(self, timeout_s: float = 20.0) -> None:
        """Create every database, start the database servers, then the switches, and wait
        until each answers; :class:`InstanceError` naming the instance that did not."""
        for paths in self.paths.values():
            if not fits_unix_paths(paths):
                raise InstanceError(f"OVS instance {paths.bridge}: socket paths under "
                                    f"{paths.directory} exceed {UNIX_PATH_MAX} bytes")
            paths.directory.mkdir(parents=True, exist_ok=True)
            paths.log_file.parent.mkdir(parents=True, exist_ok=True)
            _check(create_db_command(paths), paths.bridge, "ovsdb-tool create")
        for paths in self.paths.values():
            self._spawn(ovsdb_server_command(paths), paths)
        deadline = time.monotonic() + timeout_s
        for paths in self.paths.values():
            self._wait(paths, deadline, "ovsdb-server", lambda p=paths: p.db_socket.exists())
            _check(vsctl_command(paths, "--no-wait", "init"), paths.bridge, "ovs-vsctl init")
        for paths in self.paths.values():
            self.vswitchd_pids.append(self._spawn(vswitchd_command(paths), paths))
        for paths in self.paths.values():
            self._wait(paths, deadline, "ovs-vswitchd", lambda p=paths: _answers(p))

    def stop(self) -> None:
        """Stop every daemon by pid (SIGTERM, then SIGKILL), remove the instance directories."""
        for proc in self._procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self._procs:
            try:
                proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                proc.kill()
                with contextlib.suppress(subprocess.TimeoutExpired):  # teardown goes on
                    proc.wait(timeout=3)
        self._procs.clear()
        for log in self._logs:
            log.close()
        self._logs.clear()
        for paths in self.paths.values():
            shutil.rmtree(paths.directory, ignore_errors=True)
        if self.base.is_dir() and not any(self.base.iterdir()):
            self.base.rmdir()

    @property
    def vswitchd_by_bridge(self) -> dict[str, int]:
        """Each started instance's ovs-vswitchd pid, by the bridge it runs."""
        return dict(zip(self.paths, self.vswitchd_pids, strict=False))

    def vsctl(self, bridge: str, *args: str, timeout_s: float = 10.0) -> list[str]:
        return vsctl_command(self.paths[bridge], *args, timeout_s=timeout_s)

    def _spawn(self, command: list[str], paths: InstancePaths) -> int:
        log = paths.log_file.open("a")
        self._logs.append(log)
        # Own session: a Ctrl-C to the run's process group does not stop them before the
        # network's teardown, which still needs their databases.
        proc = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                env=instance_env(paths, os.environ), start_new_session=True)
        self._procs.append(proc)
        self.record.add_process(proc.pid, paths.marker)
        return proc.pid

    def _wait(self, paths: InstancePaths, deadline_s: float, daemon: str,
              ready: Any) -> None:
        while not ready():
            dead = [p for p in self._procs if p.poll() is not None]
            if dead or time.monotonic() > deadline_s:
                why = (f"exited with {dead[0].returncode}" if dead else "not ready in time")
                raise InstanceError(f"OVS instance {paths.bridge}: {daemon} {why}; see "
                                    f"{paths.log_file}")
            time.sleep(0.02)


def _answers(paths: InstancePaths) -> bool:
    """vswitchd answers on its control socket."""
    if not paths.vswitchd_ctl.exists():
        return False
    client = Unixctl(str(paths.vswitchd_ctl), timeout_s=2.0)
    try:
        client.call("version")
    except (UnixctlError, OSError):  # a socket bound but not yet listening refuses
        return False
    finally:
        client.close()
    return True


def _check(command: list[str], bridge: str, what: str) -> None:
    res = subprocess.run(command, capture_output=True, text=True, check=False)
    if res.returncode != 0:
        raise InstanceError(f"OVS instance {bridge}: {what} failed: {res.stderr.strip()[-300:]}")


def instance_switch_class(instances: OvsInstances) -> Any:
    """A Mininet OVS switch class whose ``ovs-vsctl``/``ovs-ofctl`` calls go to the switch's
    own instance (by bridge name). Mininet is imported here, so pure users never load it."""
    from mininet.node import OVSSwitch, TCIntf

    class InstanceSwitch(OVSSwitch):
        """An OVS bridge in its own ovsdb-server/ovs-vswitchd (:class:`OvsInstances`)."""

        @classmethod
        def setup(cls) -> None:
            # The system instance need not run: only the version (for ``isOldOVS``).
            out = subprocess.run(["ovs-vsctl", "--version"], capture_output=True, text=True,
                                 check=False).stdout
            found = re.findall(r"\d+\.\d+", out)
            cls.OVSVersion = found[0] if found else "3.0"

        def _paths(self) -> InstancePaths:
            return instances.paths[self.name]

        def bridgeOpts(self) -> str:
            return super().bridgeOpts().replace("datapath_type=netdev",
                                                f"datapath_type={DATAPATH_TYPE}")

        def vsctl(self, *args: Any, **kwargs: Any) -> Any:
            if self.batch:
                return super().vsctl(*args, **kwargs)
            return self.cmd(" ".join(vsctl_command(self._paths())), *args, **kwargs)

        def dpctl(self, *args: Any) -> Any:
            return self.cmd("ovs-ofctl", args[0], ofctl_target(self._paths()), *args[1:])

        def controllerUUIDs(self, update: bool = False) -> Any:
            uuids: list[str] = getattr(self, "_uuids", [])
            if not uuids or update:
                out = self.vsctl("-- get Bridge", self, "Controller")
                text = str(out or "").strip()
                if text.startswith("[") and text.endswith("]"):
                    uuids = [c.strip() for c in text[1:-1].split(",") if c.strip()]
                    self._uuids = uuids
            return uuids

        def stop(self, deleteIntfs: bool = True) -> None:
            self.cmd(" ".join(vsctl_command(self._paths(), "--if-exists", "del-br")), self)
            super(OVSSwitch, self).stop(deleteIntfs)

        @classmethod
        def batchStartup(cls, switches: Any, run: Any = None) -> Any:
            """Each switch's queued commands as one ``ovs-vsctl`` on its own database, all
            switches at once (each daemon creates its datapath in parallel)."""
            procs = []
            for switch in switches:
                words = " ".join(c.strip() for c in switch.commands)
                command = " ".join(vsctl_command(switch._paths(), timeout_s=30)) + " " + words
                procs.append((switch, subprocess.Popen(command, shell=True, text=True,
                                                       stdout=subprocess.PIPE,
                                                       stderr=subprocess.PIPE)))
                switch.commands = []
                switch.batch = False
            failed = []
            for switch, proc in procs:
                _out, err = proc.communicate()
                if proc.returncode != 0:
                    failed.append(f"{switch.name}: {err.strip()[-300:]}")
            if failed:
                raise InstanceError("cannot create bridges: " + "; ".join(failed))
            for switch in switches:
                for intf in switch.intfs.values():
                    if isinstance(intf, TCIntf):
                        intf.config(**intf.params)
            return switches

        @classmethod
        def batchShutdown(cls, switches: Any, run: Any = None) -> Any:
            for switch in switches:
                subprocess.run(vsctl_command(switch._paths(), "--if-exists", "del-br",
                                             switch.name, timeout_s=5),
                               capture_output=True, check=False)
            for switch in switches:
                switch.terminate()
            return switches

    return InstanceSwitch
