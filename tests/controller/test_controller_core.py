"""The pure Opus core: intents, FCFS, protection, rails together, bad input."""

from __future__ import annotations

import pytest

from controller.core import CoreConfig, Decision, Intent, OpusCore, Output
from controller.job import CommGroup, JobError, JobSpec, RankPorts
from controller.ocs import ApplyResult, Circuit, RailDescription


def rails_for(job: JobSpec, extra_ports: int = 0) -> list[RailDescription]:
    return [RailDescription(rail, tuple(sorted(ps | set(range(100, 100 + extra_ports)))), 10.0)
            for rail, ps in sorted(job.ports_by_rail.items())]


def line_job(k: int = 1, groups: list[CommGroup] | None = None, n: int = 4) -> JobSpec:
    """``n`` ranks, one per server, all on rail 0; rank r owns ports r*k+1 .. r*k+k."""
    groups = groups or [CommGroup("a", "dp", (0, 1)), CommGroup("b", "pp", (1, 2)),
                        CommGroup("c", "cp", (1, 3)), CommGroup("d", "ep", (2, 3))]
    return JobSpec.rail_optimized("j", n, 1, k, groups)


def light(core: OpusCore, out: Output, now: float) -> Output:
    """Complete every decision in ``out`` at ``now`` (the driver lit everything)."""
    total = Output()
    total.extend(out)
    pending = list(out.decisions)
    while pending:
        d = pending.pop(0)
        res = [ApplyResult(rc.rail, rc.add, rc.remove, now, now, now) for rc in d.reconfs]
        more = core.reconfig_done(d.decision_id, res, now)
        total.extend(more)
        pending.extend(more.decisions)
    return total


def ask(core: OpusCore, rank: int, group: str, seq: int = 0, now: float = 0.0,
        job: str = "j") -> Output:
    return core.intent(Intent(job, rank, group, seq, "allreduce", 1, ""), now, ref=(rank, group))


def a_running(job: JobSpec | None = None) -> OpusCore:
    """A core with ``job`` (default :func:`line_job`) registered and group a's first call running
    on its lit circuit: ranks 0 and 1 acknowledged at 0 s."""
    job = job or line_job()
    core = OpusCore(rails_for(job))
    core.register_job(job, 0.0)
    ask(core, 0, "a")
    light(core, ask(core, 1, "a"), 0.0)
    return core


def test_first_call_switches_and_second_call_does_not() -> None:
    job = line_job()
    core = OpusCore(rails_for(job))
    core.register_job(job, 0.0)
    out = ask(core, 0, "a")
    assert not out.acks and not out.decisions  # waits for rank 1
    out = ask(core, 1, "a")
    assert len(out.decisions) == 1
    (rc,) = out.decisions[0].reconfs
    assert rc.add == {Circuit(0, 1, 2)} and not rc.remove
    out = light(core, out, 0.01)
    assert {a.rank for a in out.acks} == {0, 1} and all(a.reconfigured for a in out.acks)
    core.complete("j", 0, "a", 0, 0.02)
    core.complete("j", 1, "a", 0, 0.02)
    out = ask(core, 0, "a", seq=1, now=0.03)
    assert not out.acks and not out.decisions  # served once all members asked
    out = ask(core, 1, "a", seq=1, now=0.03)  # circuits lit: ack at once, no decision
    assert sorted(a.rank for a in out.acks) == [0, 1] and not out.decisions
    assert not out.acks[0].reconfigured


def test_active_circuit_is_never_cut_decision_waits() -> None:
    core = a_running()
    core.complete("j", 0, "a", 0, 0.1)  # rank 1 still runs call a/0 on port 2
    ask(core, 2, "b", now=0.2)
    out = ask(core, 1, "b", now=0.2)
    assert not out.decisions and not out.acks
    assert Circuit(0, 1, 2) in core.active_circuits()
    out = core.complete("j", 1, "a", 0, 0.3)
    assert len(out.decisions) == 1
    (rc,) = out.decisions[0].reconfs
    assert rc.remove == {Circuit(0, 1, 2)} and rc.add == {Circuit(0, 2, 3)}


