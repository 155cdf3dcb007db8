"""Fidelity guard: is the emulation measuring the network, or the machine's CPU limits?

During a run a :class:`CpuSampler` thread reads, with psutil, the machine's CPU use and that of
the emulator's processes (Open vSwitch's ``ovs-vswitchd``, the OCS app, the rank replayers).
After the run :func:`judge` weighs the run's :class:`RunEvidence` against what was configured: a
run is ``degraded`` when the CPU was saturated, the hypervisor stole the CPU, collectives moved
their bytes markedly slower than the configured link rate (median or low tail) or faster than
it (the links were not shaped), calls lost bytes, late light from the OCS may have moved the
measured figures past their limits, light came early, the OCS app waited a delay the experiment
did not configure, or switches went missing (:mod:`testbed.metrics.darktime`); the summary says
why and whom it blames (:class:`Verdict`):

* ``machine`` -- the CPU was saturated or stolen (and slow collectives or overrunning dark
  periods on such a machine are its doing too), or dark periods overran while threads waited
  for a core (CPU pressure, :data:`CPU_PRESSURE_PCT`): the emulation could not keep up, rerun
  on a quieter machine or with slower links;
* ``quota`` -- the ranks' own CPU quota (``run.rank_cpu_quota``, :mod:`emulator.cpuquota`) held
  them back materially (:data:`QUOTA_THROTTLED_SHARE` of its periods) and the iterations took
  longer than modelled beyond :data:`MODEL_AGREEMENT` (this blame goes before the machine's),
  or their collectives were slow on an otherwise idle machine: the workload itself ran slower
  than modelled; raise the quota or turn it off (the fabric is not to blame, nor the machine);
* ``run`` -- calls lost bytes, collectives were slow or dark periods overran on a quiet machine
  (no saturation, steal or CPU pressure), the links were not shaped, light came early, the app's
  delay is not the configured one, or the OCS app and the controller disagree on the switches:
  no load explains these; the emulator, the replayer or the controller misbehaved;
* ``none`` -- the run is ``ok``.

A check with nothing to judge says so (``fidelity_unrated``), whatever the verdict: a run
without a ring collective long enough to rate has its throughput ``unrated``; a run whose
measured iterations hold fewer than :data:`MIN_CPU_SAMPLES` CPU samples (or whose samples cover
less than :data:`MIN_CPU_COVERAGE` of them) has its CPU ``unrated``: the CPU rules (saturation,
steal) judge only from samples taken inside the measured iterations, never from the start-up
or the warm-up, and never call a run saturated on fewer samples.

A degraded run is never presented as a clean result; the emulation tests never skip on a
verdict (``tests/emulation/conftest.py``). A simulated run is not judged at all: its verdict is
``simulated`` (:data:`SIMULATED`).

Calibration (:func:`calibrated_link_mbps`) picks the emulated per-port rate for this machine.
Measured on the 2-core development VM with the userspace datapath: one TCP flow through one OVS
bridge reaches ~420 Mbit/s, but 16 replayers sharing the cores with vswitchd kept
8 Mbit/s links (128 Mbit/s in all) at 74 % of the configured rate, so the emulator budgets
``AGGREGATE_MBPS_PER_CORE`` of rail traffic per core and shares it among the ranks that may
send at once (every rank, in the worst phase). The byte scale then follows as link rate over
the modelled rail rate, so transfer times stay real.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from emulator.naming import MAX_EMULATED_RANKS
from testbed.metrics.callcost import CallCostBound
from testbed.metrics.darktime import DarkCheck, OverrunBound

AGGREGATE_MBPS_PER_CORE = 50.0
MIN_LINK_MBPS = 2.0
#: Ceiling of the calibrated link rate (not a limit of the emulator: that is
#: :data:`emulator.topo.EMULATOR_MAX_LINK_MBPS`).
CALIBRATED_MAX_LINK_MBPS = 200.0
CPU_SATURATED_PCT = 92.0
#: Mean share of CPU time the hypervisor gave to other guests (steal) above which the run is
#: degraded: on a shared VM host the emulated links then run below their rate while the guest's
#: own CPU use looks moderate (measured on this 2-core VM, 4 ranks at 8 Mbit/s: 14 % steal left
#: iterations as on a quiet host, 30 % made them 1.4x as long, 47 % 2-3x).
CPU_STEAL_PCT = 20.0
#: Share of the run's time during which some thread waited for a core (Linux pressure stall
#: information, ``/proc/pressure/cpu``) above which an overrun of the OCS's dark periods is the
#: machine's: ovs-vswitchd and the OCS app's os-ken threads are ordinary threads, and the
#: app's confirmation of a switch waits for each of them in turn. Measured on this 2-core
#: machine (``docs/validation.md``, "The fidelity verdict"): an emulated run makes pressure of
#: its own, 10-42 % for the demo's 16 ranks and 11-25 % for tiny.yaml's 4 with no other work
#: running, so the former 10 % blamed almost every overrun on the machine; the failover tests
#: beside two busy loops saw 21-98 % (median ~60 %, their CPU saturated as well). Above 50 %,
#: other work took the cores; below it, an overrun is the emulation's own (the run's).
CPU_PRESSURE_PCT = 50.0
PSI_CPU = Path("/proc/pressure/cpu")
#: Achieved over configured link rate of the ring collectives: the median must reach
#: THROUGHPUT_RATIO_MIN and the low tail (p10) THROUGHPUT_RATIO_P10_MIN (slower calls stretch
#: the iterations); a median above THROUGHPUT_RATIO_MAX means the links were not shaped.
THROUGHPUT_RATIO_MIN = 0.7
THROUGHPUT_RATIO_P10_MIN = 0.5
THROUGHPUT_RATIO_MAX = 1.05
RANK_MEMORY_MB = 70.0  # resident memory of one replayer (Python, ZeroMQ, threads), measured
#: Ranks per core at wall-clock speed (time dilation 1), beyond which timed waits lose
#: accuracy. What limits a core is the ranks' work per wall second (calls, switches, bytes),
#: and at time dilation k each rank asks 1/k of it: the cap is MAX_RANKS_PER_CORE x k
#: (:func:`ranks_per_core_cap`; issue 35: 64 ranks at k = 8 used 0.34 cores for their ranks).
MAX_RANKS_PER_CORE = 24


def ranks_per_core_cap(time_dilation: float = 1.0) -> float:
    """Ranks one core can host at ``time_dilation``: their load per wall second falls by it."""
    return MAX_RANKS_PER_CORE * max(1.0, time_dilation)


def calibrated_link_mbps(num_ranks: int, cpus: int | None = None) -> float:
    """Per-port rate (Mbit/s) that keeps the data plane inside this machine's CPU budget."""
    cores = cpus or os.cpu_count() or 1
    budget = AGGREGATE_MBPS_PER_CORE * cores
    rate = budget / max(1, num_ranks)
    rate = max(MIN_LINK_MBPS, min(CALIBRATED_MAX_LINK_MBPS, rate))
    return float(round(rate, 1))


