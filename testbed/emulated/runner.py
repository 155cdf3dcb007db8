"""``opus-testbed run`` on the emulated photonic rails (Mininet hosts, OVS rails, os-ken OCS).

Order of work, from a :class:`~testbed.experiment.prepare.Prepared` run: build the emulated
rails (os-ken OCS app on one OVS bridge per rail, or electrical rails for the baseline), start
the Opus controller on the frontend network with the emulated OCS driver, register the job,
launch one replayer (:mod:`testbed.emulated.replayer`) per rank inside its Mininet host (and a
standby one per spare; or, with ``run.ranks_per_process: server``, one process per server for
its ranks), follow them (:mod:`testbed.emulated.supervisor`: progress, injected faults,
failover), and on success hand the records and the OCS app's dark periods
(:mod:`testbed.metrics.darktime`) to :func:`testbed.results.summary.finish_run`.
Under rail-state semantics the data rails are packet-switched (as the baseline's) and the
network also has the shadow OCS rails on which the bits switch (:mod:`controller.railstate`).
A rank that fails ends the run unless the run has spares (or ``--no-spares``' restart): the
error names the rank and its last op, and teardown still happens (the network's context manager
stops every process we started). :func:`run_on_rails` is that sequence for any rank processes;
torch jobs (:mod:`testbed.torchjob.runner`) use it too, through :func:`processes` (start every
rank, follow them to their exit, no failover).
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import secrets
import shutil
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

from controller.core import CoreConfig
from controller.drivers.faults import FaultInjectingDriver, OcsFaults
from controller.drivers.registry import DRIVERS, HARDWARE_DRIVERS, make_driver
from controller.events import EventLog
from controller.job import JobSpec, RankPorts
from controller.ocs import OcsDriver
from controller.railstate import RAIL_STATE
from emulator import naming
from emulator.cpuquota import CgroupUnavailable, RankCgroup, Throttling, cpu_controller
from testbed.emulated.planes import HeldRailsDriver
from testbed.emulated.staticrun import STATIC_CIRCUITS, static_emulated
from testbed.emulated.supervisor import Supervisor
from testbed.errors import RankFailed, RunError, RunRefused, Say, require_empty_dir, say_stderr
from testbed.experiment.backends import EMU, PHASE_BARRIER_PROVISIONING, backend_spec
from testbed.experiment.config import RunSettings
from testbed.experiment.dilation import (
    DilationError,
    ModelTimeWire,
    to_model_time,
    wall_link_mbps,
    wall_settings,
)
from testbed.experiment.prepare import Prepared
from testbed.metrics.compute import measured_span
from testbed.metrics.darktime import DarkCheck, ExpectedDelay, check_dark_periods
from testbed.metrics.fidelity import CpuSampler, cpu_interval_s, vswitchd_pids
from testbed.metrics.wire import WireVerdict
from testbed.plan.replay import PlanError
from testbed.results import store
from testbed.results.summary import Observed, RunFacts, finish_run

if TYPE_CHECKING:
    from controller.service import ControllerService
    from emulator.network import EmulatedRails
    from emulator.topo import RailSpec
    from emulator.wirecap import WireCapture

POLL_S = 0.5

#: (network, Opus controller endpoint, rank) -> the rank process's command line
RankLauncher = Callable[["EmulatedRails", str, int], list[str]]


@dataclass(frozen=True)
class RailsRun:
    """What a run's rank processes are started against: the network, Opus (its service, its
    endpoint and event log), the OCS fault injector and the Polatis fronts (None: none)."""

    net: EmulatedRails
    service: ControllerService
    events: EventLog
    ocs_faults: OcsFaults
    fronts: Any
    out: Path
    say: Say
    artifact: Any = None  # the ArtifactGateway the ranks speak to (artifact_protocol), or None


class RankFollower(Protocol):
    """Starts a run's rank processes and follows them until every rank finished."""

    @property
    def pids(self) -> list[int]: ...

    def launch(self) -> None: ...

    def follow(self) -> None: ...

    def close(self) -> None: ...


#: builds the follower of a run once the rails and Opus are up
StartRanks = Callable[[RailsRun], RankFollower]


