"""``opus-testbed run`` on the emulated photonic rails (Mininet hosts, OVS rails, os-ken OCS).

Order of work, from a :class:`~testbed.experiment.prepare.Prepared` run: build the emulated
rails (os-ken OCS app on one OVS bridge per rail, or electrical rails for the baseline), start
the Opus controller on the frontend network with the emulated OCS driver, register the job,
launch one replayer (:mod:`testbed.emulated.replayer`) per rank inside its Mininet host, follow
their progress, and on success hand the records and the OCS app's dark periods
(:mod:`testbed.metrics.darktime`) to :func:`testbed.results.summary.finish_run`.
Under rail-state semantics the data rails are packet-switched (as the baseline's) and the
network also has the shadow OCS rails on which the bits switch (:mod:`controller.railstate`).
A rank that fails ends the run: the error names the rank and its last op, and teardown still
happens (the network's context manager stops every process we started). :func:`run_on_rails`
is that sequence for any rank process; torch jobs (:mod:`testbed.torchjob.runner`) use it too.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from controller.core import CoreConfig
from controller.drivers import DRIVERS, HARDWARE_DRIVERS
from controller.events import EventLog
from controller.job import JobSpec, RankPorts
from controller.ocs import OcsDriver
from controller.railstate import RAIL_STATE
from testbed.errors import RankFailed, RunError, RunRefused, Say, require_empty_dir, say_stderr
from testbed.experiment.config import RunSettings
from testbed.experiment.prepare import Prepared
from testbed.metrics.darktime import DarkCheck, check_dark_periods
from testbed.metrics.fidelity import CpuSampler, vswitchd_pids
from testbed.plan.replay import PlanError
from testbed.results import store
from testbed.results.summary import RunFacts, finish_run

if TYPE_CHECKING:
    from emulator.network import EmulatedRails
    from emulator.topo import RailSpec

REPLAYER_PORT = 7100
POLL_S = 0.5

#: (network, Opus controller endpoint, rank) -> the rank process's command line
RankLauncher = Callable[["EmulatedRails", str, int], list[str]]


@contextlib.contextmanager
def _controller_driver(cfg: RunSettings, emulated: OcsDriver) -> Iterator[OcsDriver]:
    """The OCS driver Opus uses: the emulated one, or a Polatis driver (NETCONF or TL1) talking
    to a front of that protocol on each emulated rail (the lab driver, against real OVS
    circuits)."""
    if cfg.driver == "emulated" or cfg.mode == "baseline":
        yield emulated
        return
    if cfg.driver not in HARDWARE_DRIVERS:
        raise RunRefused(f"{cfg.source}: ocs.driver {cfg.driver!r} cannot drive the emulated "
                         f"rails; use one of {', '.join(DRIVERS)}")
    if cfg.ocs_options.get("host") or cfg.ocs_options.get("rails"):
        raise RunRefused(f"{cfg.source}: ocs.host/ocs.rails point at a lab switch, but an "
                         f"emulated run drives its own {cfg.driver} fronts on the emulated "
                         "rails; remove them here, and bring a lab switch up with "
                         "`opus-testbed ocs`")
    from controller.drivers.polatis.config import make_driver
    from emulator.polatis.front import emulated_fronts

    password = secrets.token_hex(8)
    with emulated_fronts(emulated, cfg.driver, password=password) as fronts:
        driver = make_driver(fronts.ocs_config(password_env="OPUS_FRONT_PASSWORD"),
                             env={"OPUS_FRONT_PASSWORD": password})
        try:
            yield driver
        finally:
            driver.close()


def rail_spec(cfg: RunSettings, servers: int, gpus_per_server: int, link_mbps: float,
              shadow_rails: int = 0) -> RailSpec:
    """The emulated network of a run: electrical rails for the baseline and under rail-state
    semantics (whose bits switch on ``shadow_rails`` small OCS rails), else OCS rails."""
    from emulator.topo import RailSpec

    electrical = cfg.mode == "baseline" or cfg.effective_semantics == RAIL_STATE
    return RailSpec(servers=servers, gpus_per_server=gpus_per_server,
                    ports_per_rank=cfg.effective_ports_per_rank, link_mbps=link_mbps,
                    mode="electrical" if electrical else "ocs",
                    switching_delay=0.0 if cfg.mode == "baseline" else cfg.switching_delay,
                    shadow_rails=shadow_rails)


def spec_ports(spec: RailSpec) -> dict[int, RankPorts]:
    """Every rank's rail and its ports there, as Opus registers them."""
    return {r: RankPorts(r, spec.rail_of(r), tuple(p.port for p in spec.rank_ports(r)))
            for r in range(spec.num_ranks)}