@dataclass(frozen=True)
class CapacityProblem:
    """Why a configuration cannot be hosted, with what to do instead."""

    message: str


def capacity_problem(num_ranks: int, cpus: int | None = None,
                     available_mb: float | None = None, time_dilation: float = 1.0
                     ) -> CapacityProblem | None:
    """None if ``num_ranks`` rank processes fit this machine at ``time_dilation``, else the
    limit and a way out."""
    cores = cpus or os.cpu_count() or 1
    avail = available_mb if available_mb is not None else (
        psutil.virtual_memory().available / 2**20)
    hints = ("use fewer ranks (a smaller cluster), or the simulation backend "
             "(--backend sim), which has no such limit")
    if num_ranks > MAX_EMULATED_RANKS:
        return CapacityProblem(f"{num_ranks} ranks exceed the emulator's limit of "
                               f"{MAX_EMULATED_RANKS} ranks per network; {hints}")
    cap = ranks_per_core_cap(time_dilation)
    if num_ranks > cap * cores:
        need = num_ranks / (MAX_RANKS_PER_CORE * cores)
        return CapacityProblem(
            f"{num_ranks} ranks on {cores} cores exceed {cap:g} ranks per core at time "
            f"dilation {time_dilation:g} ({MAX_RANKS_PER_CORE} x the factor), beyond which "
            f"timed waits lose accuracy; {hints}, or a time dilation >= {need:.3g} "
            "(run.time_dilation)")
    need = num_ranks * RANK_MEMORY_MB + 300
    if need > 0.8 * avail:
        return CapacityProblem(
            f"{num_ranks} ranks need about {need:.0f} MB but {avail:.0f} MB are available "
            f"(limit: {int((0.8 * avail - 300) // RANK_MEMORY_MB)} ranks); {hints}")
    return None


