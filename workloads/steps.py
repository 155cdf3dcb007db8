"""Lowering of collectives to per-step transfers, and the wire bytes each rank sends.

Algorithms (chosen because an optical rail gives each GPU only a few circuits, so the
bandwidth-optimal, degree-2 ring is what a photonic rail can carry; Patarasuk & Yuan 2009,
NCCL's ring algorithms):

* ``all_gather`` (ring): ``n - 1`` steps; at step ``k`` position ``i`` forwards chunk
  ``(i - k) mod n`` to position ``i + 1``. Chunk ``j`` is member ``j``'s input, so each rank
  sends ``(n - 1) * input`` bytes = ``(n - 1) / n`` of the gathered output.
* ``reduce_scatter`` (ring): the input is cut into ``n`` near-equal chunks; at step ``k``
  position ``i`` sends its partial sum of chunk ``(i - k - 1) mod n`` to ``i + 1``. A rank
  sends every chunk but its own: ``(n - 1) / n`` of the input when ``n`` divides it.
* ``all_reduce`` (ring): reduce-scatter then all-gather of the reduced chunks, ``2 (n - 1)``
  steps, ``2 (n - 1) / n`` of the input on the wire.
* ``send``/``recv`` (pairwise): one step, the sender sends the whole message.
* ``all_to_all`` (``pairwise`` exchange): ``n - 1`` steps; at step ``k`` position ``i`` sends
  its block for position ``i + k`` and receives from ``i - k``. Block sizes come from each
  member's ``split`` (bytes per destination position); the own block never hits the wire.

These are the default algorithms; :mod:`workloads.algorithms` adds the others (all-to-all as
matchings or multihop over the ring, StragglAR all-reduce) and chooses among them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

RING_KINDS = ("all_gather", "reduce_scatter", "all_reduce")
P2P_KINDS = ("send", "recv")
ALGORITHM = {"all_gather": "ring", "reduce_scatter": "ring", "all_reduce": "ring",
             "send": "pairwise", "recv": "pairwise", "all_to_all": "pairwise"}


def chunk_sizes(size_bytes: int, n: int) -> list[int]:
    """``size_bytes`` cut into ``n`` chunks that differ by at most one byte."""
    base, extra = divmod(size_bytes, n)
    return [base + (j < extra) for j in range(n)]


def wire_bytes(kind: str, n: int, position: int, size_bytes: int,
               split: Sequence[int] = ()) -> int:
    """Bytes the member at ring ``position`` of an ``n``-rank collective puts on the wire.

    ``size_bytes`` is the member's message (its input tensor). Equals what
    :func:`lower` makes that member send, byte for byte.
    """
    if n < 2 and kind not in P2P_KINDS:
        return 0
    if kind == "all_gather":
        return (n - 1) * size_bytes
    if kind == "reduce_scatter":
        return size_bytes - chunk_sizes(size_bytes, n)[position]
    if kind == "all_reduce":
        c = chunk_sizes(size_bytes, n)
        return 2 * size_bytes - c[position] - c[(position + 1) % n]
    if kind == "send":
        return size_bytes
    if kind == "recv":
        return 0
    if kind == "all_to_all":
        return sum(split) - split[position]
    raise ValueError(f"unknown collective kind {kind!r}")


@dataclass(frozen=True)
class Transfer:
    """``size_bytes`` from rank ``src`` to rank ``dst`` within one step.

    ``blocks`` (filled only when a lowering is asked for its data semantics) lists the
    :class:`Block` ids the bytes carry, in order, each with what the receiver does with it:
    ``"add"`` it to its own copy (reductions) or ``"copy"`` it over its own copy.
    """

    src: int
    dst: int
    size_bytes: int
    blocks: tuple[tuple[int, str], ...] = ()


@dataclass(frozen=True)
class Block:
    """A piece of a collective's data, to check what every rank ends with.

    Each of ``contributors`` starts with its own value of the block (its input); every rank of
    ``owners`` must end with the sum of the contributors' values (one contributor: its value).
    """

    block_id: int
    size_bytes: int
    contributors: tuple[int, ...]
    owners: tuple[int, ...]


@dataclass(frozen=True)
class Unit:
    """Consecutive steps ``[first, first + count)`` that one set of circuits serves.

    ``ranks`` take part (they all ask Opus for the circuits), ``pairs`` are the circuits; a unit
    with ``pairs=None`` is the comm group itself (its ring). ``joins_previous`` says whether the
    unit may share one Opus call with the previous unit when the ports allow (see
    :func:`workloads.algorithms.pack_segments`); ``phase`` names the units' segments.
    """

    phase: str
    first: int
    count: int
    ranks: tuple[int, ...]
    pairs: tuple[tuple[int, int], ...] | None
    joins_previous: bool = True


@dataclass(frozen=True)
class StepPlan:
    """A collective lowered to steps; transfers of one step run concurrently.

    A step ends when all its transfers have arrived; the next step may start then (ring
    algorithms pipeline chunks, but the step boundary is where data dependencies lie).
    """

    collective_id: str
    kind: str
    algorithm: str
    ranks: tuple[int, ...]
    steps: tuple[tuple[Transfer, ...], ...]
    sync: tuple[bool, ...] = ()  # per step: it ends when its sends have arrived too
    units: tuple[Unit, ...] = ()  # empty: the whole plan is one unit, the group itself
    blocks: tuple[Block, ...] = ()  # data semantics, when asked for

    def is_sync(self, step: int) -> bool:
        return bool(self.sync) and self.sync[step]

    def sent_bytes(self, rank: int) -> int:
        """Total bytes ``rank`` sends over all steps."""
        return sum(t.size_bytes for step in self.steps for t in step if t.src == rank)

    def received_bytes(self, rank: int) -> int:
        return sum(t.size_bytes for step in self.steps for t in step if t.dst == rank)

    def peers(self, rank: int) -> list[tuple[int, int, int]]:
        """Per step: (peer sent to or -1, peer received from or -1, bytes sent)."""
        out = []
        for step in self.steps:
            to = next((t for t in step if t.src == rank), None)
            frm = next((t for t in step if t.dst == rank), None)
            out.append((to.dst if to else -1, frm.src if frm else -1,
                        to.size_bytes if to else 0))
        return out


def lower(collective_id: str, kind: str, ranks: tuple[int, ...], sizes: Sequence[int],
          splits: Sequence[Sequence[int]] | None = None) -> StepPlan:
    """Lower one collective over ``ranks`` (ring order) to a step plan.

    ``sizes[i]`` is member ``i``'s message size; for send/recv ``ranks`` is
    ``(sender, receiver)`` and ``sizes[0]`` the message; for all-to-all ``splits[i][j]`` is
    what member ``i`` sends to member ``j``.
    """
    n = len(ranks)
    steps: list[tuple[Transfer, ...]] = []
    if kind in P2P_KINDS:
        steps.append((Transfer(ranks[0], ranks[1], sizes[0]),))
    elif kind == "all_to_all":
        assert splits is not None
        for k in range(1, n):
            steps.append(tuple(Transfer(ranks[i], ranks[(i + k) % n], splits[i][(i + k) % n])
                               for i in range(n)))
    elif n >= 2:
        chunks = chunk_sizes(sizes[0], n)
        sends = [ring_sends(kind, n, i, sizes, chunks) for i in range(n)]
        steps.extend(tuple(Transfer(ranks[i], ranks[(i + 1) % n], sends[i][k]) for i in range(n))
                     for k in range(len(sends[0])))
    return StepPlan(collective_id, kind, ALGORITHM[kind], ranks, tuple(steps))


def ring_sends(kind: str, n: int, position: int, sizes: Sequence[int],
               chunks: Sequence[int] | None = None) -> list[int]:
    """Bytes the member at ring ``position`` of an ``n``-rank ring collective sends, per step.

    It sends them to position ``position + 1`` and, at each step, receives what position
    ``position - 1`` sends. ``sizes`` as for :func:`lower`; ``chunks`` is
    ``chunk_sizes(sizes[0], n)`` if the caller has it. :func:`lower` is made of these, and one
    member's steps need no lowering of the whole collective.
    """
    if n < 2:
        return []
    i = position
    if kind == "all_gather":
        return [sizes[(i - k) % n] for k in range(n - 1)]
    if kind not in ("reduce_scatter", "all_reduce"):
        raise ValueError(f"unknown collective kind {kind!r}")
    c = chunk_sizes(sizes[0], n) if chunks is None else chunks
    out = [c[(i - k - 1) % n] for k in range(n - 1)]
    if kind == "all_reduce":
        out += [c[(i - k) % n] for k in range(n - 1)]
    return out