def run_emulated(prep: Prepared, out: Path, say: Say = say_stderr) -> dict[str, Any]:
    """Run ``prep`` on the emulated rails; returns the summary (also in ``out/summary.json``)."""
    cfg, plan = prep.config, prep.plan
    require_empty_dir(out)
    cluster = cfg.workload.cluster
    rail_state = cfg.effective_semantics == RAIL_STATE
    spec = rail_spec(cfg, cluster.servers, cluster.gpus_per_server, prep.link_mbps,
                     shadow_rails=cluster.gpus_per_server * cfg.workload.parallel.pp
                     if rail_state else 0)
    try:
        job = plan.job("train", spec_ports(spec))
    except PlanError as exc:
        raise RunRefused(f"{cfg.source}: {exc}") from exc
    out.mkdir(parents=True, exist_ok=True)
    (out / "ranks").mkdir(exist_ok=True)
    (out / "experiment.yaml").write_text(cfg.text)
    manifest = store.start_manifest(
        out, "emu", cfg.to_json(), link_mbps=prep.link_mbps, scale=prep.scale,
        world_size=spec.num_ranks, rails=spec.num_rails,
        modeled_iteration_s=prep.modeled_iteration_s)
    say(f"run {cfg.name}: mode {cfg.mode}, switching delay {cfg.switching_delay_ms:g} ms, "
        f"{spec.num_ranks} ranks on {spec.num_rails} rails, K={spec.ports_per_rank}, "
        f"{cfg.effective_semantics}, links {prep.link_mbps:g} Mbit/s (bytes x {prep.scale:.3g}), "
        f"{cfg.warmup}+{cfg.iterations} iterations (modelled {prep.modeled_iteration_s:.2f} s "
        f"each); results in {out}")

    def replayer(net: EmulatedRails, endpoint: str, rank: int) -> list[str]:
        rank_plan = {
            "rank": rank, "job": job.job_id, "endpoint": endpoint,
            "addr": net.rank_address(rank), "port": REPLAYER_PORT,
            "peers": {r: net.rank_address(r) for r in range(spec.num_ranks)},
            "iterations": cfg.total_iterations, "ack_timeout_s": cfg.ack_timeout_s,
            "io_timeout_s": max(30.0, 10 * prep.modeled_iteration_s),
            "out": str((out / "ranks" / f"rank{rank}.jsonl").resolve()),
            "ops": [op.to_json() for op in plan.programs[rank]]}
        path = out / "ranks" / f"rank{rank}.plan.json"
        path.write_text(json.dumps(rank_plan))
        return [sys.executable, "-m", "testbed.emulated.replayer", str(path.resolve())]

    return run_on_rails(prep, spec, job, out, manifest, replayer, say)


