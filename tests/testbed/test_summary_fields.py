"""Every ``summary.json`` field is in the field table (testbed.results.summary.FIELD_TABLE),
walked from real sim runs: a run with its baseline, a rail-state run and a failover run."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from testbed.cli.main import main
from testbed.results.summary import FIELD_TABLE

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"


def documented_fields(text: str, heading: str) -> set[str]:
    """The backticked names in the table under ``heading`` (a Markdown heading of any level);
    a name written ``_suffix`` after ``prefix`` (``baseline_fidelity``, ``_blame``) stands for
    ``prefix_suffix``."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines)
                  if re.fullmatch(rf"#+\s+{re.escape(heading)}\s*", line)), None)
    assert start is not None, f"no heading {heading!r}"
    names: set[str] = set()
    in_table = False
    for line in lines[start + 1:]:
        if line.startswith("|"):
            in_table = True
            last = ""
            for token in re.findall(r"`([^`]+)`", line):
                if token.startswith("_") and last:
                    names.add(last + token)
                else:
                    names.add(token)
                    last = token
        elif in_table or line.startswith("#"):
            break
    return names


def _summaries(tmp_path: Path) -> dict[str, dict[str, object]]:
    runs = {"baseline": ["run", str(EXAMPLES / "tiny.yaml"), "--baseline"],
            "rail-state": ["run", str(EXAMPLES / "tiny.yaml"), "--semantics", "rail-state",
                           "--mode", "on-demand"],
            "failover": ["run", str(EXAMPLES / "failover.yaml")]}
    for name, argv in runs.items():
        assert main([*argv, "--backend", "sim", "--out", str(tmp_path / name)]) == 0, name
    return {str(p.relative_to(tmp_path)): json.loads(p.read_text())
            for p in sorted(tmp_path.rglob("summary.json"))}


def test_every_summary_field_is_in_the_field_table(tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    path, heading = FIELD_TABLE
    documented = documented_fields((ROOT / path).read_text(), heading)
    summaries = _summaries(tmp_path)
    capsys.readouterr()
    assert len(summaries) == 4  # baseline/{baseline,provisioning}, rail-state, failover
    missing = {f"{where}: {key}" for where, summary in summaries.items() for key in summary
               if key not in documented}
    assert not missing, f"summary.json fields missing from {path} '{heading}': {sorted(missing)}"


def test_the_table_reader_finds_names_and_misses_the_rest() -> None:
    text = ("# Other\n| `not_this` | x |\n### The fields\n\nIntro.\n\n| key | what |\n|---|---|\n"
            "| `a`, `b_x`, `_y` | about `c` |\n| `d` | d |\nAfter the table `e`.\n")
    assert documented_fields(text, "The fields") == {"a", "b_x", "b_x_y", "c", "d"}
    with pytest.raises(AssertionError, match="no heading"):
        documented_fields(text, "Missing")
