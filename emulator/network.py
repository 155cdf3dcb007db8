"""The running emulated photonic-rail network, as a context manager that always tears down.

``with emulated_rails(spec) as net:`` builds the Mininet network of :mod:`emulator.topo` on
userspace (or kernel, when available) Open vSwitch (shadow bridges get three veth ports whose
far ends sit in the run's shadow namespace, :mod:`emulator.shadowports`),
starts the OCS app process
(:mod:`emulator.ocs_service`), waits until every rail bridge is connected, prepares the hosts
(offloads, addresses, routes) and yields an :class:`EmulatedRails`. On the way out, normal or
by exception, it stops the processes it started (by pid), the network, and the OCS process,
checks that no bridge or interface of the run is left, and removes the run record.

``ovs_per_rail`` (default: :func:`emulator.ovs_instance.per_rail_default`) gives every OCS
bridge its own ``ovsdb-server`` + ``ovs-vswitchd`` (:mod:`emulator.ovs_instance`), started
before Mininet and stopped after it; otherwise every bridge lives in the system instance.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from controller.drivers.emulated import EmulatedOcsDriver
from controller.railstate import SHADOW_PORTS
from emulator import cpuquota, naming, runstate, shadowports, vswitchd_priority
from emulator.hostnet import (
    HostRouter,
    bridge_shaping_commands,
    interface_setup_commands,
    shell_runner,
)
from emulator.ofchannel import mgmt_socket as system_mgmt_socket
from emulator.ovs_instance import (
    OvsInstances,
    missing_programs,
    ofctl_target,
    per_rail_default,
)
from emulator.topo import RailSpec, build_topo

LOG = logging.getLogger("opus.emulator")


class EmulationError(RuntimeError):
    """The emulated network could not be built or did not become ready."""


def free_tcp_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def kernel_datapath_available() -> bool:
    """True when the openvswitch kernel module is loaded (e.g. in the Vagrant VM)."""
    return Path("/sys/module/openvswitch").exists()


def _taken_slots() -> set[int]:
    out = subprocess.run(["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True,
                         check=False).stdout
    slots = set()
    for word in out.split():
        if word.startswith("198.18."):
            with contextlib.suppress(ValueError, IndexError):
                slots.add(int(word.split(".")[2]))
    return slots


def wait_for(predicate: Any, timeout_s: float, what: str, interval_s: float = 0.02) -> Any:
    """Poll ``predicate`` until it returns a truthy value; raise naming ``what`` on timeout."""
    deadline = time.monotonic() + timeout_s
    last_exc: Exception | None = None
    while True:
        try:
            value = predicate()
            if value:
                return value
        except Exception as exc:  # keep polling; report the last error on timeout
            last_exc = exc
        if time.monotonic() > deadline:
            detail = f" (last error: {last_exc})" if last_exc else ""
            raise TimeoutError(f"timed out after {timeout_s:g} s waiting for {what}{detail}")
        time.sleep(interval_s)


def _run_tc_batch(commands: Sequence[str], path: Path) -> None:
    """Run ``tc`` commands (root namespace) as one ``tc -batch``; raise naming the failure."""
    if not commands:
        return
    path.write_text("".join(c.removeprefix("tc ") + "\n" for c in commands))
    res = subprocess.run(["tc", "-batch", str(path)], capture_output=True, text=True,
                         check=False)
    if res.returncode != 0:
        raise EmulationError(f"link shaping failed ({path}): {res.stderr.strip()[-500:]}")


def kernel_bridge_class() -> Any:
    """A Mininet switch class for the frontend: a Linux bridge, not Open vSwitch.

    The frontend carries control traffic only (shims' intents, acks and heartbeats: with 32
    ranks about as many packets as all rails together) and models nothing, so it stays out of
    the userspace datapath, whose one thread polls every port of every userspace bridge on each
    wake-up. Mininet is imported here, so pure users never load it.
    """
    from mininet.node import Switch

    class KernelBridge(Switch):
        """A Linux bridge without STP: ports forward as soon as they join."""

        def start(self, _controllers: Any) -> None:
            self.cmd(f"ip link add {self.name} type bridge stp_state 0 && "
                     f"ip link set {self.name} up")
            for intf in self.intfList():
                if self.name in intf.name:
                    self.cmd(f"ip link set {intf.name} master {self.name}")

        def stop(self, deleteIntfs: bool = True) -> None:
            self.cmd(f"ip link del {self.name}")
            super().stop(deleteIntfs)

    return KernelBridge


@dataclass
class EmulatedRails:
    """Handle on a running emulated network (valid inside the ``with`` block)."""

    spec: RailSpec
    prefix: str
    run_dir: Path
    net: Any
    driver: EmulatedOcsDriver
    record: runstate.RunRecord
    slot: int
    datapath: str
    router: HostRouter
    vswitchd_priority: str  # what the run did to ovs-vswitchd's scheduling, in words
    ocs_pid: int | None = None  # the OCS app's process
    #: the cgroup with the ranks' CPU quota (None: no quota); every process started through
    #: :meth:`popen_on` goes into it
    rank_cgroup: cpuquota.RankCgroup | None = None
    instances: OvsInstances | None = None  # one Open vSwitch per OCS bridge, or the system's
    _procs: list[subprocess.Popen[Any]] = field(default_factory=list)

    @property
    def ovs(self) -> str:
        """Which Open vSwitch runs the bridges: ``per-rail`` or ``system``."""
        return "system" if self.instances is None else "per-rail"

    @property
    def vswitchd_pids(self) -> list[int]:
        """The run's own vswitchds (none when the bridges live in the system instance)."""
        return [] if self.instances is None else list(self.instances.vswitchd_pids)

    def mgmt_socket(self, rail: int) -> str:
        """Rail ``rail``'s OpenFlow management socket (its instance's, or the system one's)."""
        bridge = naming.rail_bridge(self.prefix, rail)
        if self.instances is None:
            return system_mgmt_socket(bridge)
        return str(self.instances.paths[bridge].mgmt_socket)

    def ofctl_target(self, bridge: str) -> str:
        """What ``ovs-ofctl`` takes for ``bridge`` (its instance's socket, or its name)."""
        return bridge if self.instances is None else ofctl_target(self.instances.paths[bridge])

    def host(self, rank: int) -> Any:
        return self.net.get(naming.host_name(self.prefix, rank))

    def node(self, host: int) -> Any:
        """The Mininet host of host number ``host`` (a rank's, or spare ``host - N``)."""
        return self.net.get(self.spec.host_name(self.prefix, host))

    def set_rail_links(self, host: int, up: bool) -> None:
        """Bring the switch side of ``host``'s rail links down (a cut fibre, a dead NIC: the host
        loses carrier) or up again, and, going up, the host side too."""
        state = "up" if up else "down"
        for p in self.spec.host_ports(host):
            subprocess.run(["ip", "link", "set", "dev",
                            naming.bridge_port_intf(self.prefix, p.rail, p.port), state],
                           capture_output=True, check=False)
        if up:
            self.node(host).cmd(" ; ".join(
                f"ip link set dev {self.spec.host_rail_intf(self.prefix, host, p.port_index)} up"
                for p in self.spec.host_ports(host)))

    def rank_address(self, rank: int) -> str:
        return naming.rank_address(rank)

    def frontend_address(self, rank: int) -> str:
        return naming.frontend_address(self.slot, rank)

    @property
    def root_frontend_address(self) -> str:
        return naming.frontend_root_address(self.slot)

    def rail_intf(self, rank: int, port_index: int = 0) -> str:
        return naming.rail_intf(self.prefix, rank, port_index)

    def port(self, rank: int, port_index: int = 0) -> int:
        """OpenFlow port of ``rank``'s NIC port on its rail bridge."""
        return self.spec.rank_ports(rank)[port_index].port

    def popen(self, rank: int, args: Sequence[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """Start a process inside ``rank``'s namespace; it is stopped at teardown."""
        return self.popen_on(rank, args, **kwargs)

    def popen_on(self, host: int, args: Sequence[str], **kwargs: Any
                 ) -> subprocess.Popen[Any]:
        """Start a process inside host ``host``'s namespace (rank or spare), in the ranks'
        cgroup when the run has a CPU quota; stopped at teardown."""
        kwargs.setdefault("stdout", subprocess.PIPE)
        kwargs.setdefault("stderr", subprocess.PIPE)
        env = dict(os.environ)
        env.update(kwargs.pop("env", {}) or {})
        env.setdefault("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
        command = list(args) if self.rank_cgroup is None else self.rank_cgroup.command(list(args))
        proc = self.node(host).popen(command, env=env, **kwargs)
        self._procs.append(proc)
        # The host's mnexec execs the command itself, so /proc/<pid>/cmdline is exactly args.
        # In the ranks' cgroup, a shell writes its pid there first, then execs args.
        self.record.add_process(proc.pid, " ".join(args))
        return proc

    def cmd(self, rank: int, command: str) -> str:
        return str(self.host(rank).cmd(command))

    def dump_flows(self, rail: int) -> list[str]:
        """The rail bridge's flows without counters, sorted (for comparing configurations)."""
        out = subprocess.run(
            ["ovs-ofctl", "-O", "OpenFlow13", "--no-stats", "dump-flows",
             self.ofctl_target(naming.rail_bridge(self.prefix, rail))],
            capture_output=True, text=True, check=True).stdout
        return sorted(line.strip() for line in out.splitlines() if line.strip()
                      and not line.startswith("OFPST_FLOW"))

    def set_switching_delay_ms(self, rail: int, delay_ms: float) -> None:
        self.driver.set_switching_delay_ms(rail, delay_ms)

    def stop_processes(self) -> None:
        for proc in self._procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in self._procs:
            try:
                proc.wait(timeout=3)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=3)
        self._procs.clear()


def _vsctl(instances: OvsInstances | None, bridge: str, *args: str) -> list[str]:
    """``ovs-vsctl`` on the database that holds ``bridge``."""
    if instances is None:
        return ["ovs-vsctl", "--timeout=10", *args]
    return instances.vsctl(bridge, *args)


def _add_shadow_ports(spec: RailSpec, prefix: str, instances: OvsInstances | None,
                      record: runstate.RunRecord) -> None:
    """Give each shadow bridge its three ports: veth pairs whose far ends sit in the run's
    shadow namespace (:mod:`emulator.shadowports`; recorded for cleanup before it exists), so
    that the wire check can probe and capture them; one ``ovs-vsctl`` per database."""
    if not spec.shadow_rails:
        return
    record.namespaces.append(naming.shadow_netns(prefix))
    record.save()

    def run(cmd: list[str], stdin: str | None = None) -> None:
        res = subprocess.run(cmd, input=stdin, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise EmulationError(f"cannot make the shadow rails' ports ({' '.join(cmd[:4])}): "
                                 f"{res.stderr.strip()}")

    for cmd in shadowports.netns_setup_commands(prefix):
        run(cmd)
    run(["ip", "-batch", "-"], shadowports.veth_batch(prefix, spec.shadow_ids))
    for name in shadowports.near_ends(prefix, spec.shadow_ids):  # no IPv6 chatter from root
        with contextlib.suppress(OSError):
            Path(f"/proc/sys/net/ipv6/conf/{name}/disable_ipv6").write_text("1\n")
    run(["ip", "-batch", "-"], shadowports.near_end_batch(prefix, spec.shadow_ids))
    run(["ip", "-n", naming.shadow_netns(prefix), "-batch", "-"],
        shadowports.far_end_batch(spec.shadow_ids))
    commands: dict[str, list[str]] = {}
    for rail in spec.shadow_ids:
        bridge = naming.shadow_bridge(prefix, rail)
        key = "" if instances is None else bridge
        cmd = commands.setdefault(key, _vsctl(instances, bridge))
        for port in SHADOW_PORTS:
            intf = naming.shadow_port_intf(prefix, rail, port)
            cmd += ["--", "add-port", bridge, intf, "--", "set", "Interface", intf,
                    f"ofport_request={port}"]
    for cmd in commands.values():
        res = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise EmulationError(f"cannot add the shadow rails' ports: {res.stderr.strip()}")


@contextlib.contextmanager
def emulated_rails(spec: RailSpec, *, run_dir: Path | None = None,
                   ready_timeout_s: float = 30.0,
                   rank_cpu_quota: float | str | None = None,
                   ovs_per_rail: bool | None = None) -> Iterator[EmulatedRails]:
    """Build, yield and always tear down the emulated network for ``spec``; with
    ``rank_cpu_quota`` (a fraction of the machine, or ``auto``) the processes started through
    :meth:`EmulatedRails.popen_on` share a cgroup with that CPU quota
    (:mod:`emulator.cpuquota`; raises :class:`~emulator.cpuquota.CgroupUnavailable` when none
    can be made); ``ovs_per_rail`` None follows
    :func:`emulator.ovs_instance.per_rail_default`."""
    per_rail = per_rail_default() if ovs_per_rail is None else ovs_per_rail
    _require_prerequisites(per_rail)
    records = runstate.load_records()
    prefix = naming.new_prefix(r.prefix for r in records)
    taken = _taken_slots() | {r.slot for r in records}
    slot = next((s for s in range(256) if s not in taken), None)
    if slot is None:
        raise EmulationError("no free 198.18.x.0/24 frontend subnet; run `opus-testbed clean`")
    own_dir = run_dir is None
    run_dir = Path(tempfile.mkdtemp(prefix=f"opus-{prefix}-")) if run_dir is None else run_dir
    run_dir.mkdir(parents=True, exist_ok=True)
    record = runstate.RunRecord(prefix=prefix, owner_pid=os.getpid(), slot=slot)
    record.bridges = [naming.frontend_bridge(prefix), *_ocs_bridges(spec, prefix)]
    record.save()

    # The per-rail instances run the userspace datapath whatever the kernel offers (the
    # kernel datapath is one per machine).
    datapath = "kernel" if kernel_datapath_available() and not per_rail else "user"
    of_port, mgmt_port = free_tcp_port(), free_tcp_port()
    instances = (OvsInstances(_ocs_bridges(spec, prefix), _instances_dir(prefix),
                              run_dir, record) if per_rail else None)
    dirs = contextlib.ExitStack()  # the instances' directory, recorded for `clean`
    config_path = _write_ocs_config(spec, prefix, run_dir, of_port, mgmt_port, instances)
    ocs_proc: subprocess.Popen[Any] | None = None
    ocs_log: Any = None
    net: Any = None
    handle: EmulatedRails | None = None
    driver: EmulatedOcsDriver | None = None
    cgroup: cpuquota.RankCgroup | None = None
    try:
        if rank_cpu_quota is not None:
            cgroup = cpuquota.RankCgroup.create(prefix, rank_cpu_quota)
            record.cgroups.append(str(cgroup.path))
            record.save()
        if instances is not None:
            dirs.enter_context(runstate.owned_dir(instances.base))
            try:
                instances.start()
            except RuntimeError as exc:
                raise EmulationError(str(exc)) from exc
        ocs_log = (run_dir / "ocs-service.log").open("w")
        ocs_proc = _start_ocs_service(config_path, ocs_log, record)
        net = _start_mininet(spec, prefix, slot, datapath, record, instances)
        _attach_rails(spec, prefix, of_port, config_path.parent, record, instances)
        hosts = {h: net.get(spec.host_name(prefix, h)) for h in range(spec.num_hosts)}
        run = shell_runner(hosts, config_path.parent)
        for h in hosts:
            run(h, interface_setup_commands(spec, prefix, h))
        router = HostRouter(spec, prefix, run)
        router.install_static()
        driver = EmulatedOcsDriver("127.0.0.1", mgmt_port, on_circuits=router.on_circuits)
        _wait_rails_connected(spec, driver, ocs_proc, run_dir, ready_timeout_s)
        priority = (vswitchd_priority.raise_priority(prefix) if instances is None
                    else vswitchd_priority.raise_instances(instances.vswitchd_pids))
        handle = EmulatedRails(spec, prefix, run_dir, net, driver, record, slot, datapath,
                               router, priority, ocs_pid=ocs_proc.pid, rank_cgroup=cgroup,
                               instances=instances)
        yield handle
    finally:
        if handle is not None:
            handle.stop_processes()
        vswitchd_priority.release(prefix)
        if driver is not None:
            driver.close()
        if net is not None:
            try:
                net.stop()
            except Exception:  # keep tearing down; leftovers are removed below
                LOG.exception("mininet stop failed")
        if instances is not None:
            instances.stop()
        dirs.close()
        if ocs_proc is not None:
            runstate.stop_process(ocs_proc.pid, str(config_path))
            with contextlib.suppress(subprocess.TimeoutExpired):
                ocs_proc.wait(timeout=3)
        if ocs_log is not None:
            ocs_log.close()
        _remove_owned(record, prefix)
        if own_dir and not os.environ.get("OPUS_KEEP_RUN_DIR"):
            shutil.rmtree(run_dir, ignore_errors=True)


def _require_prerequisites(per_rail: bool = False) -> None:
    """Refuse to start without root, Mininet or a running Open vSwitch (else Mininet would
    print a hint and exit the whole process), before anything is created. Per-rail instances
    need Open vSwitch's programs too (the system instance still answers `clean`'s and the
    checks' questions, so it is required in both modes)."""
    if os.geteuid() != 0:
        raise EmulationError("the emulated network needs root (Mininet and Open vSwitch)")
    from mininet.log import setLogLevel

    setLogLevel(os.environ.get("OPUS_MININET_LOG", "critical"))
    if per_rail:
        missing = missing_programs()
        if missing:
            raise EmulationError(f"one Open vSwitch per rail needs {', '.join(missing)}; "
                                 "install openvswitch-switch (scripts/setup.sh)")
    ovs = subprocess.run(["ovs-vsctl", "--timeout=5", "show"], capture_output=True, text=True,
                         check=False)
    if ovs.returncode != 0:
        raise EmulationError(f"Open vSwitch is not running ({ovs.stderr.strip()}); start it "
                             "with `bash scripts/setup.sh` (or `/usr/share/openvswitch/scripts/"
                             "ovs-ctl start --system-id=random`)")


def _ocs_bridges(spec: RailSpec, prefix: str) -> list[str]:
    """The bridges the OCS app drives: one per rail, then the shadow rails'."""
    return [naming.rail_bridge(prefix, r) for r in range(spec.num_rails)] + [
        naming.shadow_bridge(prefix, s) for s in spec.shadow_ids]


def _instances_dir(prefix: str) -> Path:
    """Where the per-rail instances keep their databases, sockets and pid files: under the
    state directory (``/run/opus-testbed/ovs/<prefix>``), never in the run directory, which
    may be a shared folder (the Vagrant VM's ``results/``) that holds no Unix sockets, or too
    deep for a socket's path."""
    return runstate.state_dir() / "ovs" / prefix


def _write_ocs_config(spec: RailSpec, prefix: str, run_dir: Path, of_port: int,
                      mgmt_port: int, instances: OvsInstances | None = None) -> Path:
    """The OCS service's config file (ports, event log, rails with their datapath ids and
    bridge names: each rail worker switches over its own connection to its bridge; with
    per-rail instances, that bridge's management and vswitchd's unixctl sockets)."""
    rails = []
    for d in spec.describe():
        bridge = (naming.rail_bridge(prefix, d.rail) if d.rail < spec.num_rails
                  else naming.shadow_bridge(prefix, d.rail))
        rail: dict[str, Any] = {**d.to_json(), "dpid": naming.dpid(prefix, d.rail),
                                "bridge": bridge}
        if instances is not None:
            paths = instances.paths[bridge]
            rail.update(mgmt_socket=str(paths.mgmt_socket),
                        unixctl_socket=str(paths.vswitchd_ctl))
        rails.append(rail)
    ocs_config = {
        "of_port": of_port,
        "mgmt_port": mgmt_port,
        "event_log": str(run_dir / "ocs-events.jsonl"),
        "rails": rails,
    }
    config_path = run_dir / prefix / "ocs.json"
    config_path.parent.mkdir(parents=True, exist_ok=True)
    config_path.write_text(json.dumps(ocs_config, indent=1))
    return config_path


def _start_ocs_service(config_path: Path, log: Any, record: runstate.RunRecord
                       ) -> subprocess.Popen[Any]:
    """The OCS service process (:mod:`emulator.ocs_service`), recorded for cleanup."""
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[1])
    proc = subprocess.Popen(
        [sys.executable, "-m", "emulator.ocs_service", "--config", str(config_path)],
        stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    record.add_process(proc.pid, str(config_path))
    return proc


def _start_mininet(spec: RailSpec, prefix: str, slot: int, datapath: str,
                   record: runstate.RunRecord, instances: OvsInstances | None = None) -> Any:
    """Build and start the Mininet network of ``spec`` (hosts, rail and frontend bridges),
    recording every node's pid."""
    from mininet.link import TCLink
    from mininet.net import Mininet
    from mininet.node import OVSSwitch

    from emulator.ovs_instance import instance_switch_class

    dp = "user" if datapath == "user" else "kernel"
    # batch=True: Mininet then runs ovs-vsctl as a subprocess; unbatched it types the command
    # into a pty shell, whose 4096-byte line limit silently cut bridges of ~50+ ports.
    switch_class = OVSSwitch if instances is None else instance_switch_class(instances)
    rail_switch = partial(switch_class, protocols="OpenFlow13", failMode="secure",
                          datapath=dp, inband=False, batch=True)
    topo = build_topo(spec, prefix, slot, rail_switch=rail_switch,
                      frontend_switch=kernel_bridge_class())
    net = Mininet(topo=topo, link=TCLink, controller=None, build=False,
                  autoSetMacs=False, autoStaticArp=False, waitConnected=False)
    net.build()
    for node in net.hosts + net.switches:
        if getattr(node, "pid", None):
            record.add_process(node.pid, f"mininet:{node.name}")
    net.start()
    return net


def _attach_rails(spec: RailSpec, prefix: str, of_port: int, work_dir: Path,
                  record: runstate.RunRecord, instances: OvsInstances | None = None) -> None:
    """Shadow ports, every OCS bridge attached to the OCS app, the root's checksum offload off
    and the bridges' shaping."""
    _add_shadow_ports(spec, prefix, instances, record)
    for bridge in _ocs_bridges(spec, prefix):
        res = subprocess.run(_vsctl(instances, bridge, "set-controller", bridge,
                                    f"tcp:127.0.0.1:{of_port}"),
                             capture_output=True, text=True, check=False)
        if res.returncode != 0:
            raise EmulationError(f"cannot attach rail bridge {bridge} to the OCS app: "
                                 f"{res.stderr.strip()}")
    root_intf = f"{naming.root_node(prefix)}-eth0"
    subprocess.run(["ethtool", "-K", root_intf, "tx", "off"], capture_output=True,
                   check=False)
    _run_tc_batch(bridge_shaping_commands(spec, prefix), work_dir / "shaping.tc")


def _wait_rails_connected(spec: RailSpec, driver: EmulatedOcsDriver,
                          ocs_proc: subprocess.Popen[Any], run_dir: Path,
                          timeout_s: float) -> None:
    """Wait until every rail bridge has connected to the OCS app (or the app has died)."""
    def rails_ready() -> bool:
        if ocs_proc.poll() is not None:
            raise EmulationError(f"OCS process exited with {ocs_proc.returncode}; see "
                                 f"{run_dir / 'ocs-service.log'}")
        return len(driver.health()["connected_rails"]) == spec.num_rails + spec.shadow_rails

    try:
        wait_for(rails_ready, timeout_s, "every rail bridge to connect to the OCS app")
    except TimeoutError as exc:
        raise EmulationError(f"{exc}; see {run_dir / 'ocs-service.log'}") from exc


def _remove_owned(record: runstate.RunRecord, prefix: str) -> None:
    """Stop the run's recorded processes, remove its bridges and links (by name prefix) and its
    recorded cgroups, then its record (kept while a cgroup will not go, for ``clean``)."""
    for proc in record.processes:
        runstate.stop_process(proc.pid, proc.marker)
    runstate.remove_cgroups(record)
    left = [c for c in record.cgroups if Path(c).is_dir()]
    if left:
        LOG.warning("cgroups %s still hold processes; `opus-testbed clean` removes them", left)
    for bridge in runstate.owned_bridges():
        if naming.prefix_of(bridge) == prefix:
            runstate.remove_bridge(bridge)
    for name in record.namespaces:  # its veths' root ends go with it
        runstate.remove_netns(name)
    for link in runstate.owned_links():
        if naming.prefix_of(link) == prefix:
            runstate.remove_link(link)
    if not left:
        record.remove()


