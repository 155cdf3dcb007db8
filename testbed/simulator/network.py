"""The sim backend's analytic rail network and the emulator's measured fixed costs.

A transfer is a flow from the sender's rail port to the
receiver's rail port (the port whose circuit joins them; on an electrical rail port
``(a + b) % K`` on both sides, as the emulator routes). Each direction of a port carries
``link_bps`` of line rate, of which ``goodput`` is payload; flows through a port share it
equally (a flow's rate is the payload rate over the flow count of its busier port). Flows of one
call to one peer are one TCP connection: they go out in order. A flow arrives ``latency_s``
after its last byte left, so a lone 2-member all-gather of ``N`` bytes takes
``latency_s + 8 N / (goodput * link_bps)`` plus the fixed costs below. The sender does not wait
for its bytes to leave before it waits for the step's receptions (the socket buffers them).

Fixed costs of the emulator (:data:`EMULATOR_COSTS`), calibrated on the development machine
(4 ranks on userspace Open vSwitch, 2 cores); ``opus-testbed bench crossval CONFIG`` measures
them on any machine (``measured_costs`` in its JSON), and its module
(:mod:`testbed.studies.crossval`) has the figures behind the defaults:

* ``control_s`` + ``control_jitter_s``: one way between a rank and the controller (ZeroMQ over
  the frontend network plus the service loop): an intent reaches the core, an ack reaches the
  rank and a completion reaches the core ``control_s`` plus an exponential draw of mean
  ``control_jitter_s`` after it was sent. The draws come from a generator seeded by ``seed``:
  a run is reproducible, and two lanes of a rank that ask at the same instant reach the core
  in either order, as in the emulator;
* ``connect_s``: the TCP connect and hello line the sender does, blocking, on a call's first
  transfer to each peer;
* ``step_s``: per step with receptions, the framing and the wake-up of the receiving lane;
* ``finish_s``: the sender's shutdown and wait for the receiver's EOF at the end of a call;
* ``switch_overhead_s``: the emulated driver's time beyond the switching delay per decision
  (request, barrier, light notification);
* ``goodput``: the payload share of the shaped link rate (TCP/IP headers leave 1448/1514 of a
  frame; ack clocking through HTB and CPU contention take the rest). Iteration times add up
  calls' mean durations, so it follows the mean of per-call fits, not their median.

These grow with the load of the machine. :data:`IDEAL_COSTS` sets them all to zero: the modelled
fabric alone (``network.latency_us`` per hop, full line rate).

Cost models (:data:`COST_MODELS`, ``sim.costs`` in an experiment file, ``--costs`` on the command
line). ``fabric`` (the default) is the datacenter being modelled: the file's ``rail_gbps`` with
the real bytes (:func:`testbed.simulator.run.prepare_sim`), ``latency_us`` per hop, an OCS dark
for exactly the switching delay, and the controller's decision time, :data:`FABRIC_DECISION_S`
per reconfiguration (charged after the light, as the emulator's driver overhead is: a call
waits the decision plus the dark period, and the ports stay dark for the delay alone).
``emulator`` is :data:`EMULATOR_COSTS` at the emulator's scaled link (bytes x link / rail rate):
the emulator's machinery, for cross-validation (``opus-testbed bench crossval``) only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True)
class NetworkModel:
    """Analytic rail network: per-port rate, per-hop latency and fixed per-call/step costs."""

    link_bps: float
    latency_s: float = 5e-6
    goodput: float = 1.0
    control_s: float = 0.0
    control_jitter_s: float = 0.0
    connect_s: float = 0.0
    step_s: float = 0.0
    finish_s: float = 0.0
    switch_overhead_s: float = 0.0

    def __post_init__(self) -> None:
        if self.link_bps <= 0 or not 0 < self.goodput <= 1:
            raise ValueError(f"link_bps must be > 0 and goodput in (0, 1], got {self.link_bps} "
                             f"and {self.goodput}")
        if min(self.latency_s, self.control_s, self.control_jitter_s, self.connect_s,
               self.step_s, self.finish_s, self.switch_overhead_s) < 0:
            raise ValueError("network model times must be >= 0")

    @property
    def payload_bps(self) -> float:
        return self.link_bps * self.goodput

    def transfer_s(self, n_bytes: int) -> float:
        """One lone flow of ``n_bytes``: from its first byte out to its arrival."""
        return self.latency_s + n_bytes * 8 / self.payload_bps


#: Costs of the emulator on the development machine (see the module docstring; ``opus-testbed
#: bench crossval`` measures them again).
EMULATOR_COSTS: dict[str, float] = {
    "goodput": 0.85,
    "extra_latency_s": 0.1e-3,  # veth + userspace OVS hop, on top of network.latency_us
    "control_s": 0.4e-3,
    "control_jitter_s": 0.7e-3,
    "connect_s": 1.0e-3,
    "step_s": 1.0e-3,
    "finish_s": 1.0e-3,
    "switch_overhead_s": 4.5e-3,
}
#: The modelled fabric alone, with no controller time.
IDEAL_COSTS: dict[str, float] = {**dict.fromkeys(EMULATOR_COSTS, 0.0), "goodput": 1.0}
#: The controller's decision time per reconfiguration under ``fabric``: the pure core's time per
#: intent, 1 / 126k intents/s (``bench_core`` with provisioning on a quiet machine,
#: docs/performance.md), rounded up to 8 us. A constant, not a timing of this process: a
#: simulated figure must not depend on the load of the machine that computes it. Messages
#: between the ranks and the controller cost nothing (a datacenter's frontend hop is a few us
#: beside it; the emulator's 0.4 ms + jitter is ZeroMQ on a loaded 2-core machine).
FABRIC_DECISION_S = 8e-6
#: The datacenter being modelled: the fabric and the controller's decisions.
FABRIC_COSTS: dict[str, float] = {**IDEAL_COSTS, "switch_overhead_s": FABRIC_DECISION_S}

FABRIC = "fabric"
EMULATOR = "emulator"
#: ``sim.costs`` / ``--costs`` name -> the fixed costs of :func:`network_model`.
COST_MODELS: dict[str, Mapping[str, float]] = {FABRIC: FABRIC_COSTS, EMULATOR: EMULATOR_COSTS}
#: What each cost model is, in the words of a run's header and summary.
COST_MODEL_TEXT: dict[str, str] = {
    FABRIC: "the modelled fabric: line rate, per-hop latency, dark for the switching delay, "
            f"{FABRIC_DECISION_S * 1e6:g} us per controller decision",
    EMULATOR: "the emulator's measured fixed costs at its scaled link (cross-validation)",
}


def costs_of(name: str) -> Mapping[str, float]:
    """The fixed costs of cost model ``name`` (``fabric`` or ``emulator``)."""
    try:
        return COST_MODELS[name]
    except KeyError:
        raise ValueError(f"unknown cost model {name!r}; choose from "
                         f"{', '.join(COST_MODELS)}") from None


def network_model(link_mbps: float, latency_us: float,
                  costs: Mapping[str, float] = FABRIC_COSTS) -> NetworkModel:
    """The model for links of ``link_mbps`` and ``latency_us`` with ``costs`` (as above)."""
    return NetworkModel(
        link_bps=link_mbps * 1e6,
        latency_s=latency_us * 1e-6 + costs.get("extra_latency_s", 0.0),
        **{k: costs[k] for k in ("goodput", "control_s", "control_jitter_s", "connect_s",
                                 "step_s", "finish_s", "switch_overhead_s") if k in costs})
