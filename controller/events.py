"""The controller's event log: one JSON object per line, each with ``event`` and ``t_s``.

Event names: ``job_registered``, ``intent``, ``speculative_intent``, ``decision``,
``reconfig_start`` (rail, ports touched), ``reconfig_end`` (rail, driver timestamps, dark_ms),
``reconfig_failed`` (``withdrawn``: never sent, as it rested on a request that failed),
``state_diverged`` (a failed decision's undo that could not fully apply:
rail, circuits left over, error), ``state_restored`` (those circuits taken back once a later
undo freed their ports), ``ack``, ``complete``, ``collective_done``, ``provisioned``,
``reconfig_avoided``, ``mispredict``, ``rank_lost``, ``rank_rejoined``, ``orphaned_decision``
(a switch that ended after its job was unregistered), ``error``, ``client_refused`` (a client
without a valid CURVE key: ``reason``, ``peer`` where known; :mod:`controller.curve`); the
emulated runner adds ``gate_released`` (``run.start_gate``: every rank had loaded). The
testbed turns them into metrics; :func:`read_events` reads a log back.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Iterable
from pathlib import Path
from typing import IO

from controller.core import Event


class EventLog:
    """Append events to a JSON-lines file and/or keep them in memory; thread-safe."""

    def __init__(self, path: str | Path | None = None, keep: bool = False) -> None:
        self.path = Path(path) if path is not None else None
        self.keep = keep
        self.records: list[Event] = []
        self._lock = threading.Lock()
        self._fh: IO[str] | None = None
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._fh = self.path.open("a", encoding="utf-8")

    @property
    def wanted(self) -> bool:
        """Whether written events go anywhere (kept in memory or to a file): a writer may skip
        building events nobody reads."""
        return self.keep or self._fh is not None

    def write(self, events: Iterable[Event]) -> None:
        events = list(events)
        if not events:
            return
        with self._lock:
            if self.keep:
                self.records.extend(events)
            if self._fh is not None:
                self._fh.write("".join(json.dumps(e, separators=(",", ":"), default=str) + "\n"
                                       for e in events))
                self._fh.flush()

    def close(self) -> None:
        with self._lock:
            if self._fh is not None:
                self._fh.close()
                self._fh = None

    def __enter__(self) -> EventLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read_events(path: str | Path) -> list[Event]:
    """Read a JSON-lines event log (blank lines ignored)."""
    with Path(path).open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]
