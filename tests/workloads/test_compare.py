"""Two schedules side by side (workloads.compare): phases, PP<->DP boundaries, differences."""

from __future__ import annotations

from wl_helpers import tiny

from workloads.compare import PhaseRow, boundaries, compare, differences, phase_rows, render


def row(axis: str, kind: str, calls: int = 1, size: int = 10) -> PhaseRow:
    return PhaseRow(axis, kind, False, calls, size * calls, size * calls)


def test_a_schedule_agrees_with_itself() -> None:
    s = tiny(4, 1, fsdp=2, pp=2)
    rep = compare(s, s)
    assert rep["equal"] is True and rep["world_size"] == 4
    assert all(not v["differences"] for v in rep["ranks"].values())
    text = render(rep, "a.yaml", "b.yaml")
    assert "ranks 0,1:" in text and "ranks 2,3:" in text and text.endswith("schedules agree")


def test_reshard_after_forward_shows_as_more_all_gathers() -> None:
    keep = tiny(4, 1, fsdp=2, pp=2, reshard_after_forward=False)
    reshard = tiny(4, 1, fsdp=2, pp=2, reshard_after_forward=True)
    rep = compare(keep, reshard, [0])
    assert rep["equal"] is False and list(rep["ranks"]) == ["0"]
    diffs = rep["ranks"]["0"]["differences"]
    gathers_a = sum(p["calls"] for p in rep["ranks"]["0"]["a"] if p["kind"] == "allgather")
    gathers_b = sum(p["calls"] for p in rep["ranks"]["0"]["b"] if p["kind"] == "allgather")
    assert gathers_b > gathers_a
    assert any(d["change"] == "only_b" and d["phase"] == "dp allgather" for d in diffs)
    assert "schedules differ" in render(rep, "keep", "reshard")


def test_phase_rows_count_every_call_and_byte() -> None:
    s = tiny(4, 1, fsdp=2, pp=2)
    rows = phase_rows(s, 0)
    ops = [o for o in s.ops_of(0) if o.is_collective]
    assert sum(r.calls for r in rows) == len(ops)
    assert sum(r.message_bytes for r in rows) == sum(o.size_bytes for o in ops)
    assert sum(r.wire_bytes for r in rows) == sum(o.wire_bytes for o in ops)


def test_differences_align_phases_and_list_each_change() -> None:
    a = [row("dp", "allgather", 3), row("pp", "sendrecv"), row("dp", "reducescatter")]
    b = [row("dp", "allgather", 2), row("pp", "sendrecv"), row("tp", "allreduce"),
         row("dp", "reducescatter")]
    diffs = differences(a, b)
    assert {"change": "changed", "a_phase": 0, "b_phase": 0, "phase": "dp allgather",
            "field": "calls", "a": 3, "b": 2} in diffs
    assert {"change": "only_b", "b_phase": 2, "phase": "tp allreduce", "calls": 1,
            "message_bytes": 10} in diffs
    assert not any(d.get("phase") == "dp reducescatter" for d in diffs)
    assert boundaries(a) == 2 and boundaries(b) == 1
    # cyclic: the last phase meets the next iteration's first (dp -> dp: no boundary)
    assert boundaries(a, cyclic=True) == 2
    c = [row("pp", "sendrecv"), row("dp", "allgather"), row("pp", "allreduce")]
    assert boundaries(c) == 2 and boundaries(c, cyclic=True) == 2
    assert boundaries(c[1:], cyclic=True) == 2 and boundaries(c[:1], cyclic=True) == 0
