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
      semantics: port-exact     # port-exact | rail-state
      request_points: auto      # auto | every | phase: which calls ask the controller
    network:
      rail_gbps: 200            # the real per-GPU scale-out rate being modelled
      link_mbps: auto           # emulated per-port rate; bytes scale by link / rail rate
      ovs_per_rail: null        # one Open vSwitch per rail bridge (null: the environment)
    run:
      iterations: 3             # measured iterations after the warm-up
      warmup: 1
      ranks_per_process: rank  # rank | server | auto: replayer processes
      rank_cpu_quota: null      # null | auto | 0 < fraction <= 1: the ranks' CPU
      start_gate: true          # replayed ranks start together (false: each once loaded)
      time_dilation: auto       # emulation: model time x k on the wall (auto | k >= 1)
      wire_check: true          # capture the OCS ports and judge the switching from the wire
    artifact_protocol:          # emulated runs: the ranks speak the Opus artifact's protocol
      port: 1234                # on the run's frontend address
    sim:
      costs: fabric             # fabric | emulator: the sim backend's cost model
    controller:
      plane: opus               # opus | static | rotor: rival planes (rotor: sim backend)

Every run option (``mode``, ``ocs``, ``network``, ``run``, ``artifact_protocol``, ``sim``,
``controller``) is declared once in :mod:`testbed.experiment.sections` (type, default, unit,
meaning; the reference page ``docs/config-reference.md`` is generated from it) and parsed and
checked by :mod:`testbed.experiment.schema`; :class:`RunSettings` is their settings object, and
holds the rules between options:
Rail-state refuses ``degree-aware`` (a port assignment policy), interleaved pipelines, and a
driver other than ``emulated``; ``phase`` request points need rail-state.
Spares, fault injection and failover (``cluster.spares_per_server``, ``cluster.spare_servers``,
``faults``, ``failover``) are parsed and checked by :mod:`testbed.experiment.faults`.
Every error names the key and its ``file:line:column``; unknown keys are rejected.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Self, TypeVar

