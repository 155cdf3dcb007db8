"""``opus-testbed run`` of a torch experiment: the script on loopback, then on the emulated rails.

1. **Prepare**: torch must be importable (else the install command; nothing is started), the
   cluster must fit this machine, the link rate is picked as for every run. Tensors are real:
   bytes are not scaled.
2. **Reference run on loopback** (``out/reference/``): one launcher per rank
   (:mod:`testbed.torchjob.launcher`) in the root namespace, collectives on the same backend,
   lanes and algorithms over 127.0.0.1, acknowledged at once. It runs first because its call
   records give the groups Opus must know (a torch script creates them at run time), its
   losses are the reference, and its records the capture with undisturbed compute gaps.
3. **Job**: the reference's lanes become the Opus job (:mod:`testbed.torchjob.groups`); one
   the rails cannot carry (a group across rails, more circuits than ports) is refused before
   the network starts, naming it and the call that used it.
4. **Rails run** (``out/``): the emulated rails and Opus in the run's mode, one launcher per
   rank in its Mininet host; the transport uses the rail addresses (the lit circuits), the
   rendezvous store rank 0's frontend address (control traffic, as the shims').
5. **End**: the metrics and summary of every run, plus ``loss_max_abs_diff`` (rails against
   reference, every rank and step, bit for bit), ``losses_compared`` and ``losses.csv``; the
   run fails (:class:`LossMismatch`) unless the losses are identical. Each rank's records are
   in ``ranks/rank<r>.jsonl`` (``reference/ranks/`` for the loopback run); the reference's
   last iteration, captured (:mod:`testbed.torchjob.capture`), is ``workload.json``, and
   ``replay.yaml`` replays it (``run out/replay.yaml --backend emu|sim``).

A rank whose script fails ends the run naming the rank, the traceback's last line and its log;
every process is stopped and the network torn down on every path.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.metadata
import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import yaml

from controller.job import JobError, JobSpec
from emulator.network import free_tcp_port
from emulator.runstate import owned_dir
from testbed.emulated.runner import (
    _follow,
    processes,
    rail_spec,
    require_quota,
    run_on_rails,
    spec_ports,
)
from testbed.errors import RunError, RunRefused, Say, require_empty_dir, say_stderr
from testbed.experiment.backends import EMU, TIME_DILATION, TORCH, backend_spec
from testbed.metrics.fidelity import calibrated_link_mbps, capacity_problem
from testbed.plan.rankplan import Peer, RankPlan, TorchPart
from testbed.results import store
from testbed.torchjob.config import TorchExperiment
from testbed.torchjob.groups import GroupError, observed_groups, rail_groups
from testbed.torchjob.losses import LossComparison, compare_losses, losses_of_log

TRANSPORT_PORT = 7300  # the torch transport's port on every rail address (namespaces are private)
MASTER_PORT = 29500  # torch's rendezvous store on rank 0's frontend address
PR_SET_PDEATHSIG = 1  # prctl(2)
INSTALL_HINT = ("pip install 'opus-testbed[torch]' --extra-index-url "
                "https://download.pytorch.org/whl/cpu (or `bash scripts/setup.sh`, which does)")


class LossMismatch(RunError):
    """The rails run's losses differ from the loopback reference's (or some are missing)."""


@dataclass(frozen=True)
class TorchPrepared:
    """A torch run before anything starts (the end of the run reads it as a RunFacts)."""

    config: TorchExperiment
    link_mbps: float
    scale: float = 1.0
    modeled_iteration_s: float | None = None  # a script has no model of its iteration time


def prepare_torch(exp: TorchExperiment, *, check_capacity: bool = True) -> TorchPrepared:
    """Check what the run needs; raises :class:`RunRefused` (nothing started) if it can't run.
    A job's time dilation is 1 (``auto``'s pick here): its compute is real."""
    reason = backend_spec(TORCH).refusal(TIME_DILATION)
    if exp.time_dilation not in ("auto", 1, 1.0) and reason is not None:
        raise RunRefused(f"{exp.source}: run.time_dilation is {exp.time_dilation:g}, but "
                         f"{reason}")
    if importlib.util.find_spec("torch") is None:
        raise RunRefused(f"{exp.source}: the workload is a PyTorch script, but torch is not "
                         f"installed for {sys.executable}; install it: {INSTALL_HINT}")
    if exp.ranks_per_process == "server":
        raise RunRefused(f"{exp.source}: run.ranks_per_process: server hosts replayed ranks; "
                         "a PyTorch job runs one process per rank: use rank or auto")
    if check_capacity and (problem := capacity_problem(exp.world_size)) is not None:
        raise RunRefused(f"{exp.source}: cannot emulate this cluster here: {problem.message}")
    return TorchPrepared(exp, exp.link_mbps or calibrated_link_mbps(exp.world_size))


def run_torch(exp: TorchExperiment, out: Path, say: Say = say_stderr) -> dict[str, Any]:
    """Run ``exp`` (see the module docstring); returns the rails run's summary."""
    require_empty_dir(out)
    require_quota(exp)
    prep = prepare_torch(exp)
    cluster = exp.cluster
    spec = rail_spec(exp, cluster.servers, cluster.gpus_per_server, prep.link_mbps)
    out.mkdir(parents=True, exist_ok=True)
    (out / "experiment.yaml").write_text(exp.text)
    steps = exp.total_iterations
    say(f"run {exp.name}: {exp.torch.script.name} on {exp.world_size} ranks, mode {exp.mode}, "
        f"switching delay {exp.switching_delay_ms:g} ms, K={spec.ports_per_rank}, links "
        f"{prep.link_mbps:g} Mbit/s, {exp.warmup}+{exp.iterations} steps; results in {out}")
    t0 = time.monotonic()
    reference = run_loopback(prep, out / "reference", say)
    say(f"  loopback reference done in {time.monotonic() - t0:.0f} s")
    try:
        groups = rail_groups(observed_groups(r for recs in reference.values() for r in recs),
                             gpus_per_server=cluster.gpus_per_server, rail_of=spec.rail_of)
        job = JobSpec("train", spec_ports(spec), groups)
    except (GroupError, JobError) as exc:
        raise RunRefused(f"{exp.source}: {exc}. Use more ports per rank (--ports-per-rank, "
                         "ocs.ports_per_rank) or a parallelism whose groups form rings on the "
                         "rails (found after the loopback reference, in "
                         f"{out / 'reference'}: a script's groups are known only by running "
                         "it; the rails were not started)") from exc
    (out / "ranks").mkdir(exist_ok=True)
    manifest = store.start_manifest(
        out, EMU, {**exp.to_json(), "script": str(exp.torch.script),
                     "args": exp.torch.argv(steps=steps, seed=exp.seed)},
        link_mbps=prep.link_mbps, scale=1.0, world_size=exp.world_size, rails=spec.num_rails,
        modeled_iteration_s=None, job=job.to_json())

    with _scale_up_dir(out) as sockets:
        def launcher(net: Any, endpoint: str, rank: int) -> list[str]:
            peers = {r: (net.rank_address(r), TRANSPORT_PORT) for r in range(exp.world_size)}
            return _launcher_args(prep, out, rank, peers, master=(net.frontend_address(0),
                                                                  MASTER_PORT),
                                  endpoint=endpoint, scale_up_dir=sockets,
                                  gloo_ifname=net.rail_intf(rank))

        summary = run_on_rails(prep, spec, job, out, manifest, processes(launcher, prep),
                               say)
    comparison = compare_losses(_losses(out, exp.world_size),
                                _losses(out / "reference", exp.world_size))
    store.write_csv(out / "losses.csv", comparison.rows)
    summary.update(loss_max_abs_diff=comparison.max_abs_diff,
                   losses_compared=comparison.compared, reference_dir=str(out / "reference"),
                   modeled_iteration_s=None)
    _capture(exp, out, reference, summary, say)
    store.write_json(out / "summary.json", summary)
    _check_losses(comparison)
    return summary