@contextlib.contextmanager
def _controller_driver(cfg: RunSettings, emulated: OcsDriver
                       ) -> Iterator[tuple[OcsDriver, Any]]:
    """The OCS driver Opus uses, and the fronts if any: the emulated driver, or a lab driver
    (Polatis NETCONF or TL1, CALIENT TL1) talking to a front of that protocol on each emulated
    rail (the lab driver, against real OVS circuits)."""
    if cfg.driver == "emulated" or cfg.mode == "baseline" or cfg.rival_plane:
        yield emulated, None
        return
    if cfg.driver not in HARDWARE_DRIVERS:
        raise RunRefused(f"{cfg.source}: ocs.driver {cfg.driver!r} cannot drive the emulated "
                         f"rails; use one of {', '.join(DRIVERS)}")
    if cfg.ocs_options.get("host") or cfg.ocs_options.get("rails"):
        raise RunRefused(f"{cfg.source}: ocs.host/ocs.rails point at a lab switch, but an "
                         f"emulated run drives its own {cfg.driver} fronts on the emulated "
                         "rails; remove them here, and bring a lab switch up with "
                         "`opus-testbed ocs`")
    from emulator.fronts import emulated_fronts

    password = secrets.token_hex(8)
    with emulated_fronts(emulated, cfg.driver, password=password) as fronts:
        # the fronts, and the rails behind them, are the run's alone and go with it: nothing
        # of another user's to restore at teardown
        driver = make_driver(fronts.ocs_config(password_env="OPUS_FRONT_PASSWORD"),
                             env={"OPUS_FRONT_PASSWORD": password}, restore_on_close=False)
        try:
            yield driver, fronts
        finally:
            driver.close()


def rail_spec(cfg: RunSettings, servers: int, gpus_per_server: int, link_mbps: float,
              shadow_rails: int = 0, spares_per_server: int = 0, spare_servers: int = 0,
              time_dilation: float = 1.0) -> RailSpec:
    """The emulated network of a run: electrical rails for the baseline and under rail-state
    semantics (whose bits switch on ``shadow_rails`` small OCS rails), else OCS rails; spare
    GPUs' ports sit on the rails too, dark until one takes over a rank. At ``time_dilation``
    k > 1 TCP's minimum retransmission timeout is k x the kernel's on the rank routes: the links
    run k times slower, and an undilated 200 ms floor fired spuriously at k = 16, where one
    queued segment takes 68-93 ms a hop (docs/performance.md, "Spurious retransmissions")."""
    from emulator.topo import LINUX_TCP_RTO_MIN_MS, RailSpec

    electrical = cfg.mode == "baseline" or cfg.effective_semantics == RAIL_STATE
    return RailSpec(servers=servers, gpus_per_server=gpus_per_server,
                    ports_per_rank=cfg.effective_ports_per_rank, link_mbps=link_mbps,
                    mode="electrical" if electrical else "ocs",
                    switching_delay=0.0 if cfg.mode == "baseline" else cfg.switching_delay,
                    shadow_rails=shadow_rails, spares_per_server=spares_per_server,
                    spare_servers=spare_servers,
                    tcp_rto_min_ms=LINUX_TCP_RTO_MIN_MS * time_dilation
                    if time_dilation > 1 else None)


def spec_ports(spec: RailSpec) -> dict[int, RankPorts]:
    """Every rank's rail and its ports there, as Opus registers them."""
    return {r: RankPorts(r, spec.rail_of(r), tuple(p.port for p in spec.rank_ports(r)))
            for r in range(spec.num_ranks)}


