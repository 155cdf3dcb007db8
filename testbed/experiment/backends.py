"""What each backend supports, and why it refuses the rest: pure data, below every runner.

A backend is where a run executes: ``emu`` (Mininet hosts and Open vSwitch rails, wall clock),
``sim`` (the event engine, virtual clock) and ``torch`` (a PyTorch script's ranks on the
emulated rails; chosen by the experiment file's ``workload.torch``/``workload.torchtitan``, never
by ``--backend``). Each :class:`BackendSpec` lists the :data:`FEATURES` it refuses with the
reason, so that a refusal reads the same wherever it is raised: at dispatch
(:mod:`testbed.backends`, which adds how to prepare and run on each) or inside a runner
(:mod:`testbed.emulated.runner`, :mod:`testbed.torchjob.runner`), which import this module and
not the registry above them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from testbed.errors import RunRefused

EMU, SIM, TORCH = "emu", "sim", "torch"

# features a backend may refuse (the key of BackendSpec.refuses)
ARTIFACT_PROTOCOL = "artifact_protocol"  # ranks that speak the artifact's protocol
TORCH_SCRIPT = "torch_script"  # a PyTorch script's workload
TIME_DILATION = "time_dilation"  # a set dilation factor other than 1
#: the phase barrier under provisioning (ocs.rail_state_phase_barrier with mode provisioning)
PHASE_BARRIER_PROVISIONING = "rail_state_phase_barrier_provisioning"
PARALLEL_POINTS = "parallel_points"  # sweep points run side by side (sweep --engine ray/dask)
RIVAL_PLANE = "rival_plane"  # controller.plane static or rotor (issue 40)
ROTOR_PLANE = "rotor_plane"  # controller.plane rotor (issue 40)
#: controller.relay_paths dynamic under controller.plane static (issue 40)
DYNAMIC_RELAY_PATHS = "dynamic_relay_paths"
FEATURES = (ARTIFACT_PROTOCOL, TORCH_SCRIPT, TIME_DILATION, PHASE_BARRIER_PROVISIONING,
            PARALLEL_POINTS, RIVAL_PLANE, ROTOR_PLANE, DYNAMIC_RELAY_PATHS)
_RIVAL_SIM_ONLY = ("controller.plane static and rotor run on the sim backend only (issue 40: "
                   "their relays through GPUs are not built on the {what}); use --backend sim")


class UnknownBackend(RunRefused):
    """A backend name that no entry has; the message lists the known ones."""


@dataclass(frozen=True)
class BackendSpec:
    """One backend: ``selectable`` by ``--backend`` (else the experiment file picks it),
    ``clock`` ``wall`` or ``virtual``, ``needs_root`` (it builds namespaces and bridges),
    ``dilates`` (it stretches wall time by a time-dilation factor, which ``auto`` picks),
    ``judged`` (its runs get a fidelity verdict: a virtual clock has no CPU limit to check),
    and the features it ``refuses``, each with the reason (and what to do instead)."""

    name: str
    summary: str
    selectable: bool
    clock: str
    needs_root: bool
    dilates: bool
    judged: bool
    refuses: dict[str, str] = field(default_factory=dict)

    def supports(self, feature: str) -> bool:
        """Whether the backend runs ``feature`` (one of :data:`FEATURES`)."""
        if feature not in FEATURES:
            raise ValueError(f"unknown backend feature {feature!r}; one of "
                             f"{', '.join(FEATURES)}")
        return feature not in self.refuses

    def refusal(self, feature: str) -> str | None:
        """Why the backend refuses ``feature``; None when it runs it."""
        return None if self.supports(feature) else self.refuses[feature]

    def require(self, feature: str, source: str) -> None:
        """:class:`RunRefused` naming ``source`` (the experiment file) and the reason when the
        backend refuses ``feature``; nothing otherwise."""
        reason = self.refusal(feature)
        if reason is not None:
            raise RunRefused(f"{source}: {reason}")


_ARTIFACT_RANKS = ("artifact_protocol makes the replayed ranks of an emulated run speak the "
                   "artifact's protocol; the {what} has no such ranks (remove artifact_protocol)")

SPECS: dict[str, BackendSpec] = {s.name: s for s in (
    BackendSpec(
        EMU, "the emulator: Mininet hosts replay the ranks over TCP through Open vSwitch "
        "rails, on the wall clock", selectable=True, clock="wall", needs_root=True,
        dilates=True, judged=True, refuses={
            PHASE_BARRIER_PROVISIONING: "ocs.rail_state_phase_barrier with provisioning is "
            "modelled on the sim backend only: the emulated ranks' lanes issue calls that "
            "become ready together in no set order, so a phase's last call may start before an "
            "earlier call of the plan, hold it at the barrier, and wait for the answer to a "
            "prediction that needs it (a deadlock the simulator's ordered start avoids); use "
            "--backend sim, mode on-demand, or set it to false",
            PARALLEL_POINTS: "emulated points run one at a time on this machine; --engine is "
            "for the sim backend",
            ROTOR_PLANE: "controller.plane rotor runs on the sim backend only (issue 40: the "
            "emulated rotor, slots cycled on the OCS bridges on the model-time clock with "
            "transfers paused across dark slots, is not built); use --backend sim",
            DYNAMIC_RELAY_PATHS: "controller.relay_paths dynamic runs on the sim backend only: "
            "it picks a transfer's path when it starts from every flow in flight, which no "
            "rank process knows (the emulated ranks forward along the fixed path table both "
            "backends share); use relay_paths fixed, or --backend sim"}),
    BackendSpec(
        SIM, "the simulator: the same plan and Opus core on a virtual clock, under a cost "
        "model (sim.costs)", selectable=True, clock="virtual", needs_root=False,
        dilates=False, judged=False, refuses={
            ARTIFACT_PROTOCOL: _ARTIFACT_RANKS.format(what="sim backend"),
            TORCH_SCRIPT: "a PyTorch script runs on the emulated rails only; its run writes "
            "replay.yaml (the captured schedule), which `run --backend sim` replays"}),
    BackendSpec(
        TORCH, "a PyTorch script's ranks on the emulated rails (chosen by the file's "
        "workload.torch or workload.torchtitan, with --backend emu)", selectable=False,
        clock="wall", needs_root=True, dilates=False, judged=True, refuses={
            ARTIFACT_PROTOCOL: _ARTIFACT_RANKS.format(what="PyTorch job"),
            TIME_DILATION: "a PyTorch job's compute runs on the CPU at its own speed and "
            "cannot be stretched by the factor, so its figures would mix model and wall time; "
            "use time_dilation: 1 (or auto) for a torch job, or replay its capture "
            "(replay.yaml) dilated",
            PARALLEL_POINTS: "a PyTorch job runs on the emulated rails, one run at a time",
            RIVAL_PLANE: _RIVAL_SIM_ONLY.format(what="emulated rails a PyTorch job runs on"),
            ROTOR_PLANE: _RIVAL_SIM_ONLY.format(what="emulated rails a PyTorch job runs on"),
            DYNAMIC_RELAY_PATHS: _RIVAL_SIM_ONLY.format(
                what="emulated rails a PyTorch job runs on")}),
)}


def emulated_static_refusal(ports_per_rank: int, spares: bool, faults: bool) -> str | None:
    """Why the emulator cannot run the static plane on rails of ``ports_per_rank`` ports per
    rank, with ``spares`` or ``faults`` (None: it can): limits of the emulated plane's routing
    and relays, not a feature of the registry (the sim has none of them). Checked by
    :func:`testbed.emulated.staticrun.static_emulated` and, before any point runs, by an
    emulated sweep."""
    if ports_per_rank != 1:
        return ("the emulated static plane runs with one port per rank (ocs.ports_per_rank 1, "
                f"got {ports_per_rank}): with more, two circuits may join the same two GPUs and "
                "a route per peer cannot pick one; use --backend sim")
    if spares or faults:
        return "the emulated static plane runs without spares or faults"
    return None


#: every backend's name
BACKEND_NAMES = tuple(SPECS)
#: the values of ``--backend``
SELECTABLE = tuple(name for name, s in SPECS.items() if s.selectable)


def backend_spec(name: str) -> BackendSpec:
    """The backend ``name``; :class:`UnknownBackend` lists the known ones."""
    spec = SPECS.get(name)
    if spec is None:
        raise UnknownBackend(f"unknown backend {name!r}; choose from "
                             f"{', '.join(BACKEND_NAMES)}")
    return spec
