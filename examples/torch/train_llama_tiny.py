"""A tiny Llama-style model trained with FSDP2 x pipeline parallelism (1F1B) on CPU.

A plain torch.distributed script, started like torchrun starts one (``RANK``, ``WORLD_SIZE``,
``MASTER_ADDR``, ``MASTER_PORT``): it runs on gloo as it is, and on the emulated photonic rails
under ``opus-testbed run examples/torch/llama-tiny-4x1.yaml`` without a change (the testbed's
launcher swaps the backend).

Model: RMSNorm, rotary attention, SwiGLU feed-forward; the first pipeline stage holds the
embedding, the last the final norm and the output layer (TorchTitan's split). Data: synthetic
token ids from a seeded generator per data-parallel index. Placement: ``rank = (stage * fsdp +
shard) * replicate + replica``, pipeline stages outermost and HSDP replicas innermost (the
GPUs of one server), as the testbed places ranks. Every block and each stage's root module is
``fully_shard``-ed over the FSDP mesh.

Each step, the last stage prints one JSON line ``{"step", "rank", "loss", "step_s"}`` with the
mean micro-batch loss as ``float.hex`` (exact, so two runs compare bit for bit).
"""

from __future__ import annotations

import argparse
import json
import os
import time

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.pipelining import PipelineStage, Schedule1F1B


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rotary(x: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding of (batch, heads, seq, head_dim)."""
    seq, head_dim = x.shape[-2], x.shape[-1]
    freqs = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    angles = torch.outer(torch.arange(seq, dtype=torch.float32), freqs)
    cos, sin = angles.cos(), angles.sin()
    even, odd = x[..., 0::2], x[..., 1::2]
    return torch.stack((even * cos - odd * sin, even * sin + odd * cos), dim=-1).flatten(-2)


class Block(nn.Module):
    """Pre-norm attention and SwiGLU feed-forward, each with a residual connection."""

    def __init__(self, dim: int, heads: int, ffn: int) -> None:
        super().__init__()
        self.heads = heads
        self.attn_norm = RMSNorm(dim)
        self.wqkv = nn.Linear(dim, 3 * dim, bias=False)
        self.wo = nn.Linear(dim, dim, bias=False)
        self.ffn_norm = RMSNorm(dim)
        self.w1 = nn.Linear(dim, ffn, bias=False)
        self.w3 = nn.Linear(dim, ffn, bias=False)
        self.w2 = nn.Linear(ffn, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q, k, v = self.wqkv(self.attn_norm(x)).split(d, dim=-1)
        q, k, v = (t.view(b, s, self.heads, d // self.heads).transpose(1, 2) for t in (q, k, v))
        a = F.scaled_dot_product_attention(rotary(q), rotary(k), v, is_causal=True)
        x = x + self.wo(a.transpose(1, 2).reshape(b, s, d))
        h = self.ffn_norm(x)
        return x + self.w2(F.silu(self.w1(h)) * self.w3(h))


class Stage(nn.Module):
    """The layers of one pipeline stage."""

    def __init__(self, args: argparse.Namespace, stage: int) -> None:
        super().__init__()
        per = args.layers // args.pp
        first, last = stage == 0, stage == args.pp - 1
        self.tok_embeddings = nn.Embedding(args.vocab, args.dim) if first else None
        self.layers = nn.ModuleDict({str(i): Block(args.dim, args.heads, args.ffn)
                                     for i in range(stage * per, (stage + 1) * per)})
        self.norm = RMSNorm(args.dim) if last else None
        self.output = nn.Linear(args.dim, args.vocab, bias=False) if last else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.tok_embeddings(x) if self.tok_embeddings is not None else x
        for layer in self.layers.values():
            h = layer(h)
        if self.norm is not None and self.output is not None:
            h = self.output(self.norm(h))
        return h


def parse_args() -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pp", type=int, default=2, help="pipeline stages")
    ap.add_argument("--fsdp", type=int, default=2, help="FSDP shards per stage")
    ap.add_argument("--replicate", type=int, default=1,
                    help="HSDP replicas (the GPUs of one server); 1: plain FSDP")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--ffn", type=int, default=256)
    ap.add_argument("--vocab", type=int, default=512)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--microbatch", type=int, default=2, help="sequences per micro-batch")
    ap.add_argument("--microbatches", type=int, default=4, help="micro-batches per step")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--reshard-after-forward", choices=("true", "false"), default="true",
                    help="FSDP2: free gathered parameters after forward (gather again for "
                    "backward)")
    return ap.parse_args()


def main() -> None:
    args = parse_args()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world != args.pp * args.fsdp * args.replicate:
        raise SystemExit(f"world size {world} != pp*fsdp*replicate = "
                         f"{args.pp}*{args.fsdp}*{args.replicate}")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    ranks = torch.arange(world).view(args.pp, args.fsdp, args.replicate).transpose(1, 2)
    mesh = DeviceMesh("cpu", ranks, mesh_dim_names=("pp", "replicate", "fsdp"))
    stage_index = mesh.get_local_rank("pp")
    dp_index = mesh.get_local_rank("fsdp") * args.replicate + mesh.get_local_rank("replicate")
    fsdp_mesh = mesh["replicate", "fsdp"] if args.replicate > 1 else mesh["fsdp"]
    first, last = stage_index == 0, stage_index == args.pp - 1

    torch.manual_seed(args.seed)  # every rank builds every stage alike and keeps its own
    model = [Stage(args, s) for s in range(args.pp)][stage_index]
    reshard = args.reshard_after_forward == "true"
    for layer in model.layers.values():
        fully_shard(layer, mesh=fsdp_mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=fsdp_mesh, reshard_after_forward=reshard)
    stage = PipelineStage(model, stage_index, args.pp, torch.device("cpu"),
                          group=mesh.get_group("pp"))

    def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits.flatten(0, 1), target.flatten(0, 1))

    # loss_fn on every stage: without it the first stage skips backward shape inference
    schedule = Schedule1F1B(stage, args.microbatches, loss_fn=loss_fn)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    data = torch.Generator().manual_seed(1000 + 100 * args.seed + dp_index)
    for step in range(args.steps):
        tokens = torch.randint(0, args.vocab, (args.microbatch * args.microbatches,
                                               args.seq + 1), generator=data)
        x, y = tokens[:, :-1], tokens[:, 1:]
        t0 = time.monotonic()
        optimizer.zero_grad()
        losses: list[torch.Tensor] = []
        inputs = (x,) if first else ()
        schedule.step(*inputs, target=y if last else None, losses=losses if last else None)
        optimizer.step()
        if last:
            loss = torch.stack(losses).mean().item()
            print(json.dumps({"step": step, "rank": rank, "loss": float.hex(loss),
                              "step_s": round(time.monotonic() - t0, 4)}), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