def test_fcfs_within_group_domain() -> None:
    """b (ready first) and c (ready later) both need rank 1's single port: b goes first."""
    core = a_running()  # a holds rank 1's port
    ask(core, 2, "b", now=0.1)
    ask(core, 3, "c", now=0.1)
    ask(core, 1, "b", now=0.2)  # b ready at 0.2
    core.intent(Intent("j", 1, "c", 0), 0.3, ref="c1")  # c ready at 0.3
    core.complete("j", 0, "a", 0, 0.4)
    out = core.complete("j", 1, "a", 0, 0.4)
    assert [d.group_id for d in out.decisions] == ["b"]
    out = light(core, out, 0.5)
    assert {a.group_id for a in out.acks} == {"b"}
    core.complete("j", 1, "b", 0, 0.6)
    out = core.complete("j", 2, "b", 0, 0.6)
    assert [d.group_id for d in out.decisions] == ["c"]


def test_later_request_on_other_ranks_is_not_held_up() -> None:
    core = a_running(line_job(groups=[CommGroup("a", "dp", (0, 1)), CommGroup("b", "pp", (1, 2)),
                                      CommGroup("d", "ep", (3, 4))], n=5))
    ask(core, 1, "b", now=0.1)
    ask(core, 2, "b", now=0.1)  # b waits for a
    ask(core, 3, "d", now=0.2)
    out = ask(core, 4, "d", now=0.2)
    assert [d.group_id for d in out.decisions] == ["d"]


def test_all_rails_of_a_group_switch_as_one_decision() -> None:
    # 2 GPUs per server, 2 rails: ring (0, 1, 2, 3) -> rail 0 joins 0-2, rail 1 joins 1-3
    groups = [CommGroup("dp", "dp", (0, 1, 2, 3)), CommGroup("x", "pp", (3, 5))]
    job = JobSpec.rail_optimized("j", 6, 2, 1, groups)
    core = OpusCore(rails_for(job))
    core.register_job(job, 0.0)
    ask(core, 3, "x")
    light(core, ask(core, 5, "x"), 0.0)  # x holds rank 3's port on rail 1
    for r in (0, 1, 2):
        out = ask(core, r, "dp", now=0.1)
        assert not out.decisions
    out = ask(core, 3, "dp", now=0.1)
    assert not out.decisions  # rail 0 could switch, rail 1 cannot: neither switches
    core.complete("j", 3, "x", 0, 0.2)
    out = core.complete("j", 5, "x", 0, 0.2)
    assert len(out.decisions) == 1
    assert sorted(rc.rail for rc in out.decisions[0].reconfs) == [0, 1]


def alternate_a_and_b(core: OpusCore, job: JobSpec) -> int:
    """Calls of group a (ranks 0, 1) and b (ranks 1, 2), twice in turn; the decisions made."""
    core.register_job(job, 0.0)
    decisions = 0
    for seq in range(2):
        for grp, (r1, r2) in (("a", (0, 1)), ("b", (1, 2))):
            ask(core, r1, grp, seq)
            out = light(core, ask(core, r2, grp, seq), 0.0)
            decisions += len(out.decisions)
            core.complete("j", r1, grp, seq, 0.0)
            core.complete("j", r2, grp, seq, 0.0)
    return decisions


def test_degree_aware_keeps_alternating_phases_lit() -> None:
    job = line_job(k=2)
    for degree_aware, expected in ((False, 4), (True, 2)):
        core = OpusCore(rails_for(job), CoreConfig(degree_aware=degree_aware))
        assert alternate_a_and_b(core, job) == expected
        assert (core.counters["avoided_reconfigurations"] > 0) == degree_aware


def test_base_mode_keeps_idle_circuits_of_the_same_parallelism() -> None:
    """A pipeline stage's sends to the previous and the next stage: two groups, one axis."""
    for axis_b, k, expected in (("pp", 2, 2), ("dp", 2, 4), ("pp", 1, 4)):
        groups = [CommGroup("a", "pp", (0, 1)), CommGroup("b", axis_b, (1, 2))]
        job = line_job(k=k, groups=groups, n=3)
        assert alternate_a_and_b(OpusCore(rails_for(job)), job) == expected, (axis_b, k)


