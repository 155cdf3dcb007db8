"""``store.read_jsonl``: a writer killed mid-line may leave a cut-off last line, nothing else."""

from __future__ import annotations

from pathlib import Path

import pytest

from testbed.errors import RunError
from testbed.results.store import RecordFileError, read_jsonl


def test_records_are_read_in_order_and_blank_lines_skipped(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"a": 1}\n\n{"a": 2}\n')
    assert read_jsonl(path) == [{"a": 1}, {"a": 2}]
    assert read_jsonl(tmp_path / "missing.jsonl") == []


def test_a_cut_off_last_line_is_skipped(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"a": 1}\n{"a": 2}\n{"a": 3, "b"')  # the writer died mid-line
    assert read_jsonl(path) == [{"a": 1}, {"a": 2}]


@pytest.mark.parametrize(("text", "line"), [
    ('{"a": 1}\n{"a": 2, "b"\n{"a": 3}\n', 2),  # a bad line in the middle
    ('{"a": 1}\nnot json\n', 2),  # a bad last line that was ended: not cut off, corrupt
    ('oops\n{"a": 1}', 1)])
def test_any_other_bad_line_names_the_file_and_line(tmp_path: Path, text: str,
                                                   line: int) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text(text)
    with pytest.raises(RecordFileError, match=rf"r\.jsonl:{line}: not a JSON record") as err:
        read_jsonl(path)
    assert isinstance(err.value, RunError)  # the command line says "error: ..." and exits 1
