"""Cross-validation of the sim backend against the emulator (root), in two tests:

* :func:`test_sim_predicts_a_held_out_config_within_the_product_bound` is the validation:
  the product's bound (:data:`~testbed.studies.crossval.AGREEMENT_BOUND`, 10 %) on
  ``examples/llama3-8b-artifact-scaled.yaml``, a config made after the simulator's emulator
  costs (:data:`testbed.simulator.network.EMULATOR_COSTS`) were fitted and never used to fit
  them;
* :func:`test_calibration_check_sim_reproduces_the_config_it_was_fitted_on` is a calibration
  check, not a validation: the costs were fitted on ``bench crossval`` runs of its 4-rank
  config (TINY), so agreement there shows only that neither backend has drifted from the runs
  it was tuned on.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from testbed.studies.crossval import AGREEMENT_BOUND, crossval_point, run_crossval

FidelityGate = Callable[..., None]
ROOT = Path(__file__).resolve().parents[2]
#: Not used to fit the emulator costs (it came later): the artifact's run scaled to 4 ranks,
#: rail-state, 100 ms, 10.18 s steps (about 1 min emulated).
HELD_OUT = ROOT / "examples" / "llama3-8b-artifact-scaled.yaml"
HELD_OUT_DELAY_MS = 100.0

# FSDP 2 x PP 2 on four single-GPU servers, one rail, two ports per rank: the FSDP and PP
# circuits of a rank change at every phase, so switching, acks and transfers all count. With
# one port the two lanes of a rank race for it every phase and iteration times take two modes
# 0.5 s apart, which five iterations cannot average; two ports keep them within ~0.2 s.
# Slow links keep the machine idle; a 20 Gbit/s rail makes the reduce-scatters 0.25 s long,
# so transfers weigh more than the control round trips.
TINY = """\
name: crossval-tiny
cluster: {servers: 4, gpus_per_server: 1}
workload:
  model: {name: cv-dense, vocab_size: 32000, hidden_size: 2048, n_layers: 8, n_heads: 16,
          n_kv_heads: 4, ffn_hidden_size: 8192}
  seq_len: 2048
  num_microbatches: 2
  parallelism: {tp: 1, fsdp: 2, pp: 2, fsdp_unit: stage}
mode: on-demand
ocs: {switching_delay: 25, ports_per_rank: 2}
run: {iterations: 5, warmup: 1}
network: {link_mbps: 8, rail_gbps: 20}
"""
DELAY_MS = 25.0  # TINY's switching delay
#: The calibration check's ratio (sim / emu) bound, kept from before the held-out test and
#: looser than the product's 10 %: TINY's iterations (about 1 s) move by up to ~0.2 s with
#: which of a rank's two lanes reaches the controller first, and five iterations do not
#: average that out (one run here: ratio 1.046, iterations 0.89-0.96 s). It makes no claim
#: for the product; the held-out test carries the product's bound.
CALIBRATION_RATIO = (0.75, 1.33)


def _judged(tmp_path: Path, delay_ms: float, gate: FidelityGate) -> None:
    """The gate on the emulated run: what holds under any load."""
    emu = tmp_path / "runs" / "emu"
    gate(json.loads((emu / "summary.json").read_text()), emu, delay_ms=delay_ms)


@pytest.mark.slow
def test_sim_predicts_a_held_out_config_within_the_product_bound(
        tmp_path: Path, no_leftovers: list[str], fidelity_gate: FidelityGate) -> None:
    """The agreement is a timing claim, asserted whatever the verdict: it held beside two busy
    loops too (measured 2026-11-27 in a CI run with both, the emulated run degraded with its CPU
    saturated: agreement 0.7 %; the calibration check's ratio 1.036), and on a quiet machine
    (1.1 %, ratio 1.046)."""
    result = run_crossval(HELD_OUT, work_dir=tmp_path / "runs", say=lambda _m: None)
    if result["emu_prefix"]:
        no_leftovers.append(result["emu_prefix"])
    assert result["switching_delay_ms"] == HELD_OUT_DELAY_MS
    # the simulated side models the emulator, not the fabric (the sim's default), and says so
    assert result["sim_costs"] == "emulator"
    sim = json.loads((tmp_path / "runs" / "sim" / "summary.json").read_text())
    assert sim["costs"] == "emulator"
    _judged(tmp_path, HELD_OUT_DELAY_MS, fidelity_gate)
    point = crossval_point(result["semantics"], HELD_OUT_DELAY_MS, result)
    assert point["agreement_pct"] is not None
    assert result["emu_reconfigurations"] > 0 and result["sim_reconfigurations_per_iteration"] > 0
    assert point["within_bound"], (
        f"|emu - sim| / sim = {point['agreement_pct']:.1f} % > {100 * AGREEMENT_BOUND:g} %: "
        f"emulated {result['emu_iteration_times_s']}, simulated "
        f"{result['sim_iteration_s']:.3f} s (mean of {result['sim_seeds']} seeds)")


def test_calibration_check_sim_reproduces_the_config_it_was_fitted_on(
        tmp_path: Path, no_leftovers: list[str], fidelity_gate: FidelityGate) -> None:
    """A calibration check (see the module docstring), with its own looser bound, asserted
    whatever the verdict, as the held-out test's is."""
    config = tmp_path / "crossval.yaml"
    config.write_text(TINY)
    result = run_crossval(config, work_dir=tmp_path / "runs", say=lambda _m: None)
    if result["emu_prefix"]:
        no_leftovers.append(result["emu_prefix"])
    assert result["emu_iteration_s"] and result["sim_iteration_s"]
    _judged(tmp_path, DELAY_MS, fidelity_gate)
    assert result["emu_reconfigurations"] > 0  # the warm-up switches at least
    assert result["sim_reconfigurations_per_iteration"] > 0
    assert (tmp_path / "runs" / "sim" / "summary.json").exists()
    assert CALIBRATION_RATIO[0] <= result["ratio"] <= CALIBRATION_RATIO[1], (
        f"ratio {result['ratio']:.3f}: emulated {result['emu_iteration_times_s']}, "
        f"simulated {result['sim_iteration_s']:.3f} s (mean of {result['sim_seeds']} seeds)")
