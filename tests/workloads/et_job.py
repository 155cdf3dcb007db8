"""Record a PyTorch execution trace (ET JSON) of a few collectives on 4 gloo CPU ranks.

usage: ``python et_job.py OUT_DIR`` in every rank process (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT`` set as torchrun sets them). The ranks form a 2 x 2 device
mesh (``pp`` groups [0, 2], [1, 3]; ``fsdp`` groups [0, 1], [2, 3]) and run :func:`calls` once
under :class:`torch.profiler.ExecutionTraceObserver`, which writes ``OUT_DIR/rank<RANK>.json``
(the ET carries no rank: the importer reads it from the file name). The tests check the
import against :func:`calls`.
"""

from __future__ import annotations

import os
import sys


def calls(rank: int) -> list[tuple[str, str, int]]:
    """(kind, group, elements of the message) in issue order; group ``world``, ``pp`` or
    ``fsdp``; float32. The message is the input tensor: the shard for an all-gather, the full
    tensor for a reduce-scatter, the activation for send/recv (stage 0 sends to stage 1).
    Stage 1's FSDP calls are larger than stage 0's (the stages hold different parameters),
    which is what tells an FSDP pair from a pipeline pair in a trace without group names."""
    stage = rank // 2
    return [("all_reduce", "fsdp", 64 + 32 * stage),
            ("all_gather", "world", 256),
            ("reduce_scatter", "fsdp", 512 + 64 * stage),
            ("send" if stage == 0 else "recv", "pp", 300),
            ("all_gather", "fsdp", 128 + 16 * stage),
            ("reduce_scatter", "world", 1024)]


def main(out_dir: str) -> None:
    import torch
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.profiler import ExecutionTraceObserver

    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("pp", "fsdp"))
    groups = {"world": None, "pp": mesh.get_group("pp"), "fsdp": mesh.get_group("fsdp")}
    os.makedirs(out_dir, exist_ok=True)
    et = ExecutionTraceObserver().register_callback(os.path.join(out_dir, f"rank{rank}.json"))
    et.start()
    for kind, name, n in calls(rank):
        group = groups[name]
        size = dist.get_world_size(group)
        x = torch.ones(n)
        if kind == "all_reduce":
            dist.all_reduce(x, group=group)
        elif kind == "all_gather":
            dist.all_gather_into_tensor(torch.empty(n * size), x, group=group)
        elif kind == "reduce_scatter":
            dist.reduce_scatter_tensor(torch.empty(n // size), x, group=group)
        elif kind == "send":
            dist.send(x, rank + world // 2, group=group)  # global rank; c10d gets the group's
        else:
            dist.recv(x, rank - world // 2, group=group)
        torch.mm(torch.ones(64, 64), torch.ones(64, 64))
    et.stop()
    et.unregister_callback()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main(sys.argv[1])
