"""The Opus core makes the same decisions, acks and events as when the golden traces were recorded.

Each trace is the core's input from a real sim-backend run (see ``core_trace.py``); replaying it
into today's core must give the same answers to the last event. A speed-up or a new option of
the core that changes the default behaviour fails here. Record again only for an intended change
of behaviour, and say so in the commit.
"""

from __future__ import annotations

import pytest
from core_trace import SCENARIOS, expected, load_trace, replay


@pytest.mark.parametrize("name", [s[0] for s in SCENARIOS])
def test_core_answers_as_recorded(name: str) -> None:
    want = expected()[name]
    got = replay(load_trace(name))
    assert got["decisions"] > 0 and got["acks"] > 0
    assert {k: got[k] for k in ("inputs", "decisions", "acks", "rejects", "events")} == {
        k: want[k] for k in ("inputs", "decisions", "acks", "rejects", "events")}
    assert got["sha256"] == want["sha256"], (
        f"{name}: the core's answers differ from the recorded ones (same counts)")


def test_a_changed_decision_changes_the_digest() -> None:
    """The digest sees a single input moved: the golden test can fail."""
    lines = load_trace("tiny-on-demand")
    base = replay(lines)
    i = next(k for k, line in enumerate(lines) if line[0] == "reconfig_done")
    lines[i] = [*lines[i][:-1], lines[i][-1] + 1e-3]  # the light comes 1 ms later
    assert replay(lines)["sha256"] != base["sha256"]
