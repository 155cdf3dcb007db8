"""The rank process of a torch job: an unchanged script, its collectives through Opus.

Run by the torch runner (:mod:`testbed.torchjob.runner`), in the rank's Mininet host for the
rails run and in the root namespace for the loopback reference::

    python -m testbed.torchjob.launcher RANK_PLAN.json

The plan is a :class:`testbed.plan.rankplan.RankPlan` with a
:class:`~testbed.plan.rankplan.TorchPart`: ``master_addr``/``master_port`` is the rendezvous
store (rank 0's frontend address, control traffic), ``listen`` this rank's transport addresses
and ``peers`` where it reaches each rank (``[rail address, port]``, or loopback, or a Unix
socket path for the GPUs of its own server); ``endpoint`` and ``job`` name the Opus controller
(null for the reference, whose calls are acknowledged at once).

Before the script runs, the launcher sets the environment torchrun would (``RANK``,
``WORLD_SIZE``, ``LOCAL_RANK``, ...), pins torch to one thread, starts the rank's lanes and
transport listener, registers the ``opus`` backend (:mod:`testbed.torchjob.backend`) and makes
it the only one: ``init_process_group`` and ``new_group`` get ``backend="opus"`` whatever the
script asked for, and ``batch_isend_irecv`` issues a batch's sends before its receives (a batch
is unordered by contract; receives first on both ends would wait for each other's lanes). A
global optimizer hook ends an iteration at each step of the first optimizer. The script then
runs as ``__main__`` with ``sys.argv = [script, *args]``.

A script that raises writes an ``error`` record (rank, iteration, last call, the traceback's
last line and the log's path) and exits with status 1; so does a failed call.
``GLOO_SOCKET_IFNAME`` points at the rank's first rail interface on the rails, so a gloo group
that escaped the patch could never use the frontend.
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import threading
import time
import traceback
from dataclasses import replace
from pathlib import Path
from typing import Any

from testbed.emulated.transport import Address
from testbed.plan.rankplan import RankPlan, RankPlanError, TorchPart, load_plan

WATCHDOG_S = 30.0  # after a failed call, how long the script may take to notice it


def _address(value: Any) -> Address:
    """A plan's address: ``[host, port]`` (TCP) or the path of a Unix socket."""
    return str(value) if isinstance(value, str) else (str(value[0]), int(value[1]))


def short_unix_addresses(plan: RankPlan) -> RankPlan:
    """The plan with its Unix socket paths under ``scale_up_dir`` re-spelt as
    ``/proc/self/fd/N/NAME`` (``N`` this process's handle on the folder, kept open): the folder
    is in the run's results, whose path may be longer than the 107 bytes a socket address
    holds."""
    part = _torch_part(plan)
    directory = part.scale_up_dir
    if not directory:
        return plan
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)  # kept open: the paths use it
    prefix = directory.rstrip("/") + "/"

    def short(address: Any) -> Any:
        if isinstance(address, str) and address.startswith(prefix):
            return f"/proc/self/fd/{fd}/{address[len(prefix):]}"
        return address

    return replace(plan, peers={r: short(a) for r, a in plan.peers.items()},
                   torch=replace(part, listen=tuple(short(a) for a in part.listen)))


def _torch_part(plan: RankPlan) -> TorchPart:
    if plan.torch is None:
        raise RankPlanError(f"rank {plan.rank}: the plan is a replayed rank's, not a torch "
                            "rank's (testbed.emulated.replayer runs it)")
    return plan.torch