def run_emulated(prep: Prepared, out: Path, say: Say = say_stderr) -> dict[str, Any]:
    """Run ``prep`` on the emulated rails; returns the summary (also in ``out/summary.json``)."""
    cfg, plan = prep.config, prep.plan
    require_empty_dir(out)
    require_quota(cfg)
    cluster = cfg.workload.cluster
    spares = not cfg.no_spares
    rail_state = cfg.effective_semantics == RAIL_STATE
    if rail_state and cfg.rail_state_phase_barrier and cfg.mode == "provisioning":
        backend_spec(EMU).require(PHASE_BARRIER_PROVISIONING, cfg.source)
    k = prep.time_dilation
    try:
        wall_mbps = wall_link_mbps(prep.link_mbps, k)
    except DilationError as exc:
        raise RunRefused(f"{cfg.source}: run.time_dilation: {exc}") from exc
    # the emulator runs the wall-clock settings; the figures come back in model time
    wall_prep = dataclasses.replace(prep, config=wall_settings(cfg, k),
                                    modeled_iteration_s=prep.modeled_iteration_s * k)
    spec = rail_spec(wall_prep.config, cluster.servers, cluster.gpus_per_server, wall_mbps,
                     shadow_rails=cluster.gpus_per_server * cfg.workload.parallel.pp
                     if rail_state else 0,
                     spares_per_server=cfg.spares_per_server if spares else 0,
                     spare_servers=cfg.spare_servers if spares else 0, time_dilation=k)
    try:
        job = plan.job("train", spec_ports(spec))
    except PlanError as exc:
        raise RunRefused(f"{cfg.source}: {exc}") from exc
    out.mkdir(parents=True, exist_ok=True)
    (out / "ranks").mkdir(exist_ok=True)
    (out / "experiment.yaml").write_text(cfg.text)
    manifest = store.start_manifest(
        out, EMU, cfg.to_json(), link_mbps=prep.link_mbps, scale=prep.scale,
        world_size=spec.num_ranks, rails=spec.num_rails,
        modeled_iteration_s=prep.modeled_iteration_s, spares=len(spec.spares),
        rank_processes=cfg.rank_processes, time_dilation=k, wall_link_mbps=wall_mbps,
        dilation=prep.dilation.to_json() if prep.dilation is not None else None)
    spare_text = f", {len(spec.spares)} spares" if spec.spares else ""
    per_server = (f", one process per server ({cluster.gpus_per_server} ranks each)"
                  if cfg.rank_processes == "server" else "")
    say(f"run {cfg.name}: mode {cfg.mode}, switching delay {cfg.switching_delay_ms:g} ms, "
        f"{spec.num_ranks} ranks on {spec.num_rails} rails{spare_text}{per_server}, "
        f"K={spec.ports_per_rank}, {cfg.effective_semantics}, links {prep.link_mbps:g} Mbit/s "
        f"(bytes x {prep.scale:.3g}), "
        f"{cfg.warmup}+{cfg.iterations} iterations (modelled {prep.modeled_iteration_s:.2f} s "
        f"each); results in {out}")
    if prep.dilation is not None:
        say(f"  {prep.dilation.text()}"
            + (f": the links run at {wall_mbps:.4g} Mbit/s and every modelled time x {k:g} "
               "on the wall; figures in model time" if k != 1 else ""))

    static = static_emulated(cfg, plan, spec) if cfg.rival_plane else None
    followers: list[Any] = []

    def supervise(run: RailsRun) -> RankFollower:
        relays = (static.start(run.net, plane_dirs, say, out / STATIC_CIRCUITS)
                  if static is not None else None)
        sup = Supervisor(net=run.net, endpoint=run.service.endpoint, plan=plan, job=job,
                         prep=wall_prep, out=out, events=run.events, ocs_faults=run.ocs_faults,
                         say=say, fronts=run.fronts, artifact=run.artifact, relays=relays)
        run.service.on_rank_lost = sup.on_rank_lost
        if static is None:
            return sup
        followers.append(static.follower(sup, run.net))
        return followers[-1]

    with contextlib.ExitStack() as plane_dirs:  # the static plane's Unix sockets
        summary = run_on_rails(prep, spec, job, out, manifest, supervise, say,
                               heartbeat_timeout_s=wall_prep.config.failover.heartbeat_timeout_s,
                               time_dilation=k)
    if static is not None and followers:
        summary = static.finish(out, summary, followers[-1], cfg.total_iterations, say)
    return summary


def run_components(follower: RankFollower | None, net: EmulatedRails | None,
                   capture: WireCapture | None = None) -> dict[str, list[int]]:
    """The run's parts by process, for the CPU breakdown: the rank processes, this process
    (the runner and the Opus controller's threads), each ovs-vswitchd, the OCS app, and the
    wire check's captures and probe sender."""
    parts = {"ranks": follower.pids if follower is not None else [],
             "controller": [os.getpid()]}
    if net is not None and net.instances is not None:  # one Open vSwitch per OCS bridge
        parts.update({f"ovs-vswitchd {bridge}": [pid] for bridge, pid
                      in net.instances.vswitchd_by_bridge.items()})
    else:
        parts["ovs-vswitchd"] = vswitchd_pids()
    if net is not None and net.ocs_pid is not None:
        parts["ocs-app"] = [net.ocs_pid]
    if capture is not None:
        parts["wire check"] = list(capture.pids)
    return parts


