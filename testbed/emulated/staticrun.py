"""The emulated run's shell around the static plane (:mod:`testbed.emulated.planes`): what
:func:`testbed.emulated.runner.run_emulated` calls, kept out of the runner."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

from emulator import runstate
from emulator.topo import RailSpec
from testbed.emulated.planes import (
    RankRelays,
    StaticFollower,
    install_reconfigurations,
    plane_stats,
    rank_relays,
)
from testbed.emulated.supervisor import REPLAYER_PORT
from testbed.errors import RunError, RunRefused, Say
from testbed.experiment.backends import (
    DYNAMIC_RELAY_PATHS,
    EMU,
    SPECS,
    emulated_static_refusal,
)
from testbed.experiment.config import RunSettings
from testbed.plan.planes import StaticPlan, static_plan
from testbed.plan.replay import ReplayPlan
from testbed.results import store

#: The static plane's installed circuits, in the run directory (:meth:`StaticRun.start`)
STATIC_CIRCUITS = "plane-circuits.json"


class StaticRun:
    """One emulated run under ``controller.plane: static``."""

    def __init__(self, cfg: RunSettings, plan: ReplayPlan, spec: RailSpec,
                 static: StaticPlan) -> None:
        self.cfg = cfg
        self.plan = plan
        self.spec = spec
        self.static = static
        self.circuits = 0

    def start(self, net: Any, stack: contextlib.ExitStack, say: Say,
              record: Path | None = None) -> dict[int, RankRelays]:
        """Install the circuits (before any rank starts) and return every rank's relays;
        ``record`` (``out/plane-circuits.json``): what was installed and when, the runner's
        own record, which the wire check judges the one-to-one rule against."""
        spec = self.spec
        reconfs = install_reconfigurations(
            self.static, lambda rank, k: spec.rank_ports(rank)[k].port)
        t0, t_request_s = time.monotonic(), time.time()
        net.driver.apply_many(reconfs)
        if record is not None:
            store.write_json(record, {
                "t_request_s": t_request_s, "t_end_s": time.time(),
                "rails": [{"rail": r.rail, "circuits": sorted(
                    sorted((c.port_a, c.port_b)) for c in r.add)} for r in reconfs]})
        self.circuits = sum(len(r.add) for r in reconfs)
        sockets = stack.enter_context(runstate.owned_dir(
            runstate.state_dir() / "scaleup" / net.prefix))
        relays = rank_relays(self.static, self.plan.programs, net.rank_address,
                             REPLAYER_PORT, sockets)
        routed = sum(len(p) for r in relays.values() for p in r.routes.values())
        say(f"  plane static: {self.circuits} circuits on {len(self.static.topology)} switches "
            f"installed in {time.monotonic() - t0:.2f} s before the ranks start; "
            f"{routed} (collective, peer) transfers cross other ranks (a relay server, or "
            "another GPU of their server)")
        return relays

    def follower(self, inner: Any, net: Any) -> StaticFollower:
        return StaticFollower(inner, net.dump_flows, self.spec.num_rails)

    def finish(self, out: Path, summary: dict[str, Any], follower: StaticFollower,
               iterations: int, say: Say) -> dict[str, Any]:
        """The plane's figures and checks in the summary; RunError if a check failed."""
        records = [r for rank in range(self.spec.num_ranks)
                   for r in store.read_jsonl(out / "ranks" / f"rank{rank}.jsonl")]
        stats = plane_stats(self.static, self.plan.programs, iterations, records,
                            self.circuits, follower.before, follower.after)
        summary.update(plane="static", plane_stats=stats)
        store.write_json(out / "summary.json", summary)
        say(f"plane static: {stats['relayed_share']:.1%} of the bytes relayed, "
            f"{stats['relay_forwarded_bytes']} bytes forwarded by {stats['relay_ranks']} "
            f"ranks (planned {stats['relay_forwarded_bytes_planned']}), one-to-one "
            f"{'held' if stats['one_to_one'] else 'BROKEN'}, "
            f"{'reconfigured' if stats['reconfigured_during_run'] else 'no reconfiguration'} "
            "during the run")
        if stats["problems"]:
            raise RunError(f"{self.cfg.source}: the static plane's checks failed: "
                           + "; ".join(stats["problems"][:5]))
        return summary


def static_emulated(cfg: RunSettings, plan: ReplayPlan, spec: RailSpec) -> StaticRun:
    """The static plane of an emulated run; :class:`RunRefused` for what it does not carry."""
    if cfg.control_plane != "static":
        raise RunRefused(f"{cfg.source}: controller.plane {cfg.control_plane} runs on the sim "
                         "backend only (issue 40: the emulated rotor is not built)")
    if cfg.relay_paths != "fixed":  # (resolve refuses it first; a runner called directly)
        SPECS[EMU].require(DYNAMIC_RELAY_PATHS, cfg.source)
    why = emulated_static_refusal(spec.ports_per_rank, bool(spec.spares),
                                  bool(getattr(cfg, "faults", None)))
    if why is not None:
        raise RunRefused(f"{cfg.source}: {why}")
    try:
        static = static_plan(plan.programs, spec.gpus_per_server, spec.ports_per_rank,
                             spec.servers)
    except ValueError as exc:
        raise RunRefused(f"{cfg.source}: {exc}") from exc
    return StaticRun(cfg, plan, spec, static)