@dataclass
class CpuSample:
    """One reading of the CPU, over the interval ``(t_start_s, t_s]`` (wall clock, as the
    ranks' records): the machine's busy and stolen share, the emulator's processes (% of one
    core), each component's, and whether every process read had been read before
    (``complete``: a pid's first read only starts its count, so its share there is 0)."""

    t_s: float
    machine_pct: float
    emulator_pct: float
    steal_pct: float = 0.0  # time the hypervisor ran other guests (Linux VMs; else 0)
    pressure_total_us: int | None = None  # PSI "some" stall total (None: no PSI)
    component_pct: dict[str, float] = field(default_factory=dict)  # name -> its processes' %
    t_start_s: float | None = None  # None: unknown (the interval before t_s)
    complete: bool = True


#: The fewest samples inside the measured iterations on which the CPU rules judge. One
#: interval's burst (a rank's start-up, an import, a flush) lifts one sample to 100 %; with
#: three, the mean exceeds :data:`CPU_SATURATED_PCT` (92 %) only if every sample exceeds 76 %,
#: that is when the whole span was busy and not one moment of it. Fewer: ``unrated``.
MIN_CPU_SAMPLES = 3
#: The share of the measured iterations the samples must cover (the rest falls between the
#: span's edges and the first and last whole sample).
MIN_CPU_COVERAGE = 0.5
#: Sampling interval bounds (s): at most 0.5 s (long runs); at least 0.1 s, where the kernel's
#: 10 ms CPU-time ticks still give 5 % resolution per sample on 2 cores.
CPU_INTERVAL_MAX_S = 0.5
CPU_INTERVAL_MIN_S = 0.1


def cpu_interval_s(measured_s: float | None) -> float:
    """The sampling interval for a run whose measured iterations should last ``measured_s``
    (wall seconds, e.g. the modelled step times the iterations): a tenth of it, within
    [:data:`CPU_INTERVAL_MIN_S`, :data:`CPU_INTERVAL_MAX_S`], so that a short run still gets
    :data:`MIN_CPU_SAMPLES` whole samples inside its measured iterations when it can."""
    if not measured_s or measured_s <= 0:
        return CPU_INTERVAL_MAX_S
    return min(CPU_INTERVAL_MAX_S, max(CPU_INTERVAL_MIN_S, measured_s / 10.0))


def cpu_pressure_total_us(path: Path = PSI_CPU) -> int | None:
    """Microseconds some thread has waited for a core since boot (PSI), None if unavailable."""
    try:
        text = path.read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("some "):
            fields = dict(f.split("=", 1) for f in line.split()[1:] if "=" in f)
            return int(fields["total"]) if "total" in fields else None
    return None


