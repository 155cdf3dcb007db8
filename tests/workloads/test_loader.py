"""YAML loading: validation with field names and file positions."""

from __future__ import annotations

from pathlib import Path

import pytest

from workloads import WorkloadConfigError, load_experiment_workload, parse_workload

ROOT = Path(__file__).resolve().parents[2]

GOOD = """\
name: demo
cluster:
  servers: 4
  gpus_per_server: 4
workload:
  model: llama3-8b
  seq_len: 8192
  num_microbatches: 8
  parallelism:
    tp: 4
    fsdp: 2
    pp: 2
"""


def _error(text: str) -> WorkloadConfigError:
    with pytest.raises(WorkloadConfigError) as info:
        parse_workload(text, "exp.yaml")
    return info.value


def test_good_file_parses() -> None:
    cfg = parse_workload(GOOD, "exp.yaml")
    assert cfg.parallel.tp == 4 and cfg.cluster.world_size == 16
    assert cfg.model.name == "llama3-8b" and cfg.num_microbatches == 8


def test_example_files_load() -> None:
    cfg = load_experiment_workload(ROOT / "examples" / "llama3-8b-workload.yaml")
    assert (cfg.parallel.tp, cfg.parallel.fsdp, cfg.parallel.pp) == (4, 2, 2)
    moe = load_experiment_workload(ROOT / "examples" / "models" / "tiny-moe-workload.yaml")
    assert moe.model.name == "tiny-moe" and moe.model.n_experts == 6


def test_other_parts_top_level_keys_are_accepted() -> None:
    text = GOOD + "ocs: {technology: piezo}\nmode: provisioning\nrun: {}\nnetwork: {}\n"
    assert parse_workload(text).parallel.pp == 2


def test_unknown_top_level_key_names_key_and_position() -> None:
    err = _error(GOOD + "wokload_extra: 1\n")
    assert err.field == "wokload_extra" and err.position == "exp.yaml:13:1"
    assert "exp.yaml:13:1: wokload_extra: unknown key" in str(err)


def test_unknown_parallelism_key() -> None:
    err = _error(GOOD.replace("    pp: 2\n", "    pp: 2\n    ppp: 3\n"))
    assert err.field == "workload.parallelism.ppp" and err.position == "exp.yaml:13:5"


def test_degrees_not_dividing_the_world_size() -> None:
    err = _error(GOOD.replace("pp: 2", "pp: 3"))
    assert err.field == "workload.parallelism.pp" and err.position == "exp.yaml:12:9"
    assert "world size" in str(err)


def test_tp_larger_than_a_server() -> None:
    err = _error(GOOD.replace("tp: 4", "tp: 8").replace("fsdp: 2", "fsdp: 1"))
    assert err.field == "workload.parallelism.tp" and err.position == "exp.yaml:10:9"
    assert "larger than a server" in str(err)


def test_ep_on_a_dense_model() -> None:
    err = _error(GOOD.replace("    pp: 2\n", "    pp: 2\n    ep: 2\n"))
    assert err.field == "workload.parallelism.ep" and "no experts" in str(err)
    assert err.position == "exp.yaml:13:9"


def test_wrong_type_and_duplicate_key() -> None:
    err = _error(GOOD.replace("tp: 4", "tp: four"))
    assert err.field == "workload.parallelism.tp" and "integer" in str(err)
    err = _error(GOOD.replace("  seq_len: 8192\n", "  seq_len: 8192\n  seq_len: 4096\n"))
    assert err.field == "workload.seq_len" and "duplicate" in str(err)


def test_unknown_preset_and_custom_model_errors() -> None:
    err = _error(GOOD.replace("model: llama3-8b", "model: llama9"))
    assert err.field == "workload.model" and err.position == "exp.yaml:6:10"
    custom = GOOD.replace("model: llama3-8b", "model: {base: llama3-8b, n_layers: 16, fnn: 1}")
    err = _error(custom)
    assert err.field == "workload.model.fnn"


def test_custom_model_overrides_a_preset() -> None:
    cfg = parse_workload(GOOD.replace("model: llama3-8b",
                                      "model: {base: llama3-8b, name: half, n_layers: 16}"))
    assert cfg.model.n_layers == 16 and cfg.model.hidden_size == 4096


def test_missing_cluster_and_bad_yaml() -> None:
    assert _error("workload: {model: llama3-8b}\n").field == "cluster"
    err = _error("cluster: [1, 2\n")
    assert err.position.startswith("exp.yaml:") and "invalid YAML" in str(err)


def test_error_is_a_value_error() -> None:
    assert issubclass(WorkloadConfigError, ValueError)
