"""``opus-testbed run``: one experiment end to end on the emulated photonic rails.

Order of work: generate the schedule and the replay plan, refuse what this machine cannot host
(before anything starts), build the emulated rails (os-ken OCS app on one OVS bridge per rail,
or electrical rails for the baseline), start the Opus controller on the frontend network with
the emulated OCS driver, register the job, launch one replayer per rank inside its Mininet host,
follow their progress, and on success compute the metrics and write the results directory
(:mod:`testbed.results`). A rank that fails ends the run: the error names the rank and its last
op, and teardown still happens (the network's context manager stops every process we started).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from controller.core import CoreConfig
from controller.events import EventLog
from controller.job import RankPorts
from controller.ocs import OcsDriver
from testbed import results
from testbed.experiment import ExperimentConfig
from testbed.fidelity import (
    CpuSampler,
    calibrated_link_mbps,
    capacity_problem,
    judge,
)
from testbed.metrics import compute_metrics
from testbed.plan import PlanError, ReplayPlan, build_plan
from workloads import generate_schedule
from workloads.schedule import Schedule
from workloads.timing import TimingModel, simulate

REPLAYER_PORT = 7100
POLL_S = 0.5


class RunError(RuntimeError):
    """The run could not be carried out; the message says what and where."""


class RunRefused(RunError):
    """The run was refused before anything started (bad input, too big for this machine)."""


class RankFailed(RunError):
    """A rank process failed; ``rank`` and its last op are in the message."""

    def __init__(self, rank: int, message: str) -> None:
        super().__init__(message)
        self.rank = rank


Say = Callable[[str], None]


def _say_stderr(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


@dataclass
class Prepared:
    """What a run needs before anything starts: schedule, plan, link rate and scale."""

    config: ExperimentConfig
    schedule: Schedule
    plan: ReplayPlan
    link_mbps: float
    scale: float
    modeled_iteration_s: float


def prepare(cfg: ExperimentConfig, *, check_capacity: bool = True) -> Prepared:
    """Schedule and plan the run; raises :class:`RunError` for what this machine can't host."""
    schedule = generate_schedule(cfg.workload)
    world = schedule.world_size
    if check_capacity:
        problem = capacity_problem(world)
        if problem is not None:
            raise RunRefused(f"{cfg.source}: cannot emulate this cluster here: "
                             f"{problem.message}")
    link_mbps = cfg.link_mbps or calibrated_link_mbps(world)
    scale = link_mbps * 1e6 / (cfg.rail_gbps * 1e9)
    if scale > 1:
        raise RunRefused(f"{cfg.source}: network.link_mbps ({link_mbps}) is above the modelled "
                       f"rail rate ({cfg.rail_gbps} Gbit/s)")
    try:
        plan = build_plan(schedule, scale=scale, rail_gbps=cfg.rail_gbps,
                          latency_s=cfg.latency_us * 1e-6)
    except PlanError as exc:
        raise RunRefused(f"{cfg.source}: {exc}") from exc
    times = simulate(schedule, TimingModel(rail_gbps=cfg.rail_gbps,
                                           latency_s=cfg.latency_us * 1e-6))
    modeled = max(e for _, e in times.values()) if times else 0.0
    return Prepared(cfg, schedule, plan, link_mbps, scale, modeled)


def default_out_dir(cfg: ExperimentConfig, root: Path = Path("results")) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    delay = "" if cfg.mode == "baseline" else f"-{cfg.switching_delay_ms:g}ms"
    return root / f"{cfg.name}-{cfg.mode}{delay}-{stamp}"


def _check_out_dir(out: Path) -> None:
    if out.exists() and any(out.iterdir()):
        raise RunRefused(f"{out} exists and is not empty; choose another --out (nothing was "
                       "changed)")


def core_config(mode: str) -> CoreConfig:
    return CoreConfig(provisioning=mode == "provisioning", degree_aware=mode == "degree-aware")