def _check_losses(comparison: LossComparison) -> None:
    problem = comparison.problem()
    if problem is not None:
        raise LossMismatch(f"{problem}; see losses.csv")


def _losses(run_dir: Path, world_size: int) -> dict[int, dict[int, float]]:
    out = {}
    for rank in range(world_size):
        with (run_dir / "ranks" / f"rank{rank}.log").open() as fh:
            steps = losses_of_log(fh)
        if steps:
            out[rank] = steps
    return out


def _launcher_args(prep: TorchPrepared, out: Path, rank: int, peers: dict[int, tuple[str, int]],
                   *, master: tuple[str, int], endpoint: str | None, scale_up_dir: Path,
                   gloo_ifname: str = "") -> list[str]:
    """Write rank ``rank``'s launcher plan under ``out/ranks``; returns its command line.

    ``peers`` are the ranks' TCP addresses; the GPUs of one server reach each other through
    Unix sockets in ``scale_up_dir`` instead (scale-up traffic).
    """
    exp = prep.config
    gpus = exp.cluster.gpus_per_server
    ranks_dir = (out / "ranks").resolve()

    def sock(r: int) -> str:
        return str(scale_up_dir / f"r{r}.sock")

    reach: dict[int, Peer] = {r: sock(r) if r // gpus == rank // gpus and r != rank
                              else address for r, address in peers.items()}
    plan = RankPlan(
        rank=rank, job="train", endpoint=endpoint, peers=reach,
        records=str(ranks_dir / f"rank{rank}.jsonl"), ack_timeout_s=exp.ack_timeout_s,
        io_timeout_s=exp.ack_timeout_s,
        torch=TorchPart(
            world_size=exp.world_size, gpus_per_server=gpus, master_addr=master[0],
            master_port=master[1],
            listen=(peers[rank], *([sock(rank)] if gpus > 1 else [])),
            log=str(ranks_dir / f"rank{rank}.log"), script=str(exp.torch.script),
            args=tuple(str(a) for a in exp.torch.argv(steps=exp.total_iterations,
                                                      seed=exp.seed)),
            axes=dict(exp.torch.axes), gloo_ifname=gloo_ifname,
            scale_up_dir=str(scale_up_dir)))
    path = ranks_dir / f"rank{rank}.plan.json"
    path.write_text(json.dumps(plan.to_json(), indent=1))
    return [sys.executable, "-m", "testbed.torchjob.launcher", str(path)]


