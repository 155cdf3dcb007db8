"""``opus-testbed run --backend sim``: a prepared run on the event engine, no Mininet, no root.

:func:`run_simulated` writes the same results directory as an emulated run
(:func:`testbed.results.summary.finish_run`), with times in seconds of the virtual clock.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from controller.job import JobError, rail_job_ports
from testbed.errors import RunError, Say, require_empty_dir, say_stderr
from testbed.experiment.backends import SIM
from testbed.experiment.config import ExperimentConfig
from testbed.experiment.prepare import Prepared, prepare
from testbed.plan.rankplan import PlanRecord
from testbed.results import store
from testbed.results.summary import Observed, finish_run
from testbed.simulator.engine import PlanSimulation, Record, SimulationError
from testbed.simulator.network import COST_MODEL_TEXT, NetworkModel, costs_of, network_model


def prepare_sim(cfg: ExperimentConfig, costs: str | None = None, **options: Any) -> Prepared:
    """``cfg`` prepared for the sim backend under cost model ``costs`` (default: the file's
    ``sim.costs``); ``options`` go to :func:`prepare` (no capacity check: a virtual clock)."""
    return prepare(cfg, check_capacity=False, costs=costs or cfg.sim_costs, **options)


def sim_network(prep: Prepared) -> NetworkModel:
    """The network of ``prep`` under the cost model it was prepared for (``prep.costs``): the
    fabric's costs at the modelled rail, or the emulator's at its scaled link."""
    return network_model(prep.link_mbps, prep.config.latency_us, costs_of(prep.costs))


def link_text(prep: Prepared) -> str:
    """The links a simulation runs on, for its header: the modelled rail and the real bytes
    under ``fabric``, the emulator's scaled link under ``emulator``."""
    if prep.scale == 1.0:
        return f"rails {prep.config.rail_gbps:g} Gbit/s per port, real bytes"
    return (f"links {prep.link_mbps:g} Mbit/s (the emulator's; bytes x {prep.scale:.3g} of "
            f"{prep.config.rail_gbps:g} Gbit/s)")


def build_simulation(prep: Prepared, *, seed: int = 0, network: NetworkModel | None = None
                     ) -> PlanSimulation:
    """A :class:`PlanSimulation` of a prepared run (:func:`testbed.experiment.prepare.prepare`)."""
    cfg = prep.config
    cluster = cfg.workload.cluster
    ports = rail_job_ports(range(prep.schedule.world_size), cluster.gpus_per_server,
                           cfg.effective_ports_per_rank)
    job = prep.plan.job("train", ports)
    net = network or sim_network(prep)
    if cfg.rival_plane:  # issue 40: static or rotor (testbed.simulator.planes)
        from testbed.simulator.planes import PlaneSimulation

        if cfg.faults or cfg.shape.spares:
            raise SimulationError(f"controller.plane {cfg.control_plane} runs without faults "
                                  "or spares")
        return PlaneSimulation(prep.plan.programs, job, cfg, network=net,
                               gpus_per_server=cluster.gpus_per_server, seed=seed or cfg.seed)
    spares = cfg.shape.spares
    if cfg.faults or spares:
        from testbed.simulator.failover import FailoverSimulation

        return FailoverSimulation(prep.plan.programs, job, cfg, network=net,
                                  gpus_per_server=cluster.gpus_per_server, seed=seed or cfg.seed)
    return PlanSimulation(prep.plan.programs, job, cfg, network=net,
                          gpus_per_server=cluster.gpus_per_server, seed=seed or cfg.seed)


def simulate_plan(prep: Prepared, *, seed: int = 0, network: NetworkModel | None = None
                  ) -> tuple[list[Record], list[dict[str, Any]]]:
    """(rank records, controller events) of ``prep`` run on the virtual clock.

    ``network`` defaults to :func:`sim_network` (the cost model ``prep`` was prepared for:
    the emulator's for :func:`prepare`'s default, the fabric's for :func:`prepare_sim`'s);
    ``seed`` (default: the config's ``run.seed``) seeds the simulated OCS.
    """
    return build_simulation(prep, seed=seed, network=network).run()