def test_bad_intents_are_rejected_and_change_nothing() -> None:
    job = line_job()
    core = OpusCore(rails_for(job))
    core.register_job(job, 0.0)
    cases = [
        (Intent("nope", 0, "a", 0), "unknown_job"),
        (Intent("j", 9, "a", 0), "unknown_rank"),
        (Intent("j", 0, "zz", 0), "unknown_group"),
        (Intent("j", 3, "a", 0), "not_a_member"),
    ]
    for intent, code in cases:
        out = core.intent(intent, 0.0, ref="x")
        assert [r.code for r in out.rejects] == [code]
        assert not out.acks and not out.decisions
    assert core.pending() == []
    bad = core.complete("j", 0, "a", 0, 0.0, ref="y")
    assert [r.code for r in bad.rejects] == ["bad_completion"]


def test_second_job_claiming_ports_is_rejected() -> None:
    job = line_job()
    core = OpusCore(rails_for(job, extra_ports=4))
    core.register_job(job, 0.0)
    thief = JobSpec("k", {0: RankPorts(0, 0, (2,)), 1: RankPorts(1, 0, (100,))},
                    {"g": CommGroup("g", "dp", (0, 1))})
    out = core.register_job(thief, 0.0, ref="k")
    assert out.rejects and "owned by job j" in out.rejects[0].message
    assert core.job("k") is None
    ok = JobSpec("k", {0: RankPorts(0, 0, (101,)), 1: RankPorts(1, 0, (100,))},
                 {"g": CommGroup("g", "dp", (0, 1))})
    assert not core.register_job(ok, 0.0).rejects


def test_job_validation_names_the_problem() -> None:
    with pytest.raises(JobError, match="needs 2 circuits at rank"):
        JobSpec.rail_optimized("j", 3, 1, 1, [CommGroup("r", "dp", (0, 1, 2))])
    with pytest.raises(JobError, match="not in the job"):
        JobSpec.rail_optimized("j", 2, 1, 1, [CommGroup("r", "dp", (0, 7))])
    with pytest.raises(JobError, match="spans rails"):
        JobSpec.rail_optimized("j", 2, 2, 1, [CommGroup("p", "pp", (0, 1), "pairs")])
    job = JobSpec.rail_optimized("j", 8, 4, 2, [CommGroup("r", "dp", (0, 4))])
    assert JobSpec.from_json(job.to_json()) == job
    assert job.ranks[5].rail == 1 and job.ranks[5].ports == (3, 4)


def test_lost_rank_releases_its_calls_and_fails_waiting_peers() -> None:
    core = a_running()
    core.complete("j", 1, "a", 0, 0.1)
    ask(core, 3, "d", now=0.1)
    ask(core, 1, "b", now=0.2)
    out = ask(core, 2, "b", now=0.2)
    assert not out.decisions  # rank 0 still "runs" a/0
    out = core.rank_lost("j", 0, 0.3)
    assert [d.group_id for d in out.decisions] == ["b"]
    out = core.rank_lost("j", 2, 0.4)
    assert [r.code for r in out.rejects] == ["peer_lost"]  # rank 3 waited for d with rank 2


