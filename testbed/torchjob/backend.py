"""The ``opus`` torch.distributed backend: every collective of a torch job through Opus.

Registered with ``torch.distributed.Backend.register_backend(..., extended_api=True)``; the
launcher (:mod:`testbed.torchjob.launcher`) makes it the job's only backend, so the script runs
unchanged. A Python ``ProcessGroup`` subclass replaces the group object outright, so every path
ends here: the ``torch.distributed`` functions, the functional collectives, FSDP2 and
pipelining. Each call becomes a :class:`~testbed.torchjob.lanes.CallSpec` plus a body that moves
the tensors with the algorithms of :mod:`testbed.torchjob.algorithms` over the project's own
transport, on the lane of its group (:mod:`testbed.torchjob.lanes`): intent, ack, transfer,
completion. gloo is never instantiated: its connections open when a group is created and would
need circuits a one-to-one OCS cannot light all at once.

Carried: all-gather, reduce-scatter and all-reduce (single, list and coalesced forms), send and
recv, broadcast and barrier; reductions SUM, AVG, MAX, MIN and PRODUCT. Refused, naming the
call and the group: reduce, gather, scatter, all-to-all, receive from any source.

Under ``torch.profiler`` (with ``record_shapes=True``) each call issues an ``opus:<method>``
event with the argument names of NCCL's ``record_param_comms`` (``Collective name``, ``In msg
nelems``, ``dtype``, ``Process Group Ranks``, ...), so ``opus-testbed import kineto`` reads
traces of these jobs (layout L4 of :mod:`workloads.kineto`).
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch._C._profiler import _RecordFunctionFast

from testbed.torchjob.algorithms import broadcast_steps, chunk_bounds, ring_sent_bytes, ring_steps
from testbed.torchjob.groups import axis_of, collective_lane, is_scale_up, p2p_lane
from testbed.torchjob.lanes import Call, CallContext, CallSpec, Runtime

BACKEND = "opus"

_RUNTIME: Runtime | None = None
_GPUS_PER_SERVER = 1
_AXES: dict[str, str] = {}


def configure(runtime: Runtime, *, gpus_per_server: int, axes: dict[str, str]) -> None:
    """Give the backend the rank's runtime (lanes, transport, records); the launcher calls it."""
    global _RUNTIME, _GPUS_PER_SERVER, _AXES
    _RUNTIME, _GPUS_PER_SERVER, _AXES = runtime, gpus_per_server, dict(axes)


def _as_bytes(t: torch.Tensor) -> memoryview:
    """A contiguous tensor's memory as bytes (no copy)."""
    if t.numel() == 0:
        return memoryview(b"")
    return memoryview(t.detach().reshape(-1).view(torch.uint8).numpy())


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


def _receive_into(ctx: CallContext, peer: int, step: int, dst: torch.Tensor, reduce_op: Any,
                  stream: str | None = None) -> None:
    """Receive ``dst``'s bytes from ``peer``; store them, or reduce them into ``dst``."""
    data = ctx.recv(peer, step, _nbytes(dst), stream)
    if dst.numel() == 0:
        return
    incoming = torch.frombuffer(data, dtype=dst.dtype).view(dst.shape)
    if reduce_op is None:
        dst.copy_(incoming)
    else:  # the received partial sum first, then the own chunk: the same order every run
        _combine(incoming, dst, reduce_op)
        dst.copy_(incoming)


def _tensors(result: Any) -> Iterator[torch.Tensor]:
    """The tensors of a call's result: a tensor, or (nested) lists of them."""
    if isinstance(result, torch.Tensor):
        yield result
    elif isinstance(result, list | tuple):
        for item in result:
            yield from _tensors(item)


def _as_device_writes(body: Callable[[CallContext], None], result: Any
                      ) -> Callable[[CallContext], None]:
    """``body`` writing its outputs as a device's collective does: without bumping their
    autograd version counters. A lane's ``copy_`` into an output would otherwise count as a
    mutation, and selective activation checkpointing (which saves collective outputs) refuses
    a saved tensor that was mutated."""
    outputs = list(_tensors(result))

    def guarded(ctx: CallContext) -> None:
        with contextlib.ExitStack() as stack:
            for t in outputs:
                stack.enter_context(torch.autograd._unsafe_preserve_version_counter(t))
            body(ctx)
    return guarded


