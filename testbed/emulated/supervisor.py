"""Follows an emulated job: progress, failures, injected faults and spare-GPU failover.

:class:`Supervisor` starts one replayer per rank (and a standby replayer per spare), then polls
every :data:`LOOP_S`: process exits, the ranks' records, the controller's heartbeat losses,
faults that are due. What happens when a rank fails depends on the run's policy:

* no failover (no spares, no ``--no-spares``): the run ends with :class:`RankFailed` naming the
  rank and its last op, as it always did;
* ``spares``: the rank moves to a spare GPU (:meth:`Supervisor._failover`): the other ranks
  abandon the interrupted iteration (control file: ``abort``), the job is unregistered, the failed
  host's rail links go down, the spare takes the rank's identity on the rails (its MACs and
  address: :meth:`emulator.hostnet.HostRouter.assign`), the job is registered again as a new
  epoch in which the rank owns the spare's ports (Opus rewires the circuits that touch them on
  first use), and every rank resumes from the last iteration all of them completed (control
  file: ``run``; the standby replayer on the spare takes the rank's plan). A failure with no
  spare left on the rank's rail ends the run naming the rank;
* ``restart`` (``--no-spares``): every rank process is stopped and started again from the last
  completed iteration on healthy hosts, after ``failover.migration_delay_s``: the cost of moving
  a job to a new rack.

With ``run.ranks_per_process: server`` (no failover: :mod:`testbed.experiment.rankprocs`) one
process hosts each server's ranks (:mod:`testbed.emulated.serverhost`), started in its first
rank's host; every host of the server holds that process, its log is ``server<S>.log``.

Detection: a rank's process exiting (a crash, an injected kill, the NIC watchdog's exit on lost
carrier) is seen within :data:`LOOP_S`; a rank that stops without exiting (``hang``) is seen when
its heartbeats stop for ``failover.heartbeat_timeout_s`` (the controller's ``rank_lost``) and its
process is stopped; a process that runs but was too starved of CPU to send heartbeats is no
failure: every rank resumes in place (the controller had refused its peers' calls). Both
times are logged: ``failure_detected`` says which one fired, ``heartbeat_lost`` when the
heartbeats would have told. Every step is an event in the controller's log with its time
(``fault``, ``failure_detected``, ``epoch_aborted``, ``spare_assigned``, ``ranks_resumed``,
``migration``, ``host_repaired``, ``no_spare``).
"""

from __future__ import annotations

import contextlib
import json
import queue
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import IO, Any

from controller.artifact_client import rank_comms
from controller.drivers.faults import OcsFaults
from controller.events import EventLog
from controller.job import JobSpec, RankPorts
from controller.railstate import RAIL_STATE
from controller.service import ControllerClient
from emulator import naming, runstate
from emulator.netns import netns_path
from testbed.emulated.gate import RunnerGate
from testbed.emulated.planes import RankRelays
from testbed.errors import RankFailed, RunError, RunRefused, Say
from testbed.experiment.faults import RANK_FAULTS, Fault
from testbed.experiment.prepare import Prepared
from testbed.experiment.rankprocs import SERVER, server_groups
from testbed.failover import Host, epoch_job_id, resume_iteration, take_over
from testbed.plan.rankplan import RankPlan, ReplayPart, StandbyPlan, replay_io_timeout_s
from testbed.plan.replay import ReplayPlan

LOOP_S = 0.02
READ_S = 0.1
REPLAYER_PORT = 7100


@dataclass
class Failure:
    """A rank found failed: when, how, and what it said last."""

    rank: int
    host: int
    t_s: float
    via: str  # "exit" | "heartbeat"
    detail: str


@dataclass
class _Host:
    proc: Any = None
    rank: int | None = None  # the rank it carries; None: a standby spare, or failed
    failed_s: float | None = None
    broken: bool = False  # an OCS port of it FAILED: never used again