@dataclass
class CpuSampler:
    """Samples machine and emulator CPU every ``interval_s`` in a background thread.

    ``pids`` names the emulator's processes (read at every sample, so processes may come and
    go); the processes known at :meth:`start` are read there, a later pid's first sample only
    starts its count (that sample is not ``complete``).
    ``components`` (optional) names the run's parts (ranks, controller, each ovs-vswitchd, OCS
    app) by their processes, so the summary can say which part took the CPU.
    """

    pids: Callable[[], Sequence[int]]
    interval_s: float = 0.5
    components: Callable[[], Mapping[str, Sequence[int]]] | None = None
    samples: list[CpuSample] = field(default_factory=list)
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None
    _procs: dict[int, psutil.Process] = field(default_factory=dict)
    _t_last: float | None = None

    def start(self) -> CpuSampler:
        """Start sampling; every process already known is read once now, so that the first
        sample holds its CPU over the whole first interval."""
        psutil.cpu_times_percent(None)
        read: dict[int, tuple[float, bool]] = {}
        for pid in self._all_pids():
            self._percent(pid, read)
        self._t_last = time.time()
        self._thread = threading.Thread(target=self._loop, daemon=True, name="cpu-sampler")
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5.0)

    def _all_pids(self) -> list[int]:
        parts = self.components() if self.components else {}
        return [*self.pids(), *(pid for pids in parts.values() for pid in pids)]

    def _percent(self, pid: int, read: dict[int, tuple[float, bool]]) -> tuple[float, bool]:
        """``pid``'s CPU % since its previous read, and whether there was one (its first read
        gives 0: it only starts the count); read once per sample."""
        if pid in read:
            return read[pid]
        proc = self._procs.get(pid)
        pct, known = 0.0, proc is not None
        try:
            if proc is None:
                self._procs[pid] = psutil.Process(pid)
                self._procs[pid].cpu_percent(None)
            else:
                pct = proc.cpu_percent(None)
        except psutil.Error:
            self._procs.pop(pid, None)
            known = True  # gone: its share is over, not unknown
        read[pid] = (pct, known)
        return read[pid]

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            read: dict[int, tuple[float, bool]] = {}
            total = sum(self._percent(pid, read)[0] for pid in self.pids())
            parts = {name: sum(self._percent(pid, read)[0] for pid in pids)
                     for name, pids in (self.components() if self.components else {}).items()}
            # one read of the machine's counters: busy as psutil.cpu_percent counts it
            times = psutil.cpu_times_percent(None)
            busy = 100.0 - times.idle - getattr(times, "iowait", 0.0)
            steal = float(getattr(times, "steal", 0.0))
            now = time.time()
            self.samples.append(CpuSample(now, busy, total, steal, cpu_pressure_total_us(),
                                          parts, self._t_last,
                                          all(known for _pct, known in read.values())))
            self._t_last = now

    def summary(self, window: tuple[float, float] | None = None) -> dict[str, Any]:
        """The CPU figures the verdict rests on: over the samples that lie wholly inside
        ``window`` (the measured iterations, wall clock), or over every sample without one.
        ``rated`` is False, with ``unrated`` saying why and no machine figure, when fewer than
        :data:`MIN_CPU_SAMPLES` samples or less than :data:`MIN_CPU_COVERAGE` of the window
        lie inside it: the rules then judge nothing rather than a moment of the run."""
        taken = len(self.samples)
        used = self.samples if window is None else [
            s for s in self.samples if s.t_start_s is not None
            and window[0] <= s.t_start_s and s.t_s <= window[1]]
        out: dict[str, Any] = {"samples": len(used), "samples_taken": taken,
                               "interval_s": self.interval_s, "cores": os.cpu_count()}
        if window is not None:
            span = max(0.0, window[1] - window[0])
            covered = sum(s.t_s - (s.t_start_s or s.t_s) for s in used)
            out.update(measured_span_s=round(span, 3), covered_s=round(covered, 3))
            if len(used) < MIN_CPU_SAMPLES or covered < MIN_CPU_COVERAGE * span:
                out.update(rated=False, unrated=(
                    f"cpu: {len(used)} sample(s) of {self.interval_s:g} s lie inside the "
                    f"measured iterations ({span:.2f} s), covering {covered:.2f} s; the CPU "
                    f"rules need {MIN_CPU_SAMPLES} covering half of them (run more "
                    "iterations)"))
                return out
        if not used:
            return out
        machine = [s.machine_pct for s in used]
        emu = [s.emulator_pct for s in used]
        steal = [s.steal_pct for s in used]
        out.update({"rated": True, "machine_cpu_mean_pct": sum(machine) / len(machine),
                    "machine_cpu_max_pct": max(machine),
                    "machine_steal_mean_pct": sum(steal) / len(steal),
                    "machine_cpu_pressure_pct": _pressure_pct(used),
                    "emulator_cpu_mean_pct": sum(emu) / len(emu),
                    **_components_summary(used)})
        return out


