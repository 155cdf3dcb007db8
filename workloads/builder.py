"""Build the per-role programs of one training iteration (see :mod:`workloads.schedule`).

Traffic and its sizes, per rank (``T = micro_batch_size * seq_len / cp`` tokens, ``H`` hidden,
``a`` activation bytes, ``P`` the parameters of an FSDP unit held by this TP/EP rank):

* TP, Megatron-LM (Shoeybi et al. 2019): per block, forward one all-reduce after attention and
  one after the MLP, of ``T*H*a`` bytes; the backward mirrors them. With sequence parallelism
  (Korthikanti et al. 2022) each all-reduce becomes an all-gather of the ``T/tp`` shard before
  the sub-layer and a reduce-scatter of ``T*H*a`` after it.
* FSDP / ZeRO-3 (Rajbhandari et al. 2020; PyTorch FSDP2 as TorchTitan uses it): per unit, an
  all-gather whose input is this rank's shard ``ceil(P / S)`` in bf16 (``S`` = shard group
  size) and a reduce-scatter whose input is the unsharded gradient ``ceil(P / S) * S`` in
  fp32. HSDP adds an all-reduce of the fp32 shard over the replicate group. A unit is
  all-gathered before a forward or a backward only when it is sharded at that moment
  (FSDP2's unshard is a no-op for a gathered unit); when it is resharded:

  - without reshard-after-forward (``never``; ``default`` under PP): never, so the
    all-gather runs once per iteration (first micro-batch) and gradients are reduced in the
    last micro-batch's backward, unit by unit (gradient accumulation without sync before);
  - with it and without PP (``always``; ``default`` without PP): after every forward and
    every backward, so the unit is all-gathered before every forward and backward; gradients
    are reduced in the last micro-batch's backward;
  - with it under PP (``always``), as PyTorch's pipeline stage runs FSDP2
    (``torch/distributed/pipelining/stage.py``: every micro-batch's backward runs with
    ``set_reshard_after_backward(False)`` and without gradient sync; the stage reduces once,
    after its last backward): after every forward only. A backward gathers the units a forward
    resharded and leaves them gathered; after the stage's last action every unit's gradient is
    reduce-scattered from the main thread in module order (FSDP2's state list, which the
    stage's ``perform_reduce_grad`` walks: the embedding, the blocks, ``[norm, output]``; a
    ``block-root`` stage module first) and the units are resharded. This is the measured
    rule, not "an all-gather before every micro-batch's forward and backward": for
    TorchTitan's Llama3-8B run of the Opus artifact (PP2, 17 units a stage, 1F1B) it gives,
    per stage and step, 51 all-gathers with 2 micro-batches (stage 0: F0, F1, B0 gather;
    stage 1: F0, B0, B1) and 68 with 3, plus 17 reduce-scatters: with the grad-norm
    all-reduce the 69 and 86 FSDP calls per step of the artifact's recorded communication
    patterns. The literal rule would give 68 and 102 all-gathers. TorchTitan 0.3.0's own
    trainer with that structure issues the same FSDP2 and pipeline calls in the same order
    (``tests/torchjob/test_titan.py``, ``workloads/FORMAT.md``).

  All-gathers issued inside a backward (FSDP's pre-backward hooks) are marked
  ``thread="autograd"``; every other op runs on the main thread.
* Activation checkpointing ``full`` (TorchTitan's ``_apply_full_ac``: a checkpoint wrapper
  around every transformer block, not the embedding, final norm or output head): in the
  backward each block's forward runs again first, with its compute and its TP/CP/EP
  collectives, after the block's FSDP all-gather (the wrapper sits inside the FSDP unit, so
  the recompute needs no all-gather of its own).
* DDP (Li et al. 2020): gradients in fp32 buckets of ``ddp_bucket_mb`` MiB, each all-reduced
  as soon as the backward fills it; the remainder is flushed at the end.
* PP: one send/recv of the stage-boundary activation ``micro_batch_size * seq/cp * H * a``
  bytes (divided by ``tp`` with sequence parallelism) per micro-batch and chunk boundary
  forward, and of its gradient backward. 1F1B (Narayanan et al. 2021, PipeDream-Flush) and
  Megatron-LM's interleaved schedule with virtual stages.
* CP, ring attention (Liu et al. 2023; TorchTitan's context parallel): per block, forward an
  all-gather of this rank's K and V (``2*T*kv_dim_local*a``); backward a reduce-scatter of
  the K/V gradients (``cp`` times that).
* EP (GShard, Lepikhin et al. 2020; DeepSpeed-MoE): per MoE block, forward an all-to-all
  dispatch of ``T*top_k*H*a`` bytes split by the experts each peer hosts (uniform routing)
  and the matching combine; the backward runs both in reverse.
* Optimizer synchronisation: a 4-byte all-reduce of the gradient norm on every sharded axis
  (FSDP, TP, EP, PP), as in gradient clipping of DTensor-sharded parameters. Then, with
  ``loss_logging_allreduces = n``, TorchTitan's loss logging on the data-parallel group (FSDP,
  else DP, else CP): all-reduces of 4, 4 and 8 bytes (mean loss, max loss, tokens seen; 8
  bytes for any further one).
* Compute durations are FLOPs / (peak * MFU), times ``compute_scale`` (1 unless the config is
  calibrated to a measured step, :mod:`workloads.calibrate`).

Layer split over the ``pp * virtual_stages`` chunks: ``n_layers // chunks`` each; the
remainder goes to the middle chunks first, then the last, then the first (those also hold the
embedding and the output head); or TorchTitan's split (``pp_layer_split: torchtitan``, see
:func:`workloads.parallel.split_layers`). An MoE block's routed experts are one FSDP unit with
the rest of the block without EP (TorchTitan's ``apply_fsdp`` wraps ``moe.experts`` apart only
when ``ep_degree > 1``), their own unit on the ``edp`` axis with it. Experts split over EP
ranks: ``n_experts // ep`` each, the first ``n_experts % ep`` ranks take one more.

Worked check (Llama3-8B, TP4, FSDP2, PP2, fp32 reduce): stage 0 holds the embedding and blocks
0-15; its TP-sharded matrices have 4,014,997,504 parameters (exactly 3829 MiB / 4 bytes * 4)
and the 16 blocks' RMSNorm weights 131,072 more, replicated over TP. Per rank P =
1,003,749,376 + 131,072 = 1,003,880,448, so the whole-stage all-gather is P/2 * 2 bytes =
957.38 MiB and the reduce-scatter P * 4 bytes = 3829.50 MiB; the paper's "957 MB" and
"3829 MB" are these figures truncated to whole MiB (the replicated norms add 0.13 and 0.5 MiB).
Stage 1 (blocks 16-31, final norm, output head) has the same matrices and 135,168 norm
weights. The PP message is 1 * 8192 * 4096 * 2 bytes = 64 MiB.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from workloads.config import WorkloadConfig
from workloads.layout import build_groups, index_groups
from workloads.models import embedding_params, head_params, layer_params
from workloads.parallel import split_layers
from workloads.schedule import Program, Schedule, TemplateOp
from workloads.threads import AUTOGRAD_THREAD, MAIN_THREAD

GRAD_NORM_BYTES = 4
#: TorchTitan's loss logging with ``log_freq = 1``: mean loss (fp32), max loss (fp32), tokens
#: seen (int64); any further all-reduce is taken as 8 bytes.
LOSS_LOGGING_BYTES = (4, 4, 8)


def split_experts(n_experts: int, ep: int) -> list[int]:
    """Experts hosted by each EP position."""
    base, extra = divmod(n_experts, ep)
    return [base + (j < extra) for j in range(ep)]


def pipeline_order(pp: int, stage: int, microbatches: int, virtual: int,
                   schedule: str) -> list[tuple[str, int, int]]:
    """Actions ``("F"|"B", microbatch, local chunk)`` of one stage in issue order.

    1F1B: ``pp - stage - 1`` warm-up forwards, then alternate one forward and one backward,
    then drain the backwards. Interleaved (Megatron-LM): micro-batches in groups of ``pp``,
    chunks cycled within a group; ``2 (pp - stage - 1) + (virtual - 1) pp`` warm-up forwards.
    """
    total = microbatches * virtual
    if schedule == "1f1b":
        warm = min(pp - stage - 1, microbatches)
        fwd = [("F", k, 0) for k in range(total)]
        bwd = [("B", k, 0) for k in range(total)]
    else:
        warm = min(2 * (pp - stage - 1) + (virtual - 1) * pp, total)
        fwd, bwd = [], []
        for k in range(total):
            group, within = divmod(k, pp * virtual)
            mb = group * pp + within % pp
            fwd.append(("F", mb, within // pp))
            bwd.append(("B", mb, virtual - 1 - within // pp))
    order = fwd[:warm]
    for i in range(total - warm):
        order += [fwd[warm + i], bwd[i]]
    return order + bwd[total - warm:]


@dataclass(frozen=True)
class Unit:
    """An FSDP unit: its name and this rank's dense and expert parameters."""

    name: str
    dense: int
    expert: int