def _set_environment(plan: RankPlan) -> None:
    part = _torch_part(plan)
    rank, gpus = plan.rank, part.gpus_per_server
    os.environ.update({
        "RANK": str(rank), "WORLD_SIZE": str(part.world_size),
        "LOCAL_RANK": str(rank % gpus), "LOCAL_WORLD_SIZE": str(gpus),
        "GROUP_RANK": str(rank // gpus), "MASTER_ADDR": part.master_addr,
        "MASTER_PORT": str(part.master_port), "OMP_NUM_THREADS": "1",
        "OPUS_RANK_LOG": part.log})
    if part.gloo_ifname:
        os.environ["GLOO_SOCKET_IFNAME"] = part.gloo_ifname


def _patch_distributed() -> None:
    """``opus`` as every group's backend; sends before receives in every p2p batch."""
    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    from testbed.torchjob.backend import BACKEND

    init, new_group, batch = (c10d.init_process_group, c10d.new_group,
                              c10d.batch_isend_irecv)

    def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
        return init(BACKEND, *args, **kwargs)

    def opus_new_group(*args: Any, **kwargs: Any) -> Any:
        if len(args) > 2:  # (ranks, timeout, backend, ...)
            args = (*args[:2], BACKEND, *args[3:])
        else:
            kwargs["backend"] = BACKEND
        return new_group(*args, **kwargs)

    def batch_isend_irecv(p2p_op_list: list[Any]) -> Any:
        ordered = sorted(p2p_op_list, key=lambda p: p.op is not dist.isend)
        return batch(ordered)

    for module in (dist, c10d):
        module.init_process_group = init_process_group
        module.new_group = opus_new_group
        module.batch_isend_irecv = batch_isend_irecv


def _iteration_hook(runtime: Any) -> None:
    from torch.optim.optimizer import register_optimizer_step_post_hook

    first: list[int] = []

    def on_step(optimizer: Any, _args: Any, _kwargs: Any) -> None:
        if not first:
            first.append(id(optimizer))
        if id(optimizer) == first[0]:
            runtime.end_iteration()

    register_optimizer_step_post_hook(on_step)


def _error_record(runtime: Any, plan: RankPlan, exc: BaseException) -> dict[str, Any]:
    """The first failure: a failed call's, else the script's own exception."""
    log = _torch_part(plan).log
    if runtime is not None and runtime.failure is not None:
        failure = dict(runtime.failure)
        failure["error"] += f" (log: {log})"
        return failure
    last_line = traceback.format_exception_only(exc)[-1].strip()
    call = runtime.last_call if runtime is not None else None
    return {"it": runtime.iteration if runtime is not None else -1,
            "i": call.record["i"] if call else -1,
            "tag": f"{call.spec.op} on {call.spec.torch_group}" if call else "",
            "lane": call.spec.lane if call else "", "error": f"{last_line} (log: {log})",
            "traceback": traceback.format_exception(exc)}


def _watchdog(runtime: Any, plan: RankPlan) -> None:
    """Ends the rank when a call failed and the script does not stop by itself."""
    while not runtime.aborted.wait(1.0):
        pass
    threading.Event().wait(WATCHDOG_S)
    runtime.emit(ev="error", **_error_record(runtime, plan, RuntimeError("call failed")))
    sys.stderr.flush()
    os._exit(1)


def run(plan: RankPlan) -> int:
    """Run the plan's script on the opus backend; returns the exit status."""
    part = _torch_part(plan)
    _set_environment(plan)
    import torch

    from controller.shim import Shim
    from testbed.torchjob import backend
    from testbed.torchjob.lanes import Runtime, ShimFactory

    torch.set_num_threads(1)
    rank, endpoint = plan.rank, plan.endpoint
    factory: ShimFactory | None = None
    if endpoint:
        def factory(profile: Any, seqs: dict[str, int]) -> Shim:
            return Shim(endpoint, plan.job, rank, ack_timeout_s=plan.ack_timeout_s,
                        profile=profile, seqs=seqs)

    out = open(plan.records, "a", encoding="utf-8")  # noqa: SIM115 (closed by os._exit)
    short = short_unix_addresses(plan)
    runtime = Runtime(rank, listen=[_address(a) for a in _torch_part(short).listen],
                      peers={r: _address(a) for r, a in short.peers.items()},
                      out=out, io_timeout_s=plan.io_timeout_s, shim_factory=factory,
                      thread_init=lambda: torch.set_grad_enabled(False))
    backend.configure(runtime, gpus_per_server=part.gpus_per_server, axes=dict(part.axes))
    backend.register()
    _patch_distributed()
    _iteration_hook(runtime)
    threading.Thread(target=_watchdog, args=(runtime, plan), daemon=True).start()
    script = str(Path(part.script).resolve())
    sys.argv = [script, *part.args]
    sys.path.insert(0, str(Path(script).parent))
    runtime.emit(ev="started", t=time.time(), pid=os.getpid(), script=script,
                 args=sys.argv[1:])
    try:
        runpy.run_path(script, run_name="__main__")
    except BaseException as exc:  # the script's failure, or a call's seen by the script
        if isinstance(exc, SystemExit) and exc.code in (None, 0):
            pass
        else:
            traceback.print_exc()
            runtime.emit(ev="error", **_error_record(runtime, plan, exc))
            return 1
    runtime.close()
    if runtime.failure is not None:
        runtime.emit(ev="error", **_error_record(runtime, plan, RuntimeError("call failed")))
        return 1
    runtime.emit(ev="finished", t=time.time(),
                 profile_mismatches=runtime.profile.mispredictions)
    return 0


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    with open(args[0]) as fh:
        plan = load_plan(json.load(fh), args[0])
    if not isinstance(plan, RankPlan):
        raise RankPlanError(f"{args[0]}: a standby plan; a torch rank needs a rank's plan")
    status = run(plan)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # lanes blocked in a failed call must not keep the process alive


if __name__ == "__main__":
    main()