def _components_summary(samples: Sequence[CpuSample]) -> dict[str, Any]:
    """Mean cores per component over the ``complete`` samples (a component absent from a
    sample counts 0 there), the machine's busy cores over the same samples, and the
    difference (``other_cores_mean``): other processes, and kernel work (the veths'
    softirqs) charged to none of the run's processes."""
    whole = [s for s in samples if s.complete]
    names = sorted({name for s in whole for name in s.component_pct})
    if not names:
        return {}
    cores = os.cpu_count() or 1
    parts = {name: round(sum(s.component_pct.get(name, 0.0) for s in whole)
                         / len(whole) / 100.0, 3) for name in names}
    machine = sum(s.machine_pct for s in whole) / len(whole) / 100.0 * cores
    return {"component_cores_mean": parts, "machine_cores_mean": round(machine, 3),
            "other_cores_mean": round(machine - sum(parts.values()), 3),
            "component_samples": len(whole)}


def _pressure_pct(samples: Sequence[CpuSample]) -> float | None:
    """Share (%) of the sampled time during which some thread waited for a core."""
    first, last = samples[0], samples[-1]
    if first.pressure_total_us is None or last.pressure_total_us is None \
            or last.t_s <= first.t_s:
        return None
    stalled_s = (last.pressure_total_us - first.pressure_total_us) / 1e6
    return min(100.0, 100.0 * stalled_s / (last.t_s - first.t_s))  # clocks read apart


def vswitchd_pids(instances: Sequence[int] = ()) -> list[int]:
    """Open vSwitch's daemons (read only: we sample them, never signal them): the run's own
    per-rail ``instances`` when it has them (:mod:`emulator.ovs_instance`), else the system
    daemon, from its pid file in ``OVS_RUNDIR`` when set, as Open vSwitch's own tools look."""
    if instances:
        return list(instances)
    rundir = os.environ.get("OVS_RUNDIR")
    paths = ((f"{rundir}/ovs-vswitchd.pid",) if rundir else
             ("/var/run/openvswitch/ovs-vswitchd.pid", "/run/openvswitch/ovs-vswitchd.pid"))
    for path in paths:
        try:
            return [int(Path(path).read_text().strip())]
        except (OSError, ValueError):
            continue
    return []


MACHINE = "machine"
RUN = "run"
QUOTA = "quota"
#: Share of the CFS periods in which the ranks' CPU quota ran out (``nr_throttled /
#: nr_periods`` of its cgroup) from which it held them back materially. A first setting, not
#: yet measured against runs: a quota that bites in one period of twenty already stretches the
#: ranks' bursts (start-up, ring steps), each throttled period up to the rest of its 100 ms.
QUOTA_THROTTLED_SHARE = 0.05
#: How far an emulated iteration may exceed what it was expected to take (the modelled
#: electrical step plus the switching it waited for) before the quota is named for it: the bound
#: to which emulated and simulated iterations agree (``bench crossval``, 10 %).
MODEL_AGREEMENT = 0.10


@dataclass(frozen=True)
class Reason:
    """One reason a run is degraded, and whom it blames: :data:`MACHINE`, :data:`QUOTA` or
    :data:`RUN`.

    ``timing``: the reason is a measured time (late light, slow collectives), which a loaded
    machine can stretch; every other reason (lost bytes, a wrong or short delay, early light,
    missing switches, unshaped links) is a fault whatever the load.
    """

    blame: str
    text: str
    timing: bool = False


