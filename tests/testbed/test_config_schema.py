"""The config schema (testbed.experiment.schema, .sections): errors at the key's position, the
same rules for files and for settings made in code, and the reference page generated from it."""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from testbed.experiment import reference
from testbed.experiment.config import SPECS, ExperimentError, RunSettings, parse_experiment
from testbed.experiment.schema import Section, all_specs, option
from testbed.experiment.sections import SCHEMA, Scheduling
from workloads.errors import WorkloadConfigError
from workloads.loader import TOP_LEVEL_KEYS

#: a small job, three lines (the positions below count from here)
BASE = """\
cluster: {servers: 4, gpus_per_server: 1}
workload: {model: llama3-8b, seq_len: 1024,
           parallelism: {fsdp: 2, pp: 2}}
"""


def _error(extra: str) -> WorkloadConfigError:
    with pytest.raises(WorkloadConfigError) as info:
        parse_experiment(BASE + extra, "exp.yaml")
    return info.value


def test_a_value_of_another_type_is_refused_at_its_position() -> None:
    err = _error("run:\n  warmup: 1\n  iterations: three\n")
    assert str(err) == "exp.yaml:6:15: run.iterations: must be an integer, got 'three'"
    err = _error("ocs: {rail_state_phase_barrier: yes please}\n")
    assert str(err) == ("exp.yaml:4:33: ocs.rail_state_phase_barrier: must be true or false, "
                        "got 'yes please'")
    err = _error("network: {rail_gbps: true}\n")  # a bool is no number
    assert (err.field, err.position) == ("network.rail_gbps", "exp.yaml:4:22")


def test_an_unknown_key_is_refused_at_the_key_with_the_allowed_ones() -> None:
    """``ocs:`` is read by four sections of the schema: the allowed keys are all of theirs."""
    err = _error("ocs:\n  switching_delay: 10\n  sematics: rail-state\n")
    assert err.position == "exp.yaml:6:3" and err.field == "ocs.sematics"
    assert err.reason.startswith("unknown key 'sematics'; allowed: switching_delay, "
                                 "ports_per_rank, semantics, request_points, ")
    ocs_keys = [s.key for s in SPECS if s.section.yaml == "ocs"]
    assert err.reason.endswith(", ".join(ocs_keys))
    assert {"driver", "host", "credentials_file", "rail_state_inflight"} <= set(ocs_keys)


def test_a_refused_value_names_what_is_accepted() -> None:
    err = _error("sim: {costs: cheap}\n")
    assert str(err) == "exp.yaml:4:14: sim.costs: must be one of fabric, emulator, got 'cheap'"
    err = _error("artifact_protocol: {port: 70000}\n")
    assert err.reason == "must be a TCP port (0-65535; 0 picks a free one), got 70000"


def test_words_stand_for_stored_values() -> None:
    assert parse_experiment(BASE + "network: {link_mbps: auto}\n").link_mbps is None
    assert parse_experiment(BASE + "network: {link_mbps: 8}\n").link_mbps == 8.0
    err = _error("network: {link_mbps: fast}\n")
    assert err.reason == "must be a number or null or 'auto', got 'fast'"


def test_settings_made_in_code_follow_the_same_rules() -> None:
    cfg = parse_experiment(BASE, "exp.yaml")
    with pytest.raises(ExperimentError) as info:
        cfg.replace(iterations="3")
    assert str(info.value) == "exp.yaml: run.iterations: must be an integer, got '3'"
    with pytest.raises(ExperimentError, match=r"^exp\.yaml: ocs\.request_points: must be one"):
        cfg.replace(request_points="sometimes")
    assert cfg.replace(switching_delay=10).switching_delay_ms == 10.0


def test_defaults_are_the_schema_defaults_and_valid() -> None:
    cfg = RunSettings()
    cfg.validate()
    for spec in SPECS:
        assert getattr(cfg, spec.name) == spec.default, spec.path


def test_the_control_plane_is_opus_unless_the_file_names_a_rival() -> None:
    cfg = parse_experiment(BASE + "ocs: {switching_delay: 25}\n")
    assert (cfg.control_plane, cfg.rotor_slot_ms, cfg.effective_rotor_slot_ms) == (
        "opus", None, 250.0)
    assert parse_experiment(BASE + "controller: {rotor_slot_ms: 40}\n"
                            ).effective_rotor_slot_ms == 40.0
    err = _error("controller:\n  plane: rotor\n")
    assert str(err) == ("exp.yaml:5:10: controller.plane: the rotor control plane is not built "
                        "yet (issue 40, rival control planes); only opus runs")
    err = _error("controller: {plane: round-robin}\n")
    assert err.reason == "must be one of opus, static, rotor, got 'round-robin'"
    assert _error("controller: {rotor_slot_ms: 0}\n").reason == "must be positive"


def test_a_section_object_carries_the_runs_values_of_its_options() -> None:
    cfg = parse_experiment(BASE + "ocs: {semantics: rail-state, rail_state_inflight: reflip}\n")
    scheduling = cfg.section(Scheduling)
    assert isinstance(scheduling, Scheduling)
    assert (scheduling.semantics, scheduling.rail_state_inflight) == ("rail-state", "reflip")
    assert scheduling.request_points == "auto"


def test_the_lab_switch_keys_stay_out_of_the_manifest() -> None:
    cfg = parse_experiment(BASE + "ocs: {host: 10.0.0.7, username: lab, password_env: PW}\n")
    assert cfg.ocs_options == {"host": "10.0.0.7", "username": "lab", "password_env": "PW"}
    manifest = cfg.to_json()
    assert not {"device_host", "device_username", "host", "username"} & set(manifest)
    assert manifest["semantics"] == "port-exact" and manifest["ack_timeout_s"] == 120.0


def test_every_option_is_documented_and_every_mapping_is_a_top_level_key() -> None:
    for spec in SPECS:
        assert spec.option.help.strip(), spec.path
    assert {s.yaml for s in SCHEMA if s.yaml} <= set(TOP_LEVEL_KEYS)


def test_an_option_declared_twice_is_refused() -> None:
    @dataclass(frozen=True)
    class Twice:
        costs: str = option("a", "again", key="costs")

    with pytest.raises(TypeError, match=r"path 'sim\.costs' declared twice"):
        all_specs((*SCHEMA, Section("again", Twice, "sim", "again")))


def test_the_checked_in_reference_page_is_the_schemas() -> None:
    """``docs/config-reference.md`` is generated: run ``python -m testbed.experiment.reference``
    after changing the schema."""
    assert reference.PAGE.read_text() == reference.page()
    assert reference.main(["--check"]) == 0
