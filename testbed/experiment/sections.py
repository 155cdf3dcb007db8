"""The experiment file's run options, declared once (:mod:`testbed.experiment.schema`).

Each class is one section of the schema; :class:`testbed.experiment.config.RunSettings` is
all of them (its fields are theirs, one flat namespace: ``cfg.semantics``, ``cfg.iterations``),
and :data:`SCHEMA` says which YAML mapping each reads. The ``ocs:`` mapping carries three
sections: :class:`Scheduling` (what Opus decides and how), :class:`Timing` (how long a switch
takes), :class:`Device` (which driver, and the access keys of a lab switch), besides
:class:`Fabric` (ports per rank). ``docs/config-reference.md`` is written from here
(``python -m testbed.experiment.reference``).

To add an option: declare a field with :func:`~testbed.experiment.schema.option` in its section
(default, help, unit, accepted values), then use ``cfg.<field>`` where it acts; its parsing,
checks, manifest entry and reference row follow. Rules between options (rail-state refuses
``degree-aware``) stay in ``RunSettings.validate``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from controller.drivers.registry import DRIVERS
from controller.ocs import resolve_switching_delay_ms, technology_words
from controller.railstate import INFLIGHT, JOIN, PORT_EXACT, SEMANTICS
from emulator.cpuquota import validate_setting as validate_quota
from emulator.topo import EMULATOR_MAX_LINK_MBPS
from testbed.experiment import rankprocs
from testbed.experiment.dilation import AUTO, parse_time_dilation
from testbed.experiment.schema import Section, option

MODES = ("baseline", "on-demand", "provisioning", "degree-aware")
REQUEST_POINTS = ("auto", "every", "phase")
#: ``sim.costs`` values (:data:`testbed.simulator.network.COST_MODELS`; named here so that the
#: file's checks need no simulator import).
FABRIC, EMULATOR = "fabric", "emulator"
SIM_COSTS = (FABRIC, EMULATOR)
#: ``controller.plane``: Opus, or a rival control plane on the same rails (issue 40)
CONTROL_PLANES = ("opus", "static", "rotor")
#: ``controller.relay_paths``: how the static plane picks a relayed transfer's path
FIXED, DYNAMIC = "fixed", "dynamic"
RELAY_PATHS = (FIXED, DYNAMIC)


def _at_least(low: float, why: str) -> Any:
    return lambda v: None if v >= low else why


def _positive(v: float) -> str | None:
    return None if v > 0 else "must be positive"


def _switching_delay(value: Any) -> float | str:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError(f"must be a number of ms or a technology name ({technology_words()})")
    resolve_switching_delay_ms(value)
    return value if isinstance(value, str) else float(value)


@dataclass(frozen=True)
class Experiment:
    name: str = option("experiment", "The run's name (results folders, plots).",
                       default_text="the file's name without `.yaml`")
    mode: str = option("provisioning", "How circuits are switched: `baseline` is the fully "
                       "connected electrical rail (no circuits); `on-demand` switches when a "
                       "call needs a circuit; `provisioning` also switches ahead of time from "
                       "the profiled first iteration (paper 4.1); `degree-aware` keeps idle "
                       "circuits lit while spare ports exist (K = max(2, ports_per_rank)).",
                       choices=MODES)


@dataclass(frozen=True)
class Timing:
    switching_delay: float | str = option(
        25.0, "How long a reconfiguration keeps the affected ports dark: a number of ms or a "
        "Table 3 technology name (`piezo`, `mems`, ...). Never scaled by the emulator.",
        unit="ms", parse=_switching_delay, type_text="a number or a technology name")


@dataclass(frozen=True)
class Fabric:
    ports_per_rank: int = option(1, "K: ports per GPU on its rail's OCS (rail-state's data "
                                 "rails use one; degree-aware at least two).",
                                 check=_at_least(1, "must be >= 1"))


@dataclass(frozen=True)
class Scheduling:
    semantics: str = option(PORT_EXACT, "`port-exact`: a real OCS, circuits are one-to-one "
                            "port matchings a call must hold. `rail-state`: the model of Opus's "
                            "public artifact, a bitmask per rail (controller.railstate), on "
                            "packet-switched data rails and small shadow OCS rails.",
                            choices=SEMANTICS)
    request_points: str = option("auto", "Which calls ask the controller: `every` call "
                                 "(port-exact needs it), or only at the artifact's points, "
                                 "`phase` (testbed.plan.requestpoints); `auto` is `phase` "
                                 "under rail-state, else `every`.", choices=REQUEST_POINTS)
    rail_state_inflight: str = option(JOIN, "Rail-state: a request for a bit already being "
                                      "switched to its value `join`s that switch, or `reflip`s "
                                      "it after it (the artifact's controller).",
                                      choices=INFLIGHT)
    rail_state_ack_timeout_s: float | None = option(
        None, "Rail-state: how long a rank waits for its ack before it goes on without it (the "
        "artifact's shim: 10; model time, dilated with every other timeout); the late ack is "
        "dropped and the call's completion waits for it. null: it waits for the light.",
        unit="s",
        check=lambda v: None if v > 0 else (
            f"must be a positive number of seconds or null (wait for the light), got {v!r}"),
        default_text="null (wait for the light)")
    rail_state_serialize_per_rank: bool = option(
        False, "Rail-state: the controller reads a rank's next request only once the request "
        "of it that started a switch is answered (the artifact's controller).")
    rail_state_phase_barrier: bool = option(
        False, "Rail-state: no call of a rank starts before its previous phase's last call has "
        "ended (and with provisioning, before the next phase's predicted switch is done): the "
        "artifact's shim's `topo_ready` (testbed.plan.phasebarrier). With provisioning, sim "
        "backend only.")


@dataclass(frozen=True)
class Device:
    driver: str = option("emulated", "The OCS driver (controller.drivers.registry): "
                         "`emulated` drives the emulated OCS directly; the lab drivers drive it "
                         "through a front of their protocol on every emulated rail.",
                         choices=tuple(DRIVERS))
    device_host: str | None = option(None, "A lab switch's address (one switch: rail 0); an "
                                     "emulated run refuses it (it drives its own fronts).",
                                     key="host", manifest=False)
    device_port: int | None = option(None, "The switch's management port (default: the "
                                     "driver's).", key="port", manifest=False)
    device_username: str | None = option(None, "The login (default: the credentials file's, "
                                         "else admin).", key="username", manifest=False)
    device_password_env: str | None = option(
        None, "The environment variable holding the password (default: OPUS_OCS_PASSWORD).",
        key="password_env", manifest=False)
    device_credentials_file: str | None = option(
        None, "A YAML file with `password` (and `username`), readable by its owner only.",
        key="credentials_file", manifest=False)
    device_timeout_s: float | None = option(None, "How long a device command may take.",
                                            key="timeout_s", unit="s", manifest=False)
    device_devices: Any = option(None, "Accepted, as files have carried it; no driver reads "
                                 "it.", key="devices", manifest=False, type_text="any")
    device_size: int | str | None = option(None, "N of the N x N switch (or `16x16`); a switch "
                                           "of another size is refused.", key="size",
                                           manifest=False)
    device_rails: list | None = option(None, "One switch per rail instead of `host`: entries "
                                       "with `rail` and the keys above; an emulated run "
                                       "refuses it.", key="rails", manifest=False)


@dataclass(frozen=True)
class Network:
    rail_gbps: float = option(200.0, "The real per-GPU scale-out rate being modelled.",
                              unit="Gbit/s", check=_positive)
    link_mbps: float | None = option(
        None, "The emulated per-port rate; bytes scale by link / rail rate. `auto`: calibrate "
        "for this machine.", unit="Mbit/s", words={"auto": None},
        check=lambda v: None if 0 < v <= EMULATOR_MAX_LINK_MBPS else (
            f"must be in (0, {EMULATOR_MAX_LINK_MBPS:g}] Mbit/s (Mininet's HTB limit) or "
            "'auto'"))
    latency_us: float = option(5.0, "Per-hop latency of the modelled fabric.", unit="us",
                               check=_at_least(0, "must be >= 0"))
    ovs_per_rail: bool | None = option(
        None, "`true`: every emulated OCS bridge in its own ovsdb-server + ovs-vswitchd "
        "(emulator.ovs_instance); `false`: the system Open vSwitch; null: the environment "
        "variable `OPUS_OVS_PER_RAIL` (1/0), else the emulator's default.",
        default_text="null (environment)")


@dataclass(frozen=True)
class Run:
    iterations: int = option(3, "Measured iterations after the warm-up.",
                             check=_at_least(1, "must be >= 1"))
    warmup: int = option(1, "Warm-up iterations (profiled, not measured).",
                         check=_at_least(0, "must be >= 0"))
    ack_timeout_s: float = option(120.0, "How long a replayed rank waits for the controller's "
                                  "ack of a call before it gives up (x k under time "
                                  "dilation).", unit="s",
                                  check=_positive)
    seed: int = option(0, "Seeds the simulated OCS's jitter and the fault draws.")
    ranks_per_process: str = option(
        rankprocs.DEFAULT, "Replayer processes (testbed.experiment.rankprocs): one per `rank`; "
        "one per `server` hosting its ranks as threads (refused with failover); `auto`: "
        "`server` unless the run has failover. PyTorch jobs run one process per rank.",
        choices=rankprocs.RANKS_PER_PROCESS)
    rank_cpu_quota: float | str | None = option(
        None, "Emulated runs: the rank processes share one cgroup with this fraction of the "
        "machine's CPU (`auto`: all but emulator.cpuquota.AUTO_RESERVE_CORES); null: no quota.",
        parse=validate_quota, type_text="a fraction in (0, 1] or `auto` or null",
        default_text="null (no quota)")
    start_gate: bool = option(True, "Replayed ranks start together (false: each once loaded).")
    time_dilation: float | str = option(
        AUTO, "Emulation: model time x k on the wall (`auto` or k >= 1; docs/validation.md).",
        parse=parse_time_dilation, type_text="a number >= 1 or `auto`",
        default_text="`auto`")
    wire_check: bool = option(False, "Emulated OCS runs: tcpdump captures every OCS port and "
                              "the verdict judges each switch's dark period and the one-to-one "
                              "rule from the capture (testbed.metrics.wire, docs/wire.md). Off "
                              "by default: on a saturated 2-core machine its CPU starved ranks "
                              "and two configurations read false early light (docs/wire.md); "
                              "`make demo` turns it on. Electrical baselines and simulated runs "
                              "have no capture; without tcpdump the run goes on without it, "
                              "saying so.")


@dataclass(frozen=True)
class ArtifactProtocol:
    artifact_port: int | None = option(
        None, "Emulated runs: the controller also serves the public Opus artifact's line "
        "protocol on this TCP port of the run's frontend address (0: a free one), and the "
        "replayed ranks speak it (controller.artifact); refused on the sim backend and with "
        "failover. Absent: off.", key="port",
        check=lambda v: None if 0 <= v <= 65535 else (
            f"must be a TCP port (0-65535; 0 picks a free one), got {v!r}"),
        default_text="null (off)")


@dataclass(frozen=True)
class Sim:
    sim_costs: str = option(FABRIC, "The sim backend's cost model (`--costs` overrides it): "
                            "`fabric` simulates the modelled datacenter, `emulator` the "
                            "emulator's measured costs at its scaled link, for cross-validation "
                            "(testbed.simulator.network).", key="costs", choices=SIM_COSTS)


@dataclass(frozen=True)
class Controller:
    control_plane: str = option(
        "opus", "What moves the circuits: `opus` (the controller of the paper); `static` "
        "(circuits set once, never switched) or `rotor` (a fixed round of matchings, each held "
        "for `rotor_slot_ms`, whatever the job asks), the rival planes of issue 40.",
        key="plane", choices=CONTROL_PLANES)
    rotor_slot_ms: float | None = option(
        None, "`rotor`: how long each matching of the round is held; null: 10 x the switching "
        "delay, at least 0.1 ms (controller.planes.rotor).", unit="ms", check=_positive,
        default_text="null (10 x the switching delay, >= 0.1 ms)")
    relay_paths: str = option(
        FIXED, "`static`: how a transfer's path of circuits is chosen. `fixed`: one path per "
        "comm group and rank pair, computed once from the topology and the job's bytes "
        "(controller.planes.relay.path_table), as TopoOpt computes its forwarding offline; "
        "both backends take it. `dynamic`: per transfer when it starts, the least-loaded hop "
        "on a shortest path given every flow in flight (sim backend only: an upper bound on "
        "per-flow load balancing). The rotor always chooses per slot (RotorLB).",
        choices=RELAY_PATHS)


SCHEMA: tuple[Section, ...] = (
    Section("experiment", Experiment, "", "What the run is called and how Opus switches."),
    Section("timing", Timing, "ocs", "How long the optical switch takes to reconfigure."),
    Section("fabric", Fabric, "ocs", "The ports each rank has on its rail's OCS."),
    Section("scheduling", Scheduling, "ocs", "The controller's semantics: which model of the "
            "rails it schedules and when ranks ask it."),
    Section("device", Device, "ocs", "Which driver moves the circuits, and how a lab switch is "
            "reached. Credentials are never stored: `password_env` names a variable and "
            "`credentials_file` a file read when the driver is made; none of these keys goes "
            "into a run's manifest."),
    Section("network", Network, "network", "The modelled electrical fabric and its emulation."),
    Section("run", Run, "run", "How long the run is and how its ranks are hosted."),
    Section("artifact_protocol", ArtifactProtocol, "artifact_protocol",
            "The public Opus artifact's protocol, spoken by the ranks."),
    Section("sim", Sim, "sim", "The sim backend."),
    Section("controller", Controller, "controller", "The control plane on the rails."),
)
