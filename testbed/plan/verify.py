"""Real data for verify plans: what each rank holds during a call, and whether it ends right.

A verify plan (:func:`testbed.plan.replay.build_plan` with ``verify=True``, for tests) lists
each call's blocks ``(id, scaled bytes, contributors, owners)`` and, per transfer, the blocks it
carries with ``"add"`` or ``"copy"``. A rank starts the call holding its own value of every
block it contributes (deterministic bytes from the collective, iteration, rank and block) and
zeros elsewhere; a send carries its current values, a reception adds them (bytewise, modulo
256) or copies them over its own. At the end every owner must hold the sum of the contributors'
values: the all-to-all block from its origin, the fully reduced chunk, and so on. Pure; the
replayer (:mod:`testbed.emulated.replayer`) moves the bytes.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

from testbed.plan.replay import BlockOps, PlanBlock


def block_value(collective_id: str, iteration: int, rank: int, block_id: int,
                size_bytes: int) -> np.ndarray:
    """``rank``'s own value of a block (uint8, deterministic)."""
    seed = (zlib.crc32(collective_id.encode()), iteration, rank, block_id)
    return np.random.default_rng(seed).integers(0, 256, size_bytes, dtype=np.uint8)


class CallData:
    """One rank's blocks during one call of a verify plan."""

    def __init__(self, blocks: Sequence[PlanBlock], collective_id: str, iteration: int,
                 rank: int) -> None:
        self.rank = rank
        self.blocks = list(blocks)
        self.key = (collective_id, iteration)
        self.held = {b: (block_value(collective_id, iteration, rank, b, n) if rank in c
                         else np.zeros(n, dtype=np.uint8)) for b, n, c, _o in blocks}

    def outgoing(self, carried: BlockOps) -> bytes:
        """The payload of a transfer: the current values of the blocks it carries."""
        return b"".join(self.held[b].tobytes() for b, _op in carried)

    def incoming(self, carried: BlockOps, payload: bytes) -> None:
        """Apply a received payload: each block added to or copied over the rank's own."""
        at = 0
        for b, op in carried:
            n = len(self.held[b])
            value = np.frombuffer(payload, dtype=np.uint8, count=n, offset=at)
            self.held[b] = self.held[b] + value if op == "add" else value.copy()
            at += n
        if at != len(payload):
            raise ValueError(f"payload of {len(payload)} bytes for blocks of {at}")

    def wrong_blocks(self) -> list[int]:
        """Blocks this rank owns whose value is not the sum of the contributors' values."""
        out = []
        for b, n, contributors, owners in self.blocks:
            if self.rank not in owners:
                continue
            want = np.zeros(n, dtype=np.uint8)
            for c in contributors:
                want += block_value(*self.key, c, b, n)
            if not np.array_equal(self.held[b], want):
                out.append(b)
        return out

    def owned_bytes(self) -> int:
        """Bytes of the blocks this rank must end with."""
        return sum(n for _b, n, _c, owners in self.blocks if self.rank in owners)