@dataclass(frozen=True)
class Verdict:
    """``fidelity`` is ``ok``, ``degraded`` (with reasons) or ``simulated`` (nothing measured);
    ``unrated`` names the checks that had nothing to judge (an ``ok`` run says so)."""

    fidelity: str
    reasons: tuple[Reason, ...] = ()
    unrated: tuple[str, ...] = ()

    @property
    def blame(self) -> str:
        """``run`` if any reason blames the run, else ``quota`` if any blames the ranks' CPU
        quota, else ``machine`` if degraded, else ``none``."""
        for blame in (RUN, QUOTA):
            if any(r.blame == blame for r in self.reasons):
                return blame
        return MACHINE if self.reasons else "none"

    def to_summary(self) -> dict[str, Any]:
        """The summary's keys: ``fidelity``, ``fidelity_reasons`` (texts), ``fidelity_blame``,
        ``fidelity_causes`` (each reason with its blame) and ``fidelity_unrated`` (checks with
        nothing to judge, each with why)."""
        return {"fidelity": self.fidelity, "fidelity_reasons": [r.text for r in self.reasons],
                "fidelity_blame": self.blame,
                "fidelity_causes": [{"blame": r.blame, "reason": r.text, "timing": r.timing}
                                    for r in self.reasons],
                "fidelity_unrated": list(self.unrated)}


#: the sim backend's verdict: a virtual clock has no CPU limit to check, so nothing is judged
SIMULATED = Verdict("simulated")

#: How the unrated throughput check reads in ``fidelity_unrated``.
UNRATED_THROUGHPUT = ("throughput: no ring collective long enough to rate against the link "
                      "rate")


@dataclass(frozen=True)
class RunEvidence:
    """What a run's verdict rests on: the CPU samples (:meth:`CpuSampler.summary`), delivery,
    the ring collectives' achieved rates against the link rate (None: no call long enough to
    rate), the OCS's dark periods and the bound their overruns put on the figures (None: not an
    emulated OCS run). Built in one place, :func:`testbed.results.summary.run_evidence`, from
    what the backend observed (:class:`testbed.results.summary.Observed`): a new piece of
    evidence is a field here, a line there and a rule in :func:`judge`."""

    cpu: Mapping[str, Any] = field(default_factory=dict)
    calls: int = 0
    calls_delivered: int = 0
    throughput_ratio_median: float | None = None
    throughput_ratio_p10: float | None = None
    dark: DarkCheck | None = None
    overrun: OverrunBound | None = None
    #: the ranks' CPU quota and its throttling (the summary's ``rank_cpu_quota``; None: none)
    quota: Mapping[str, Any] | None = None
    iteration_s: float | None = None  # measured, mean
    expected_iteration_s: float | None = None  # modelled step + exposed switching (None: no model)
    #: what the capture of the OCS ports contradicts (early light, frames at a non-peer, an app
    #: record the wire disagrees with: :class:`testbed.metrics.wire.WireVerdict`)
    wire_faults: tuple[str, ...] = ()
    wire_timing_faults: tuple[str, ...] = ()  # the same, where a busy switch can be the cause
    call_cost: CallCostBound | None = None  # the emulator's per-call costs (None: not measured)
    #: TCP's wall-clock timers that fired in the measured iterations
    #: (:func:`testbed.metrics.tcpstats.stall_fault`'s words; None: none fired or not counted)
    tcp_stall: str | None = None


def quota_throttled(quota: Mapping[str, Any] | None) -> float | None:
    """The share of periods in which the ranks' quota ran out, when it is at least
    :data:`QUOTA_THROTTLED_SHARE` (else None: no quota, or it did not bite materially)."""
    share = (quota or {}).get("throttled_share")
    return share if share is not None and share >= QUOTA_THROTTLED_SHARE else None


def _quota_words(quota: Mapping[str, Any], share: float) -> str:
    return (f"the ranks' CPU quota (run.rank_cpu_quota {quota.get('setting')}: "
            f"{quota.get('fraction', 0):.2f} of the machine, {quota.get('cores', 0):g} cores) "
            f"held them back in {100 * share:.0f} % of its periods")


