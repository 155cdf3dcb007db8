"""No password reaches a run's directory, its log lines or its exceptions.

An emulated run with ``driver: polatis-tl1`` logs in to its TL1 fronts with a password made
for the run (TL1 carries it in clear text, ``ACT-USER``); here that password is a known marker,
and the whole run directory, the log records and what the run printed are searched for it.
"""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from testbed.emulated import runner
from testbed.experiment.config import load_experiment
from testbed.experiment.prepare import prepare

TINY = Path(__file__).resolve().parents[2] / "examples" / "tiny.yaml"
MARKER = "5ecre7f0c0ffee42"


def test_the_front_password_is_nowhere_in_the_run(tmp_path: Path, no_leftovers: list[str],
                                                   monkeypatch: pytest.MonkeyPatch,
                                                   caplog: pytest.LogCaptureFixture,
                                                   capfd: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(runner.secrets, "token_hex", lambda _n=None: MARKER)
    caplog.set_level(logging.DEBUG)
    said: list[str] = []
    cfg = load_experiment(TINY).replace(mode="on-demand", driver="polatis-tl1", iterations=1)
    out = tmp_path / "run"
    summary = runner.run_emulated(prepare(cfg), out, say=said.append)
    import json

    no_leftovers.append(str(json.loads((out / "manifest.json").read_text())["prefix"]))
    assert summary["reconfigurations"] > 0  # the fronts were logged in to and driven
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) > 5
    leaks = [str(p) for p in files if MARKER.encode() in p.read_bytes()]
    assert leaks == []
    assert MARKER not in "\n".join(said)
    assert MARKER not in caplog.text
    printed = capfd.readouterr()
    assert MARKER not in printed.out + printed.err
