"""Cross-validation: the sim backend's iteration time agrees with the emulated run's (root)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from testbed.experiment.crossval import run_crossval

FidelityGate = Callable[..., None]

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


def test_sim_agrees_with_emulation(tmp_path: Path, no_leftovers: list[str],
                                   fidelity_gate: FidelityGate) -> None:
    config = tmp_path / "crossval.yaml"
    config.write_text(TINY)
    result = run_crossval(config, work_dir=tmp_path / "runs", say=lambda _m: None)
    if result["emu_prefix"]:
        no_leftovers.append(result["emu_prefix"])
    assert result["emu_iteration_s"] and result["sim_iteration_s"]
    ratio_ok = 0.75 <= result["ratio"] <= 1.33
    if not ratio_ok:
        # a miss on a machine that did not keep up compares nothing (skip); a miss by a run
        # that lost bytes or was slow on a quiet machine fails here
        fidelity_gate(result["emu_fidelity"], result["emu_fidelity_blame"],
                      result["emu_fidelity_reasons"])
    # (a miss with only the OCS's dark periods over the guard's tolerance fails: dark periods
    # within the tests' bound cannot explain it)
    assert ratio_ok, (
        f"ratio {result['ratio']:.3f}: emulated {result['emu_iteration_times_s']}, "
        f"simulated {result['sim_iteration_s']:.3f} s (mean of {result['sim_seeds']} seeds)")
    # an agreement still fails if the run itself was at fault (lost bytes, slow on a quiet
    # machine, dark periods beyond the tests' bound); a busy machine's run that agreed is judged
    # on its agreement
    if result["emu_fidelity_blame"] == "run":
        fidelity_gate(result["emu_fidelity"], "run", result["emu_fidelity_reasons"],
                      dark_error_ms=result["emu_dark_error_ms"], delay_ms=DELAY_MS)
    assert result["emu_reconfigurations"] > 0  # the warm-up switches at least
    assert result["sim_reconfigurations_per_iteration"] > 0
    assert (tmp_path / "runs" / "sim" / "summary.json").exists()
