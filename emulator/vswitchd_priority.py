"""ovs-vswitchd's main thread at real-time priority while emulated runs are live, and back after.

Why: with the userspace datapath that thread forwards every packet and answers the OCS app's
flow mods, barriers and datapath purges, so each switch's light waits for it to be scheduled.
At its default (``SCHED_OTHER``, nice -10) a waking vswitchd does not always preempt the rank
processes at once; on this 2-core machine at load 8 the light then came 0.9 ms late at p50 with
``SCHED_FIFO`` against 1.8 ms without, and the demo's late-light bound fell from 3.3-6.3 % of
an iteration to 2.9-3.3 % (``docs/performance.md``, "Light confirmation"). The OCS app's rail
workers already run at ``SCHED_FIFO`` :data:`emulator.ocs_app.WORKER_PRIORITY`; vswitchd goes
just below them, so a worker due to light a circuit still runs first.

Only the main thread (thread id = the daemon's pid) is raised, and only from ``SCHED_OTHER``:
a vswitchd someone else gave another policy is left alone. Runs share it: a state file under
:func:`emulator.runstate.state_dir` names the daemon, its former policy and the live runs that
hold it; the last run to let go (or ``opus-testbed clean``, once those runs are dead) restores
the former policy, if the same daemon still runs with the policy set here.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from emulator import runstate

#: Real-time priority for vswitchd's main thread (the OCS app's rail workers run at 10).
VSWITCHD_PRIORITY = 5
STATE_NAME = "vswitchd-priority.json"


def vswitchd_pid(rundir: str | None = None) -> int | None:
    """ovs-vswitchd's pid from its pidfile, or None when there is none or it is not running."""
    rundir = rundir or os.environ.get("OVS_RUNDIR", "/var/run/openvswitch")
    try:
        pid = int(Path(rundir, "ovs-vswitchd.pid").read_text().strip())
    except (OSError, ValueError):
        return None
    return pid if runstate.pid_alive(pid) else None


def _state_path() -> Path:
    return runstate.state_dir() / STATE_NAME


@contextlib.contextmanager
def _locked() -> Iterator[dict[str, Any] | None]:
    """The shared state (None: no run holds vswitchd), read under an exclusive lock that lasts
    while the caller decides and :func:`_write` s."""
    path = _state_path()
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.with_suffix(".lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            state = json.loads(path.read_text()) if path.exists() else None
        except (OSError, ValueError):
            state = None
        yield state


def _write(state: dict[str, Any] | None) -> None:
    path = _state_path()
    if state is None:
        path.unlink(missing_ok=True)
        return
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(state))
    tmp.replace(path)


def raise_priority(prefix: str) -> str:
    """Hold vswitchd's main thread at ``SCHED_FIFO`` for run ``prefix``; what was done, in words
    (for the run's log line)."""
    pid = vswitchd_pid()
    if pid is None:
        return "ovs-vswitchd's pid not found: its priority left as it is"
    with _locked() as state:
        if state is not None and state.get("pid") == pid:
            state["holders"] = sorted({*state.get("holders", []), prefix})
            _write(state)
            return f"ovs-vswitchd at SCHED_FIFO {VSWITCHD_PRIORITY}"
        try:
            policy = os.sched_getscheduler(pid)
            if policy != os.SCHED_OTHER:
                return "ovs-vswitchd already has a real-time policy: left as it is"
            os.sched_setscheduler(pid, os.SCHED_FIFO, os.sched_param(VSWITCHD_PRIORITY))
        except OSError as exc:
            return f"ovs-vswitchd's priority left as it is ({exc.strerror})"
        _write({"pid": pid, "policy": policy, "holders": [prefix]})
    return f"ovs-vswitchd at SCHED_FIFO {VSWITCHD_PRIORITY}"


def release(prefix: str | None = None, *, everyone: bool = False) -> bool:
    """Let go for run ``prefix`` (None: only drop runs no longer live; ``everyone``: drop every
    run, as ``opus-testbed clean --all`` does); restore vswitchd's former policy when no live
    run holds it. True if it was restored."""
    live = set() if everyone else runstate.live_prefixes()
    with _locked() as state:
        if state is None:
            return False
        holders = [h for h in state.get("holders", []) if h != prefix and h in live]
        if holders:
            state["holders"] = holders
            _write(state)
            return False
        _write(None)
        pid = state.get("pid")
        if not isinstance(pid, int) or not runstate.pid_alive(pid):
            return False
        try:
            if os.sched_getscheduler(pid) != os.SCHED_FIFO:
                return False  # someone changed it since: theirs now
            os.sched_setscheduler(pid, int(state.get("policy", os.SCHED_OTHER)),
                                  os.sched_param(0))
        except OSError:
            return False
    return True


def raise_instances(pids: list[int]) -> str:
    """Put the main thread of each of the run's own vswitchds (:mod:`emulator.ovs_instance`)
    at ``SCHED_FIFO`` :data:`VSWITCHD_PRIORITY`; what was done, in words. Nothing to restore:
    they die with the run."""
    refused = []
    for pid in pids:
        try:
            os.sched_setscheduler(pid, os.SCHED_FIFO, os.sched_param(VSWITCHD_PRIORITY))
        except OSError as exc:
            refused.append(f"{pid}: {exc.strerror}")
    if refused:
        return (f"{len(pids) - len(refused)} of {len(pids)} ovs-vswitchd instances at "
                f"SCHED_FIFO {VSWITCHD_PRIORITY} (refused: {', '.join(refused)})")
    return f"{len(pids)} ovs-vswitchd instances at SCHED_FIFO {VSWITCHD_PRIORITY}"