def _op_type(reduce_op: Any) -> Any:
    return reduce_op.op if hasattr(reduce_op, "op") else reduce_op


def _combine(acc: torch.Tensor, other: torch.Tensor, reduce_op: Any) -> None:
    o = _op_type(reduce_op)
    if o in (dist.ReduceOp.SUM, dist.ReduceOp.AVG):
        acc.add_(other)
    elif o == dist.ReduceOp.MAX:
        torch.maximum(acc, other, out=acc)
    elif o == dist.ReduceOp.MIN:
        torch.minimum(acc, other, out=acc)
    elif o == dist.ReduceOp.PRODUCT:
        acc.mul_(other)
    else:
        raise NotImplementedError(f"reduction {o} is not carried by the opus backend (SUM, AVG, "
                                  "MAX, MIN and PRODUCT are)")


class OpusWork(dist._Work):
    """The handle of one call; :meth:`wait` is recorded (when the script needed the result)."""

    def __init__(self, future: torch.futures.Future, call: Call, runtime: Runtime) -> None:
        super().__init__()
        self._future = future
        self._call = call
        self._runtime = runtime

    def wait(self, timeout: Any = None) -> bool:
        t_start = time.time()
        self._future.wait()
        self._runtime.waited(self._call, t_start, time.time())
        return True

    def is_completed(self) -> bool:
        return bool(self._future.done())

    def is_success(self) -> bool:
        return self._call.done.is_set() and self._call.error is None

    def get_future(self) -> torch.futures.Future:
        return self._future


