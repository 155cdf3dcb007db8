"""The docs' pinned figures (docs/figures.yaml, scripts/figures.py): quoted as pinned, and still
what their commands print."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _figures():  # scripts/ is not a package: load the tool by path
    spec = importlib.util.spec_from_file_location("docs_figures", ROOT / "scripts" / "figures.py")
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules["docs_figures"] = module
    spec.loader.exec_module(module)
    return module


figures = _figures()


def test_every_quoted_figure_is_its_pinned_value() -> None:
    _, listed = figures.load()
    assert listed, "docs/figures.yaml lists no figure"
    problems = figures.static_problems(listed)
    assert not problems, "\n".join(problems)


def test_a_quote_that_differs_from_its_pin_is_caught(tmp_path: Path) -> None:
    fig = figures.Figure(id="x", command="c", value=13.52, fmt="{:+.1f} %")
    assert fig.text() == "+13.5 %" and fig.agrees(13.549) and not fig.agrees(13.56)
    line = "costs <!--fig:x-->+14.1 %<!--/fig--> at 100 ms"
    assert [m.groups() for m in figures.MARKER.finditer(line)] == [("x", "+14.1 %")]


def test_json_paths_select_one_element() -> None:
    data = {"rungs": [{"rung": "a", "modes": {"on-demand": {"s": 1.5}}},
                      {"rung": "b", "modes": {"on-demand": {"s": 2.5}}}],
            "points": [{"mode": "x", "delay_ms": 100.0, "t": 3}]}
    assert figures.json_get(data, "rungs[rung=b].modes.on-demand.s") == 2.5
    assert figures.json_get(data, "points[mode=x,delay_ms=100].t") == 3
    assert figures.json_get(data, "rungs[0].rung") == "a"
    with pytest.raises(KeyError, match="matches 0 elements"):
        figures.json_get(data, "rungs[rung=c].modes")


@pytest.mark.slow
def test_the_pinned_figures_have_not_drifted() -> None:
    """Re-runs every listed command (about a minute of CPU). On failure: if the change that
    moved a figure is intended, re-pin with `python scripts/figures.py --update` and re-read
    the prose around each moved figure (docs/figures.md)."""
    commands, listed = figures.load()
    measured, _ = figures.measure(commands, listed)
    drift = [f"{f.id}: pinned {f.text()}, now {f.text(measured[f.id])} ({commands[f.command].run})"
             for f in listed if not f.agrees(measured[f.id])]
    assert not drift, ("figures drifted (re-pin: python scripts/figures.py --update):\n"
                       + "\n".join(drift))