def run_simulated(prep: Prepared, out: Path, say: Say = say_stderr, *, seed: int = 0,
                  network: NetworkModel | None = None) -> dict[str, Any]:
    """Run ``prep`` on the sim backend; writes the results directory as ``run_emulated`` does."""
    cfg, plan = prep.config, prep.plan
    require_empty_dir(out)
    cluster = cfg.workload.cluster
    world = prep.schedule.world_size
    rails = cluster.gpus_per_server
    net = network or sim_network(prep)
    out.mkdir(parents=True, exist_ok=True)
    (out / "ranks").mkdir(exist_ok=True)
    (out / "experiment.yaml").write_text(cfg.text)
    manifest = store.start_manifest(
        out, SIM, cfg.to_json(), link_mbps=prep.link_mbps, scale=prep.scale,
        world_size=world, rails=rails, modeled_iteration_s=prep.modeled_iteration_s,
        network_model=asdict(net), costs=prep.costs, seed=seed or cfg.seed)
    paths = f", {cfg.relay_paths} relay paths" if cfg.control_plane == "static" else ""
    plane = f"plane {cfg.control_plane} (no Opus{paths}), " if cfg.rival_plane else ""
    say(f"run {cfg.name} (sim): {plane}mode {cfg.mode}, switching delay "
        f"{cfg.switching_delay_ms:g} ms, "
        f"{world} ranks on {rails} rails, K={cfg.effective_ports_per_rank}, "
        f"{cfg.effective_semantics}, {link_text(prep)}, costs {prep.costs} "
        f"({COST_MODEL_TEXT[prep.costs]}), {cfg.warmup}+{cfg.iterations} iterations; "
        f"results in {out}")
    t0 = time.monotonic()
    try:
        sim = build_simulation(prep, seed=seed, network=net)
        records, events = sim.run()
    except (SimulationError, JobError) as exc:  # a job the Opus core refused mid-run too
        manifest.update(status="failed", error=str(exc))
        store.write_json(out / "manifest.json", manifest)
        raise RunError(f"{cfg.source}: {exc}") from exc
    wall_s = time.monotonic() - t0
    say(f"  simulated {sim.now:.3f} s of virtual time in {wall_s:.1f} s "
        f"({sim.counters['events']} events)")
    with (out / "controller-events.jsonl").open("w", encoding="utf-8") as fh:
        for e in events:
            fh.write(json.dumps(e, separators=(",", ":")) + "\n")
    by_rank: dict[int, list[str]] = {r: [] for r in plan.programs}
    for rec in records:
        by_rank[int(rec["rank"])].append(json.dumps(rec, separators=(",", ":")))
    for r, lines in by_rank.items():
        (out / "ranks" / f"rank{r}.jsonl").write_text("".join(x + "\n" for x in lines))
        (out / "ranks" / f"rank{r}.plan.json").write_text(json.dumps(PlanRecord(
            r, cfg.total_iterations, tuple(plan.programs[r])).to_json()))
    cpu: dict[str, Any] = {"samples": 0, "note": "simulated: no emulator processes"}
    summary = finish_run(out, prep, Observed(records, events, cpu, wall_s), manifest,
                             num_rails=rails,
                             ranks_rail0=[r for r in range(world) if r % rails == 0],
                             backend=SIM, costs=prep.costs)
    plane_summary = getattr(sim, "plane_summary", None)
    if plane_summary is not None:  # issue 40: a rival plane's figures beside the summary
        stats = plane_summary()
        summary.update(plane=cfg.control_plane, plane_stats=stats)
        store.write_json(out / "summary.json", summary)
        say(f"plane {cfg.control_plane}: {stats['relayed_share']:.1%} of the bytes relayed"
            + (f", slot {stats['slot_ms']:g} ms, {stats['wait_s']:.3f} s of transfer waits "
               "for a circuit" if "slot_ms" in stats else ""))
    return summary