class OpusProcessGroup(dist.ProcessGroup):
    """One torch process group of this rank, carried on Opus lanes."""

    def __init__(self, opts: Any, _backend_options: Any = None) -> None:
        super().__init__(opts.group_rank, opts.group_size)
        if _RUNTIME is None:
            raise RuntimeError("the opus backend runs under `python -m testbed.torchjob.launcher` "
                               "(opus-testbed run starts it)")
        self._runtime = _RUNTIME
        self.n = int(opts.group_size)
        self.position = int(opts.group_rank)
        self.members = tuple(int(r) for r in opts.global_ranks_in_group) or tuple(range(self.n))
        self.me = self.members[self.position]
        self._name = str(opts.group_id)
        self._desc = ""
        self._p2p_counts: dict[tuple[int, int, int], int] = {}

    # ---------------------------------------------------------------- identity

    @property
    def group_name(self) -> str:
        return self._name

    @property
    def group_desc(self) -> str:
        return self._desc or self._name

    def _set_group_name(self, name: str) -> None:
        self._name = name

    def _set_group_desc(self, desc: str) -> None:
        self._desc = desc

    def getBackendName(self) -> str:  # torch's name
        return BACKEND

    def name(self) -> str:
        return BACKEND

    @property
    def axis(self) -> str:
        return axis_of(self._desc, _AXES)

    def _describe(self) -> str:
        return f"group {self.group_desc} (members {list(self.members)})"

    # ----------------------------------------------------------------- calls

    def _submit(self, op: str, kind: str, body: Callable[[CallContext], None], result: Any, *,
                size_bytes: int, wire_bytes: int, expected: int, dtype: torch.dtype,
                peer: int = -1) -> OpusWork:
        if peer >= 0:
            lane = p2p_lane(self.me, peer)
            scale_up = is_scale_up((self.me, peer), _GPUS_PER_SERVER)
        else:
            lane = collective_lane(self.axis, self.members)
            scale_up = is_scale_up(self.members, _GPUS_PER_SERVER)
        spec = CallSpec(op, kind, lane, self.axis, self.members, size_bytes, wire_bytes,
                        expected, str(dtype).removeprefix("torch."), self.group_desc, peer,
                        scale_up)
        future: torch.futures.Future = torch.futures.Future()

        def done(error: BaseException | None) -> None:
            if error is None:
                future.set_result(result)
            else:
                future.set_exception(error)

        numel = size_bytes // dtype.itemsize
        args = {"Collective name": op, "In msg nelems": numel,
                "Out msg nelems": numel * self.n if kind == "all_gather" else numel,
                "dtype": spec.dtype, "Group size": self.n, "Process Group Name": self._name,
                "Process Group Description": self.group_desc,
                "Process Group Ranks": str(list(self.members))}
        if peer >= 0:
            args["Rank"] = self.members.index(peer)
        with _RecordFunctionFast(f"opus:{op}", [], args):
            call = self._runtime.submit(spec, _as_device_writes(body, result), done)
        return OpusWork(future, call, self._runtime)

    def _ring(self, ctx: CallContext, kind: str, chunks: Sequence[torch.Tensor], reduce_op: Any,
              step0: int = 0) -> None:
        """Ring ``kind`` over ``chunks`` (this member's copy of every chunk), in place."""
        n, i = self.n, self.position
        to, frm = self.members[(i + 1) % n], self.members[(i - 1) % n]
        for k, step in enumerate(ring_steps(kind, n, i)):
            ctx.send(to, step0 + k, _as_bytes(chunks[step.send_chunk]))
            _receive_into(ctx, frm, step0 + k, chunks[step.recv_chunk],
                          reduce_op if step.reduce else None)

    def _reduced(self, ctx: CallContext, kind: str, flat: torch.Tensor, reduce_op: Any,
                 step0: int = 0) -> list[torch.Tensor]:
        """Reduce-scatter (or all-reduce) the 1-D ``flat`` in place; returns its chunks."""
        chunks = [flat[a:b] for a, b in chunk_bounds(flat.numel(), self.n)]
        self._ring(ctx, "reduce_scatter", chunks, reduce_op, step0)
        if _op_type(reduce_op) == dist.ReduceOp.AVG:
            chunks[self.position].div_(self.n)
        if kind == "all_reduce":
            self._ring(ctx, "all_gather", chunks, None, step0 + self.n - 1)
        return chunks

    def _ring_bytes(self, kind: str, numel: int, element_size: int) -> tuple[int, int]:
        """(sent, received) bytes of this member in ring ``kind`` over ``numel`` elements."""
        sent = sum(ring_sent_bytes(kind, self.n, self.position, numel, element_size))
        got = sum(ring_sent_bytes(kind, self.n, (self.position - 1) % self.n, numel,
                                  element_size))
        return sent, got

    def _gathered(self, ctx: CallContext, output: torch.Tensor, inp: torch.Tensor) -> None:
        chunks = list(output.view(self.n, -1).unbind(0))
        chunks[self.position].copy_(inp.reshape(-1))
        self._ring(ctx, "all_gather", chunks, None)

    def all_gather_single(self, output: torch.Tensor, inp: torch.Tensor, opts: Any = None
                          ) -> OpusWork:
        self._need_contiguous("all_gather_single", output, inp)
        sent, got = self._ring_bytes("all_gather", inp.numel(), inp.element_size())
        return self._submit("all_gather_single", "all_gather",
                            lambda ctx: self._gathered(ctx, output, inp), output,
                            size_bytes=_nbytes(inp), wire_bytes=sent, expected=got,
                            dtype=inp.dtype)

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor],
                                    inputs: list[torch.Tensor], opts: Any = None) -> OpusWork:
        self._need_contiguous("all_gather_single_coalesced", *outputs, *inputs)
        sizes = [self._ring_bytes("all_gather", t.numel(), t.element_size()) for t in inputs]

        def body(ctx: CallContext) -> None:
            for j, (out, inp) in enumerate(zip(outputs, inputs, strict=True)):
                ctx.stream = f"{ctx.call.record['cid']}/{j}"
                self._gathered(ctx, out, inp)

        return self._submit("all_gather_single_coalesced", "all_gather", body, outputs,
                            size_bytes=sum(_nbytes(t) for t in inputs),
                            wire_bytes=sum(s for s, _ in sizes),
                            expected=sum(g for _, g in sizes), dtype=inputs[0].dtype)

    def allgather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                  opts: Any = None) -> OpusWork:
        outs, inp = self._single("allgather", output_lists, inputs)
        if any(o.numel() != inp.numel() for o in outs):
            raise NotImplementedError(f"opus backend: allgather with uneven sizes on "
                                      f"{self._describe()}")
        flat = inp.new_empty(self.n * inp.numel())
        sent, got = self._ring_bytes("all_gather", inp.numel(), inp.element_size())

        def body(ctx: CallContext) -> None:
            self._gathered(ctx, flat, inp.contiguous())
            for j, o in enumerate(outs):
                o.copy_(flat[j * inp.numel():(j + 1) * inp.numel()].view(o.shape))

        return self._submit("allgather", "all_gather", body, output_lists,
                            size_bytes=_nbytes(inp), wire_bytes=sent, expected=got,
                            dtype=inp.dtype)

    def reduce_scatter_single(self, output: torch.Tensor, inp: torch.Tensor, opts: Any
                              ) -> OpusWork:
        self._need_contiguous("reduce_scatter_single", output, inp)
        sent, got = self._ring_bytes("reduce_scatter", inp.numel(), inp.element_size())

        def body(ctx: CallContext) -> None:
            chunks = self._reduced(ctx, "reduce_scatter", inp.detach().clone().reshape(-1),
                                   opts.reduceOp)
            output.view(-1).copy_(chunks[self.position])

        return self._submit("reduce_scatter_single", "reduce_scatter", body, output,
                            size_bytes=_nbytes(inp), wire_bytes=sent, expected=got,
                            dtype=inp.dtype)

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor],
                                        inputs: list[torch.Tensor], opts: Any) -> OpusWork:
        self._need_contiguous("reduce_scatter_single_coalesced", *outputs, *inputs)
        sizes = [self._ring_bytes("reduce_scatter", t.numel(), t.element_size())
                 for t in inputs]

        def body(ctx: CallContext) -> None:
            for j, (out, inp) in enumerate(zip(outputs, inputs, strict=True)):
                ctx.stream = f"{ctx.call.record['cid']}/{j}"
                chunks = self._reduced(ctx, "reduce_scatter", inp.detach().clone().reshape(-1),
                                       opts.reduceOp)
                out.view(-1).copy_(chunks[self.position])

        return self._submit("reduce_scatter_single_coalesced", "reduce_scatter", body, outputs,
                            size_bytes=sum(_nbytes(t) for t in inputs),
                            wire_bytes=sum(s for s, _ in sizes),
                            expected=sum(g for _, g in sizes), dtype=inputs[0].dtype)

    def reduce_scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]],
                       opts: Any) -> OpusWork:
        ins, out = self._single("reduce_scatter", input_lists, outputs)
        if any(t.numel() != out.numel() for t in ins):
            raise NotImplementedError(f"opus backend: reduce_scatter with uneven sizes on "
                                      f"{self._describe()}")
        flat_numel = self.n * out.numel()
        sent, got = self._ring_bytes("reduce_scatter", flat_numel, out.element_size())

        def body(ctx: CallContext) -> None:
            flat = torch.cat([t.detach().reshape(-1) for t in ins])
            chunks = self._reduced(ctx, "reduce_scatter", flat, opts.reduceOp)
            out.copy_(chunks[self.position].view(out.shape))

        return self._submit("reduce_scatter", "reduce_scatter", body, outputs,
                            size_bytes=flat_numel * out.element_size(), wire_bytes=sent,
                            expected=got, dtype=out.dtype)

    def allreduce(self, tensors: list[torch.Tensor], opts: Any) -> OpusWork:
        return self._all_reduce("allreduce", tensors, opts.reduceOp)

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any) -> OpusWork:
        return self._all_reduce("allreduce_coalesced", tensors, opts.reduceOp)

    def _all_reduce(self, op: str, tensors: list[torch.Tensor], reduce_op: Any) -> OpusWork:
        numel = sum(t.numel() for t in tensors)
        sent, got = self._ring_bytes("all_reduce", numel, tensors[0].element_size())

        def body(ctx: CallContext) -> None:
            flat = torch.cat([t.detach().reshape(-1) for t in tensors])
            self._reduced(ctx, "all_reduce", flat, reduce_op)
            start = 0
            for t in tensors:
                t.copy_(flat[start:start + t.numel()].view(t.shape))
                start += t.numel()

        return self._submit(op, "all_reduce", body, tensors,
                            size_bytes=sum(_nbytes(t) for t in tensors), wire_bytes=sent,
                            expected=got, dtype=tensors[0].dtype)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any) -> OpusWork:
        (t,) = tensors
        frm, to = broadcast_steps(self.n, self.position, int(opts.rootRank))

        def body(ctx: CallContext) -> None:
            buf = t.detach().contiguous()
            if frm is not None:
                _receive_into(ctx, self.members[frm], 0, buf, None)
            if to is not None:
                ctx.send(self.members[to], 0, _as_bytes(buf))
            if buf.data_ptr() != t.data_ptr():
                t.copy_(buf)

        return self._submit("broadcast", "broadcast", body, tensors, size_bytes=_nbytes(t),
                            wire_bytes=0 if to is None else _nbytes(t),
                            expected=0 if frm is None else _nbytes(t), dtype=t.dtype)

    def barrier(self, opts: Any = None) -> OpusWork:
        one = torch.ones(1)
        work = self._all_reduce("barrier", [one], dist.ReduceOp.SUM)
        return work

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> OpusWork:
        (t,) = tensors
        peer = self.members[dst]
        stream = self._p2p_stream(self.me, peer, tag)
        return self._submit("send", "send",
                            lambda ctx: ctx.send(peer, 0, _as_bytes(t.contiguous()), stream),
                            tensors, size_bytes=_nbytes(t), wire_bytes=_nbytes(t), expected=0,
                            dtype=t.dtype, peer=peer)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> OpusWork:
        (t,) = tensors
        peer = self.members[src]
        stream = self._p2p_stream(peer, self.me, tag)

        def body(ctx: CallContext) -> None:
            buf = t if t.is_contiguous() else t.contiguous()
            _receive_into(ctx, peer, 0, buf, None, stream)
            if buf is not t:
                t.copy_(buf)

        return self._submit("recv", "recv", body, tensors, size_bytes=_nbytes(t), wire_bytes=0,
                            expected=_nbytes(t), dtype=t.dtype, peer=peer)

    def _p2p_stream(self, src: int, dst: int, tag: int) -> str:
        """The data stream of the next message from ``src`` to ``dst`` with ``tag`` (both ends
        count their messages alike: torch matches point-to-point messages in order)."""
        key = (src, dst, tag)
        count = self._p2p_counts.get(key, 0)
        self._p2p_counts[key] = count + 1
        return f"{self._name}:{src}>{dst}:{tag}#{count}"

    # ----------------------------------------------------------------- checks

    def _single(self, op: str, lists: list[Any], singles: list[torch.Tensor]
                ) -> tuple[list[torch.Tensor], torch.Tensor]:
        if len(lists) != 1 or len(singles) != 1:
            raise NotImplementedError(f"opus backend: {op} with several tensors per rank on "
                                      f"{self._describe()}")
        return list(lists[0]), singles[0]

    def _need_contiguous(self, op: str, *tensors: torch.Tensor) -> None:
        if not all(t.is_contiguous() for t in tensors):
            raise NotImplementedError(f"opus backend: {op} on non-contiguous tensors on "
                                      f"{self._describe()}")


def _refused(op: str) -> Callable[..., OpusWork]:
    def refuse(self: OpusProcessGroup, *args: Any, **kwargs: Any) -> OpusWork:
        raise NotImplementedError(
            f"opus backend: {op} on {self._describe()} is not carried (all-gather, "
            "reduce-scatter, all-reduce, send/recv, broadcast and barrier are)")
    return refuse


for _op in ("reduce", "gather", "scatter", "alltoall", "all_to_all_single", "recv_anysource",
            "allgather_coalesced"):
    setattr(OpusProcessGroup, _op, _refused(_op))


def register() -> None:
    """Register the ``opus`` backend with torch.distributed (once per process)."""
    if BACKEND.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(BACKEND, OpusProcessGroup, extended_api=True,
                                      devices=["cpu"])