def quota_reason(quota: Mapping[str, Any] | None, iteration_s: float | None,
                 expected_s: float | None) -> Reason | None:
    """The reason for iterations the ranks' own quota made longer than modelled: the quota
    throttled them materially and the measured iteration exceeds the expected one (modelled
    step plus the switching it waited for) by more than :data:`MODEL_AGREEMENT`."""
    share = quota_throttled(quota)
    if share is None or quota is None or iteration_s is None or not expected_s:
        return None
    excess = iteration_s / expected_s - 1.0
    if excess <= MODEL_AGREEMENT:
        return None
    return Reason(QUOTA, f"{_quota_words(quota, share)} ({quota.get('throttled_s', 0):.1f} s "
                  f"held back) and an iteration took {iteration_s:.3f} s against the "
                  f"{expected_s:.3f} s modelled with its switching ({100 * excess:+.0f} %, "
                  f"tolerance {100 * MODEL_AGREEMENT:.0f} %): the workload itself ran slower "
                  "than modelled; raise run.rank_cpu_quota or set it to null", timing=True)


def judge(ev: RunEvidence) -> Verdict:
    """``ok``, or ``degraded`` with each reason and whom it blames (see the module docstring)."""
    reasons = []
    cpu = ev.cpu
    mean = cpu.get("machine_cpu_mean_pct")
    saturated = mean is not None and mean > CPU_SATURATED_PCT
    if saturated:
        reasons.append(Reason(MACHINE, f"the machine's CPU was saturated (mean {mean:.0f} %"
                              f"{_others_words(cpu)}): lower network.link_mbps or use fewer "
                              "ranks", timing=True))
    steal = cpu.get("machine_steal_mean_pct")
    stolen = steal is not None and steal > CPU_STEAL_PCT
    if stolen:
        reasons.append(Reason(MACHINE, f"the hypervisor gave {steal:.0f} % of the CPU time to "
                              "other guests (steal): this VM's host is busy; run again when it "
                              "is quiet", timing=True))
    slowed = quota_reason(ev.quota, ev.iteration_s, ev.expected_iteration_s)
    if slowed is not None:
        reasons.append(slowed)
    share = quota_throttled(ev.quota)
    reasons += _throughput_reasons(ev.throughput_ratio_median, ev.throughput_ratio_p10,
                                   busy=saturated or stolen,
                                   quota=_quota_words(ev.quota, share)
                                   if ev.quota is not None and share is not None else None)
    if ev.calls_delivered < ev.calls:
        reasons.append(Reason(RUN, f"{ev.calls - ev.calls_delivered} of {ev.calls} calls did "
                              "not deliver every byte"))
    overrun = ev.overrun.exceeded() if ev.overrun is not None else None
    if overrun:
        reasons.append(overrun_reason(overrun, cpu))
    costly = ev.call_cost.exceeded() if ev.call_cost is not None else None
    if costly:
        reasons.append(call_cost_reason(costly, cpu))
    if ev.dark is not None:
        reasons += [Reason(RUN, text) for text in ev.dark.run_faults()]
    reasons += [Reason(RUN, text) for text in ev.wire_faults]
    reasons += [overrun_reason(text, cpu) for text in ev.wire_timing_faults]
    if ev.tcp_stall is not None:
        reasons.append(overrun_reason(ev.tcp_stall, cpu))
    unrated: tuple[str, ...] = ((UNRATED_THROUGHPUT,) if ev.throughput_ratio_median is None
                                else ())
    if cpu.get("rated") is False:
        unrated += (str(cpu.get("unrated") or "cpu: too few samples"),)
    return Verdict("degraded" if reasons else "ok", tuple(reasons), unrated)


def _others_words(cpu: Mapping[str, Any]) -> str:
    """How much of the machine's busy CPU the run's own parts took, when sampled (so that
    saturation by other processes reads as such): ``; the run's parts took 0.56 of 2.00 busy
    cores, other processes and kernel work 1.44``."""
    machine, other = cpu.get("machine_cores_mean"), cpu.get("other_cores_mean")
    if machine is None or other is None:
        return ""
    return (f"; the run's parts took {machine - other:.2f} of {machine:.2f} busy cores, other "
            f"processes and kernel work {other:.2f}")


