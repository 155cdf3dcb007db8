"""One process for a server's ranks (``run.ranks_per_process: server``).

Started by the supervisor inside the first rank's Mininet host::

    python -m testbed.emulated.serverhost SERVER.json

``SERVER.json`` lists the server's ranks: ``{"ranks": [{"rank": R, "plan": RANK_PLAN.json,
"netns": "/proc/<host shell pid>/ns/net"}, ...]}``. Each rank runs as
:mod:`testbed.emulated.replayer` runs it in a process of its own (its lanes as threads), on a
thread that first enters its own host's network namespace (:mod:`emulator.netns`), so
its listener, its connections to peers and its shims' connections to Opus are all opened there,
and it writes its own records to its own ``records`` file. Each rank says on standard error (the
server's log) which namespace its thread is in.

The ranks share one interpreter and its GIL: their compute phases are timed waits and their
transfers blocking socket calls, both of which release it. What holds it for long is loading a
plan (JSON and its ops), so every rank loads first and none starts replaying until all of the
process have: no rank's timed path waits behind another's loading. The process exits when every rank
finished (status 0) or at the first rank that failed, with that rank's status: the run ends then
anyway (this mode has no failover), and a failed rank's peers would only wait for it.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import traceback
from typing import Any

from emulator.netns import enter_netns, netns_id
from testbed.emulated.replayer import Replayer, read_plan


def _run_rank(entry: dict[str, Any], loaded: threading.Barrier,
              done: queue.Queue[tuple[int, int]]) -> None:
    """Replay one rank on this (namespaced) thread once every rank of the process has loaded
    its plan (``loaded``); put (rank, exit status) in ``done``."""
    rank = int(entry["rank"])
    status = 1
    try:
        enter_netns(str(entry["netns"]))  # first: every socket and thread below lives there
        print(f"rank {rank}: thread in netns {netns_id()} (host's {netns_id(entry['netns'])})",
              file=sys.stderr, flush=True)
        replayer = Replayer(read_plan(str(entry["plan"])))
        loaded.wait()
        status = replayer.run()
        replayer.out.close()
    except BaseException:
        loaded.abort()  # the others stop waiting (and fail): the run ends with this rank
        print(f"rank {rank} failed:\n{traceback.format_exc()}", file=sys.stderr, flush=True)
    finally:
        done.put((rank, status))


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    with open(args[0], encoding="utf-8") as fh:
        entries = json.load(fh)["ranks"]
    done: queue.Queue[tuple[int, int]] = queue.Queue()
    loaded = threading.Barrier(len(entries))
    for entry in entries:
        threading.Thread(target=_run_rank, args=(entry, loaded, done),
                         name=f"rank-{entry['rank']}", daemon=True).start()
    status = 0
    for _ in entries:
        rank, code = done.get()
        if code != 0:
            print(f"rank {rank} exited with status {code}; ending the server's process",
                  file=sys.stderr, flush=True)
            status = code
            break
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # lanes blocked in a failed call must not keep the process alive


if __name__ == "__main__":
    sys.exit(main())
