"""What a rank's call waited for, from the calls table (pure): its peers, or light.

A call (one rank's part of a collective instance) runs from its intent to its end:

* **waiting for peers**: from the rank's intent until the instance's last member has called
  (the latest intent among the instance's rows): the collective cannot start without them,
  whatever the fabric (a pipeline bubble, a slower peer's compute);
* **waiting for light**: from then until the rank's ack, when the ack comes later: every member
  is in, but the circuits are not lit (the switching and the controller's round trip). Over a
  measured iteration, the union of these spans over all ranks is the run's exposed switching
  (:func:`testbed.metrics.compute.exposed_intervals` takes the instance's first ack);
* **transfer**: from the later of the ack and the last member's call to the end.

On the electrical baseline an ack can come before the last peer has called: that call waited
for its peer only. Instances are keyed by (epoch, iteration, collective id); a row without a
collective id is an instance of its own (nothing to wait for but light).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

Span = tuple[float, float]


@dataclass(frozen=True)
class CallSpans:
    """One call's peers wait, light wait (None when it had none) and transfer, in seconds of
    the run's clock."""

    row: Mapping[str, Any]
    peers: Span | None
    light: Span | None
    transfer: Span


def _instance(row: Mapping[str, Any], index: int) -> tuple[str, str, str]:
    cid = row.get("collective")
    if cid in (None, ""):
        return ("", "", f"#row{index}")
    return (str(row.get("epoch", 0)), str(row.get("iteration", "")), str(cid))


def call_spans(calls: Sequence[Mapping[str, Any]]) -> list[CallSpans]:
    """Every call of ``calls`` (rows of ``calls.csv``; values may be strings) split into its
    waits and its transfer."""
    ready: dict[tuple[str, str, str], float] = {}
    keys = [_instance(r, i) for i, r in enumerate(calls)]
    for key, r in zip(keys, calls, strict=True):
        ready[key] = max(ready.get(key, float("-inf")), float(r["t_intent_s"]))
    out = []
    for key, r in zip(keys, calls, strict=True):
        intent, ack, end = float(r["t_intent_s"]), float(r["t_ack_s"]), float(r["t_end_s"])
        all_in = ready[key]
        peers = (intent, min(all_in, end)) if all_in > intent else None
        go = max(intent, all_in)
        light = (go, ack) if ack > go else None
        out.append(CallSpans(r, peers, light, (max(ack, all_in), max(end, ack, all_in))))
    return out


def union(spans: Iterable[Span]) -> list[Span]:
    """The spans merged where they overlap or touch, in time order."""
    out: list[Span] = []
    for a, b in sorted(spans):
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out