def run_on_rails(prep: RunFacts, spec: RailSpec, job: JobSpec, out: Path,
                 manifest: dict[str, Any], launch: RankLauncher, say: Say) -> dict[str, Any]:
    """Build the rails, start Opus with ``job`` registered, start every rank's process in its
    host (``launch`` writes the rank's plan and returns its command line; its log and records
    go to ``out/ranks/``), follow them to the end and finish the run."""
    from controller.service import ControllerService
    from emulator.network import emulated_rails

    cfg = prep.config
    t_start = time.monotonic()
    procs: dict[int, Any] = {}
    logs: list[IO[str]] = []
    sampler = CpuSampler(lambda: [p.pid for p in procs.values()] + vswitchd_pids())
    try:
        with contextlib.ExitStack() as stack:  # unwinds: controller, OCS driver, network
            net = stack.enter_context(emulated_rails(spec, run_dir=out / "emulator"))
            manifest.update(datapath=net.datapath, prefix=net.prefix)
            store.write_json(out / "manifest.json", manifest)
            say(f"  network up in {time.monotonic() - t_start:.1f} s (prefix {net.prefix}, "
                f"{net.datapath} datapath)")
            driver = stack.enter_context(_controller_driver(cfg, net.driver))
            svc = ControllerService(driver, bind=f"tcp://{net.root_frontend_address}:0",
                                    config=CoreConfig.for_mode(cfg.mode,
                                                               cfg.effective_semantics),
                                    event_log=EventLog(out / "controller-events.jsonl"))
            with svc:
                svc.register_job(job)
                for rank in range(spec.num_ranks):
                    args = launch(net, svc.endpoint, rank)
                    log = (out / "ranks" / f"rank{rank}.log").open("w")
                    logs.append(log)
                    procs[rank] = net.popen(rank, args, stdout=log, stderr=log)
                sampler.start()
                _follow(out, procs, cfg, prep, say)
                sampler.stop()
    finally:
        sampler.stop()
        for fh in logs:
            fh.close()
    wall_s = time.monotonic() - t_start
    records = [r for rank in range(spec.num_ranks)
               for r in store.read_jsonl(out / "ranks" / f"rank{rank}.jsonl")]
    events = store.read_jsonl(out / "controller-events.jsonl")
    return finish_run(out, prep, records, events, sampler.summary(), manifest, wall_s,
                      num_rails=spec.num_rails, ranks_rail0=spec.ranks_on_rail(0),
                      dark=_dark_check(out, cfg, events))


def _dark_check(out: Path, cfg: RunSettings,
                controller_events: list[dict[str, Any]]) -> DarkCheck | None:
    """The OCS app's dark periods against the injected delay (None: electrical rails). The
    switch counts are compared only when the controller drives the OCS app directly (a Polatis
    front may split or merge the requests it passes on)."""
    if cfg.mode == "baseline":
        return None
    ocs_events = store.read_jsonl(out / "emulator" / "ocs-events.jsonl")
    return check_dark_periods(ocs_events, cfg.switching_delay_ms,
                              controller_events if cfg.driver == "emulated" else None)


def _follow(out: Path, procs: dict[int, Any], cfg: RunSettings, prep: RunFacts,
            say: Say) -> None:
    """Wait for every rank, reporting progress; raise :class:`RankFailed` on the first failure.

    Exit statuses are read before the records, so a rank's last records (its error) are read
    before its exit is reported.
    """
    total = cfg.total_iterations
    done: dict[int, int] = dict.fromkeys(procs, 0)
    offsets: dict[int, int] = dict.fromkeys(procs, 0)
    last_op: dict[int, str] = {}
    budget_s = 120 + total * max(60.0, 20 * (prep.modeled_iteration_s or 0.0))
    deadline = time.monotonic() + budget_s
    reported = -1
    while True:
        exited = {r: p.poll() for r, p in procs.items()}
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
        for rank, code in exited.items():
            if code not in (None, 0):
                log = out / "ranks" / f"rank{rank}.log"
                raise RankFailed(rank, f"rank {rank} exited with status {code} after "
                                 f"{last_op.get(rank, 'no call')}; log {log}, its tail: "
                                 f"{log.read_text()[-800:].strip()}")
        if all(code == 0 for code in exited.values()):
            return
        if time.monotonic() > deadline:
            stuck = sorted(r for r, c in exited.items() if c is None)
            raise RunError(f"ranks {stuck} did not finish within {budget_s:.0f} s; last calls: "
                           + "; ".join(f"rank {r}: {last_op.get(r, 'none')}" for r in stuck[:4]))
        time.sleep(POLL_S)