def _ceil(a: int, b: int) -> int:
    return -(-a // b)


class _ProgramBuilder:
    """Appends the ops of one role; keeps the compute chain and communicator order."""

    def __init__(self, cfg: WorkloadConfig, stage: int, ep_index: int, sizes: dict[str, int]):
        self.cfg = cfg
        self.p = cfg.parallel
        self.stage = stage
        self.ep_index = ep_index
        self.sizes = sizes  # comm group size per axis
        self.ops: list[TemplateOp] = []
        self.cursor: list[int] = []  # the compute/sync chain's last op
        self.last_on: dict[str, int] = {}  # last async collective per communicator axis
        self.grad_sync: list[int] = []
        self.sends: list[int] = []  # the pipeline sends issued so far
        m = cfg.model_spec
        self.tokens = cfg.micro_batch_size * cfg.seq_len // self.p.cp
        self.flops_per_s = cfg.gpu.peak_bf16_tflops * 1e12 * cfg.mfu
        self.experts = split_experts(m.n_experts, self.p.ep) if m.is_moe else []
        self.local_experts = self.experts[ep_index] if m.is_moe else 0
        self.chunk_layers = split_layers(m.n_layers, self.p.chunks, self.p.pp_layer_split)
        self.buckets: dict[str, int] = {"dp": 0, "edp": 0}
        self.n_buckets = 0
        self.unsharded: set[str] = set()  # FSDP units whose parameters are gathered now
        # the pipeline-stage rule of FSDP2 with reshard-after-forward (module docstring)
        self.reduce_at_step_end = self.fsdp_on and self.p.pp > 1 and self.p.reshard

    # --- primitives ----------------------------------------------------------------------
    def add(self, op: TemplateOp) -> int:
        self.ops.append(op)
        return len(self.ops) - 1

    def compute(self, tag: str, flops: float, extra: list[int] | None = None) -> int:
        deps = tuple(sorted(set(self.cursor + (extra or []))))
        duration_s = flops / self.flops_per_s * self.cfg.compute_scale
        i = self.add(TemplateOp("compute", tag, deps, duration_s=duration_s))
        self.cursor = [i]
        return i

    def sync(self, kind: str, axis: str, tag: str, size: int,
             split: tuple[int, ...] = ()) -> None:
        """A collective on the compute chain (TP, CP, EP): the next compute waits for it."""
        if self.sizes[axis] < 2:
            return
        i = self.add(TemplateOp(kind, tag, tuple(self.cursor), axis=axis, size_bytes=size,
                                split=split))
        self.cursor = [i]

    def async_coll(self, kind: str, axis: str, tag: str, size: int,
                   deps: list[int], thread: str = MAIN_THREAD) -> int | None:
        """A collective on its own stream, serialised with the previous one on its axis."""
        if self.sizes[axis] < 2 or size <= 0:
            return None
        prev = [self.last_on[axis]] if axis in self.last_on else []
        i = self.add(TemplateOp(kind, tag, tuple(sorted(set(deps + prev))), axis=axis,
                                size_bytes=size, thread=thread))
        self.last_on[axis] = i
        return i

    def p2p(self, kind: str, tag: str, peer_stage: int, deps: list[int]) -> int:
        i = self.add(TemplateOp(kind, tag, tuple(deps), axis="pp", size_bytes=self.act_bytes,
                                peer_stage=peer_stage))
        if kind == "send":
            self.sends.append(i)
        return i

    # --- sizes -------------------------------------------------------------------------
    @property
    def act_bytes(self) -> int:
        """Stage-boundary activation (or its gradient) of one micro-batch."""
        b = self.tokens * self.cfg.model_spec.hidden_size * self.cfg.act_dtype_bytes
        return b // self.p.tp if self.p.sp else b

    def units(self, chunk: int) -> list[Unit]:
        """FSDP units of a chunk: the root (embedding / head) first, then the blocks."""
        m, tp = self.cfg.model_spec, self.p.tp
        root = 0
        if chunk == 0:
            root += _ceil(embedding_params(m), tp)
        if chunk == self.p.chunks - 1:
            out, norm = head_params(m)
            root += _ceil(out, tp) + norm
        units = [Unit(f"c{chunk}.root", root, 0)] if root else []
        for layer in self.chunk_layers[chunk]:
            lp = layer_params(m, layer)
            expert = _ceil(lp.expert_each, tp) * self.local_experts if lp.n_experts else 0
            dense = _ceil(lp.tp_sharded, tp) + lp.replicated
            if self.p.ep == 1:  # TorchTitan shards the experts apart only under EP
                dense, expert = dense + expert, 0
            units.append(Unit(f"l{layer}", dense, expert))
        if self.p.fsdp_unit == "stage":
            return [Unit(f"c{chunk}.all", sum(u.dense for u in units),
                         sum(u.expert for u in units))]
        return units

    def module_order(self, chunk: int) -> list[Unit]:
        """A chunk's units in module order, the order its forward reaches them and the order
        of FSDP2's state list (``named_modules()`` pre-order), which the pipeline stage's
        step-end reduction walks: the embedding, the blocks, then ``[norm, output]``. A root
        that holds only the head (the last of several chunks) comes after the blocks, unless
        the root is the stage module itself (``block-root``), whose state comes first."""
        units = self.units(chunk)
        head_only = chunk == self.p.chunks - 1 and chunk > 0 and self.p.fsdp_unit == "block"
        if head_only and len(units) > 1 and units[0].name.endswith("root"):
            return units[1:] + units[:1]
        return units

    # --- FLOPs -------------------------------------------------------------------------
    def attn_flops(self) -> float:
        m, t = self.cfg.model_spec, self.tokens
        sharded, replicated = m.attn_matrices
        core = 2 * t * self.cfg.seq_len * m.n_heads * (m.qk_head_dim + m.v_head_dim_eff)
        return (2 * t * sharded + core) / self.p.tp + 2 * t * replicated

    def mlp_flops(self, layer: int) -> float:
        m, t = self.cfg.model_spec, self.tokens
        if not m.is_moe_layer(layer):
            return 2 * t * 3 * m.hidden_size * m.ffn_hidden_size / self.p.tp
        expert = 3 * m.hidden_size * m.moe_ffn_hidden_size
        routed_tokens = t * m.top_k * self.p.ep * self.local_experts / m.n_experts
        return (2 * routed_tokens * expert + 2 * t * expert * m.n_shared_experts) / self.p.tp \
            + 2 * t * m.hidden_size * m.n_experts

    def head_flops(self) -> float:
        m = self.cfg.model_spec
        return 2 * self.tokens * m.vocab_size * m.hidden_size / self.p.tp

    # --- FSDP / DDP ----------------------------------------------------------------------
    @property
    def fsdp_on(self) -> bool:
        return self.p.fsdp > 1

    def gather(self, unit: Unit, tag: str, deps: list[int],
               thread: str = MAIN_THREAD) -> list[int]:
        """All-gathers of a unit's dense and expert shards if it is sharded (then it is not);
        returns their op indices."""
        if not self.fsdp_on or unit.name in self.unsharded:
            return []
        self.unsharded.add(unit.name)
        out = []
        a = self.cfg.param_dtype_bytes
        for axis, n in (("fsdp", unit.dense), ("edp", unit.expert)):
            if n:
                i = self.async_coll("all_gather", axis, f"{tag}.{axis}.ag",
                                    _ceil(n, self.sizes[axis]) * a, deps, thread)
                if i is not None:
                    out.append(i)
        return out

    def reshard(self, units: list[Unit]) -> None:
        """FSDP frees the gathered parameters of ``units``; the next use gathers them again."""
        self.unsharded.difference_update(u.name for u in units)

    def reduce_grads(self, unit: Unit, tag: str, extra: list[int] | None = None) -> None:
        """Gradient sync of a unit whose backward just finished (last micro-batch); the
        reduce-scatters also wait for ``extra``."""
        r = self.cfg.reduce_dtype_bytes
        if self.fsdp_on:
            for axis, n in (("fsdp", unit.dense), ("edp", unit.expert)):
                if not n:
                    continue
                s = self.sizes[axis]
                i = self.async_coll("reduce_scatter", axis, f"{tag}.{axis}.rs",
                                    _ceil(n, s) * s * r, self.cursor + (extra or []))
                if i is not None:
                    self.grad_sync.append(i)
                    if axis == "fsdp" and self.p.dp > 1:
                        j = self.async_coll("all_reduce", "dp", f"{tag}.dp.ar", _ceil(n, s) * r,
                                            [i])
                        if j is not None:
                            self.grad_sync.append(j)
            return
        cap = int(self.cfg.ddp_bucket_mb * 2**20)
        for axis, n in (("dp", unit.dense), ("edp", unit.expert)):
            self.buckets[axis] += n * r
            while self.buckets[axis] >= cap:
                self.flush_bucket(axis, cap)

    def flush_bucket(self, axis: str, size: int) -> None:
        if size <= 0:
            return
        self.buckets[axis] -= size
        i = self.async_coll("all_reduce", axis, f"bucket{self.n_buckets}.{axis}.ar", size,
                            list(self.cursor))
        self.n_buckets += 1
        if i is not None:
            self.grad_sync.append(i)

    # --- one forward / backward of a micro-batch on a chunk --------------------------------
    def segments(self, chunk: int) -> list[tuple[str, int]]:
        """Compute segments of a chunk's forward: ``(unit name, layer)``, layer -1 = head."""
        stage_mode = self.p.fsdp_unit == "stage"
        segs = [(f"c{chunk}.all" if stage_mode else f"l{layer}", layer)
                for layer in self.chunk_layers[chunk]]
        if chunk == self.p.chunks - 1:
            segs.append((f"c{chunk}.all" if stage_mode else f"c{chunk}.root", -1))
        return segs

    def forward(self, mb: int, local_chunk: int) -> None:
        p = self.p
        c = local_chunk * p.pp + self.stage
        pre = f"f.m{mb}.c{c}"
        entry: list[int] = []
        if c > 0:
            entry = [self.p2p("recv", f"act.c{c - 1}.m{mb}", (c - 1) % p.pp, list(self.cursor))]
        units = self.module_order(c)  # gathered in the order the forward reaches them
        names = [u.name for u in units]
        ag: dict[str, list[int]] = {}
        issued = 0
        for k, (name, layer) in enumerate(self.segments(c)):
            # FSDP2-style prefetch: when a unit starts, the next unit's all-gather is issued.
            want = min(names.index(name) + 1, len(units) - 1)
            while issued <= want:
                ag[names[issued]] = self.gather(units[issued], f"{pre}.{names[issued]}",
                                                sorted(set(self.cursor + entry)))
                issued += 1
            extra = list(ag.get(name, []))
            if k == 0:  # the embedding (a root gathered first) runs before the first block
                extra += entry + (ag.get(names[0], []) if names[0].endswith("root") else [])
            if layer < 0:
                self.compute(f"{pre}.head", self.head_flops(), extra)
            else:
                self._forward_layer(layer, f"{pre}.l{layer}", extra)
        if p.reshard:
            self.reshard(units)
        if c < p.chunks - 1:
            self.p2p("send", f"act.c{c}.m{mb}", (c + 1) % p.pp, list(self.cursor))

    def backward(self, mb: int, local_chunk: int, last: bool) -> None:
        p = self.p
        c = local_chunk * p.pp + self.stage
        pre = f"b.m{mb}.c{c}"
        entry: list[int] = []
        if c < p.chunks - 1:
            entry = [self.p2p("recv", f"grad.c{c + 1}.m{mb}", (c + 1) % p.pp, list(self.cursor))]
        units = {u.name: u for u in self.units(c)}
        segs = list(reversed(self.segments(c)))
        reduce_now = last and not self.reduce_at_step_end
        for k, (name, layer) in enumerate(segs):
            extra = entry if k == 0 else []
            if k == 0 or segs[k - 1][0] != name:
                extra = extra + self.gather(units[name], f"{pre}.{name}",
                                            sorted(set(self.cursor + entry)), AUTOGRAD_THREAD)
            if layer < 0:
                self.compute(f"{pre}.head", 2 * self.head_flops(), extra)
            else:
                if self.cfg.activation_checkpointing == "full":
                    self._forward_layer(layer, f"{pre}.l{layer}.rc", extra)
                    extra = []
                self._backward_layer(layer, f"{pre}.l{layer}", extra)
            unit_done = k == len(segs) - 1 or segs[k + 1][0] != name
            if reduce_now and unit_done and name.startswith("l"):
                self.reduce_grads(units[name], f"{pre}.{name}")
        # a unit without a compute segment (stage 0's embedding under PP): its pre-backward
        # hook gathers it when the backward reaches it, and the compute stream waits for that
        for name in units.keys() - {n for n, _ in segs}:
            ag = self.gather(units[name], f"{pre}.{name}", list(self.cursor), AUTOGRAD_THREAD)
            self.cursor = sorted(set(self.cursor + ag))
        if reduce_now:  # the root unit (or the whole chunk) reduces when the chunk's backward ends
            for name, u in units.items():
                if not name.startswith("l"):
                    self.reduce_grads(u, f"{pre}.{name}")
        if p.reshard and not self.reduce_at_step_end:
            self.reshard(list(units.values()))
        if c > 0:
            self.p2p("send", f"grad.c{c}.m{mb}", (c - 1) % p.pp, list(self.cursor))

    def _forward_layer(self, layer: int, tag: str, extra: list[int]) -> None:
        p, m = self.p, self.cfg.model_spec
        th = self.tokens * m.hidden_size * self.cfg.act_dtype_bytes
        if p.sp:
            self.sync("all_gather", "tp", f"{tag}.tp.ag_attn", th // p.tp)
        self.sync("all_gather", "cp", f"{tag}.cp.ag_kv", self.kv_bytes())
        self.compute(f"{tag}.attn", self.attn_flops(), extra)
        self.sync("reduce_scatter" if p.sp else "all_reduce", "tp", f"{tag}.tp.attn_out", th)
        if p.sp:
            self.sync("all_gather", "tp", f"{tag}.tp.ag_mlp", th // p.tp)
        if m.is_moe_layer(layer) and p.ep > 1:
            dispatch, combine = self.a2a_splits()
            self.sync("all_to_all", "ep", f"{tag}.ep.dispatch", sum(dispatch), dispatch)
            self.compute(f"{tag}.moe", self.mlp_flops(layer))
            self.sync("all_to_all", "ep", f"{tag}.ep.combine", sum(combine), combine)
        else:
            self.compute(f"{tag}.mlp", self.mlp_flops(layer))
        self.sync("reduce_scatter" if p.sp else "all_reduce", "tp", f"{tag}.tp.mlp_out", th)

    def _backward_layer(self, layer: int, tag: str, extra: list[int]) -> None:
        p, m = self.p, self.cfg.model_spec
        th = self.tokens * m.hidden_size * self.cfg.act_dtype_bytes
        if p.sp:
            self.sync("all_gather", "tp", f"{tag}.tp.ag_mlp", th // p.tp)
        if m.is_moe_layer(layer) and p.ep > 1:
            dispatch, combine = self.a2a_splits()
            self.sync("all_to_all", "ep", f"{tag}.ep.combine_grad", sum(dispatch), dispatch)
            self.compute(f"{tag}.moe", 2 * self.mlp_flops(layer), extra)
            self.sync("all_to_all", "ep", f"{tag}.ep.dispatch_grad", sum(combine), combine)
        else:
            self.compute(f"{tag}.mlp", 2 * self.mlp_flops(layer), extra)
        self.sync("reduce_scatter" if p.sp else "all_reduce", "tp", f"{tag}.tp.mlp_in", th)
        if p.sp:
            self.sync("all_gather", "tp", f"{tag}.tp.ag_attn", th // p.tp)
        self.compute(f"{tag}.attn", 2 * self.attn_flops())
        self.sync("reduce_scatter", "cp", f"{tag}.cp.rs_dkv", self.kv_bytes() * p.cp)
        self.sync("reduce_scatter" if p.sp else "all_reduce", "tp", f"{tag}.tp.attn_in", th)

    def kv_bytes(self) -> int:
        """This rank's K and V for its ``T`` tokens (KV heads split over TP when possible)."""
        m = self.cfg.model_spec
        heads = max(1, m.n_kv_heads // self.p.tp)
        return self.tokens * heads * (m.qk_head_dim + m.v_head_dim_eff) * self.cfg.act_dtype_bytes

    def a2a_splits(self) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """(dispatch, combine) bytes to each EP position under uniform routing."""
        m, p = self.cfg.model_spec, self.p
        tokens = self.tokens // p.tp if p.sp else self.tokens
        per = tokens * m.top_k * m.hidden_size * self.cfg.act_dtype_bytes
        dispatch = tuple(per * e // m.n_experts for e in self.experts)
        combine = tuple(per * self.local_experts // m.n_experts for _ in self.experts)
        return dispatch, combine

    def finish(self) -> None:
        """The end of the step: the pipeline stage's gradient reduction (reshard-after-forward
        under PP), DDP's last buckets, the optimizer's synchronisation all-reduces, then the
        loss-logging all-reduces.

        The stage's reduction waits for its pipeline sends: PyTorch's ``Schedule1F1B`` waits
        for the last send's work (``_wait_batch_p2p(send_work)``) before the stage reduces its
        gradients (``perform_reduce_grad``; ``torch/distributed/pipelining/schedules.py``), and
        the artifact's recorded main-thread order has the last send before the
        reduce-scatters."""
        if self.reduce_at_step_end:
            for c in range(self.stage, self.p.chunks, self.p.pp):
                units = self.module_order(c)  # perform_reduce_grad walks FSDP2's states
                for u in units:
                    self.reduce_grads(u, f"step.c{c}.{u.name}", list(self.sends))
                self.reshard(units)
        for axis in ("dp", "edp"):
            self.flush_bucket(axis, self.buckets[axis])
        deps = sorted(set(self.cursor + self.grad_sync))
        axes = ["fsdp" if self.fsdp_on else "", "tp", "ep", "pp"]
        if self.cfg.model_spec.is_moe and self.fsdp_on and self.p.ep > 1:  # experts apart
            axes.append("edp")
        for axis in axes:
            if axis and self.sizes[axis] > 1:
                i = self.add(TemplateOp("all_reduce", f"opt.gradnorm.{axis}", tuple(deps),
                                        axis=axis, size_bytes=GRAD_NORM_BYTES))
                deps = [i]
        log_axis = next((a for a in ("fsdp", "dp", "cp") if self.sizes[a] > 1), None)
        for k in range(self.cfg.loss_logging_allreduces if log_axis else 0):
            size = LOSS_LOGGING_BYTES[min(k, len(LOSS_LOGGING_BYTES) - 1)]
            i = self.add(TemplateOp("all_reduce", f"log.loss{k}.{log_axis}", tuple(deps),
                                    axis=str(log_axis), size_bytes=size))
            deps = [i]
        self.cursor = deps


def build_program(cfg: WorkloadConfig, stage: int, ep_index: int,
                  sizes: dict[str, int]) -> Program:
    """The op list of the ranks at pipeline ``stage`` and EP position ``ep_index``."""
    p = cfg.parallel
    b = _ProgramBuilder(cfg, stage, ep_index, sizes)
    order = pipeline_order(p.pp, stage, cfg.num_microbatches, p.virtual_stages, p.pp_schedule)
    for kind, mb, chunk in order:
        if kind == "F":
            b.forward(mb, chunk)
        else:
            b.backward(mb, chunk, last=mb == cfg.num_microbatches - 1)
    b.finish()
    return Program(stage, ep_index, tuple(b.ops))


def generate_schedule(cfg: WorkloadConfig) -> Schedule:
    """Validate ``cfg`` and build the schedule of one training iteration (pure)."""
    cfg.validate()
    p = cfg.parallel
    groups = build_groups(p)
    sizes = {axis: g.size for axis, g in groups.items()}
    m = cfg.model_spec
    variants = p.ep if m.is_moe and m.n_experts % p.ep else 1
    programs = [build_program(cfg, s, e, sizes) for s in range(p.pp) for e in range(variants)]
    world = p.world_size
    stage = np.arange(world, dtype=np.int64) // (world // p.pp)
    ep_pos = index_groups(groups["ep"], world).position if variants > 1 else 0
    program_of = (stage * variants + ep_pos).astype(np.int32)
    return Schedule(cfg, groups, programs, program_of)