@contextlib.contextmanager
def _controller_driver(cfg: ExperimentConfig, emulated: OcsDriver) -> Iterator[OcsDriver]:
    """The OCS driver Opus uses: the emulated one, or the Polatis NETCONF driver talking to a
    NETCONF front on each emulated rail (the lab driver, exercised against real OVS circuits)."""
    if cfg.driver == "emulated" or cfg.mode == "baseline":
        yield emulated
        return
    if cfg.driver != "polatis-netconf":
        raise RunRefused(f"{cfg.source}: ocs.driver {cfg.driver!r} cannot drive the emulated "
                         "rails; use emulated or polatis-netconf (a lab switch is brought up "
                         "with `opus-testbed ocs connect`)")
    if cfg.ocs_options.get("host") or cfg.ocs_options.get("rails"):
        raise RunRefused(f"{cfg.source}: ocs.host/ocs.rails point at a lab switch, but an "
                         "emulated run drives its own NETCONF fronts on the emulated rails; "
                         "remove them here, and bring a lab switch up with `opus-testbed ocs`")
    from controller.polatis.config import make_driver
    from emulator.polatis.front import netconf_fronts

    password = secrets.token_hex(8)
    with netconf_fronts(emulated, password=password) as fronts:
        driver = make_driver(fronts.ocs_config(password_env="OPUS_FRONT_PASSWORD"),
                             env={"OPUS_FRONT_PASSWORD": password})
        try:
            yield driver
        finally:
            driver.close()


def run_emulated(prep: Prepared, out: Path, say: Say = _say_stderr) -> dict[str, Any]:
    """Run ``prep`` on the emulated rails; returns the summary (also in ``out/summary.json``)."""
    from emulator.network import emulated_rails
    from emulator.topo import RailSpec

    cfg, plan = prep.config, prep.plan
    _check_out_dir(out)
    cluster = cfg.workload.cluster
    spec = RailSpec(servers=cluster.servers, gpus_per_server=cluster.gpus_per_server,
                    ports_per_rank=cfg.effective_ports_per_rank, link_mbps=prep.link_mbps,
                    mode="electrical" if cfg.mode == "baseline" else "ocs",
                    switching_delay=0.0 if cfg.mode == "baseline" else cfg.switching_delay)
    ports = {r: RankPorts(r, spec.rail_of(r), tuple(p.port for p in spec.rank_ports(r)))
             for r in range(spec.num_ranks)}
    try:
        job = plan.job("train", ports)
    except PlanError as exc:
        raise RunRefused(f"{cfg.source}: {exc}") from exc
    out.mkdir(parents=True, exist_ok=True)
    (out / "ranks").mkdir(exist_ok=True)
    (out / "experiment.yaml").write_text(cfg.text)
    manifest = results.start_manifest(
        out, "emu", cfg.to_json(), link_mbps=prep.link_mbps, scale=prep.scale,
        world_size=spec.num_ranks, rails=spec.num_rails,
        modeled_iteration_s=prep.modeled_iteration_s)
    say(f"run {cfg.name}: mode {cfg.mode}, switching delay {cfg.switching_delay_ms:g} ms, "
        f"{spec.num_ranks} ranks on {spec.num_rails} rails, K={spec.ports_per_rank}, "
        f"links {prep.link_mbps:g} Mbit/s (bytes x {prep.scale:.3g}), "
        f"{cfg.warmup}+{cfg.iterations} iterations (modelled {prep.modeled_iteration_s:.2f} s "
        f"each); results in {out}")
    t_start = time.monotonic()
    from controller.service import ControllerService

    procs: dict[int, Any] = {}
    logs: list[IO[str]] = []
    sampler = CpuSampler(lambda: [p.pid for p in procs.values()])
    try:
        with contextlib.ExitStack() as stack:  # unwinds: controller, OCS driver, network
            net = stack.enter_context(emulated_rails(spec, run_dir=out / "emulator"))
            manifest.update(datapath=net.datapath, prefix=net.prefix)
            results.write_json(out / "manifest.json", manifest)
            say(f"  network up in {time.monotonic() - t_start:.1f} s (prefix {net.prefix}, "
                f"{net.datapath} datapath)")
            driver = stack.enter_context(_controller_driver(cfg, net.driver))
            svc = ControllerService(driver, bind=f"tcp://{net.root_frontend_address}:0",
                                    config=core_config(cfg.mode),
                                    event_log=EventLog(out / "controller-events.jsonl"))
            with svc:
                svc.register_job(job)
                peers = {r: net.rank_address(r) for r in range(spec.num_ranks)}
                for rank, ops in plan.programs.items():
                    rank_plan = {
                        "rank": rank, "job": job.job_id, "endpoint": svc.endpoint,
                        "addr": net.rank_address(rank), "peers": peers, "port": REPLAYER_PORT,
                        "iterations": cfg.total_iterations, "ack_timeout_s": cfg.ack_timeout_s,
                        "io_timeout_s": max(30.0, 10 * prep.modeled_iteration_s),
                        "out": str((out / "ranks" / f"rank{rank}.jsonl").resolve()),
                        "ops": [op.to_json() for op in ops]}
                    path = out / "ranks" / f"rank{rank}.plan.json"
                    path.write_text(json.dumps(rank_plan))
                    log = (out / "ranks" / f"rank{rank}.log").open("w")
                    logs.append(log)
                    procs[rank] = net.popen(rank, [sys.executable, "-m", "testbed.replayer",
                                                   str(path.resolve())],
                                            stdout=log, stderr=log)
                sampler.start()
                _follow(out, procs, cfg, prep, say)
                sampler.stop()
    finally:
        sampler.stop()
        for fh in logs:
            fh.close()
    wall_s = time.monotonic() - t_start
    records = [r for rank in range(spec.num_ranks)
               for r in results.read_jsonl(out / "ranks" / f"rank{rank}.jsonl")]
    events = results.read_jsonl(out / "controller-events.jsonl")
    summary = finish_run(out, prep, records, events, sampler.summary(), manifest, wall_s,
                         num_rails=spec.num_rails, ranks_rail0=spec.ranks_on_rail(0))
    return summary


