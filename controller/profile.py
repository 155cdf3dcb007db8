"""Per-rank call profile for provisioning (paper §4.1): record iteration 1, predict later ones.

Pure and I/O-free; the shim and the simulator use it the same way: call
:meth:`CallProfile.mark_iteration` at each iteration start, :meth:`CallProfile.observe` for
every collective call, and :meth:`CallProfile.predict_next` after a call completes. A call that
differs from the profile switches prediction off for the rest of that iteration, so a wrong
profile costs at most on-demand switching; the next iteration resynchronises at its start.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class CallSignature:
    """What the profile remembers of a call: group, collective kind, bytes, axis."""

    group_id: str
    kind: str
    size_bytes: int
    axis: str = ""


class CallProfile:
    """Records the first iteration's calls and predicts the next call in later iterations."""

    def __init__(self) -> None:
        self.iteration = -1
        self._recording: list[CallSignature] = []
        self.profile: tuple[CallSignature, ...] | None = None
        self._pos = 0
        self._in_sync = False
        self.mispredictions = 0
        self.lock = threading.Lock()  # for callers that share one profile between threads

    def mark_iteration(self) -> None:
        """A new training iteration starts; the first one is the profiling iteration."""
        if self.iteration == 0 and self._recording:
            self.profile = tuple(self._recording)
        self.iteration += 1
        self._pos = 0
        self._in_sync = self.profile is not None

    def observe(self, call: CallSignature) -> bool:
        """Note a call as it starts; returns False if the profile predicted something else."""
        if self.iteration <= 0:
            self._recording.append(call)
            return True
        if not self._in_sync or self.profile is None:
            return True
        expected = self.profile[self._pos] if self._pos < len(self.profile) else None
        if expected is None or (expected.group_id, expected.kind) != (call.group_id, call.kind):
            self._in_sync = False
            self.mispredictions += 1
            return False
        self._pos += 1
        return True

    def predict_next(self) -> CallSignature | None:
        """The call expected after the last observed one (wrapping to the next iteration)."""
        if not self._in_sync or not self.profile:
            return None
        return self.profile[self._pos % len(self.profile)]