from controller.ocs import resolve_switching_delay_ms
from controller.planes.rotor import default_slot_s
from controller.railstate import PORT_EXACT, RAIL_STATE
from testbed.experiment import rankprocs
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
from testbed.experiment.schema import all_specs, check_values, parse_sections
from testbed.experiment.sections import (  # noqa: F401 (MODES, SIM_COSTS, ...: re-exported)
    EMULATOR,
    FABRIC,
    MODES,
    RELAY_PATHS,
    REQUEST_POINTS,
    SCHEMA,
    SIM_COSTS,
    ArtifactProtocol,
    Controller,
    Device,
    Experiment,
    Fabric,
    Network,
    Run,
    Scheduling,
    Sim,
    Timing,
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

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

#: ``sweep --delays``'s default (ms): 0 is the baseline; 250 and 500 give each family a slope.
DEFAULT_SWEEP_DELAYS = "0,1,10,25,50,100,250,500"
#: every run option, resolved (:mod:`testbed.experiment.sections`)
SPECS = all_specs(SCHEMA)
#: the ``ocs:`` keys that reach a lab switch (``RunSettings.ocs_options``)
_DEVICE_ACCESS = [s for s in SPECS if s.section.cls is Device and s.name != "driver"]


SectionT = TypeVar("SectionT", bound="DataclassInstance")  # a section's class of SCHEMA


class ExperimentError(WorkloadConfigError):
    """A bad experiment file or option; the message names the key and its position."""


@dataclass(frozen=True)
class RunSettings(Experiment, Timing, Fabric, Scheduling, Device, Network, Run,
                  ArtifactProtocol, Sim, Controller):
    """How an experiment runs, whatever its workload: every option of
    :data:`~testbed.experiment.sections.SCHEMA` (one field each, named as there), the file it
    came from, and the rules between options."""

    source: str = "<string>"
    text: str = ""

    def section(self, cls: type[SectionT]) -> SectionT:
        """This run's values of one section of the schema (``cfg.section(Scheduling)``), as
        that section's object: what a part that needs only those options can take."""
        return cls(**{f.name: getattr(self, f.name) for f in dataclasses.fields(cls)})

    @property
    def ocs_options(self) -> dict[str, Any]:
        """The lab switch's access keys the file sets (``ocs.host``, ``ocs.rails``, ...)."""
        return {s.key: getattr(self, s.name) for s in _DEVICE_ACCESS
                if getattr(self, s.name) is not None}

    @property
    def rival_plane(self) -> bool:
        """Whether a rival control plane moves the circuits (``controller.plane`` static or
        rotor, issue 40; :mod:`testbed.simulator.planes`). ``mode: baseline`` is the electrical
        rails whatever the plane."""
        return self.control_plane != "opus" and self.mode != "baseline"

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
        if self.rival_plane:  # a rival plane uses every port the file gives
            return self.ports_per_rank
        if self.mode == "degree-aware":
            return max(2, self.ports_per_rank)
        return 1 if self.effective_semantics == RAIL_STATE else self.ports_per_rank

    @property
    def packet_switched(self) -> bool:
        """Whether the data rails are packet switches (the baseline's electrical rails, and
        rail-state's data rails): no circuit limits what a rank's ports carry."""
        return (self.mode == "baseline" or self.effective_semantics == RAIL_STATE
                or self.rival_plane)  # a rival plane's ranks send as on packet rails

    @property
    def effective_semantics(self) -> str:
        """The controller's semantics; the electrical baseline has no controller decisions."""
        if self.mode == "baseline" or self.rival_plane:
            return PORT_EXACT
        return self.semantics

    @property
    def effective_request_points(self) -> str:
        """``every`` or ``phase``: ``auto`` resolved for the semantics."""
        if self.request_points != "auto":
            return self.request_points
        return "phase" if self.effective_semantics == RAIL_STATE else "every"

    @property
    def effective_rotor_slot_ms(self) -> float:
        """``controller.rotor_slot_ms``, or when it is null 10 x the switching delay, at least
        0.1 ms (:func:`controller.planes.rotor.default_slot_s`)."""
        if self.rotor_slot_ms is not None:
            return self.rotor_slot_ms
        return default_slot_s(self.switching_delay_ms / 1e3) * 1e3

    @property
    def total_iterations(self) -> int:
        return self.warmup + self.iterations

    def replace(self, **changes: Any) -> Self:
        """A copy with command-line overrides applied and validated."""
        out = dataclasses.replace(self, **changes)
        out.validate()
        return out

    def validate(self) -> None:
        """Every option by the schema's rules, then the rules between options."""
        for spec, why in check_values(self, SPECS):
            raise ExperimentError(why, spec.path, self.source)
        if self.rival_plane and not self.effective_rotor_slot_ms > self.switching_delay_ms:
            raise ExperimentError(f"must be longer than the switching delay "
                                  f"({self.switching_delay_ms:g} ms), got "
                                  f"{self.rotor_slot_ms}", "controller.rotor_slot_ms",
                                  self.source)
        self._validate_semantics()
        self._validate_faults()

    def _validate_semantics(self) -> None:
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
        """The run-relevant settings, as the run resolved them (the workload is in the
        manifest's copy of the file; a lab switch's access keys are left out)."""
        out: dict[str, Any] = {"name": self.name, "source": self.source}
        out.update((s.name, getattr(self, s.name)) for s in SPECS if s.option.manifest)
        out.update(switching_delay_ms=self.switching_delay_ms,
                   ports_per_rank=self.effective_ports_per_rank,
                   semantics=self.effective_semantics,
                   request_points=self.effective_request_points)
        return out


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
    """The :class:`RunSettings` fields of experiment document ``doc`` (top-level mapping
    ``top``), each typed and checked at its position by the schema."""
    kwargs = parse_sections(doc, top, SPECS)
    if "name" not in kwargs:
        kwargs["name"] = Path(doc.source).stem if doc.source != "<string>" else "experiment"
    return {**kwargs, "source": doc.source, "text": text}


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