def _follow(out: Path, procs: dict[int, Any], cfg: ExperimentConfig, prep: Prepared,
            say: Say) -> None:
    """Wait for every rank, reporting progress; raise :class:`RankFailed` on the first failure."""
    total = cfg.total_iterations
    done: dict[int, int] = dict.fromkeys(procs, 0)
    offsets: dict[int, int] = dict.fromkeys(procs, 0)
    last_op: dict[int, str] = {}
    budget_s = 120 + total * max(60.0, 20 * prep.modeled_iteration_s)
    deadline = time.monotonic() + budget_s
    reported = -1
    while True:
        for rank in procs:
            path = out / "ranks" / f"rank{rank}.jsonl"
            if not path.exists():
                continue
            with path.open() as fh:
                fh.seek(offsets[rank])
                chunk = fh.read()
            cut = chunk.rfind("\n") + 1
            offsets[rank] += len(chunk[:cut].encode())
            for line in chunk[:cut].splitlines():
                rec = json.loads(line)
                if rec.get("ev") == "iteration":
                    done[rank] = int(rec["it"]) + 1
                elif rec.get("ev") == "call":
                    last_op[rank] = f"{rec['kind']} {rec['cid']} (iteration {rec['it']})"
                elif rec.get("ev") == "error":
                    raise RankFailed(rank, f"rank {rank} failed in iteration {rec['it']} at op "
                                     f"{rec['i']} ({rec['tag']}, lane {rec['lane']}): "
                                     f"{rec['error']}")
        slowest = min(done.values())
        if slowest != reported:
            reported = slowest
            phase = "warm-up" if slowest <= cfg.warmup and slowest < total else "measured"
            say(f"  iterations done: {slowest}/{total} ({phase})")
        exited = {r: p.poll() for r, p in procs.items()}
        for rank, code in exited.items():
            if code not in (None, 0):
                log = (out / "ranks" / f"rank{rank}.log").read_text()[-800:]
                raise RankFailed(rank, f"rank {rank} exited with status {code} after "
                                 f"{last_op.get(rank, 'no call')}; log tail: {log.strip()}")
        if all(code == 0 for code in exited.values()):
            return
        if time.monotonic() > deadline:
            stuck = sorted(r for r, c in exited.items() if c is None)
            raise RunError(f"ranks {stuck} did not finish within {budget_s:.0f} s; last calls: "
                           + "; ".join(f"rank {r}: {last_op.get(r, 'none')}" for r in stuck[:4]))
        time.sleep(POLL_S)