def process_stopped(pid: int) -> bool:
    """True if ``pid`` is stopped (SIGSTOP: a hang) or a zombie, from ``/proc/<pid>/stat``."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("T", "t", "Z")


class Supervisor:
    """Launch and follow one emulated job (see the module docstring)."""

    def __init__(self, *, net: Any, endpoint: str, plan: ReplayPlan, job: JobSpec, prep: Prepared,
                 out: Path, events: EventLog, ocs_faults: OcsFaults, say: Say,
                 fronts: Any = None, artifact: Any = None,
                 relays: Mapping[int, RankRelays] | None = None) -> None:
        self.net = net
        self.relays = relays or {}  # the static plane's paths per rank (issue 40)
        self.spec = net.spec
        self.endpoint = endpoint
        self.plan = plan
        self.job = job
        self.base_job = job.job_id
        self.prep = prep
        self.cfg = prep.config
        self.out = out
        self.events = events
        self.ocs_faults = ocs_faults
        self.fronts = fronts
        self.artifact = artifact  # the artifact protocol's gateway the ranks speak to, or None
        self.say = say
        cfg = self.cfg
        failures = sum(1 for f in cfg.faults if f.kind in RANK_FAULTS or f.kind == "port_failed")
        # spares (or planned failures: failover.repair_s may refill an empty pool)
        self.policy = ("restart" if cfg.no_spares else "spares"
                       if self.spec.spares or failures else None)
        self.per_server = cfg.rank_processes == SERVER
        if self.per_server and self.policy is not None:  # the config refuses this first
            raise RunRefused(f"{cfg.source}: run.ranks_per_process: server cannot run with "
                             f"failover ({self.policy}); use rank or auto")
        # where a rank's process writes its output (server<S>.log when it hosts a server)
        self.rank_logs = {r: out / "ranks" / f"rank{r}.log" for r in range(self.spec.num_ranks)}
        self.epoch = 0
        self.hosts = {h: _Host(rank=h if h < self.spec.num_ranks else None)
                      for h in range(self.spec.num_hosts)}
        self.logs: list[IO[str]] = []
        self.control = out / "ranks" / "control.json"
        self.lost: queue.Queue[tuple[str, int, float]] = queue.Queue()
        self.recoveries = 0
        # each injected failure may need a recovery, each spare (or repair) allows one more
        # (and a few false heartbeat alarms on a starved machine, resumed in place)
        self.max_recoveries = failures + 3 + (len(self.spec.spares)
                                              if self.policy == "spares" else 0)
        # progress of the current epoch: rank -> iterations completed
        self.done = dict.fromkeys(range(self.spec.num_ranks), 0)
        self.ever_done = dict.fromkeys(range(self.spec.num_ranks), 0)
        self.last_op: dict[int, str] = {}
        self.offsets: dict[Path, int] = {}
        self.fired: set[int] = set()
        self.stalls: dict[int, tuple[float, str]] = {}
        self.gate: RunnerGate | None = None
        self._owned = contextlib.ExitStack()  # the gate's directory, removed at close
        self.t_launch = 0.0
        self.t_last_failure = -1.0

    # --------------------------------------------------------------- set-up

    @property
    def pids(self) -> list[int]:
        return sorted({h.proc.pid for h in self.hosts.values() if h.proc is not None})

    def _rank_plan_path(self, rank: int) -> Path:
        return self.out / "ranks" / f"rank{rank}.plan.json"

    def _failover_block(self, host: int, rank: int | None) -> dict[str, Any] | None:
        if self.policy is None:
            return None
        faults = [{"kind": f.kind, "index": f.index, "at_iteration": f.at_iteration}
                  for f in self.cfg.faults if f.kind in RANK_FAULTS and f.rank == rank
                  and f.at_iteration is not None and f.index not in self.fired]
        return {"control": str(self.control.resolve()), "host": host, "faults": faults,
                "watch_intfs": [self.spec.host_rail_intf(self.net.prefix, host, p.port_index)
                                for p in self.spec.host_ports(host)],
                "epoch": self.epoch, "start_it": 0, "job": self.job.job_id,
                "after_epoch": self.epoch}

    def _phase_barrier(self) -> bool:
        """Whether the ranks run the artifact shim's phase barrier (rail-state; with
        provisioning it waits for the answers to the ranks' predictions too)."""
        cfg = self.cfg
        return bool(cfg.rail_state_phase_barrier and cfg.effective_semantics == RAIL_STATE
                    and cfg.mode != "baseline")

    def _rail_state_ack_timeout_s(self) -> float | None:
        """How long a rank's call waits for its ack before it goes on (wall seconds: the
        settings are the dilated ones); None: it waits for the light."""
        cfg = self.cfg
        on = cfg.effective_semantics == RAIL_STATE and cfg.mode != "baseline"
        return cfg.rail_state_ack_timeout_s if on else None

    def _write_rank_plans(self) -> None:
        peers = {r: self.net.rank_address(r) for r in range(self.spec.num_ranks)}
        cfg = self.cfg
        for rank, ops in self.plan.programs.items():
            artifact = None if self.artifact is None else {
                "host": self.artifact.host, "port": self.artifact.port,
                "local_rank": rank % self.spec.gpus_per_server,
                "comms": {g: c.to_json() for g, c in rank_comms(self.job, rank).items()}}
            rank_plan = RankPlan(
                rank=rank, job=self.job.job_id, endpoint=self.endpoint, peers=dict(peers),
                records=str((self.out / "ranks" / f"rank{rank}.jsonl").resolve()),
                ack_timeout_s=cfg.ack_timeout_s,
                io_timeout_s=replay_io_timeout_s(self.prep.modeled_iteration_s),
                time_dilation=self.prep.time_dilation,
                failover=self._failover_block(rank, rank),
                replay=ReplayPart(
                    addr=self.net.rank_address(rank), port=REPLAYER_PORT,
                    iterations=cfg.total_iterations, ops=tuple(ops),
                    gate=self.gate.paths.to_json() if self.gate is not None else None,
                    artifact=artifact, phase_barrier=self._phase_barrier(),
                    phase_barrier_provisioning=self._phase_barrier()
                    and self.cfg.mode == "provisioning",
                    rail_state_ack_timeout_s=self._rail_state_ack_timeout_s(),
                    **(self.relays[rank].replay_fields() if rank in self.relays else {})))
            self._rank_plan_path(rank).write_text(json.dumps(rank_plan.to_json()))

    def _start(self, host: int, plan_path: Path, log_name: str) -> None:
        log = (self.out / "ranks" / log_name).open("a")
        self.logs.append(log)
        self.hosts[host].proc = self.net.popen_on(
            host, [sys.executable, "-m", "testbed.emulated.replayer", str(plan_path.resolve())],
            stdout=log, stderr=log)

    def _start_rank(self, rank: int, host: int, start_it: int = 0) -> None:
        path = self._rank_plan_path(rank)
        if start_it or self.epoch:
            plan = RankPlan.from_json(json.loads(path.read_text()))
            plan = replace(plan, failover={**(self._failover_block(host, rank) or {}),
                                           "start_it": start_it})
            path.write_text(json.dumps(plan.to_json()))
        self._start(host, path, f"rank{rank}.log")

    def _start_server(self, server: int, ranks: tuple[int, ...]) -> None:
        """One process for ``server``'s ranks (each in its host's namespace), started in the
        first one's host and held by all of them."""
        path = self.out / "ranks" / f"server{server}.json"
        path.write_text(json.dumps({"ranks": [
            {"rank": r, "plan": str(self._rank_plan_path(r).resolve()),
             "netns": netns_path(int(self.net.node(r).pid))} for r in ranks]}))
        log = self.out / "ranks" / f"server{server}.log"
        self.logs.append(fh := log.open("a"))
        proc = self.net.popen_on(ranks[0], [sys.executable, "-m", "testbed.emulated.serverhost",
                                            str(path.resolve())], stdout=fh, stderr=fh)
        for r in ranks:
            self.hosts[r].proc = proc
            self.rank_logs[r] = log

    def _start_standby(self, host: int) -> None:
        spare = host - self.spec.num_ranks
        name = f"spare{spare}" if spare >= 0 else f"host{host}-standby"  # a repaired host
        path = self.out / "ranks" / f"{name}.plan.json"
        block = self._failover_block(host, None)
        assert block is not None  # a standby spare runs only under a failover policy
        path.write_text(json.dumps(StandbyPlan(
            records=str((self.out / "ranks" / f"{name}.jsonl").resolve()),
            failover=block).to_json()))
        self._start(host, path, f"{name}.log")

    def launch(self) -> None:
        """Write the plans and the first control, start every rank and every standby spare."""
        (self.out / "ranks").mkdir(exist_ok=True)
        t_start = time.time()
        self._write_control("run", start_it=0)
        if self.cfg.start_gate:  # before any rank starts: the ranks open its pipes
            # its pipes live in the state directory, recorded for `clean`: the run directory
            # may be a shared folder that holds no FIFOs (the Vagrant VM's results/)
            gate_dir = self._owned.enter_context(runstate.owned_dir(
                runstate.state_dir() / "gate" / self.net.prefix))
            self.gate = RunnerGate(gate_dir, self.plan.programs,
                                   on_release=lambda t: self._event(
                                       "gate_released", t, ranks=len(self.plan.programs)))
        self._write_rank_plans()
        if self.per_server:
            for ranks in server_groups(self.plan.programs, self.spec.server_of):
                self._start_server(self.spec.server_of(ranks[0]), ranks)
        else:
            for rank in self.plan.programs:
                self._start_rank(rank, rank)
        if self.policy == "spares":
            for host in range(self.spec.num_ranks, self.spec.num_hosts):
                self._start_standby(host)
        self.t_launch = time.time()
        # when the processes were started (a rank's ``started`` record says when it had
        # loaded): bench ranks compares how long that took
        (self.out / "ranks" / "launch.json").write_text(json.dumps(
            {"t_start": t_start, "t_end": self.t_launch, "processes": len(self.pids),
             "ranks_per_process": SERVER if self.per_server else "rank"}))

    def close(self) -> None:
        if self.gate is not None:
            self.gate.close()
        self._owned.close()
        for fh in self.logs:
            fh.close()

    # -------------------------------------------------------------- control

    def _write_control(self, state: str, start_it: int = 0,
                       takeover: dict[int, dict[str, Any]] | None = None) -> None:
        body = {"epoch": self.epoch, "state": state, "job": self.job.job_id,
                "start_it": start_it,
                "takeover": {str(h): t for h, t in (takeover or {}).items()}}
        tmp = self.control.with_suffix(".tmp")
        tmp.write_text(json.dumps(body))
        tmp.replace(self.control)

    def _event(self, name: str, t_s: float | None = None, **fields: Any) -> None:
        self.events.write([{"event": name, "t_s": time.time() if t_s is None else t_s,
                            **fields}])

    def on_rank_lost(self, job_id: str, rank: int, t_s: float) -> None:
        """The controller's heartbeat verdict (called from its thread)."""
        self.lost.put((job_id, rank, t_s))

    # ----------------------------------------------------------------- loop

    def follow(self) -> None:
        """Until every rank finished; raises :class:`RankFailed` or :class:`RunError`."""
        cfg = self.cfg
        total = cfg.total_iterations
        budget_s = 120 + total * max(60.0, 20 * self.prep.modeled_iteration_s)
        budget_s += self.max_recoveries * (30 + cfg.failover.migration_delay_s)
        deadline = time.monotonic() + budget_s
        reported = -1
        next_read = 0.0
        while True:
            now = time.monotonic()
            if now >= next_read:
                next_read = now + READ_S
                self._read_records()
            self._due_faults()
            slowest = min(self.done.values())
            if slowest != reported:
                reported = slowest
                phase = "warm-up" if slowest <= cfg.warmup and slowest < total else "measured"
                self.say(f"  iterations done: {slowest}/{total} ({phase})")
            failure = self._find_failure()
            if failure is not None:
                self._recover(failure)
                continue
            self._check_stalls()
            self._repair_due()
            ranks = [h for h in self.hosts.values() if h.rank is not None]
            if ranks and all(h.proc is not None and h.proc.poll() == 0 for h in ranks):
                return
            if time.monotonic() > deadline:
                stuck = sorted(h.rank for h in ranks if h.rank is not None
                               and (h.proc is None or h.proc.poll() is None))
                raise RunError(f"ranks {stuck} did not finish within {budget_s:.0f} s; last "
                               "calls: " + "; ".join(f"rank {r}: {self.last_op.get(r, 'none')}"
                                                     for r in stuck[:4]))
            time.sleep(LOOP_S)

    def _read_records(self) -> None:
        for host, state in self.hosts.items():
            if state.rank is not None:
                self._read_file(self.out / "ranks" / f"rank{state.rank}.jsonl")
            elif host >= self.spec.num_ranks:
                self._read_file(self.out / "ranks" / f"spare{host - self.spec.num_ranks}.jsonl")

    def _read_file(self, path: Path) -> None:
        if not path.exists():
            return
        with path.open() as fh:
            fh.seek(self.offsets.get(path, 0))
            chunk = fh.read()
        cut = chunk.rfind("\n") + 1
        self.offsets[path] = self.offsets.get(path, 0) + len(chunk[:cut].encode())
        for line in chunk[:cut].splitlines():
            self._on_record(json.loads(line))

    def _on_record(self, rec: dict[str, Any]) -> None:
        ev, epoch = rec.get("ev"), int(rec.get("epoch", 0))
        if rec.get("rank") is None:
            return  # a standby spare's own records
        rank = int(rec["rank"])
        if ev == "iteration" and epoch == self.epoch:
            self.done[rank] = int(rec["it"]) + 1
            self.ever_done[rank] = max(self.ever_done[rank], self.done[rank])
        elif ev == "call":
            self.last_op[rank] = f"{rec['kind']} {rec['cid']} (iteration {rec['it']})"
        elif ev == "error":
            raise RankFailed(rank, f"rank {rank} failed in iteration {rec['it']} at op "
                             f"{rec['i']} ({rec['tag']}, lane {rec['lane']}): {rec['error']}")
        elif ev == "stalled" and epoch == self.epoch and rank not in self.stalls:
            self.stalls[rank] = (time.monotonic(), f"rank {rank} failed in iteration "
                                 f"{rec['it']} at op {rec['i']} ({rec['tag']}, lane "
                                 f"{rec['lane']}): {rec['error']}")
        elif ev == "fault":
            index = rec.get("index")
            if index is not None:
                self.fired.add(int(index))
            self._event("fault", float(rec["t"]), kind=rec["kind"], rank=rank,
                        index=index, it=rec.get("it"), intf=rec.get("intf"))

    def _check_stalls(self) -> None:
        """A stalled rank with no failed peer within the grace period: a fault of its own."""
        grace_s = self.cfg.failover.heartbeat_timeout_s + 1.0
        for rank, (t0, message) in self.stalls.items():
            if time.monotonic() - t0 > grace_s and time.time() - self.t_last_failure > grace_s:
                raise RankFailed(rank, message)

    # --------------------------------------------------------------- faults

    def _due_faults(self) -> None:
        started = max(self.ever_done.values())  # the first rank has started this iteration
        elapsed = time.time() - self.t_launch
        for f in self.cfg.faults:
            if f.index in self.fired:
                continue
            rank_side = f.kind in RANK_FAULTS and f.at_iteration is not None
            due = (f.at_s is not None and elapsed >= f.at_s) or (
                not rank_side and (f.at_iteration or 0) <= started and f.at_s is None)
            if due and not rank_side:
                self.fired.add(f.index)
                self._inject(f)

    def _inject(self, f: Fault) -> None:
        """A fault the runner executes (OCS faults; rank faults given a time)."""
        t = time.time()
        info: dict[str, Any] = {"kind": f.kind, "index": f.index}
        if f.kind in RANK_FAULTS:
            assert f.rank is not None
            host = self._host_of(f.rank)
            info["rank"] = f.rank
            proc = self.hosts[host].proc
            if f.kind == "link_down":
                self.net.set_rail_links(host, up=False)
            elif proc is not None and proc.poll() is None:
                proc.send_signal(signal.SIGKILL if f.kind == "kill" else signal.SIGSTOP)
        elif f.kind == "port_failed":
            assert f.rail is not None and f.port is not None
            info.update(rail=f.rail, port=f.port)
            self.ocs_faults.fail_port(f.rail, f.port)
            if self.fronts is not None and f.rail in self.fronts.servers:
                device = self.fronts.device(f.rail)
                device.faults.failed_ports.update({f.port, device.size + f.port})
            for host, p in ((h, p) for h in self.hosts for p in self.spec.host_ports(h)):
                if p.rail == f.rail and p.port == f.port:
                    self.hosts[host].broken = True
            subprocess.run(["ip", "link", "set", "dev", naming.bridge_port_intf(
                self.net.prefix, f.rail, f.port), "down"], capture_output=True, check=False)
        elif f.kind == "jitter":
            self.ocs_faults.jitter_ms = f.jitter_ms
            info["jitter_ms"] = f.jitter_ms
        elif f.kind == "refuse":
            self.ocs_faults.refuse(f.count)
            info["count"] = f.count
        self._event("fault", t, **info)

    def _host_of(self, rank: int) -> int:
        return next(h for h, s in self.hosts.items() if s.rank == rank)

    # ------------------------------------------------------------ failures

    def _find_failure(self) -> Failure | None:
        while not self.lost.empty():
            job_id, rank, t_s = self.lost.get()
            self._event("heartbeat_lost", t_s, job=job_id, rank=rank)
            if job_id == self.job.job_id and rank in self.done:
                host = self._host_of(rank)
                proc = self.hosts[host].proc
                if proc is not None and proc.poll() is None:
                    via = "heartbeat" if process_stopped(proc.pid) else "false_alarm"
                    return Failure(rank, host, t_s, via,
                                   f"rank {rank} stopped sending heartbeats")
        for host, state in self.hosts.items():
            proc = state.proc
            if proc is None:
                continue
            code = proc.poll()
            if code is None or (code == 0 and state.rank is not None):
                continue
            t = time.time()
            if state.rank is None:  # a standby spare died: it can no longer take a rank
                state.proc, state.broken = None, True
                self._event("spare_lost", t, host=host, status=code)
                continue
            rank = state.rank
            log = self.rank_logs[rank]
            who = (f"the process of rank {rank}" if not self.per_server else "the process of "
                   f"server {self.spec.server_of(rank)} (ranks "
                   f"{', '.join(str(r) for r, p in self.rank_logs.items() if p == log)})")
            return Failure(rank, host, t, "exit",
                           f"{who} exited with status {code} after rank {rank}'s "
                           f"{self.last_op.get(rank, 'no call')}; log {log}, its tail: "
                           f"{log.read_text()[-800:].strip()}")
        return None

    def _recover(self, failure: Failure) -> None:
        self._read_records()
        self._event("failure_detected", failure.t_s, rank=failure.rank, host=failure.host,
                    via=failure.via, epoch=self.epoch)
        if self.policy is None:
            raise RankFailed(failure.rank, failure.detail)
        if self.recoveries >= self.max_recoveries:
            raise RankFailed(failure.rank, f"{failure.detail} (after {self.recoveries} "
                             "recoveries, no more are allowed)")
        if self.gate is not None:  # ranks still at the gate go on, into the aborted epoch 0
            self.gate.release()
        self.recoveries += 1
        self.t_last_failure = time.time()
        self.stalls.clear()
        if failure.via == "false_alarm":
            self._resume_in_place(failure)
        elif self.policy == "spares":
            self._failover(failure)
        else:
            self._restart_all(failure)

    def _new_epoch(self) -> None:
        self.epoch += 1
        self._write_control("abort")
        self._event("epoch_aborted", epoch=self.epoch - 1, job=self.job.job_id)

    def _unregister(self) -> None:
        with ControllerClient(self.endpoint) as client:
            client.unregister_job(self.job.job_id)

    def _register(self, ports: dict[int, RankPorts]) -> None:
        self.job = self.plan.job(epoch_job_id(self.base_job, self.epoch), ports)
        with ControllerClient(self.endpoint) as client:
            client.register_job(self.job)

    def _stop_proc(self, host: int) -> None:
        proc = self.hosts[host].proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(timeout=5)

    def _resume_iteration(self) -> int:
        """The first iteration that not every rank completed in the current epoch."""
        return resume_iteration(self.done.values())

    def _host(self, host: int) -> Host:
        return Host(host, self.spec.host_ports(host)[0].rail, self.spec.host_server(host),
                    tuple(p.port for p in self.spec.host_ports(host)))

    def _free_hosts(self) -> list[Host]:
        """Hosts that can take a rank over: idle, healthy, their process alive."""
        return [self._host(h) for h, s in self.hosts.items() if s.rank is None
                and not s.broken and s.failed_s is None and s.proc is not None
                and s.proc.poll() is None]

    def _failover(self, failure: Failure) -> None:
        rank, old = failure.rank, failure.host
        self._new_epoch()
        self._stop_proc(old)  # fenced: a hung process never comes back
        self._unregister()
        self.net.router.release(old)
        self.hosts[old].rank, self.hosts[old].failed_s = None, time.time()
        self.hosts[old].proc = None
        failed = replace(self._host(old), ports=self.job.ranks[rank].ports)
        takeover = take_over(self.job.ranks, rank, failed, self._free_hosts())
        if takeover is None:
            self._event("no_spare", rank=rank, rail=self.spec.rail_of(rank))
            raise RankFailed(rank, f"{failure.detail}; no spare is left on rail "
                             f"{self.spec.rail_of(rank)} to take rank {rank} over")
        spare = takeover.spare.host
        identity_t_s = time.time()  # the wire check follows the port from here (its address)
        self.net.router.assign(rank, spare)
        self._event("spare_assigned", **takeover.event(), identity_t_s=identity_t_s)
        self._register(takeover.ports)
        start = self._resume_iteration()
        self.done = dict.fromkeys(self.done, start)
        self.hosts[spare].rank = rank
        pending = [{"kind": f.kind, "index": f.index, "at_iteration": f.at_iteration}
                   for f in self.cfg.faults if f.kind in RANK_FAULTS and f.rank == rank
                   and f.at_iteration is not None and f.index not in self.fired]
        self._write_control("run", start_it=start, takeover={spare: {
            "plan": str(self._rank_plan_path(rank).resolve()), "faults": pending}})
        self._event("ranks_resumed", epoch=self.epoch, job=self.job.job_id,
                    start_iteration=start, rank=rank, host=spare, policy="spares")
        # off the critical path: no circuit leads to the failed host once Opus rewired them
        self.net.set_rail_links(old, up=False)
        self.say(f"  rank {rank} failed ({failure.via}); host {spare} took it over, resuming "
                 f"from iteration {start}")

    def _resume_in_place(self, failure: Failure) -> None:
        """Heartbeats stopped but the process runs (starved of CPU, not hung): the controller
        refused its peers' calls, so the epoch is redone on the same hosts."""
        self._new_epoch()
        self._unregister()
        start = self._resume_same_hosts(failure, "in_place", restart=False)
        self.say(f"  rank {failure.rank}'s heartbeats stopped but it runs (a starved CPU?); "
                 f"every rank resumes from iteration {start} in place")

    def _restart_all(self, failure: Failure) -> None:
        self._new_epoch()
        for host, state in self.hosts.items():
            if state.rank is not None:
                self._stop_proc(host)
        self._unregister()
        self.net.set_rail_links(failure.host, up=True)  # the job moves to healthy hosts
        self.ocs_faults.failed.clear()
        delay_s = self.cfg.failover.migration_delay_s
        self._event("migration", delay_s=delay_s, rank=failure.rank)
        if delay_s:
            time.sleep(delay_s)
        start = self._resume_same_hosts(failure, "restart", restart=True)
        self.say(f"  rank {failure.rank} failed ({failure.via}); every rank restarts from "
                 f"iteration {start}")

    def _resume_same_hosts(self, failure: Failure, policy: str, restart: bool) -> int:
        """Register the job again on the same ports and resume every rank (``restart``: in new
        processes) from the last iteration all completed; returns that iteration."""
        self._register(dict(self.job.ranks))
        start = self._resume_iteration()
        self.done = dict.fromkeys(self.done, start)
        if restart:
            for host, state in self.hosts.items():
                if state.rank is not None:
                    self._start_rank(state.rank, host, start)
        self._write_control("run", start_it=start)
        self._event("ranks_resumed", epoch=self.epoch, job=self.job.job_id,
                    start_iteration=start, rank=failure.rank, host=failure.host,
                    policy=policy)
        return start

    def _repair_due(self) -> None:
        repair_s = self.cfg.failover.repair_s
        if repair_s is None or self.policy != "spares":
            return
        now = time.time()
        for host, state in self.hosts.items():
            if state.failed_s is not None and not state.broken and now - state.failed_s >= repair_s:
                state.failed_s = None
                self.net.set_rail_links(host, up=True)
                self._start_standby(host)
                self._event("host_repaired", host=host)

