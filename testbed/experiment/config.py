"""Experiment files: the workload plus how to run it (mode, OCS, network, iterations).

Layout (the ``workload`` and ``cluster`` keys are :mod:`workloads.loader`'s)::

    name: llama3-8b-paper
    cluster: {servers: 4, gpus_per_server: 4}
    workload: {...}
    mode: provisioning          # baseline | on-demand | provisioning | degree-aware
    ocs:
      switching_delay: 25       # ms, or a Table 3 technology name (e.g. piezo, mems)
      ports_per_rank: 1         # K: ports per GPU on its rail OCS
      driver: emulated          # emulated | polatis-netconf | polatis-tl1 | calient-tl1
      semantics: port-exact     # port-exact | rail-state (see below)
      request_points: auto      # auto | every | phase: which calls ask the controller
    network:
      rail_gbps: 200            # the real per-GPU scale-out rate being modelled
      link_mbps: auto           # emulated per-port rate; bytes scale by link / rail rate
      ovs_per_rail: null        # one Open vSwitch per rail bridge (null: see below)
    run:
      iterations: 3             # measured iterations after the warm-up
      warmup: 1
      ranks_per_process: rank  # rank | server | auto: replayer processes (see below)
      rank_cpu_quota: null      # null | auto | 0 < fraction <= 1: the ranks' CPU (see below)
      start_gate: true          # replayed ranks start together (false: each once loaded)
      time_dilation: auto       # emulation: model time x k on the wall (auto | k >= 1)
      wire_check: false         # capture the OCS ports and judge the switching from the wire
    artifact_protocol:          # emulated runs: the ranks speak the Opus artifact's protocol
      port: 1234                # on the run's frontend address (see below)
    sim:
      costs: fabric             # fabric | emulator: the sim backend's cost model (see below)

Modes: ``baseline`` is the fully connected electrical rail (a packet switch, no circuits);
``on-demand`` switches circuits when a call needs them; ``provisioning`` also switches ahead of
time from the profiled first iteration (paper §4.1); ``degree-aware`` keeps idle circuits lit
while spare ports exist, so it runs with at least two ports per rank (K = max(2, ports_per_rank)).
Semantics: ``port-exact`` (the default) is a real OCS: circuits are one-to-one port matchings
that a call must hold. ``rail-state`` is the model of Opus's public artifact, not physics: a
bitmask per rail, one bit per pipeline stage (:mod:`controller.railstate`); the data rails are
packet-switched as the baseline's (one port per rank; ``ports_per_rank`` is ignored) and the
bits switch on small shadow OCS rails. Request points: ``every``
call asks (port-exact needs it), or only at the artifact's points, ``phase``
(:mod:`testbed.plan.requestpoints`); ``auto`` is ``phase`` under rail-state, else ``every``.
``ocs.rail_state_inflight``: a rail-state request for a bit already being switched to its value
``join``s that switch (the default: a switch delivers a state once) or ``reflip``s it after it
(the artifact's controller). ``ocs.rail_state_ack_timeout_s``: ``null`` (the default: a rank
waits for the light) or how long a rank waits for its ack before it goes on without it (the
artifact's shim: 10; sim backend only). ``ocs.rail_state_serialize_per_rank``: ``false`` (the
default) or ``true``: the controller reads a rank's next request only once the request of it
that started a switch is answered (the artifact's controller).
``ocs.rail_state_phase_barrier``: ``false`` (the default) or ``true``: no call of a rank starts
before the rank's previous phase's last call has ended, and with provisioning before the next
phase's switch it predicted is done either (the artifact's shim's ``topo_ready``, ``MODE=baseline``
and ``MODE=provision`` without ``USE_CUDA_STREAM``; :mod:`testbed.simulator.phasebarrier`; sim
backend only).
Rail-state refuses ``degree-aware`` (a port assignment policy), interleaved pipelines, and a
driver other than ``emulated``.
Drivers (:data:`controller.drivers.registry.DRIVERS`): ``emulated`` drives the emulated OCS
directly; ``polatis-netconf`` / ``polatis-tl1`` / ``calient-tl1`` drive it through a Polatis
NETCONF / Polatis TL1 / CALIENT TL1 front on every emulated rail (the lab driver's code path).
The sim backend is chosen with ``--backend sim``, not with a driver.
``run.rank_cpu_quota`` (emulated runs): the rank processes share one cgroup with a CPU quota of
that fraction of the machine (``auto``: all but :data:`emulator.cpuquota.AUTO_RESERVE_CORES`),
so Open vSwitch, the OCS app and the controller keep headroom (:mod:`emulator.cpuquota`);
``null`` (the default) sets none. A run that asks for one where no cgroup cpu controller is
usable is refused.
``network.ovs_per_rail``: ``true`` runs every emulated OCS bridge in its own ``ovsdb-server`` +
``ovs-vswitchd`` (:mod:`emulator.ovs_instance`), ``false`` in the system Open vSwitch, ``null``
(the default) follows the environment variable ``OPUS_OVS_PER_RAIL`` (``1``/``0``), else
:data:`emulator.ovs_instance.DEFAULT_PER_RAIL`.
Spares, fault injection and failover (``cluster.spares_per_server``, ``cluster.spare_servers``,
``faults``, ``failover``) are parsed and checked by :mod:`testbed.experiment.faults`.
``run.ranks_per_process`` (:mod:`testbed.experiment.rankprocs`): one replayer process per rank
(``rank``, the default), one per server hosting its ranks as threads, each in its own host's
network namespace (``server``; refused with failover), or ``server`` unless the run has
failover (``auto``). PyTorch jobs always run one process per rank.
``artifact_protocol.port`` (emulated runs; absent: off): the controller also serves the public
Opus artifact's line protocol (:mod:`controller.artifact`) on that TCP port (0: a free one) of
the run's frontend address, and the replayed ranks speak it instead of the project's ZeroMQ
protocol (:mod:`controller.artifact_client`); refused on the sim backend and with failover.
``sim.costs`` (sim backend; ``--costs`` overrides it): ``fabric`` (the default) simulates the
modelled datacenter, ``emulator`` the emulator's measured costs at its scaled link, for
cross-validation (:mod:`testbed.simulator.network`).
Every error names the key and its ``file:line:column``; unknown keys are rejected.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

from controller.drivers.registry import DRIVERS
from controller.ocs import resolve_switching_delay_ms, technology_words
from controller.railstate import INFLIGHT, JOIN, PORT_EXACT, RAIL_STATE, SEMANTICS
from emulator.cpuquota import validate_setting as validate_quota
from emulator.topo import EMULATOR_MAX_LINK_MBPS
from testbed.experiment import rankprocs
from testbed.experiment.dilation import AUTO, DilationError, parse_time_dilation
from testbed.experiment.faults import (
    FAILOVER_KEYS,
    FAULT_KEYS,
    RANK_FAULTS,
    ClusterShape,
    FailoverSettings,
    Fault,
    FaultSpecError,
    check_fault,
    spare_shortage,
)
from workloads.algorithms import ALGORITHM
from workloads.config import WorkloadConfig
from workloads.errors import WorkloadConfigError
from workloads.loader import (
    WorkloadSource,
    calibrated,
    parse_workload_source,
)
from workloads.schedule import Schedule
from workloads.timing import TimingModel
from workloads.yamldoc import YamlDoc, load_file

MODES = ("baseline", "on-demand", "provisioning", "degree-aware")
OCS_KEYS = ("switching_delay", "ports_per_rank", "driver", "semantics", "request_points",
            "rail_state_inflight", "rail_state_ack_timeout_s",
            "rail_state_serialize_per_rank", "rail_state_phase_barrier", "host",
            "port", "username", "password_env", "credentials_file", "timeout_s", "devices",
            "size", "rails")
REQUEST_POINTS = ("auto", "every", "phase")
#: ``sweep --delays``'s default (ms): 0 is the baseline; 250 and 500 give each family a slope.
DEFAULT_SWEEP_DELAYS = "0,1,10,25,50,100,250,500"
NETWORK_KEYS = ("rail_gbps", "link_mbps", "latency_us", "ovs_per_rail")
ARTIFACT_KEYS = ("port",)
SIM_KEYS = ("costs",)
#: ``sim.costs`` values (:data:`testbed.simulator.network.COST_MODELS`; named here so that the
#: file's checks need no simulator import).
FABRIC, EMULATOR = "fabric", "emulator"
SIM_COSTS = (FABRIC, EMULATOR)
RUN_KEYS = ("iterations", "warmup", "ack_timeout_s", "seed", "ranks_per_process",
            "rank_cpu_quota", "start_gate", "time_dilation", "wire_check")


class ExperimentError(WorkloadConfigError):
    """A bad experiment file or option; the message names the key and its position."""


@dataclass(frozen=True)
class RunSettings:
    """How an experiment runs, whatever its workload: mode, OCS, network, iterations."""

    name: str = "experiment"
    source: str = "<string>"
    text: str = ""
    mode: str = "provisioning"
    switching_delay: float | str = 25.0
    ports_per_rank: int = 1
    driver: str = "emulated"
    semantics: str = PORT_EXACT
    request_points: str = "auto"
    rail_state_inflight: str = JOIN
    rail_state_ack_timeout_s: float | None = None  # None: wait for the light
    rail_state_serialize_per_rank: bool = False
    rail_state_phase_barrier: bool = False
    ocs_options: dict[str, Any] = field(default_factory=dict)
    rail_gbps: float = 200.0
    link_mbps: float | None = None  # None: calibrate for this machine
    latency_us: float = 5.0
    ovs_per_rail: bool | None = None  # None: emulator.ovs_instance.per_rail_default()
    iterations: int = 3
    warmup: int = 1
    ack_timeout_s: float = 120.0
    seed: int = 0
    ranks_per_process: str = rankprocs.DEFAULT
    rank_cpu_quota: float | str | None = None  # None: no quota; "auto"; fraction of the machine
    start_gate: bool = True  # emulated ranks wait for each other before their first op
    time_dilation: float | str = AUTO  # emulation: model time x k on the wall; "auto"
    #: emulated OCS runs: tcpdump on every OCS port (testbed.metrics.wire, docs/wire.md); off by
    #: default until its cost at 16 ranks and its frames at a non-peer are understood
    wire_check: bool = False
    artifact_port: int | None = None  # the ranks speak the artifact's protocol on this port
    sim_costs: str = FABRIC  # the sim backend's cost model: fabric | emulator

    @property
    def switching_delay_ms(self) -> float:
        return 0.0 if self.mode == "baseline" else resolve_switching_delay_ms(
            self.switching_delay)

    @property
    def timing_model(self) -> TimingModel:
        """The alpha-beta model of the electrical rails: the modelled step and calibration."""
        return TimingModel(rail_gbps=self.rail_gbps, latency_s=self.latency_us * 1e-6)

    @property
    def effective_ports_per_rank(self) -> int:
        """K used by the run: degree-aware assignment needs a spare port to keep circuits;
        rail-state's data rails are packet-switched, one port per rank (as the baseline's)."""
        if self.mode == "degree-aware":
            return max(2, self.ports_per_rank)
        return 1 if self.effective_semantics == RAIL_STATE else self.ports_per_rank

    @property
    def packet_switched(self) -> bool:
        """Whether the data rails are packet switches (the baseline's electrical rails, and
        rail-state's data rails): no circuit limits what a rank's ports carry."""
        return self.mode == "baseline" or self.effective_semantics == RAIL_STATE

    @property
    def effective_semantics(self) -> str:
        """The controller's semantics; the electrical baseline has no controller decisions."""
        return PORT_EXACT if self.mode == "baseline" else self.semantics

    @property
    def effective_request_points(self) -> str:
        """``every`` or ``phase``: ``auto`` resolved for the semantics."""
        if self.request_points != "auto":
            return self.request_points
        return "phase" if self.effective_semantics == RAIL_STATE else "every"

    @property
    def total_iterations(self) -> int:
        return self.warmup + self.iterations

    def replace(self, **changes: Any) -> Self:
        """A copy with command-line overrides applied and validated."""
        out = dataclasses.replace(self, **changes)
        out.validate()
        return out

    def validate(self) -> None:
        if self.mode not in MODES:
            raise ExperimentError(f"must be one of {', '.join(MODES)}, got {self.mode!r}",
                                  "mode", self.source)
        try:
            resolve_switching_delay_ms(self.switching_delay)
        except ValueError as exc:
            raise ExperimentError(str(exc), "ocs.switching_delay", self.source) from exc
        checks = [("ocs.ports_per_rank", self.ports_per_rank >= 1, "must be >= 1"),
                  ("network.rail_gbps", self.rail_gbps > 0, "must be positive"),
                  ("network.latency_us", self.latency_us >= 0, "must be >= 0"),
                  ("run.iterations", self.iterations >= 1, "must be >= 1"),
                  ("run.warmup", self.warmup >= 0, "must be >= 0"),
                  ("run.ack_timeout_s", self.ack_timeout_s > 0, "must be positive")]
        if self.link_mbps is not None:
            checks.append(("network.link_mbps", 0 < self.link_mbps <= EMULATOR_MAX_LINK_MBPS,
                           f"must be in (0, {EMULATOR_MAX_LINK_MBPS:g}] Mbit/s (Mininet's HTB "
                           "limit) or 'auto'"))
        for key, ok, why in checks:
            if not ok:
                raise ExperimentError(why, key, self.source)
        try:
            validate_quota(self.rank_cpu_quota)
        except ValueError as exc:
            raise ExperimentError(str(exc), "run.rank_cpu_quota", self.source) from exc
        if self.driver not in DRIVERS:
            raise ExperimentError(f"must be one of {', '.join(DRIVERS)}, got {self.driver!r}",
                                  "ocs.driver", self.source)
        if self.ranks_per_process not in rankprocs.RANKS_PER_PROCESS:
            raise ExperimentError(f"must be one of {', '.join(rankprocs.RANKS_PER_PROCESS)}, "
                                  f"got {self.ranks_per_process!r}", "run.ranks_per_process",
                                  self.source)
        try:
            parse_time_dilation(self.time_dilation)
        except DilationError as exc:
            raise ExperimentError(str(exc), "run.time_dilation", self.source) from exc
        port = self.artifact_port
        if port is not None and (isinstance(port, bool) or not isinstance(port, int)
                                 or not 0 <= port <= 65535):
            raise ExperimentError(f"must be a TCP port (0-65535; 0 picks a free one), got "
                                  f"{port!r}", "artifact_protocol.port", self.source)
        if not isinstance(self.start_gate, bool):
            raise ExperimentError(f"must be true or false, got {self.start_gate!r}",
                                  "run.start_gate", self.source)
        if not isinstance(self.wire_check, bool):
            raise ExperimentError(f"must be true or false, got {self.wire_check!r}",
                                  "run.wire_check", self.source)
        if self.sim_costs not in SIM_COSTS:
            raise ExperimentError(f"must be one of {', '.join(SIM_COSTS)}, got "
                                  f"{self.sim_costs!r}", "sim.costs", self.source)
        self._validate_semantics()
        self._validate_faults()

    def _validate_semantics(self) -> None:
        if self.semantics not in SEMANTICS:
            raise ExperimentError(f"must be one of {', '.join(SEMANTICS)}, got "
                                  f"{self.semantics!r}", "ocs.semantics", self.source)
        if self.rail_state_inflight not in INFLIGHT:
            raise ExperimentError(f"must be one of {', '.join(INFLIGHT)}, got "
                                  f"{self.rail_state_inflight!r}", "ocs.rail_state_inflight",
                                  self.source)
        if self.request_points not in REQUEST_POINTS:
            raise ExperimentError(f"must be one of {', '.join(REQUEST_POINTS)}, got "
                                  f"{self.request_points!r}", "ocs.request_points", self.source)
        timeout = self.rail_state_ack_timeout_s
        if timeout is not None and (isinstance(timeout, bool)
                                    or not isinstance(timeout, int | float) or timeout <= 0):
            raise ExperimentError(f"must be a positive number of seconds or null (wait for the "
                                  f"light), got {timeout!r}", "ocs.rail_state_ack_timeout_s",
                                  self.source)
        if not isinstance(self.rail_state_serialize_per_rank, bool):
            raise ExperimentError(f"must be true or false, got "
                                  f"{self.rail_state_serialize_per_rank!r}",
                                  "ocs.rail_state_serialize_per_rank", self.source)
        if not isinstance(self.rail_state_phase_barrier, bool):
            raise ExperimentError(f"must be true or false, got "
                                  f"{self.rail_state_phase_barrier!r}",
                                  "ocs.rail_state_phase_barrier", self.source)
        if self.semantics == PORT_EXACT:  # (the rail-state options are ignored there, as a
            # sweep may run one file under both semantics)
            if self.request_points == "phase":
                raise ExperimentError("phase request points need rail-state semantics: under "
                                      "port-exact every call must hold lit circuits, so every "
                                      "call asks (every, or auto)", "ocs.request_points",
                                      self.source)
            return
        problems = [
            ("mode", self.mode == "degree-aware", "degree-aware is a port-exact assignment "
             "policy; rail-state has no port matchings (use on-demand or provisioning)"),
            ("ocs.driver", self.driver != "emulated", "rail-state switches shadow rails of the "
             "emulated OCS; use driver: emulated"), *self._rail_state_problems()]
        for key, bad, why in problems:
            if bad:
                raise ExperimentError(f"{why} (ocs.semantics is rail-state)", key, self.source)

    def _rail_state_problems(self) -> list[tuple[str, bool, str]]:
        """(key, refused, why) of what the workload asks that rail-state cannot carry."""
        return []

    def _validate_faults(self) -> None:
        """Spares and faults need a replayed schedule (:class:`ExperimentConfig`); none here."""

    def to_json(self) -> dict[str, Any]:
        """The run-relevant settings (the workload is in the manifest's copy of the file)."""
        return {"name": self.name, "source": self.source, "mode": self.mode,
                "switching_delay": self.switching_delay,
                "switching_delay_ms": self.switching_delay_ms,
                "ports_per_rank": self.effective_ports_per_rank, "driver": self.driver,
                "semantics": self.effective_semantics,
                "request_points": self.effective_request_points,
                "rail_state_inflight": self.rail_state_inflight,
                "rail_state_ack_timeout_s": self.rail_state_ack_timeout_s,
                "rail_state_serialize_per_rank": self.rail_state_serialize_per_rank,
                "rail_state_phase_barrier": self.rail_state_phase_barrier,
                "rail_gbps": self.rail_gbps, "link_mbps": self.link_mbps,
                "latency_us": self.latency_us, "ovs_per_rail": self.ovs_per_rail,
                "iterations": self.iterations, "warmup": self.warmup, "seed": self.seed,
                "ranks_per_process": self.ranks_per_process,
                "rank_cpu_quota": self.rank_cpu_quota, "start_gate": self.start_gate,
                "time_dilation": self.time_dilation, "artifact_port": self.artifact_port,
                "wire_check": self.wire_check, "sim_costs": self.sim_costs}


@dataclass(frozen=True, kw_only=True)
class ExperimentConfig(RunSettings):
    """A validated experiment: what to train (a generated or a captured schedule), on which
    fabric, how long."""

    workload: WorkloadConfig
    schedule_file: str | None = None  # workload: {schedule: FILE} replays this schedule
    spares_per_server: int = 0
    spare_servers: int = 0
    faults: tuple[Fault, ...] = ()
    failover: FailoverSettings = field(default_factory=FailoverSettings)
    no_spares: bool = False  # --no-spares: no spare hosts; a failure restarts every rank
    spares_position: str = ""  # file:line:column of the spares setting, for late refusals

    def schedule(self) -> Schedule:
        """The schedule to run: loaded from ``schedule_file``, else generated."""
        path = Path(self.schedule_file) if self.schedule_file else None
        return WorkloadSource(self.workload, path).schedule()

    @property
    def shape(self) -> ClusterShape:
        """The cluster as faults see it (spares only when the run uses them)."""
        cluster = self.workload.cluster
        spares = not self.no_spares
        return ClusterShape(cluster.servers, cluster.gpus_per_server,
                            self.effective_ports_per_rank, self.total_iterations,
                            self.spares_per_server if spares else 0,
                            self.spare_servers if spares else 0)

    @property
    def failover_trigger(self) -> str | None:
        """What gives the run failover, in words (None: nothing; a failed rank ends the run),
        as the supervisor decides its policy."""
        if self.no_spares:
            return "--no-spares restarts every rank"
        if self.spares_per_server or self.spare_servers:
            return "the cluster has spare GPUs"
        kinds = sorted({f.kind for f in self.faults
                        if f.kind in RANK_FAULTS or f.kind == "port_failed"})
        return f"faults: {', '.join(kinds)}" if kinds else None

    @property
    def rank_processes(self) -> str:
        """``rank`` or ``server``: ``run.ranks_per_process`` resolved for this run."""
        return rankprocs.resolve(self.ranks_per_process, self.failover_trigger)

    def _validate_faults(self) -> None:
        """Faults against the cluster as overridden (iterations, K, --no-spares)."""
        try:
            rankprocs.resolve(self.ranks_per_process, self.failover_trigger)
        except rankprocs.GroupingRefused as exc:
            raise ExperimentError(str(exc), "run.ranks_per_process", self.source) from exc
        if self.artifact_port is not None and self.failover_trigger is not None:
            raise ExperimentError(f"the artifact's protocol has no failover, but this run has it "
                                  f"({self.failover_trigger}); remove artifact_protocol or the "
                                  "spares and rank faults", "artifact_protocol.port", self.source)
        shape = self.shape
        if self.effective_semantics != PORT_EXACT and (shape.spares or self.faults):
            raise ExperimentError("spares and faults need port-exact semantics (a spare takes "
                                  "over a rank's ports, which rail-state does not own)",
                                  "ocs.semantics", self.source)
        for fault in self.faults:
            try:
                check_fault(fault.to_json(), fault.index, shape)
            except FaultSpecError as exc:
                raise ExperimentError(str(exc), exc.field, fault.position or self.source
                                      ) from exc
        if not self.no_spares and self.failover.repair_s is None:
            short = spare_shortage(self.faults, shape)
            if short is not None:
                fault, why = short
                raise ExperimentError(f"not enough spares: {why}", fault.field,
                                      fault.position or self.source)

    def to_json(self) -> dict[str, Any]:
        return {**super().to_json(), "schedule_file": self.schedule_file,
                "spares_per_server": self.spares_per_server,
                "spare_servers": self.spare_servers, "no_spares": self.no_spares,
                "faults": [f.to_json() for f in self.faults],
                "failover": self.failover.to_json()}

    def _rail_state_problems(self) -> list[tuple[str, bool, str]]:
        par = self.workload.parallel
        return [("workload.parallelism.pp_schedule", par.pp_schedule != "1f1b"
                 or par.virtual_stages != 1, "rail-state has one bit per pipeline stage and "
                 "links adjacent stages only: an interleaved schedule cannot be expressed (use "
                 "1f1b)")]


def parse_experiment(text: str, source: str = "<string>", base_dir: Path | None = None
                     ) -> ExperimentConfig:
    """Parse and validate a whole experiment document."""
    workload = parse_workload_source(text, source, base_dir)
    doc = YamlDoc(text, source)
    top = doc.mapping(doc.root, "", None)
    kwargs = run_settings(doc, top, text)
    kwargs["workload"] = workload.config
    if workload.schedule_file is not None:
        kwargs["schedule_file"] = str(workload.schedule_file)
    _parse_failover(doc, top, kwargs)
    cfg = doc.validated(ExperimentConfig(**kwargs))
    if cfg.workload.calibrate_step_s is None:
        return cfg
    return dataclasses.replace(cfg, workload=calibrated(doc, cfg.workload, cfg.timing_model))


def run_settings(doc: YamlDoc, top: dict[str, Any], text: str) -> dict[str, Any]:
    """The :class:`RunSettings` fields of experiment document ``doc`` (``name``, ``mode``,
    ``ocs``, ``network``, ``run``), checked with their positions."""
    source = doc.source
    kwargs: dict[str, Any] = {"source": source, "text": text}
    if "name" in top:
        kwargs["name"] = doc.typed(top["name"], "name", str)
    else:
        kwargs["name"] = Path(source).stem if source != "<string>" else "experiment"
    if "mode" in top:
        mode = doc.typed(top["mode"], "mode", str)
        if mode not in MODES:
            raise doc.error("mode", f"must be one of {', '.join(MODES)}, got {mode!r}")
        kwargs["mode"] = mode
    ocs = doc.mapping(top.get("ocs", {}), "ocs", OCS_KEYS)
    if "switching_delay" in ocs:
        value = ocs["switching_delay"]
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise doc.error("ocs.switching_delay", "must be a number of ms or a technology "
                            f"name ({technology_words()})")
        try:
            resolve_switching_delay_ms(value)
        except ValueError as exc:
            raise doc.error("ocs.switching_delay", str(exc)) from exc
        kwargs["switching_delay"] = float(value) if not isinstance(value, str) else value
    if "ports_per_rank" in ocs:
        kwargs["ports_per_rank"] = doc.typed(ocs["ports_per_rank"], "ocs.ports_per_rank", int)
    if "driver" in ocs:
        driver = doc.typed(ocs["driver"], "ocs.driver", str)
        if driver not in DRIVERS:
            raise doc.error("ocs.driver", f"must be one of {', '.join(DRIVERS)}, got {driver!r}")
        kwargs["driver"] = driver
    for key in ("semantics", "request_points", "rail_state_inflight"):
        if key in ocs:
            kwargs[key] = doc.typed(ocs[key], f"ocs.{key}", str)
    if "rail_state_ack_timeout_s" in ocs:
        value = ocs["rail_state_ack_timeout_s"]
        kwargs["rail_state_ack_timeout_s"] = (None if value is None else doc.typed(
            value, "ocs.rail_state_ack_timeout_s", float))
        if value is not None and value <= 0:
            raise doc.error("ocs.rail_state_ack_timeout_s", "must be a positive number of "
                            f"seconds or null (wait for the light), got {value!r}")
    for key in ("rail_state_serialize_per_rank", "rail_state_phase_barrier"):
        if key in ocs:
            kwargs[key] = doc.typed(ocs[key], f"ocs.{key}", bool)
    kwargs["ocs_options"] = {k: v for k, v in ocs.items()
                             if k not in ("switching_delay", "ports_per_rank", "driver",
                                          "semantics", "request_points",
                                          "rail_state_inflight", "rail_state_ack_timeout_s",
                                          "rail_state_serialize_per_rank",
                                          "rail_state_phase_barrier")}
    net = doc.mapping(top.get("network", {}), "network", NETWORK_KEYS)
    if "rail_gbps" in net:
        kwargs["rail_gbps"] = doc.typed(net["rail_gbps"], "network.rail_gbps", float)
    if "latency_us" in net:
        kwargs["latency_us"] = doc.typed(net["latency_us"], "network.latency_us", float)
    if net.get("ovs_per_rail") is not None:
        kwargs["ovs_per_rail"] = doc.typed(net["ovs_per_rail"], "network.ovs_per_rail", bool)
    if "link_mbps" in net and net["link_mbps"] != "auto":
        kwargs["link_mbps"] = doc.typed(net["link_mbps"], "network.link_mbps", float)
    run = doc.mapping(top.get("run", {}), "run", RUN_KEYS)
    for key in ("iterations", "warmup", "seed"):
        if key in run:
            kwargs[key] = doc.typed(run[key], f"run.{key}", int)
    if "ack_timeout_s" in run:
        kwargs["ack_timeout_s"] = doc.typed(run["ack_timeout_s"], "run.ack_timeout_s", float)
    if "ranks_per_process" in run:
        value = doc.typed(run["ranks_per_process"], "run.ranks_per_process", str)
        if value not in rankprocs.RANKS_PER_PROCESS:
            raise doc.error("run.ranks_per_process", f"must be one of "
                            f"{', '.join(rankprocs.RANKS_PER_PROCESS)}, got {value!r}")
        kwargs["ranks_per_process"] = value
    if "rank_cpu_quota" in run:
        try:
            kwargs["rank_cpu_quota"] = validate_quota(run["rank_cpu_quota"])
        except ValueError as exc:
            raise doc.error("run.rank_cpu_quota", str(exc)) from exc
    if "start_gate" in run:
        kwargs["start_gate"] = doc.typed(run["start_gate"], "run.start_gate", bool)
    if "time_dilation" in run:
        try:
            kwargs["time_dilation"] = parse_time_dilation(run["time_dilation"])
        except DilationError as exc:
            raise doc.error("run.time_dilation", str(exc)) from exc
    if "wire_check" in run:
        kwargs["wire_check"] = doc.typed(run["wire_check"], "run.wire_check", bool)
    art = doc.mapping(top.get("artifact_protocol", {}), "artifact_protocol", ARTIFACT_KEYS)
    if "port" in art:
        port = kwargs["artifact_port"] = doc.typed(art["port"], "artifact_protocol.port", int)
        if not 0 <= port <= 65535:
            raise doc.error("artifact_protocol.port", f"must be a TCP port (0-65535; 0 picks a "
                            f"free one), got {port}")
    sim = doc.mapping(top.get("sim", {}), "sim", SIM_KEYS)
    if "costs" in sim:
        costs = doc.typed(sim["costs"], "sim.costs", str)
        if costs not in SIM_COSTS:
            raise doc.error("sim.costs", f"must be one of {', '.join(SIM_COSTS)}, got "
                            f"{costs!r}")
        kwargs["sim_costs"] = costs
    return kwargs


_FAULT_TYPES: dict[str, type] = {"kind": str, "rank": int, "rail": int, "port": int,
                                 "at_iteration": int, "at_s": float, "jitter_ms": float,
                                 "count": int}


def _parse_failover(doc: YamlDoc, top: dict[str, Any], kwargs: dict[str, Any]) -> None:
    """``cluster.spares_per_server``, ``cluster.spare_servers``, ``faults`` and ``failover``."""
    cluster = top["cluster"]
    for key in ("spares_per_server", "spare_servers"):
        if key in cluster:
            value = doc.typed(cluster[key], f"cluster.{key}", int)
            if value < 0:
                raise doc.error(f"cluster.{key}", f"must be >= 0, got {value}")
            kwargs[key] = value
            kwargs["spares_position"] = doc.pos(f"cluster.{key}")
    fo = doc.mapping(top.get("failover", {}), "failover", FAILOVER_KEYS)
    settings: dict[str, Any] = {}
    for key in FAILOVER_KEYS:
        if fo.get(key) is not None:
            value = settings[key] = doc.typed(fo[key], f"failover.{key}", float)
            positive = key == "heartbeat_timeout_s"
            if value < 0 or (positive and value == 0):
                raise doc.error(f"failover.{key}",
                                f"must be {'> 0' if positive else '>= 0'}, got {value}")
    kwargs["failover"] = FailoverSettings(**settings)
    raw_faults = top.get("faults", [])
    if not isinstance(raw_faults, list):
        raise doc.error("faults", "must be a list of faults")
    cfg = ExperimentConfig(**{k: v for k, v in kwargs.items() if k != "faults"})
    shape = cfg.shape
    faults = []
    for i, item in enumerate(raw_faults):
        path = f"faults[{i}]"
        entry = doc.mapping(item, path, FAULT_KEYS)
        typed = {k: doc.typed(v, f"{path}.{k}", _FAULT_TYPES[k]) for k, v in entry.items()}
        try:
            faults.append(check_fault(typed, i, shape, doc.pos(path)))
        except FaultSpecError as exc:
            raise doc.error(exc.field, str(exc)) from exc
    kwargs["faults"] = tuple(faults)


def check_algorithm_ports(cfg: ExperimentConfig, schedule: Schedule) -> None:
    """Refuse an algorithm chosen in ``workload.algorithms`` whose circuits need more ports per
    rank than K on an optical rail (packet-switched rails have no such budget), at its
    position."""
    if cfg.packet_switched or not cfg.workload.algorithms:
        return
    k = cfg.effective_ports_per_rank
    network = {(t.kind, t.axis) for p in schedule.programs for t in p.ops
               if t.is_collective and t.axis}
    for kind, axis in sorted(network):
        chosen = [(k_, a, name) for k_, a, name in cfg.workload.algorithms
                  if k_ == kind and a in ("", axis)]
        if not chosen or bool(schedule.group_scale_up(axis).all()):
            continue
        name = cfg.workload.algorithm_for(kind, axis)
        group = schedule.group_ranks(f"{axis}0")
        on_rail = max(sum(1 for r in group if schedule.rail_of(r) == rail)
                      for rail in {schedule.rail_of(r) for r in group})
        algorithm = ALGORITHM[name]
        need = algorithm.min_ports(kind, on_rail)
        if need > k:
            path = f"workload.algorithms.{kind}" + (
                f".{axis}" if any(a == axis for _, a, _n in chosen) else "")
            raise ExperimentError(
                f"{name} needs {need} ports per rank for {axis} groups of {on_rail} ranks on a "
                f"rail ({algorithm.port_reason}), but ocs.ports_per_rank is {k}; "
                "raise ocs.ports_per_rank, choose another algorithm, or run mode: baseline",
                path, YamlDoc(cfg.text, cfg.source).pos(path) if cfg.text else cfg.source)


def load_experiment(path: str | Path) -> ExperimentConfig:
    """Read and validate the experiment file at ``path``."""
    return load_file(path, parse_experiment, ExperimentError)
