"""A rank process for the service tests: runs calls through a real shim, prints JSON lines.

Usage: python shim_worker.py ENDPOINT JOB RANK HOLD_S GROUP [GROUP ...]
Each GROUP is one call; the body of each call sleeps HOLD_S (so a test can kill it mid-call).
"""

from __future__ import annotations

import json
import sys
import time

from controller.shim import Shim


def main() -> None:
    endpoint, job_id, rank, hold_s = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
    with Shim(endpoint, job_id, rank, heartbeat_interval_s=0.1, ack_timeout_s=20) as shim:
        shim.mark_iteration()
        for group in sys.argv[5:]:
            with shim.collective(group, "allreduce", 1024) as grant:
                print(json.dumps({"rank": rank, "group": group, "seq": grant.seq,
                                  "in_call": True}), flush=True)
                time.sleep(hold_s)
            print(json.dumps({"rank": rank, "group": group, "done": True}), flush=True)


if __name__ == "__main__":
    main()