def test_intent_after_rank_lost_is_rejected_until_rank_rejoins() -> None:
    job = line_job()
    core = OpusCore(rails_for(job))
    core.register_job(job, 0.0)
    core.rank_lost("j", 0, 0.1)  # nothing was waiting on rank 0 yet
    out = ask(core, 1, "a", now=0.2)  # a = (0, 1): would wait for rank 0 forever
    assert [r.code for r in out.rejects] == ["peer_lost"]
    assert "rank 0" in out.rejects[0].message
    assert out.rejects[0].ref == (1, "a")
    assert not out.acks and not out.decisions and core.pending() == []
    out = ask(core, 0, "a", now=0.2)  # the lost rank itself, before it greets again
    assert [r.code for r in out.rejects] == ["peer_lost"]
    ask(core, 1, "b", now=0.3)  # b = (1, 2) does not need rank 0: served as before
    out = ask(core, 2, "b", now=0.3)
    assert [d.group_id for d in out.decisions] == ["b"] and not out.rejects
    # the rank comes back (the service calls this on its hello): it is served again
    back = core.rank_rejoined("j", 0, 0.4)
    assert [e["event"] for e in back.events] == ["rank_rejoined"]
    assert not core.rank_rejoined("j", 0, 0.4).events  # not lost (any more): nothing to say
    assert not ask(core, 1, "a", now=0.5).rejects
    assert not ask(core, 0, "a", now=0.5).rejects
    assert ("j", "a", 0, "queued") in core.pending()  # waits for b's switch, like any call


def test_lost_rank_is_forgotten_when_the_job_is_registered_again() -> None:
    job = line_job()
    core = OpusCore(rails_for(job))
    core.register_job(job, 0.0)
    core.rank_lost("j", 3, 0.1)
    assert [r.code for r in ask(core, 2, "d", now=0.2).rejects] == ["peer_lost"]
    core.unregister_job("j", 0.3)
    core.register_job(job, 0.4)
    ask(core, 2, "d", now=0.5)
    out = ask(core, 3, "d", now=0.5)
    assert not out.rejects and [d.group_id for d in out.decisions] == ["d"]


def test_lost_rank_fails_peers_of_a_call_being_switched() -> None:
    job = line_job()
    core = OpusCore(rails_for(job))
    core.register_job(job, 0.0)
    ask(core, 1, "b")
    out = ask(core, 2, "b")
    assert [d.group_id for d in out.decisions] == ["b"]  # switching for b/0 in flight
    assert not core.rank_lost("j", 1, 0.1).rejects  # the switch goes on
    out = light(core, out, 0.2)  # rank 2 waited for rank 1 forever
    assert [(r.code, r.ref) for r in out.rejects] == [("peer_lost", (2, "b"))]
    assert "rank 1" in out.rejects[0].message
    assert not out.acks and core.pending() == []
    assert Circuit(0, 2, 3) in core.state.all_circuits()  # lit anyway: the switch did it


def test_provisioning_ignores_predictions_for_a_group_with_a_lost_rank() -> None:
    job = line_job()
    core = OpusCore(rails_for(job), CoreConfig(provisioning=True))
    core.register_job(job, 0.0)
    ask(core, 1, "b")
    light(core, ask(core, 2, "b"), 0.0)
    core.rank_lost("j", 0, 0.1)
    core.complete("j", 2, "b", 0, 0.2)
    out = core.complete("j", 1, "b", 0, 0.2, next_intent=Intent("j", 1, "a", 0))
    assert not out.decisions and core.pending() == []
    assert [e["code"] for e in out.events if e["event"] == "error"] == ["peer_lost"]


def switching_for_a() -> tuple[JobSpec, OpusCore, Decision]:
    """A registered line job whose group a's circuit is being switched on."""
    job = line_job()
    core = OpusCore(rails_for(job))
    core.register_job(job, 0.0)
    ask(core, 0, "a")
    (d,) = ask(core, 1, "a").decisions
    return job, core, d


def test_decision_completing_after_its_job_was_unregistered() -> None:
    _job, core, d = switching_for_a()
    gone = core.unregister_job("j", 0.1)
    assert sorted(r.ref for r in gone.rejects) == [(0, "a"), (1, "a")]  # type: ignore[type-var]
    res = [ApplyResult(rc.rail, rc.add, rc.remove, 0.1, 0.1, 0.2) for rc in d.reconfs]
    out = core.reconfig_done(d.decision_id, res, 0.2)  # raised KeyError in _plan
    assert not out.acks and not out.rejects and not out.decisions
    kinds = [e["event"] for e in out.events]
    assert "reconfig_end" in kinds and "orphaned_decision" in kinds
    assert Circuit(0, 1, 2) in core.state.all_circuits()  # the switch did change
    assert not core.dark_ports() and not core.active_circuits() and core.pending() == []
    assert core.reconfig_done(d.decision_id, res, 0.3).events == []  # once only