def finish_run(out: Path, prep: Prepared, records: list[dict[str, Any]],
               events: list[dict[str, Any]], cpu: dict[str, Any], manifest: dict[str, Any],
               wall_s: float, *, num_rails: int, ranks_rail0: list[int],
               backend: str = "emu") -> dict[str, Any]:
    """Metrics, fidelity verdict, tables, summary and plots of a finished run."""
    cfg = prep.config
    m = compute_metrics(records, events, warmup=cfg.warmup, link_mbps=prep.link_mbps,
                        scale=prep.scale, num_rails=num_rails)
    compute_rows = [{"rank": r["rank"], "it": r["it"], "op": r["i"], "t_start": r["t_start"],
                     "t_end": r["t_end"]} for r in records if r.get("ev") == "compute"]
    for name, rows in (("iterations", m.iterations), ("calls", m.calls),
                       ("compute", compute_rows), ("windows", m.windows),
                       ("circuits", m.circuits), ("rails", m.rails)):
        results.write_csv(out / f"{name}.csv", rows)
    s = m.summary
    if backend == "emu":
        fidelity, reasons = judge(cpu, s["throughput_ratio_median"], s["calls"],
                                  s["calls_delivered"])
    else:
        fidelity, reasons = "ok", []
    expected_iterations = cfg.total_iterations
    summary = {"name": cfg.name, "backend": backend, "mode": cfg.mode,
               "switching_delay_ms": cfg.switching_delay_ms,
               "ports_per_rank": cfg.effective_ports_per_rank, "link_mbps": prep.link_mbps,
               "scale": prep.scale, "world_size": prep.schedule.world_size,
               "warmup": cfg.warmup, "iterations": cfg.iterations,
               "all_iterations_completed": s["iterations_completed"] == expected_iterations,
               **s, "fidelity": fidelity, "fidelity_reasons": reasons, "cpu": cpu,
               "modeled_iteration_s": prep.modeled_iteration_s, "wall_s": wall_s,
               "mispredictions": sum(int(r.get("mispredictions", 0)) for r in records
                                     if r.get("ev") == "finished"),
               "timeline_ranks": ranks_rail0, "timeline_rails": [0]}
    results.write_json(out / "summary.json", summary)
    manifest.update(status="done", finished=time.strftime("%Y-%m-%dT%H:%M:%S%z"))
    results.write_json(out / "manifest.json", manifest)
    results.render_run(out)
    return summary


def summary_text(summary: dict[str, Any]) -> str:
    """The one-screen summary printed at the end of a run."""
    def f(key: str, fmt: str = "{:.3f}") -> str:
        v = summary.get(key)
        return "n/a" if v is None else fmt.format(v)

    lines = [
        f"== {summary['name']}: {summary['mode']} "
        f"({summary['switching_delay_ms']:g} ms switching, K={summary['ports_per_rank']}, "
        f"{summary['backend']}) ==",
        f"iteration time      {f('iteration_time_s')} s  (mean of {summary['iterations']} after "
        f"{summary['warmup']} warm-up; each: "
        + ", ".join(f"{t:.3f}" for t in summary.get("iteration_times_s", [])) + ")",
    ]
    if summary.get("baseline_iteration_time_s") is not None:
        lines.append(f"baseline            {f('baseline_iteration_time_s')} s  -> overhead "
                     f"{f('overhead_pct', '{:+.2f}')} %")
    lines += [
        f"reconfigurations    {summary['reconfigurations']} rail switches "
        f"({f('reconfigurations_per_iteration', '{:.1f}')} per measured iteration)",
        f"exposed reconfig    {f('exposed_reconfig_s')} s per iteration waiting on light",
        f"windows             {summary['windows']} (>1 ms: "
        f"{f('windows_over_1ms_pct', '{:.0f}')} %, median {f('window_median_s')} s)",
        f"delivery            {summary['calls_delivered']}/{summary['calls']} calls complete, "
        f"{summary['bytes_received_scaled']}/{summary['bytes_expected_scaled']} bytes",
        f"throughput          median {f('throughput_ratio_median', '{:.2f}')} of the configured "
        f"{summary['link_mbps']:g} Mbit/s",
        f"fidelity            {summary['fidelity']}"
        + ("" if not summary.get("fidelity_reasons") else ": "
           + "; ".join(summary["fidelity_reasons"])),
    ]
    return "\n".join(lines)