def run_on_rails(prep: RunFacts, spec: RailSpec, job: JobSpec, out: Path,
                 manifest: dict[str, Any], start: StartRanks, say: Say,
                 heartbeat_timeout_s: float = 5.0, time_dilation: float = 1.0
                 ) -> dict[str, Any]:
    """Build the rails, start Opus with ``job`` registered (a rank silent for
    ``heartbeat_timeout_s`` is lost), start and follow every rank's process in its host
    (``start``'s follower; logs and records go to ``out/ranks/``) and finish the run.

    At ``time_dilation`` k the network and ranks were built from the wall-clock settings
    (``spec``; the ranks' plans); the records, the controller's events and the OCS app's are
    read back in model time (:func:`~testbed.experiment.dilation.to_model_time`), and judged
    against ``prep``'s model-time configuration. The controller runs on the wall clock: its
    decisions take no modelled constant (it orders by time), so with every modelled input
    k times longer they are the model-time controller's, k times slower."""
    from controller.service import ControllerService
    from emulator.network import emulated_rails

    cfg = prep.config
    require_quota(cfg)
    t_start = time.monotonic()
    follower: RankFollower | None = None
    net: EmulatedRails | None = None
    throttling: Throttling | None = None
    cgroup: RankCgroup | None = None
    modeled = prep.modeled_iteration_s  # model time: the measured iterations take k x on the wall
    modeled = modeled * time_dilation if modeled else modeled
    capture: WireCapture | None = None
    sampler = CpuSampler(lambda: (follower.pids if follower is not None else [])
                         + vswitchd_pids(net.vswitchd_pids if net is not None else ()),
                         interval_s=cpu_interval_s(modeled * cfg.iterations if modeled else None),
                         components=lambda: run_components(follower, net, capture))
    try:
        with contextlib.ExitStack() as stack:  # unwinds: controller, OCS driver, network
            try:
                net = stack.enter_context(emulated_rails(
                    spec, run_dir=out / "emulator", rank_cpu_quota=cfg.rank_cpu_quota,
                    ovs_per_rail=cfg.ovs_per_rail))
            except CgroupUnavailable as exc:
                raise RunRefused(f"{cfg.source}: run.rank_cpu_quota is "
                                 f"{cfg.rank_cpu_quota}, but {exc}") from exc
            cgroup = net.rank_cgroup
            manifest.update(datapath=net.datapath, prefix=net.prefix, ovs=net.ovs,
                            vswitchd_priority=net.vswitchd_priority,
                            rank_cgroup=None if cgroup is None else str(cgroup.path))
            store.write_json(out / "manifest.json", manifest)
            quota = ("" if cgroup is None else f", ranks' CPU quota {cgroup.fraction:.2f} of "
                     f"the machine in {cgroup.path}")
            say(f"  network up in {time.monotonic() - t_start:.1f} s (prefix {net.prefix}, "
                f"{net.datapath} datapath, {net.ovs} Open vSwitch, {net.vswitchd_priority}"
                f"{quota})")
            capture = _start_wire_capture(stack, net, cfg, spec, out, say)
            ocs_faults = OcsFaults(seed=cfg.seed)
            driver, fronts = stack.enter_context(_controller_driver(
                cfg, FaultInjectingDriver(net.driver, ocs_faults)))
            if cfg.rival_plane:  # the plane's circuits (testbed.emulated.staticrun)
                driver = HeldRailsDriver(driver)
            events = EventLog(out / "controller-events.jsonl")
            # the service binds the root end of the run's own frontend network: the run's
            # hosts are its only other members, so no CURVE keys (controller.curve)
            svc = ControllerService(driver, bind=f"tcp://{net.root_frontend_address}:0",
                                    trusted_networks=(naming.frontend_network(net.slot),),
                                    config=CoreConfig.for_mode(
                                        cfg.mode, cfg.effective_semantics,
                                        cfg.rail_state_inflight,
                                        cfg.rail_state_serialize_per_rank),
                                    event_log=events, heartbeat_timeout_s=heartbeat_timeout_s)
            with svc, artifact_gateway(cfg, svc, job, net, out, say) as gateway:
                svc.register_job(job)
                follower = start(RailsRun(net, svc, events, ocs_faults, fronts, out, say,
                                          gateway))
                try:
                    follower.launch()
                    sampler.start()
                    follower.follow()
                    sampler.stop()
                    throttling = cgroup.throttling() if cgroup is not None else None
                finally:
                    follower.close()
    finally:
        sampler.stop()
    wall_s = time.monotonic() - t_start
    k = time_dilation
    wall_records = [r for rank in range(spec.num_ranks)
                    for r in store.read_jsonl(out / "ranks" / f"rank{rank}.jsonl")]
    wall_events = store.read_jsonl(out / "controller-events.jsonl")
    # the JSONL files keep the wall clock; the CSVs, plots, summary and export: model time
    records, events_read = to_model_time(wall_records, k), to_model_time(wall_events, k)
    expected = expected_delay(cfg, spec)
    wire = (None if capture is None else
            wire_verdict(out, capture.out_dir, wall_events, expected, k))
    seen = Observed(records, events_read,
                    sampler.summary(measured_span(wall_records, cfg.warmup)),  # wall clock
                    wall_s, _dark_check(out, cfg, events_read, expected, k),
                    cgroup.summary(throttling) if cgroup is not None else None, wire,
                    wire_skipped(cfg, spec, wall_events) if capture is None else None)
    return finish_run(out, prep, seen, manifest, num_rails=spec.num_rails,
                      ranks_rail0=spec.ranks_on_rail(0))


