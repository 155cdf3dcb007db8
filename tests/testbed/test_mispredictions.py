"""One count of mispredictions: summary.json's ``mispredictions`` is the controller's
``mispredict`` events, as controller-events.jsonl and the trace show them; the ranks' own count
(calls started out of their profiled order) is ``profile_mismatches``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from testbed.cli.main import main

TINY = Path(__file__).resolve().parents[2] / "examples" / "tiny.yaml"


def test_summary_events_and_trace_count_the_same_mispredictions(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # under the emulator's costs rank 2 starts an FSDP reduce-scatter and a PP send at the
    # same instant on two lanes: its profile saw them in order (0 mismatches), the
    # controller got the send's ask first and withdrew the speculation (2, deterministic)
    out = tmp_path / "r"
    assert main(["run", str(TINY), "--backend", "sim", "--costs", "emulator", "--perfetto",
                 "--out", str(out)]) == 0
    capsys.readouterr()
    summary = json.loads((out / "summary.json").read_text())
    events = [json.loads(line) for line in (out / "controller-events.jsonl").open()]
    trace = json.loads((out / "trace.json").read_text())
    marks = trace["traceEvents"] if isinstance(trace, dict) else trace
    logged = sum(e["event"] == "mispredict" for e in events)
    drawn = sum(e.get("name") == "mispredict" for e in marks)
    assert summary["mispredictions"] == logged == drawn == 2
    assert summary["profile_mismatches"] == 0
    finished = [e for e in marks if e.get("name") == "finished"]
    assert finished and all(e["args"] == {"profile_mismatches": 0} for e in finished)
