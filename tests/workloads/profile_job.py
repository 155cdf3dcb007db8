"""Run a torch training script under ``torch.profiler`` and write this rank's Chrome trace.

usage: ``python profile_job.py OUT_DIR SCRIPT [ARGS...]`` in every rank process (``RANK``,
``WORLD_SIZE``, ``MASTER_ADDR``, ``MASTER_PORT`` set as torchrun sets them).

The script runs unchanged (``runpy``); a global optimizer-step hook advances the profiler once
per training step, so the trace holds ``ProfilerStep#N`` spans as a real job's profiler loop
writes them. Step 0 (pipeline shape inference, warm-up) runs in the profiler's warm-up and
step ``OPUS_PROFILE_SKIP`` (default 1) is recorded, after the process groups exist, so the
trace's ``distributedInfo`` lists them. The trace goes to ``OUT_DIR/rank<RANK>.json``.
"""

from __future__ import annotations

import os
import runpy
import sys


def main(argv: list[str]) -> None:
    import torch.profiler as tp
    from torch.optim.optimizer import register_optimizer_step_post_hook

    out_dir, script, *args = argv
    skip = int(os.environ.get("OPUS_PROFILE_SKIP", "1"))
    path = os.path.join(out_dir, f"rank{os.environ['RANK']}.json")

    def export(prof: tp.profile) -> None:
        os.makedirs(out_dir, exist_ok=True)
        prof.export_chrome_trace(path)

    prof = tp.profile(activities=[tp.ProfilerActivity.CPU], record_shapes=True,
                      schedule=tp.schedule(wait=0, warmup=skip, active=1, repeat=1),
                      on_trace_ready=export)
    register_optimizer_step_post_hook(lambda *_: prof.step())
    prof.start()
    sys.argv = [script, *args]
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        prof.stop()


if __name__ == "__main__":
    main(sys.argv[1:])
