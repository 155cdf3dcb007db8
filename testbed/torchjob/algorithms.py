"""The collective algorithms a torch job's calls run, per group position, over element counts.

Pure (no torch): the backend (:mod:`testbed.torchjob.backend`) slices tensors by these plans.
They are the algorithms of :mod:`workloads.steps`, so a call puts the same bytes on the same
circuits as a replayed schedule does, and its ``wire_bytes`` are the schedule's:

* ring all-gather, reduce-scatter and all-reduce: at each step position ``i`` sends one chunk to
  ``i + 1`` and receives one from ``i - 1`` (:class:`RingStep`);
* pairwise exchange (all-to-all): at step ``k`` position ``i`` sends its block for ``i + k`` and
  receives the block of ``i - k``;
* broadcast: a chain along the ring from the root (each member forwards to the next), so it
  needs the ring's circuits only.

Chunks are cut on element boundaries (:func:`chunk_bounds`). When ``n`` divides the element
count (reduce-scatter always; FSDP's padded shards) the byte counts equal
:func:`workloads.steps.chunk_sizes` of the bytes exactly; otherwise chunks differ from the
schedule's byte split by less than one element. Reductions are always accumulated in the same
order (the received partial sum, then the own chunk), so two runs of a job reduce bit for bit
alike whatever the network did.
"""

from __future__ import annotations

from dataclasses import dataclass

from workloads.steps import chunk_sizes


@dataclass(frozen=True)
class RingStep:
    """One step of a ring collective at one position: the chunk sent to the next member, the
    chunk received from the previous one, and whether the received chunk is reduced into the
    own copy (reduce-scatter phase) or replaces it (all-gather phase)."""

    send_chunk: int
    recv_chunk: int
    reduce: bool


def chunk_bounds(numel: int, n: int) -> list[tuple[int, int]]:
    """``numel`` elements cut into ``n`` near-equal chunks: (start, stop) element offsets."""
    out, start = [], 0
    for size in chunk_sizes(numel, n):
        out.append((start, start + size))
        start += size
    return out


def ring_steps(kind: str, n: int, position: int) -> list[RingStep]:
    """The steps of ring ``kind`` (all_gather, reduce_scatter, all_reduce) at ``position``.

    After a reduce-scatter, position ``i`` holds the reduction of chunk ``i``; after an
    all-gather (or all-reduce) every position holds every chunk.
    """
    if n < 2:
        return []
    i = position
    gather = [RingStep((i - k) % n, (i - k - 1) % n, False) for k in range(n - 1)]
    if kind == "all_gather":
        return gather
    scatter = [RingStep((i - k - 1) % n, (i - k - 2) % n, True) for k in range(n - 1)]
    if kind == "reduce_scatter":
        return scatter
    if kind == "all_reduce":
        return scatter + gather
    raise ValueError(f"not a ring collective: {kind!r}")


def exchange_steps(n: int, position: int) -> list[tuple[int, int]]:
    """Pairwise exchange at ``position``: per step, (position sent to, position received from)."""
    return [((position + k) % n, (position - k) % n) for k in range(1, n)]


def broadcast_steps(n: int, position: int, root: int) -> tuple[int | None, int | None]:
    """The chain broadcast at ``position``: (position received from, position sent to), each
    None at the chain's ends (the root receives nothing, the root's predecessor sends nothing)."""
    frm = None if position == root else (position - 1) % n
    to = None if (position + 1) % n == root else (position + 1) % n
    return frm, to


def ring_sent_bytes(kind: str, n: int, position: int, numel: int, element_size: int
                    ) -> list[int]:
    """Bytes ``position`` sends per step of ring ``kind`` over ``numel`` elements.

    For all-gather ``numel`` is one member's input (every member's is the same size); for
    reduce-scatter and all-reduce it is the whole input, cut into ``n`` chunks.
    """
    if kind == "all_gather":
        return [numel * element_size for _ in ring_steps(kind, n, position)]
    bounds = chunk_bounds(numel, n)
    return [(bounds[s.send_chunk][1] - bounds[s.send_chunk][0]) * element_size
            for s in ring_steps(kind, n, position)]
