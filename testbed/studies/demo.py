"""``opus-testbed demo``: the demo's runs and the public artifact's runs beside them.

Six emulated runs of ``examples/demo.yaml`` at one switching delay (:data:`DEMO_RUNS`: the
electrical baseline, a one-to-one OCS on demand, with provisioning and degree-aware with K=2,
and the artifact's rail-state model on demand and with provisioning), then the artifact's own
experiment under rail-state on the sim backend (:data:`ARTIFACT_RUNS`). Each run is judged
against its baseline (:func:`testbed.results.baseline.against_baseline`), on disk too; the
command line prints the table.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from testbed.backends import EMU, SIM
from testbed.errors import Say
from testbed.experiment.config import ExperimentConfig, load_experiment
from testbed.results import store
from testbed.results.baseline import against_baseline
from testbed.studies.run import check_one, run_one, shared_dilation

DEMO_CONFIG = Path(__file__).resolve().parents[2] / "examples" / "demo.yaml"
#: The artifact's experiment, run under rail-state (sim backend) for the demo's last line.
ARTIFACT_CONFIG = DEMO_CONFIG.parent / "llama3-8b-artifact.yaml"
#: The demo's runs: (label, mode, semantics); the first is the baseline of the others.
DEMO_RUNS = (("baseline", "baseline", "port-exact"), ("on-demand", "on-demand", "port-exact"),
             ("provisioning", "provisioning", "port-exact"),
             ("degree-aware K=2", "degree-aware", "port-exact"),
             ("rail-state on-demand", "on-demand", "rail-state"),
             ("rail-state provisioning", "provisioning", "rail-state"))
BASELINE = DEMO_RUNS[0][0]
ARTIFACT_RUNS = (DEMO_RUNS[0], DEMO_RUNS[4], DEMO_RUNS[5])
#: The runs compared with the artifact's: those under its rail-state model.
RAIL_STATE_LABELS = tuple(label for label, _, semantics in DEMO_RUNS
                          if semantics == "rail-state")


@dataclass(frozen=True)
class DemoResult:
    """The demo's summaries and the artifact's (label -> summary, each with its overhead
    against its baseline), the experiment as run and its switching delay."""

    config: ExperimentConfig
    delay_ms: float
    summaries: dict[str, dict[str, Any]]
    artifact: dict[str, dict[str, Any]]


def run_dir(out: Path, label: str) -> Path:
    """Where the demo's run ``label`` writes."""
    return out / label.replace(" ", "-").replace("=", "")


def run_demo(out: Path, say: Say, delay: float | str | None = None,
             time_dilation: float | str | None = None) -> DemoResult:
    """Every run of :data:`DEMO_RUNS` on the emulator, then :data:`ARTIFACT_RUNS` on the
    simulator at the same delay; ``delay`` (ms or a Table 3 technology) overrides the demo's,
    ``time_dilation`` the demo's factor (``auto``: the one picked for the on-demand run, which
    switches most, shared by every row so that each is set against a baseline run alike)."""
    cfg = load_experiment(DEMO_CONFIG)
    if delay is not None:
        cfg = cfg.replace(switching_delay=delay)
    if time_dilation is not None:
        cfg = cfg.replace(time_dilation=time_dilation)
    cfg = cfg.replace(wire_check=True)  # the showcase is judged by the wire too (docs/wire.md)
    cfg = shared_dilation(cfg.replace(mode="on-demand"), EMU, say).replace(mode=cfg.mode)
    delay_ms = cfg.replace(mode="on-demand").switching_delay_ms
    artifact_cfg = load_experiment(ARTIFACT_CONFIG).replace(switching_delay=delay_ms)
    for _label, mode, semantics in DEMO_RUNS:  # every check before the first run starts
        check_one(cfg.replace(mode=mode, semantics=semantics), EMU)
    for _label, mode, semantics in ARTIFACT_RUNS:
        check_one(artifact_cfg.replace(mode=mode, semantics=semantics), SIM)
    summaries = {label: run_one(cfg.replace(mode=mode, semantics=semantics),
                                run_dir(out, label), EMU, say)
                 for label, mode, semantics in DEMO_RUNS}
    against_baseline(summaries, BASELINE)
    for label, s in summaries.items():  # judged against the baseline on disk too, as printed
        if label != BASELINE:
            store.write_json(run_dir(out, label) / "summary.json", s)
    artifact = {label: run_one(artifact_cfg.replace(mode=mode, semantics=semantics),
                               out / "artifact-sim" / label.replace(" ", "-"), SIM, say)
                for label, mode, semantics in ARTIFACT_RUNS}
    against_baseline(artifact, BASELINE)
    return DemoResult(cfg, delay_ms, summaries, artifact)
