"""``opus-testbed run`` on the emulated photonic rails (Mininet hosts, OVS rails, os-ken OCS).

Order of work, from a :class:`~testbed.experiment.prepare.Prepared` run: build the emulated
rails (os-ken OCS app on one OVS bridge per rail, or electrical rails for the baseline), start
the Opus controller on the frontend network with the emulated OCS driver, register the job,
launch one replayer (:mod:`testbed.emulated.replayer`) per rank inside its Mininet host (and a
standby one per spare), follow them (:mod:`testbed.emulated.supervisor`: progress, injected
faults, failover), and on success hand the records to
:func:`testbed.results.summary.finish_run`. Under rail-state semantics the data rails are
packet-switched (as the baseline's) and the network also has the shadow OCS rails on which the
bits switch (:mod:`controller.railstate`). A rank that fails ends the run unless the run has
spares (or ``--no-spares``' restart): the error names the rank and its last op, and teardown
still happens (the network's context manager stops every process we started).
"""

from __future__ import annotations

import contextlib
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from controller.core import CoreConfig
from controller.drivers import DRIVERS, HARDWARE_DRIVERS
from controller.drivers.faults import FaultInjectingDriver, OcsFaults
from controller.events import EventLog
from controller.job import RankPorts
from controller.ocs import OcsDriver
from controller.railstate import RAIL_STATE
from testbed.emulated.supervisor import Supervisor
from testbed.errors import RunRefused, Say, require_empty_dir, say_stderr
from testbed.experiment.config import ExperimentConfig
from testbed.experiment.prepare import Prepared
from testbed.metrics.fidelity import CpuSampler, vswitchd_pids
from testbed.plan.replay import PlanError
from testbed.results import store
from testbed.results.summary import finish_run


@contextlib.contextmanager
def _controller_driver(cfg: ExperimentConfig, emulated: OcsDriver
                       ) -> Iterator[tuple[OcsDriver, Any]]:
    """The OCS driver Opus uses, and the Polatis fronts if any: the emulated driver, or a
    Polatis driver (NETCONF or TL1) talking to a front of that protocol on each emulated rail
    (the lab driver, against real OVS circuits)."""
    if cfg.driver == "emulated" or cfg.mode == "baseline":
        yield emulated, None
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
            yield driver, fronts
        finally:
            driver.close()


def run_emulated(prep: Prepared, out: Path, say: Say = say_stderr) -> dict[str, Any]:
    """Run ``prep`` on the emulated rails; returns the summary (also in ``out/summary.json``)."""
    from emulator.network import emulated_rails
    from emulator.topo import RailSpec

    cfg, plan = prep.config, prep.plan
    require_empty_dir(out)
    cluster = cfg.workload.cluster
    spares = not cfg.no_spares
    rail_state = cfg.effective_semantics == RAIL_STATE
    spec = RailSpec(servers=cluster.servers, gpus_per_server=cluster.gpus_per_server,
                    ports_per_rank=cfg.effective_ports_per_rank, link_mbps=prep.link_mbps,
                    mode="electrical" if cfg.mode == "baseline" or rail_state else "ocs",
                    switching_delay=0.0 if cfg.mode == "baseline" else cfg.switching_delay,
                    shadow_rails=cluster.gpus_per_server * cfg.workload.parallel.pp
                    if rail_state else 0,
                    spares_per_server=cfg.spares_per_server if spares else 0,
                    spare_servers=cfg.spare_servers if spares else 0)
    ports = {r: RankPorts(r, spec.rail_of(r), tuple(p.port for p in spec.rank_ports(r)))
             for r in range(spec.num_ranks)}
    try:
        job = plan.job("train", ports)
    except PlanError as exc:
        raise RunRefused(f"{cfg.source}: {exc}") from exc
    out.mkdir(parents=True, exist_ok=True)
    (out / "ranks").mkdir(exist_ok=True)
    (out / "experiment.yaml").write_text(cfg.text)
    manifest = store.start_manifest(
        out, "emu", cfg.to_json(), link_mbps=prep.link_mbps, scale=prep.scale,
        world_size=spec.num_ranks, rails=spec.num_rails,
        modeled_iteration_s=prep.modeled_iteration_s, spares=len(spec.spares))
    spare_text = f", {len(spec.spares)} spares" if spec.spares else ""
    say(f"run {cfg.name}: mode {cfg.mode}, switching delay {cfg.switching_delay_ms:g} ms, "
        f"{spec.num_ranks} ranks on {spec.num_rails} rails{spare_text}, "
        f"K={spec.ports_per_rank}, {cfg.effective_semantics}, links {prep.link_mbps:g} Mbit/s "
        f"(bytes x {prep.scale:.3g}), "
        f"{cfg.warmup}+{cfg.iterations} iterations (modelled {prep.modeled_iteration_s:.2f} s "
        f"each); results in {out}")
    t_start = time.monotonic()
    from controller.service import ControllerService

    sup: Supervisor | None = None
    sampler = CpuSampler(lambda: (sup.pids if sup is not None else []) + vswitchd_pids())
    try:
        with contextlib.ExitStack() as stack:  # unwinds: controller, OCS driver, network
            net = stack.enter_context(emulated_rails(spec, run_dir=out / "emulator"))
            manifest.update(datapath=net.datapath, prefix=net.prefix)
            store.write_json(out / "manifest.json", manifest)
            say(f"  network up in {time.monotonic() - t_start:.1f} s (prefix {net.prefix}, "
                f"{net.datapath} datapath)")
            ocs_faults = OcsFaults(seed=cfg.seed)
            driver, fronts = stack.enter_context(_controller_driver(
                cfg, FaultInjectingDriver(net.driver, ocs_faults)))
            events = EventLog(out / "controller-events.jsonl")
            svc = ControllerService(driver, bind=f"tcp://{net.root_frontend_address}:0",
                                    config=CoreConfig.for_mode(cfg.mode,
                                                               cfg.effective_semantics),
                                    event_log=events,
                                    heartbeat_timeout_s=cfg.failover.heartbeat_timeout_s)
            with svc:
                svc.register_job(job)
                sup = Supervisor(net=net, endpoint=svc.endpoint, plan=plan, job=job, prep=prep,
                                 out=out, events=events, ocs_faults=ocs_faults, say=say,
                                 fronts=fronts)
                svc.on_rank_lost = sup.on_rank_lost
                try:
                    sup.launch()
                    sampler.start()
                    sup.follow()
                    sampler.stop()
                finally:
                    sup.close()
    finally:
        sampler.stop()
    wall_s = time.monotonic() - t_start
    records = [r for rank in range(spec.num_ranks)
               for r in store.read_jsonl(out / "ranks" / f"rank{rank}.jsonl")]
    events_read = store.read_jsonl(out / "controller-events.jsonl")
    summary = finish_run(out, prep, records, events_read, sampler.summary(), manifest, wall_s,
                         num_rails=spec.num_rails, ranks_rail0=spec.ranks_on_rail(0))
    return summary