@contextlib.contextmanager
def artifact_gateway(cfg: RunSettings, svc: ControllerService, job: JobSpec,
                     net: EmulatedRails, out: Path, say: Say) -> Iterator[Any]:
    """The artifact's protocol beside ``svc`` on the run's frontend address
    (``artifact_protocol.port``; None when off): the network of the run's own namespaces,
    named trusted here, as the ZeroMQ service's is. Stopped before the service; its counters
    and refusals go to ``out/artifact-protocol.json``."""
    port = getattr(cfg, "artifact_port", None)
    if port is None:
        yield None
        return
    from controller.artifact_gateway import ArtifactGateway

    spec = net.spec
    servers: list[list[str]] = [[] for _ in range(spec.servers)]
    for rank in range(spec.num_ranks):
        servers[spec.server_of(rank)].append(net.frontend_address(rank))
    front = net.root_frontend_address
    with ArtifactGateway(svc, job, server_ips=servers, gpus_per_server=spec.gpus_per_server,
                         host=front, port=port, trusted=[front]) as gateway:
        say(f"  the artifact's protocol on {gateway.address} (no authentication: the run's "
            "frontend network only)")
        try:
            yield gateway
        finally:
            gateway.stop()
            store.write_json(out / "artifact-protocol.json",
                             {"address": gateway.address, "counters": gateway.counters,
                              "refused": gateway.refused})


def wire_skip_reason(cfg: RunSettings, spec: RailSpec) -> str | None:
    """Why a run has no wire check, or None when it has one."""
    if not getattr(cfg, "wire_check", False):
        return "run.wire_check is off"
    if cfg.mode == "baseline":
        return "no OCS rail to observe (electrical rails)"
    if shutil.which("tcpdump") is None:  # on by default: the run goes on, saying why
        return "tcpdump is not installed (apt-get install tcpdump, or scripts/setup.sh)"
    return None


def wire_skipped(cfg: RunSettings, spec: RailSpec,
                 controller_events: list[dict[str, Any]]) -> dict[str, Any] | None:
    """``summary["wire"]`` of a switched run that had no capture (None for a baseline): why,
    and that the wire saw none of its switches."""
    from testbed.metrics.wire import skipped_summary

    reason = wire_skip_reason(cfg, spec)
    if reason is None or cfg.mode == "baseline":
        return None
    return skipped_summary(reason, controller_events)