def run_loopback(prep: TorchPrepared, ref: Path, say: Say
                 ) -> dict[int, list[dict[str, Any]]]:
    """The job on loopback (``ref``: the reference of a rails run): every rank a launcher in
    the root namespace, calls acknowledged at once. Returns each rank's records."""
    world = prep.config.world_size
    (ref / "ranks").mkdir(parents=True)
    peers = {r: ("127.0.0.1", free_tcp_port()) for r in range(world)}
    master = ("127.0.0.1", free_tcp_port())
    with _local_processes() as start, _scale_up_dir(ref) as sockets:
        procs = {r: start(_launcher_args(prep, ref, r, peers, master=master, endpoint=None,
                                         scale_up_dir=sockets),
                          ref / "ranks" / f"rank{r}.log") for r in range(world)}
        _follow(ref, procs, prep.config, prep, say)
    return {r: store.read_jsonl(ref / "ranks" / f"rank{r}.jsonl") for r in range(world)}


def _scale_up_dir(run_dir: Path) -> contextlib.AbstractContextManager[Path]:
    """``run_dir/scaleup``, the folder of the scale-up Unix sockets: in the run's own results,
    recorded for ``opus-testbed clean`` should the run be killed, removed on the way out. (The
    launchers reach it as ``/proc/self/fd/N/``: a socket's path must stay under 108 bytes.)"""
    return owned_dir(run_dir.resolve() / "scaleup")


def _die_with_parent() -> None:
    """In the child: be sent SIGTERM if the runner dies without its teardown (SIGKILL)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@contextlib.contextmanager
def _local_processes() -> Iterator[Callable[[list[str], Path], subprocess.Popen[Any]]]:
    """Start processes in the root namespace (logs to a file); all are stopped on the way out,
    and by the kernel should the runner be killed."""
    procs: list[subprocess.Popen[Any]] = []
    logs: list[IO[str]] = []
    env = dict(os.environ)
    env["PYTHONPATH"] = str(Path(__file__).resolve().parents[2])

    def start(args: list[str], log_path: Path) -> subprocess.Popen[Any]:
        log = log_path.open("w")
        logs.append(log)
        procs.append(subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=env,
                                      start_new_session=True, preexec_fn=_die_with_parent))
        return procs[-1]

    try:
        yield start
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.terminate()
        for proc in procs:
            try:
                proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=5)
        for log in logs:
            log.close()


def _capture(exp: TorchExperiment, out: Path, reference: dict[int, list[dict[str, Any]]],
             summary: dict[str, Any], say: Say) -> None:
    """The reference's last iteration as a workload schedule (``workload.json``) and an
    experiment that replays it (``replay.yaml``: ``run out/replay.yaml --backend emu|sim``)."""
    from testbed.torchjob.capture import CaptureError, schedule_from_records

    summary["capture"] = None
    sources = [str(out / "reference" / "ranks" / f"rank{r}.jsonl") for r in sorted(reference)]
    try:
        schedule = schedule_from_records(
            reference, iteration=exp.total_iterations - 1,
            gpus_per_server=exp.cluster.gpus_per_server, sources=sources,
            torch_version=importlib.metadata.version("torch"))
    except CaptureError as exc:
        summary["capture_error"] = str(exc)
        say(f"  no capture: {exc}")
        return
    schedule.to_json(str(out / "workload.json"))
    replay = {"name": f"{exp.name}-replay",
              "cluster": {"servers": exp.cluster.servers,
                          "gpus_per_server": exp.cluster.gpus_per_server},
              "workload": {"schedule": "workload.json"}, "mode": exp.mode,
              "ocs": {"switching_delay": exp.switching_delay,
                      "ports_per_rank": exp.ports_per_rank},
              # the modelled rate is the emulated one: the replay moves the job's real bytes
              "network": {"link_mbps": summary["link_mbps"],
                          "rail_gbps": summary["link_mbps"] / 1000},
              "run": {"warmup": exp.warmup, "iterations": exp.iterations}}
    (out / "replay.yaml").write_text(yaml.safe_dump(replay, sort_keys=False))
    summary["capture"] = str(out / "workload.json")
