"""Losses printed by a torch job, and the bit-for-bit comparison of two runs."""

from __future__ import annotations

import math

from testbed.torchjob.losses import compare_losses, losses_of_log, parse_loss


def test_losses_are_read_exactly_from_a_log() -> None:
    log = ["[W init] some warning", '{"step": 0, "rank": 2, "loss": "0x1.9b09ea0000000p+2"}',
           '{"step": 1, "loss": 6.25}', "{not json", '{"step": 2}']
    assert losses_of_log(log) == {0: float.fromhex("0x1.9b09ea0000000p+2"), 1: 6.25}
    assert parse_loss("-0x1.8p+1") == -3.0 and parse_loss("2.5") == 2.5


def test_identical_runs_differ_by_zero() -> None:
    ref = {2: {0: 6.4, 1: 6.3}, 3: {0: 6.1, 1: 6.0}}
    c = compare_losses(ref, {r: dict(s) for r, s in ref.items()})
    assert c.identical and c.max_abs_diff == 0.0 and c.compared == 4 and c.problem() is None


def test_a_last_bit_difference_is_reported_with_its_place() -> None:
    ref = {2: {0: 6.4, 1: 6.3}}
    off = {2: {0: 6.4, 1: math.nextafter(6.3, 7.0)}}
    c = compare_losses(ref, off)
    assert not c.identical and c.max_abs_diff == math.ulp(6.3)
    assert "rank 2 step 1" in str(c.problem())
    signed_zero = compare_losses({0: {0: 0.0}}, {0: {0: -0.0}})
    assert signed_zero.max_abs_diff and not signed_zero.identical


def test_missing_steps_and_silent_scripts_fail() -> None:
    c = compare_losses({2: {0: 1.0, 1: 1.0}}, {2: {0: 1.0}})
    assert not c.identical and "rank 2 step 1 (the run)" in str(c.problem())
    silent = compare_losses({}, {})
    assert not silent.identical and "printed no losses" in str(silent.problem())