def _start_wire_capture(stack: contextlib.ExitStack, net: EmulatedRails, cfg: RunSettings,
                        spec: RailSpec, out: Path, say: Say) -> WireCapture | None:
    """Start the capture of every OCS port (:mod:`emulator.wirecap`) when the run has one; it
    stops, and writes its files, when ``stack`` unwinds."""
    from emulator.wirecap import captured_ports, probe_interval_ms, probe_targets, wire_capture

    skip = wire_skip_reason(cfg, spec)
    if skip is not None:
        if cfg.mode != "baseline":
            say(f"  wire check: none ({skip})")
        return None
    # the rails it watches: the OCS data rails, or under rail-state the shadow rails
    shortest_ms = min(spec.delay_ms(p.rail) for p in captured_ports(net))  # wall time
    probe_ports = len(probe_targets(net))
    capture = stack.enter_context(wire_capture(
        net, out / "wire", probe_interval_ms=probe_interval_ms(shortest_ms, probe_ports)))
    senders = "every rank port" if spec.mode == "ocs" else "every shadow port's far end"
    say(f"  wire check: tcpdump on {len(capture.ports)} OCS ports, probe frames every "
        f"{capture.probe_interval_ms:g} ms from {senders}")
    return capture


def wire_verdict(out: Path, capture_dir: Path, controller_events: list[dict[str, Any]],
                 expected: ExpectedDelay, time_dilation: float = 1.0) -> WireVerdict:
    """The capture's judgement of the run and the app's agreement with it. At time dilation
    k it judges on the wall clock (``controller_events`` as logged, ``expected`` x k: the
    wire expects k x the delay) and hands its switches to the late-light bound in model time
    (:class:`~testbed.experiment.dilation.ModelTimeWire`)."""
    from testbed.metrics.wire import agreement, check_wire, standing_circuits

    k = time_dilation
    wall = ExpectedDelay(expected.base_ms * k, {r: v * k for r, v in expected.per_rail_ms.items()},
                         expected.jitter_ms * k)
    plane = out / STATIC_CIRCUITS
    standing = standing_circuits(json.loads(plane.read_text())) if plane.exists() else []
    wire = check_wire(capture_dir, controller_events, wall, standing=standing)
    app = store.read_jsonl(out / "emulator" / "ocs-events.jsonl")
    if k == 1:
        return WireVerdict(wire, agreement(wire, app))
    return ModelTimeWire(wire, agreement(wire, app), k)


def require_quota(cfg: RunSettings) -> None:
    """Refuse a run that asks for a rank CPU quota on a machine without a usable cgroup cpu
    controller, before anything starts."""
    if cfg.rank_cpu_quota is None:
        return
    try:
        cpu_controller()
    except CgroupUnavailable as exc:
        raise RunRefused(f"{cfg.source}: run.rank_cpu_quota is {cfg.rank_cpu_quota}, but {exc}; "
                         "set it to null (or pass --rank-cpu-quota off)") from exc


class _RankProcesses:
    """One process per rank, started with a :data:`RankLauncher` and followed to its exit."""

    def __init__(self, launch: RankLauncher, run: RailsRun, prep: RunFacts) -> None:
        self.launch_args, self.run, self.prep = launch, run, prep
        self.procs: dict[int, Any] = {}
        self.logs: list[IO[str]] = []

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs.values()]

    def launch(self) -> None:
        run = self.run
        for rank in range(run.net.spec.num_ranks):
            args = self.launch_args(run.net, run.service.endpoint, rank)
            log = (run.out / "ranks" / f"rank{rank}.log").open("w")
            self.logs.append(log)
            self.procs[rank] = run.net.popen(rank, args, stdout=log, stderr=log)

    def follow(self) -> None:
        _follow(self.run.out, self.procs, self.prep.config, self.prep, self.run.say)

    def close(self) -> None:
        for fh in self.logs:
            fh.close()


def processes(launch: RankLauncher, prep: RunFacts) -> StartRanks:
    """The follower of rank processes started with ``launch`` (no failover: a rank that fails
    ends the run)."""
    return lambda run: _RankProcesses(launch, run, prep)


