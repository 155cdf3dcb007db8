"""The backend registry (:mod:`testbed.backends`, :mod:`testbed.experiment.backends`): each
entry, what it refuses and why, and the dispatch sites that go through it."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.backends import REGISTRY, get_backend, resolve
from testbed.errors import RunRefused
from testbed.experiment.backends import (
    ARTIFACT_PROTOCOL,
    BACKEND_NAMES,
    DYNAMIC_RELAY_PATHS,
    EMU,
    FEATURES,
    PARALLEL_POINTS,
    PHASE_BARRIER_PROVISIONING,
    RIVAL_PLANE,
    ROTOR_PLANE,
    SELECTABLE,
    SIM,
    SPECS,
    TIME_DILATION,
    TORCH,
    TORCH_SCRIPT,
    UnknownBackend,
    backend_spec,
    emulated_static_refusal,
)
from testbed.experiment.config import parse_experiment
from testbed.studies.run import check_one, shared_dilation
from testbed.torchjob.config import load_torch_experiment

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
TINY = (EXAMPLES / "tiny.yaml").read_text()


def test_the_entries() -> None:
    assert BACKEND_NAMES == (EMU, SIM, TORCH) == tuple(REGISTRY)
    assert SELECTABLE == (EMU, SIM)  # torch is the experiment file's choice, not --backend's
    for name, backend in REGISTRY.items():
        assert backend.name == name and backend.spec is SPECS[name]
        assert set(backend.spec.refuses) <= set(FEATURES)
        assert all(reason.strip() for reason in backend.spec.refuses.values())
    emu, sim, torch = (SPECS[n] for n in (EMU, SIM, TORCH))
    assert (emu.clock, sim.clock, torch.clock) == ("wall", "virtual", "wall")
    assert emu.needs_root and torch.needs_root and not sim.needs_root
    assert emu.dilates and not sim.dilates and not torch.dilates
    assert emu.judged and torch.judged and not sim.judged


@pytest.mark.parametrize(("name", "feature", "supported"), [
    (EMU, ARTIFACT_PROTOCOL, True), (SIM, ARTIFACT_PROTOCOL, False),
    (TORCH, ARTIFACT_PROTOCOL, False),
    (EMU, TORCH_SCRIPT, True), (SIM, TORCH_SCRIPT, False),
    (EMU, PHASE_BARRIER_PROVISIONING, False), (SIM, PHASE_BARRIER_PROVISIONING, True),
    (EMU, TIME_DILATION, True), (TORCH, TIME_DILATION, False),
    (EMU, PARALLEL_POINTS, False), (SIM, PARALLEL_POINTS, True),
    (EMU, RIVAL_PLANE, True), (SIM, RIVAL_PLANE, True), (TORCH, RIVAL_PLANE, False),
    (EMU, ROTOR_PLANE, False), (SIM, ROTOR_PLANE, True), (TORCH, ROTOR_PLANE, False),
    (EMU, DYNAMIC_RELAY_PATHS, False), (SIM, DYNAMIC_RELAY_PATHS, True),
    (TORCH, DYNAMIC_RELAY_PATHS, False),
])
def test_what_each_backend_supports(name: str, feature: str, supported: bool) -> None:
    spec = backend_spec(name)
    assert spec.supports(feature) is supported
    assert (spec.refusal(feature) is None) is supported


def test_every_feature_is_refused_by_some_backend() -> None:
    """A feature every backend runs is no feature of the registry (its constant is dead)."""
    refused = {f for spec in SPECS.values() for f in spec.refuses}
    assert refused == set(FEATURES)


def test_an_unknown_backend_lists_the_known_ones() -> None:
    with pytest.raises(UnknownBackend, match="unknown backend 'gpu'; choose from emu, sim, "
                       "torch"):
        get_backend("gpu")
    assert issubclass(UnknownBackend, RunRefused)  # the command line's exit 2: bad input
    with pytest.raises(ValueError, match="unknown backend feature 'warp'"):
        SPECS[EMU].supports("warp")


def test_a_refusal_names_the_file_and_the_reason() -> None:
    with pytest.raises(RunRefused, match=r"^exp\.yaml: emulated points run one at a time"):
        SPECS[EMU].require(PARALLEL_POINTS, "exp.yaml")
    SPECS[SIM].require(PARALLEL_POINTS, "exp.yaml")  # supported: nothing happens


def test_resolve_refuses_what_the_file_asks_for_and_the_backend_cannot_run() -> None:
    cfg = parse_experiment(TINY + "artifact_protocol:\n  port: 0\n")
    assert resolve(cfg, EMU).name == EMU
    with pytest.raises(RunRefused, match=r"artifact_protocol.*the sim backend has no such ranks"):
        resolve(cfg, SIM)
    with pytest.raises(RunRefused, match="chosen by the experiment file"):
        resolve(parse_experiment(TINY), TORCH)
    with pytest.raises(UnknownBackend, match="choose from emu, sim, torch"):
        check_one(parse_experiment(TINY), "gpu")


def test_dynamic_relay_paths_run_on_the_sim_only() -> None:
    static = TINY + "controller:\n  plane: static\n  relay_paths: dynamic\n"
    cfg = parse_experiment(static)
    assert resolve(cfg, SIM).name == SIM
    with pytest.raises(RunRefused, match=r"relay_paths dynamic runs on the sim backend only: "
                       r"it picks a transfer's path when it starts from every flow in flight"):
        resolve(cfg, EMU)
    assert resolve(cfg.replace(relay_paths="fixed"), EMU).name == EMU
    # the setting acts on the static plane only: Opus, and the electrical baseline, run
    assert resolve(cfg.replace(control_plane="opus"), EMU).name == EMU
    assert resolve(cfg.replace(mode="baseline"), EMU).name == EMU


def test_the_emulated_static_plane_s_own_limits() -> None:
    assert emulated_static_refusal(1, spares=False, faults=False) is None
    assert "one port per rank (ocs.ports_per_rank 1, got 2)" in str(
        emulated_static_refusal(2, spares=False, faults=False))
    assert "without spares or faults" in str(emulated_static_refusal(1, True, False))
    assert "without spares or faults" in str(emulated_static_refusal(1, False, True))


def test_a_pytorch_script_goes_to_the_torch_backend() -> None:
    exp = load_torch_experiment(EXAMPLES / "torch" / "llama-tiny-4x1.yaml")
    assert resolve(exp, EMU).name == TORCH
    assert check_one(exp, EMU) is None  # its runner checks it
    with pytest.raises(RunRefused, match="runs on the emulated rails only"):
        resolve(exp, SIM)


def test_the_sim_backend_prepares_without_a_capacity_check() -> None:
    prep = check_one(parse_experiment(TINY), SIM)
    assert prep is not None and prep.plan.programs


def test_only_a_dilating_backend_resolves_auto_dilation() -> None:
    cfg = parse_experiment(TINY)
    assert shared_dilation(cfg, SIM, lambda _m: None) is cfg


def test_the_sweep_refuses_through_the_registry(tmp_path: Path) -> None:
    from testbed.studies.sweep import SweepError, run_sweep

    cfg = parse_experiment(TINY)
    with pytest.raises(SweepError, match="unknown backend 'gpu'; choose from emu, sim"):
        run_sweep(cfg, [1.0], ["on-demand"], tmp_path / "s", "gpu", 1)
    with pytest.raises(SweepError, match="one at a time on this machine"):
        run_sweep(cfg, [1.0], ["on-demand"], tmp_path / "s", EMU, 1, engine="ray")
    assert not (tmp_path / "s").exists()


def test_the_collective_bench_maps_its_backends_onto_the_registry(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from testbed.studies import collective_bench as cb

    assert {backend for backend, _costs in cb.VARIANTS.values()} <= set(BACKEND_NAMES)
    monkeypatch.setattr(cb.os, "geteuid", lambda: 1000)
    assert cb.default_backends() == ("sim-ideal", "sim-emulator")
    with pytest.raises(RunRefused, match=r"the emu backend runs the emulator: it needs root"):
        cb._Runner(["emu"], None, lambda _m: None)
