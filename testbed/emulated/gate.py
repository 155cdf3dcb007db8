"""The start gate (``run.start_gate``): no rank starts its first op before every rank has loaded.

NCCL's set-up is a collective, so on a real cluster no rank's first call goes out while another
rank is still importing; without a gate the emulated ranks (2-2.5 s to load 16 of them on two
cores) start staggered, and the first ranks' calls switch circuits while the others still load.

Mechanism: two named pipes in the state directory (``/run/opus-testbed/gate/<prefix>``: the run
directory may be a shared folder without FIFOs), which every Mininet host sees (the hosts have
their own network namespaces, not their own file systems).

* ``loaded``: the runner holds it open for reading (``O_RDWR``: never an end of file); each rank,
  once set up, writes one line ``RANK`` (shorter than ``PIPE_BUF``, so atomic) and closes it.
* ``go``: the runner holds the only write end (``O_RDWR``, opened before any rank starts); each
  rank opens it for reading before it signals, then polls it. The runner releases every rank at
  once by closing its end: the last writer's close wakes all readers together (end of file),
  which a byte per rank would not (Linux wakes pipe readers one at a time, each waking the next).

Neither side polls on a timer, so the gate adds no poll period to the release and no skew
between ranks beyond the kernel's wake-ups. The records a rank writes (``{"ev": "gate",
"t_loaded": ..., "t_go": ...}``) are summarised by :mod:`testbed.metrics.startgate`.
"""

from __future__ import annotations

import contextlib
import os
import select
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

#: How long a rank waits for the release before it fails (the runner ends a run whose rank
#: died before loading long before this).
WAIT_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class GatePaths:
    """The gate's two pipes in ``directory``."""

    loaded: Path
    go: Path

    @classmethod
    def under(cls, directory: Path) -> GatePaths:
        return cls(directory / "loaded", directory / "go")

    def to_json(self) -> dict[str, str]:
        return {"loaded": str(self.loaded.resolve()), "go": str(self.go.resolve())}


def loaded_ranks(lines: Iterable[str]) -> set[int]:
    """The ranks named by the ``loaded`` pipe's lines (blank or foreign lines are ignored)."""
    out = set()
    for line in lines:
        text = line.strip()
        if text.isdigit():
            out.add(int(text))
    return out


class RunnerGate:
    """The runner's side: makes the pipes, counts the ranks that loaded, releases them all.

    ``on_release(t_s)`` is called (from the gate's thread) once every rank of ``ranks`` has
    signalled, right after the release."""

    def __init__(self, directory: Path, ranks: Iterable[int],
                 on_release: Callable[[float], None] | None = None) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.paths = GatePaths.under(directory)
        self.expected = frozenset(ranks)
        self.loaded: set[int] = set()
        self.t_release_s: float | None = None
        self.released = threading.Event()
        self._on_release = on_release
        self._lock = threading.Lock()  # the counting thread and the runner may both release
        self._closed = False
        for path in (self.paths.loaded, self.paths.go):
            os.mkfifo(path, 0o600)
        self._loaded_fd = os.open(self.paths.loaded, os.O_RDWR | os.O_NONBLOCK)
        self._go_fd: int | None = os.open(self.paths.go, os.O_RDWR | os.O_NONBLOCK)
        self._stop_r, self._stop_w = os.pipe()
        self._thread = threading.Thread(target=self._count, daemon=True, name="start-gate")
        self._thread.start()

    def _count(self) -> None:
        buf = ""
        poller = select.poll()
        poller.register(self._loaded_fd, select.POLLIN)
        poller.register(self._stop_r, select.POLLIN)
        while not self.released.is_set():
            ready = {fd for fd, _ in poller.poll()}
            if self._stop_r in ready:
                return
            with contextlib.suppress(BlockingIOError):
                buf += os.read(self._loaded_fd, 4096).decode("ascii", "replace")
            lines, _, buf = buf.rpartition("\n")
            self.loaded |= loaded_ranks(lines.splitlines())
            if self.expected <= self.loaded:
                self.release()

    def release(self) -> None:
        """Let every rank go (idempotent): close the only write end of ``go``."""
        with self._lock:
            if self._go_fd is None:
                return
            self.t_release_s = time.time()
            os.close(self._go_fd)
            self._go_fd = None
            self.released.set()
        if self._on_release is not None:
            self._on_release(self.t_release_s)

    def close(self) -> None:
        """Stop counting and close the pipes (ranks still waiting then see the release);
        idempotent."""
        if self._closed:
            return
        self._closed = True
        os.write(self._stop_w, b"x")
        self._thread.join(5.0)
        with self._lock:
            if self._go_fd is not None:
                os.close(self._go_fd)
                self._go_fd = None
        for fd in (self._loaded_fd, self._stop_r, self._stop_w):
            with contextlib.suppress(OSError):
                os.close(fd)


class GateTimeout(RuntimeError):
    """The runner did not release the gate in time."""


class RankGate:
    """A rank's side: :meth:`open` before set-up ends, then :meth:`pass_gate`."""

    def __init__(self, paths: GatePaths) -> None:
        self.paths = paths
        self._go_fd: int | None = None

    def open(self) -> None:
        """Open ``go`` for reading (the runner already holds its write end)."""
        self._go_fd = os.open(self.paths.go, os.O_RDONLY | os.O_NONBLOCK)

    def pass_gate(self, rank: int, timeout_s: float = WAIT_TIMEOUT_S) -> tuple[float, float]:
        """Signal ``rank`` loaded and wait for the release; returns (t_loaded, t_go), wall
        clock seconds."""
        if self._go_fd is None:
            self.open()
        assert self._go_fd is not None
        t_loaded = time.time()
        fd = os.open(self.paths.loaded, os.O_WRONLY)
        try:
            os.write(fd, f"{rank}\n".encode("ascii"))
        finally:
            os.close(fd)
        poller = select.poll()
        poller.register(self._go_fd, select.POLLIN | select.POLLHUP)
        deadline = time.monotonic() + timeout_s
        try:
            # released before this rank opened ``go`` (the runner lets every rank go when one
            # fails while others still load): no writer ever joined this reader, so poll would
            # never report the hang-up, but a read sees the end of file at once
            with contextlib.suppress(BlockingIOError):
                if os.read(self._go_fd, 1) == b"":
                    return t_loaded, time.time()
            while True:
                left_ms = int(max(0.0, deadline - time.monotonic()) * 1000)
                if poller.poll(left_ms) and os.read(self._go_fd, 1) == b"":
                    return t_loaded, time.time()  # end of file: the runner closed its end
                if time.monotonic() >= deadline:
                    raise GateTimeout(f"start gate not released within {timeout_s:g} s")
        finally:
            os.close(self._go_fd)
            self._go_fd = None