def expected_delay(cfg: RunSettings, spec: RailSpec | None = None) -> ExpectedDelay:
    """The switching delay the experiment configured: ``ocs.switching_delay``, the network's
    per-rail delays (``spec``), and the widest ``jitter`` fault of the plan (a torch job has
    no fault plan). The verdict judges the OCS against this, never against its own record."""
    from controller.ocs import resolve_switching_delay_ms

    per_rail = ({} if spec is None else
                {r: resolve_switching_delay_ms(v) for r, v in spec.per_rail_delay.items()})
    if spec is not None and spec.per_rail_delay:  # rail-state: a shadow rail switches at its
        per_rail.update({s: spec.delay_ms(s) for s in spec.shadow_ids})  # data rail's delay
    jitter = max((f.jitter_ms for f in getattr(cfg, "faults", ()) if f.kind == "jitter"),
                 default=0.0)
    return ExpectedDelay(cfg.switching_delay_ms, per_rail, jitter)


def _dark_check(out: Path, cfg: RunSettings, controller_events: list[dict[str, Any]],
                expected: ExpectedDelay | None = None, time_dilation: float = 1.0
                ) -> DarkCheck | None:
    """The OCS app's dark periods against the configured delay (``expected``; None: the
    experiment's, :func:`expected_delay`), or None on electrical rails. The switch counts are
    compared only when the controller drives the OCS app directly (a Polatis front may split or
    merge the requests it passes on); through a front, a controller that switched while the
    app's log is missing or empty is still a fault."""
    if cfg.mode == "baseline" or cfg.rival_plane:  # a rival plane: Opus switches nothing
        return None
    log = out / "emulator" / "ocs-events.jsonl"
    return check_dark_periods(to_model_time(store.read_jsonl(log), time_dilation),
                              expected or expected_delay(cfg),
                              controller_events, counts_compared=cfg.driver == "emulated",
                              log_found=log.exists())


def _follow(out: Path, procs: dict[int, Any], cfg: RunSettings, prep: RunFacts,
            say: Say) -> None:
    """Wait for every rank, reporting progress; raise :class:`RankFailed` on the first failure.

    Exit statuses are read before the records, so a rank's last records (its error) are read
    before its exit is reported.
    """
    total = cfg.total_iterations
    done: dict[int, int] = dict.fromkeys(procs, 0)
    offsets: dict[int, int] = dict.fromkeys(procs, 0)
    last_op: dict[int, str] = {}
    budget_s = 120 + total * max(60.0, 20 * (prep.modeled_iteration_s or 0.0))
    deadline = time.monotonic() + budget_s
    reported = -1
    while True:
        exited = {r: p.poll() for r, p in procs.items()}
        for rank in procs:
            path = out / "ranks" / f"rank{rank}.jsonl"
            if not path.exists():
                continue
            with path.open() as fh:
                fh.seek(offsets[rank])
                chunk = fh.read()
            cut = chunk.rfind("\n") + 1
            offsets[rank] += len(chunk[:cut].encode())
            for line in chunk[:cut].splitlines():
                rec = json.loads(line)
                if rec.get("ev") == "iteration":
                    done[rank] = int(rec["it"]) + 1
                elif rec.get("ev") == "call":
                    last_op[rank] = f"{rec['kind']} {rec['cid']} (iteration {rec['it']})"
                elif rec.get("ev") == "error":
                    raise RankFailed(rank, f"rank {rank} failed in iteration {rec['it']} at op "
                                     f"{rec['i']} ({rec['tag']}, lane {rec['lane']}): "
                                     f"{rec['error']}")
        slowest = min(done.values())
        if slowest != reported:
            reported = slowest
            phase = "warm-up" if slowest <= cfg.warmup and slowest < total else "measured"
            say(f"  iterations done: {slowest}/{total} ({phase})")
        for rank, code in exited.items():
            if code not in (None, 0):
                log = out / "ranks" / f"rank{rank}.log"
                raise RankFailed(rank, f"rank {rank} exited with status {code} after "
                                 f"{last_op.get(rank, 'no call')}; log {log}, its tail: "
                                 f"{log.read_text()[-800:].strip()}")
        if all(code == 0 for code in exited.values()):
            return
        if time.monotonic() > deadline:
            stuck = sorted(r for r, c in exited.items() if c is None)
            raise RunError(f"ranks {stuck} did not finish within {budget_s:.0f} s; last calls: "
                           + "; ".join(f"rank {r}: {last_op.get(r, 'none')}" for r in stuck[:4]))
        time.sleep(POLL_S)


