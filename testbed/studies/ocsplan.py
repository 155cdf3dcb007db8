"""What a run will do to the glass, before it runs: ``opus-testbed ocs plan CONFIG``.

The run's first iteration is played on the virtual clock by the sim backend's engine
(:mod:`testbed.simulator.engine`: the same schedule, plan and Opus core as a real run, against
the simulated OCS), and every reconfiguration the controller starts is listed per rail, in
order: the circuits it makes and removes, as rail ports. Nothing talks to a switch. The ports
the run owns on each rail are the simulated OCS's (the ranks' ports, and spares' where the run
has spares): on a shared switch they are what ``ocs.ports`` must give the run
(:mod:`controller.drivers.guard`).

The plan is of a fault-free first iteration (the warm-up of a run, whose timing the shim
profiles; provisioning from the profile starts with the second): injected faults and the
iterations after it are left out. Times are the virtual clock's, in model seconds.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from testbed.experiment.config import ExperimentConfig


def ocs_plan(cfg: ExperimentConfig) -> dict[str, Any]:
    """The plan of ``cfg``'s first iteration, as JSON-ready data (see the module docstring)."""
    from testbed.experiment.prepare import prepare
    from testbed.simulator.run import build_simulation

    first = dataclasses.replace(cfg, warmup=0, iterations=1, faults=())
    prep = prepare(first, check_capacity=False)
    sim = build_simulation(prep)
    descs = [d for d in sim.driver.describe() if d.mode == "ocs"]
    _records, events = sim.run()
    return plan_from_events(cfg, {d.rail: d.ports for d in descs},
                            {d.rail: d.switching_delay_ms for d in descs}, events)


def plan_from_events(cfg: ExperimentConfig, ports: Mapping[int, tuple[int, ...]],
                     delay_ms: Mapping[int, float], events: list[dict[str, Any]]
                     ) -> dict[str, Any]:
    """Group the controller's ``reconfig_start`` events by rail (pure)."""
    rails: dict[int, dict[str, Any]] = {
        rail: {"rail": rail, "ports": list(ps), "switching_delay_ms": delay_ms[rail],
               "steps": [], "make": 0, "remove": 0}
        for rail, ps in sorted(ports.items())}
    circuits: dict[int, set[tuple[int, int]]] = {rail: set() for rail in rails}
    for e in sorted((e for e in events if e.get("event") == "reconfig_start"),
                    key=lambda e: (float(e["t_s"]), int(e["decision"]))):
        rail = int(e["rail"])
        if rail not in rails:
            continue
        add = [(int(c[0]), int(c[1])) for c in e.get("add", [])]
        remove = [(int(c[0]), int(c[1])) for c in e.get("remove", [])]
        rails[rail]["steps"].append({"t_s": float(e["t_s"]), "decision": e["decision"],
                                     "make": [list(c) for c in add],
                                     "remove": [list(c) for c in remove]})
        rails[rail]["make"] += len(add)
        rails[rail]["remove"] += len(remove)
        circuits[rail] -= set(remove)
        circuits[rail] |= set(add)
    for rail, data in rails.items():
        data["circuits_after"] = [list(c) for c in sorted(circuits[rail])]
    return {"experiment": cfg.name, "source": cfg.source, "driver": cfg.driver,
            "mode": cfg.mode, "semantics": cfg.effective_semantics, "iteration": 0,
            "rails": list(rails.values())}


def plan_text(plan: Mapping[str, Any]) -> str:
    """The plan for a terminal: per rail, its ports, then each reconfiguration in order."""
    from controller.drivers.guard import port_text

    lines = [f"{plan['experiment']} ({plan['source']}): driver {plan['driver']}, mode "
             f"{plan['mode']}, {plan['semantics']}; the first iteration, on the virtual clock "
             "(nothing was sent to a switch)"]
    for r in plan["rails"]:
        lines.append(f"rail {r['rail']}: owns ports {port_text(r['ports'])} "
                     f"(ocs.ports); {r['make']} cross-connect(s) made, {r['remove']} removed, "
                     f"{len(r['steps'])} reconfiguration(s) of {r['switching_delay_ms']:g} ms")
        for s in r["steps"]:
            made = " ".join(f"{a}<->{b}" for a, b in s["make"]) or "-"
            removed = " ".join(f"{a}<->{b}" for a, b in s["remove"]) or "-"
            lines.append(f"  t={s['t_s'] * 1e3:9.3f} ms  remove {removed}  make {made}")
        left = " ".join(f"{a}<->{b}" for a, b in r["circuits_after"]) or "none"
        lines.append(f"  after the iteration: {left}")
    lines.append("A circuit a<->b is duplex: on a Polatis N x N switch, pairs a->N+b and "
                 "b->N+a.")
    return "\n".join(lines)