def test_failed_decision_after_its_job_was_unregistered() -> None:
    _job, core, d = switching_for_a()
    core.unregister_job("j", 0.1)
    rejects = core.counters["rejects"]
    out = core.reconfig_failed(d.decision_id, "boom", 0.2)
    assert not out.acks and not out.rejects and not out.decisions  # told already at unregister
    assert core.counters["rejects"] == rejects
    assert {"reconfig_failed", "orphaned_decision"} <= {e["event"] for e in out.events}
    assert Circuit(0, 1, 2) not in core.state.all_circuits()  # undone, as the driver reports
    assert not core.dark_ports()


def test_old_decision_does_not_serve_a_job_registered_again_under_the_same_id() -> None:
    job, core, d = switching_for_a()
    core.unregister_job("j", 0.1)
    core.register_job(job, 0.2)
    core.intent(Intent("j", 0, "a", 0), 0.3, ref="new0")
    out = core.intent(Intent("j", 1, "a", 0), 0.3, ref="new1")
    assert not out.decisions and not out.acks  # its circuit is still being switched on
    res = [ApplyResult(rc.rail, rc.add, rc.remove, 0.1, 0.1, 0.4) for rc in d.reconfs]
    out = core.reconfig_done(d.decision_id, res, 0.4)
    assert sorted(str(a.ref) for a in out.acks) == ["new0", "new1"]  # only the new job's ranks
    assert not out.acks[0].reconfigured and not out.decisions



def test_failed_decision_is_undone_and_its_ranks_rejected() -> None:
    _job, core, d = switching_for_a()
    out = core.reconfig_failed(d.decision_id, "boom", 0.2)
    assert sorted((r.ref, r.code) for r in out.rejects) == [  # type: ignore[type-var]
        ((0, "a"), "reconfig_failed"), ((1, "a"), "reconfig_failed")]
    assert all("boom" in r.message for r in out.rejects)
    assert [e["event"] for e in out.events if e["event"] != "error"] == ["reconfig_failed"]
    assert not core.state.all_circuits() and not core.dark_ports() and core.pending() == []


def _diverged() -> tuple[OpusCore, Decision]:
    """Decision A swaps 1-2 and 3-4 for 2-3; while it switches, decision B takes the freed
    ports 1 and 4 for 1-4. A fails: its 2-3 is dropped, but 1-2 and 3-4 cannot come back."""
    groups = [CommGroup("a", "dp", (0, 1)), CommGroup("d", "ep", (2, 3)),
              CommGroup("b", "pp", (1, 2)), CommGroup("e", "cp", (0, 3))]
    job = line_job(groups=groups)
    core = OpusCore(rails_for(job))
    core.register_job(job, 0.0)
    for group, (r0, r1) in (("a", (0, 1)), ("d", (2, 3))):
        ask(core, r0, group)
        light(core, ask(core, r1, group), 0.01)
        core.complete("j", r0, group, 0, 0.02)
        core.complete("j", r1, group, 0, 0.02)
    ask(core, 1, "b", now=0.03)
    (a,) = ask(core, 2, "b", now=0.03).decisions
    assert a.reconfs[0].remove == {Circuit(0, 1, 2), Circuit(0, 3, 4)}
    ask(core, 0, "e", now=0.04)
    (b,) = ask(core, 3, "e", now=0.04).decisions
    assert b.reconfs[0].add == {Circuit(0, 1, 4)} and not b.reconfs[0].remove

    out = core.reconfig_failed(a.decision_id, "boom", 0.05)
    (diverged,) = [e for e in out.events if e["event"] == "state_diverged"]
    assert (diverged["decision"], diverged["rail"]) == (a.decision_id, 0)
    assert diverged["not_restored"] == [[1, 2], [3, 4]] and diverged["not_dropped"] == []
    assert "port 1 already has peer 4" in diverged["error"]
    assert sorted((r.ref, r.code) for r in out.rejects) == [  # type: ignore[type-var]
        ((1, "b"), "reconfig_failed"), ((2, "b"), "reconfig_failed")]
    # what could be undone was: 2-3 is gone; 1-4 stays with decision B, still switching
    assert core.state.all_circuits() == {Circuit(0, 1, 4)}
    assert core.dark_ports() == {(0, 1), (0, 4)}
    return core, b


