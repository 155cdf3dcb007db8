"""A torch script for the loopback backend test: every carried call, checked against exact
values computed locally; run by the testbed's launcher on 3 ranks (see test_backend_loopback).

Prints one JSON line ``{"rank", "checks"}`` when every check passed, and the message of the
refused ``reduce``; writes a profiler trace of one all-reduce to ``$OPS_TRACE_DIR``.
"""

from __future__ import annotations

import json
import os

import torch
import torch.distributed as dist

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
dist.init_process_group("gloo")  # the launcher makes it "opus"
checks = 0


def check(got: torch.Tensor, want: torch.Tensor) -> None:
    global checks
    assert torch.equal(got, want), (got, want)
    checks += 1


def values(r: int, n: int = 10) -> torch.Tensor:
    """Exact in float64: integers."""
    return torch.arange(n, dtype=torch.float64) + 100 * r


total = sum(values(r) for r in range(world))
t = values(rank)
dist.all_reduce(t)  # 10 elements over 3 members: uneven chunks
check(t, total)
for op, want in ((dist.ReduceOp.MAX, values(world - 1)), (dist.ReduceOp.MIN, values(0)),
                 (dist.ReduceOp.AVG, total / world)):
    t = values(rank)
    dist.all_reduce(t, op=op)
    check(t, want)
t = torch.full((4,), 2.0 + rank)
dist.all_reduce(t, op=dist.ReduceOp.PRODUCT)
check(t, torch.full((4,), 2.0 * 3.0 * 4.0))

out = torch.empty(world * 6, dtype=torch.float64)
dist.all_gather_into_tensor(out, values(rank, 6))
check(out, torch.cat([values(r, 6) for r in range(world)]))
gathered = [torch.empty(5, dtype=torch.float64) for _ in range(world)]
dist.all_gather(gathered, values(rank, 5))
check(torch.cat(gathered), torch.cat([values(r, 5) for r in range(world)]))

shard = torch.empty(4, dtype=torch.float64)
work = dist.reduce_scatter_tensor(shard, values(rank, 4 * world), async_op=True)
work.wait()
check(shard, sum(values(r, 4 * world) for r in range(world))[4 * rank:4 * (rank + 1)])
parts = [values(rank, 9)[3 * j:3 * (j + 1)].clone() for j in range(world)]
mine = torch.empty(3, dtype=torch.float64)
dist.reduce_scatter(mine, parts, op=dist.ReduceOp.AVG)
check(mine, (sum(values(r, 9) for r in range(world)) / world)[3 * rank:3 * (rank + 1)])

b = values(rank, 7)
dist.broadcast(b, src=1)
check(b, values(1, 7))

nxt, prv = (rank + 1) % world, (rank - 1) % world
got = torch.empty(8, dtype=torch.float64)
ops = [dist.P2POp(dist.irecv, got, prv), dist.P2POp(dist.isend, values(rank, 8), nxt)]
for w in dist.batch_isend_irecv(ops):  # receive listed first: the launcher sends first
    w.wait()
check(got, values(prv, 8))

pair = dist.new_group([0, 2])
if rank in (0, 2):
    t = values(rank, 3)
    dist.all_reduce(t, group=pair)
    check(t, values(0, 3) + values(2, 3))

dist.barrier()
try:
    dist.reduce(values(rank, 2), dst=0)
except NotImplementedError as exc:
    print(json.dumps({"refused": str(exc)}), flush=True)

with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU],
                            record_shapes=True) as prof:  # (the events keep their args)
    t = values(rank)
    dist.all_reduce(t)  # under the profiler: an opus:allreduce event
check(t, total)
prof.export_chrome_trace(os.path.join(os.environ["OPS_TRACE_DIR"], f"rank{rank}.json"))

param = torch.nn.Parameter(torch.zeros(2))
opt = torch.optim.SGD([param], lr=0.1)
for _ in range(2):  # two optimizer steps: two iterations
    param.grad = torch.ones(2)
    opt.step()
print(json.dumps({"rank": rank, "checks": checks}), flush=True)
dist.destroy_process_group()