def overrun_reason(overrun: str, cpu: Mapping[str, Any]) -> Reason:
    """The reason for dark periods that overran, blamed on the machine when its CPU was
    saturated, stolen or contended (threads waited for a core), else on the run."""
    mean, steal = cpu.get("machine_cpu_mean_pct"), cpu.get("machine_steal_mean_pct")
    pressure = cpu.get("machine_cpu_pressure_pct")
    contended = pressure is not None and pressure > CPU_PRESSURE_PCT
    if (mean is not None and mean > CPU_SATURATED_PCT) or (
            steal is not None and steal > CPU_STEAL_PCT) or contended:
        text = f"{overrun}: Open vSwitch and the OCS app waited for the CPU"
        if contended:
            text += f" (some thread waited for a core {pressure:.0f} % of the run)"
        return Reason(MACHINE, text, timing=True)
    if cpu.get("rated") is False:
        return Reason(RUN, f"{overrun}; the machine's CPU is unrated (too few samples inside "
                      "the measured iterations), so no load is known to explain it",
                      timing=True)
    return Reason(RUN, f"{overrun} although the machine's CPU was neither saturated, stolen "
                  "nor contended", timing=True)


def call_cost_reason(text: str, cpu: Mapping[str, Any]) -> Reason:
    """The reason for per-call costs past their limit: the machine's when its CPU was
    saturated, stolen or contended (the costs are CPU time), else the run's (too small a
    time dilation for its calls)."""
    mean, steal = cpu.get("machine_cpu_mean_pct"), cpu.get("machine_steal_mean_pct")
    pressure = cpu.get("machine_cpu_pressure_pct")
    if (mean is not None and mean > CPU_SATURATED_PCT) or (
            steal is not None and steal > CPU_STEAL_PCT) or (
            pressure is not None and pressure > CPU_PRESSURE_PCT):
        return Reason(MACHINE, f"{text}: the machine's CPU was busy", timing=True)
    return Reason(RUN, text, timing=True)


def add_reason(summary: dict[str, Any], reason: Reason) -> None:
    """Degrade a judged run's ``summary`` by one more ``reason`` (once: a reason already there
    is not added again); the verdict keys stay as :meth:`Verdict.to_summary` writes them."""
    if summary.get("fidelity") not in ("ok", "degraded"):
        return  # simulated, or not judged: nothing to degrade
    causes = list(summary.get("fidelity_causes") or [])
    if any(c.get("reason") == reason.text for c in causes):
        return
    causes.append({"blame": reason.blame, "reason": reason.text, "timing": reason.timing})
    verdict = Verdict("degraded", tuple(Reason(c["blame"], c["reason"], bool(c.get("timing")))
                                        for c in causes),
                      tuple(summary.get("fidelity_unrated") or ()))
    summary.update(verdict.to_summary())


def _throughput_reasons(median: float | None, p10: float | None, *, busy: bool,
                        quota: str | None = None) -> list[Reason]:
    """Collectives faster than the link (shaping failed: always the run's) or slower than it,
    in the median or in the low tail (the machine's when its CPU was busy, else the ranks'
    quota's when it held them back materially, ``quota`` saying how, else the run's)."""
    if median is None:
        return []
    if median > THROUGHPUT_RATIO_MAX:
        return [Reason(RUN, f"collectives moved their bytes at {100 * median:.0f} % of the "
                       f"configured link rate (median), above {100 * THROUGHPUT_RATIO_MAX:.0f} "
                       "%: the links were not shaped")]
    slow = []
    if median < THROUGHPUT_RATIO_MIN:
        slow.append(f"collectives reached only {100 * median:.0f} % of the configured link "
                    "rate (median)")
    if p10 is not None and p10 < THROUGHPUT_RATIO_P10_MIN:
        slow.append(f"one collective in ten reached {100 * p10:.0f} % of the configured link "
                    f"rate or less (p10, limit {100 * THROUGHPUT_RATIO_P10_MIN:.0f} %)")
    if not slow:
        return []
    text = "; ".join(slow)
    if busy:
        return [Reason(MACHINE, f"{text}: lower network.link_mbps", timing=True)]
    if quota is not None:
        return [Reason(QUOTA, f"{text}: {quota}; raise run.rank_cpu_quota or set it to null",
                       timing=True)]
    return [Reason(RUN, f"{text} although the machine's CPU was neither saturated nor stolen",
                   timing=True)]
