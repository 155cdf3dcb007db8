"""The field table (testbed.results.summary.FIELD_TABLE) names written keys and the needed ones."""

from __future__ import annotations

import re
from pathlib import Path

from testbed.results.summary import FIELD_TABLE

ROOT = Path(__file__).resolve().parents[2]
NEEDED = {"iteration_time_s", "overhead_pct", "reconfigurations", "exposed_reconfig_s",
          "fidelity", "fidelity_reasons", "fidelity_blame", "fidelity_causes",
          "fidelity_unrated", "dark_error_ms", "dark_overrun_bound", "throughput_ratio_median",
          "throughput_ratio_p10", "failovers", "recovery_s", "after_resume_delivered"}


def _table_keys() -> set[str]:
    path, heading = FIELD_TABLE  # where the table is (test_summary_fields.py reads it too)
    text = (ROOT / path).read_text()
    section = re.split(rf"#+ {re.escape(heading)}\n", text, maxsplit=1)[1].split("\n#", 1)[0]
    rows = [ln for ln in section.splitlines() if ln.startswith("| `")]
    assert rows, "no table rows"
    keys = {k for row in rows for k in re.findall(r"`([a-z_0-9]+)`", row.split("|")[1])}
    return {k for k in keys if not k.startswith("_")}  # `_blame`: shorthand for the row's prefix


def _written_keys() -> str:
    return "\n".join(p.read_text() for p in (ROOT / "testbed").rglob("*.py"))


def test_every_key_in_the_table_is_written_by_the_code() -> None:
    source = _written_keys()
    missing = sorted(k for k in _table_keys()
                     if f'"{k}"' not in source and f"{k}=" not in source)
    assert not missing, f"{FIELD_TABLE[0]}'s table names keys no code writes: {missing}"


def test_the_table_has_the_fields_a_reader_needs() -> None:
    assert _table_keys() >= NEEDED, sorted(NEEDED - _table_keys())
