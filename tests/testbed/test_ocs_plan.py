"""``opus-testbed ocs plan``: what a run will make and remove on the glass, switch untouched."""

from __future__ import annotations

import json
import select
import socket
from pathlib import Path

import pytest

from controller.ocs import CrossconnectState, Reconfiguration
from testbed.cli.main import main
from testbed.experiment.config import load_experiment
from testbed.studies.ocsplan import ocs_plan

ROOT = Path(__file__).resolve().parents[2]
TINY = ROOT / "examples" / "tiny.yaml"


def test_the_plan_lists_every_switch_of_the_first_iteration_in_order() -> None:
    plan = ocs_plan(load_experiment(TINY))
    (rail,) = plan["rails"]
    assert rail["rail"] == 0 and rail["ports"] == [1, 2, 3, 4]
    assert rail["steps"] and rail["make"] >= rail["remove"] > 0
    # replayed from an empty rail, the steps keep every port one-to-one and end where it says
    state = CrossconnectState({0: rail["ports"]})
    times = [s["t_s"] for s in rail["steps"]]
    assert times == sorted(times)
    for s in rail["steps"]:
        state.apply(Reconfiguration.of(0, add=s["make"], remove=s["remove"]))
    assert sorted(c.to_json() for c in state.circuits(0)) == rail["circuits_after"]
    assert rail["make"] == sum(len(s["make"]) for s in rail["steps"])


def test_the_plan_never_touches_the_switch(tmp_path: Path,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    with socket.socket() as lab:  # the "switch": a listener that must see no connection
        lab.bind(("127.0.0.1", 0))
        lab.listen(4)
        config = tmp_path / "lab.yaml"
        config.write_text(TINY.read_text().replace(
            "  switching_delay: 10\n", "  switching_delay: 10\n  driver: polatis-netconf\n"
            f"  host: 127.0.0.1\n  port: {lab.getsockname()[1]}\n"))
        assert main(["ocs", "plan", str(config), "--json"]) == 0
        plan = json.loads(capsys.readouterr().out)
        assert plan["driver"] == "polatis-netconf" and plan["rails"][0]["steps"]
        assert select.select([lab], [], [], 0.2)[0] == []
    assert main(["ocs", "plan", str(config)]) == 0
    text = capsys.readouterr().out
    assert "rail 0: owns ports 1-4" in text and "nothing was sent to a switch" in text