def test_failed_decision_whose_freed_ports_were_claimed_reports_the_divergence() -> None:
    _diverged()


def test_circuits_left_by_a_failed_decision_come_back_when_the_claimant_fails_too() -> None:
    """The switch refused A, so 1-2 and 3-4 are still on it; B, which took their ports in the
    core's view, fails too (the switch says port 1 has a peer): the core takes 1-2 and 3-4
    back and matches the switch again, so later plans can use them."""
    core, b = _diverged()
    out = core.reconfig_failed(b.decision_id, "port 1 already has peer 2", 0.06)
    (restored,) = [e for e in out.events if e["event"] == "state_restored"]
    assert restored["restored"] == [[1, 2], [3, 4]] and restored["rail"] == 0
    assert core.state.all_circuits() == {Circuit(0, 1, 2), Circuit(0, 3, 4)}
    assert not core.dark_ports()


def test_events_built_on_read_are_the_dicts_in_order() -> None:
    """The core records frequent events as tuples; reading ``events`` builds them once, in the
    order they happened, beside events recorded as dicts, and the list is the caller's."""
    job = line_job()
    core = OpusCore(rails_for(job))
    core.register_job(job, 0.0)
    ask(core, 0, "a", now=0.1)
    out = light(core, ask(core, 1, "a", now=0.2), 0.3)
    assert [e["event"] for e in out.events] == [
        "intent", "decision", "reconfig_start", "reconfig_end", "ack", "ack"]
    intent, decision, start, end, ack0, ack1 = out.events
    assert intent == {"event": "intent", "t_s": 0.2, "job": "j", "rank": 1, "group": "a",
                      "seq": 0, "kind": "allreduce", "size_bytes": 1, "axis": ""}
    assert list(intent) == ["event", "t_s", "job", "rank", "group", "seq", "kind",
                            "size_bytes", "axis"]  # key order, as in the event log
    assert decision["rails"] == [0] and decision["waited_s"] == pytest.approx(0.1)
    assert start["ports"] == [1, 2] and start["add"] == [[1, 2]] and start["remove"] == []
    assert end["added"] == [[1, 2]] and end["dark_ms"] == 0.0
    assert (ack0["rank"], ack1["rank"]) == (0, 1) and ack0["wait_s"] == pytest.approx(0.2)
    assert out.events is out.events  # built once; appends by the caller stay
    out.events.append({"event": "mine"})
    assert out.events[-1] == {"event": "mine"}
    done = core.complete("j", 0, "a", 0, 0.4)
    bad = core.complete("j", 0, "a", 0, 0.5)  # a duplicate: an error event, recorded as a dict
    done.extend(core.complete("j", 1, "a", 0, 0.6))
    done.extend(bad)
    assert [e["event"] for e in done.events] == ["complete", "complete", "collective_done",
                                                 "error"]
    assert done.events[2] == {"event": "collective_done", "t_s": 0.6, "job": "j", "group": "a",
                              "seq": 0}
    first = ask(core, 0, "a", seq=1, now=0.7)
    handed_out = first.events
    assert [e["event"] for e in handed_out] == ["intent"]
    first.extend(ask(core, 1, "a", seq=1, now=0.8))  # records not built yet, after a read
    assert all(isinstance(e, dict) for e in handed_out)  # the list read before holds dicts
    assert [(e["event"], e["t_s"]) for e in first.events] == [
        ("intent", 0.7), ("intent", 0.8), ("ack", 0.8), ("ack", 0.8)]
