"""Emulation tests build real Mininet networks on real Open vSwitch: they need root.

The prerequisites are ``opus-testbed check``'s own checks (root, Mininet, a running Open
vSwitch where ``OVS_RUNDIR`` points). When one is missing:

* under CI (the environment variable ``CI`` is true, as ``.ci/run`` runs with ``CI=true``) the
  whole pytest run stops at collection with a non-zero status and each check's fix hint, so a CI
  job whose Open vSwitch did not start is red, not green with every emulation test skipped;
* elsewhere (a developer without root) the emulation tests are skipped with the same reasons.

:func:`require_fidelity` is the one rule for a finished run's fidelity verdict: it asserts what
must hold under any load and never skips a run.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest
from dark_bounds import switch_log, switching_problems

from emulator.runstate import leftovers
from testbed.check import Check, check_mininet, check_ovs, check_root
from testbed.metrics.fidelity import RUN

#: exit status of a CI run stopped because a prerequisite is missing (pytest's "tests failed")
MISSING_PREREQUISITE_EXIT = pytest.ExitCode.TESTS_FAILED


def ci_requested(env: dict[str, str] | None = None) -> bool:
    """True when ``CI`` is set to a true value (:func:`testbed.check.ci_requested`)."""
    from testbed.check import ci_requested as ci

    return ci(env)


def missing_prerequisites() -> list[Check]:
    """The failed checks among root, Mininet and Open vSwitch (``opus-testbed check``'s)."""
    return [c for c in (check_root(), check_mininet(), check_ovs()) if not c.ok]


def _explain(failed: Sequence[Check]) -> str:
    return "; ".join(f"{c.name}: {c.detail} (fix: {c.fix})" for c in failed)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    emulation = [item for item in items if "tests/emulation" in str(item.path)]
    if not emulation:
        return
    for item in emulation:
        item.add_marker(pytest.mark.emulation)
    failed = missing_prerequisites()
    if not failed:
        return
    if ci_requested():
        pytest.exit(f"CI=true but the emulation tests cannot run: {_explain(failed)}",
                    returncode=MISSING_PREREQUISITE_EXIT)
    skip = pytest.mark.skip(reason=f"emulation prerequisites missing: {_explain(failed)}")
    for item in emulation:
        item.add_marker(skip)


def require_fidelity(summary: Mapping[str, Any], out: Path | None, *, delay_ms: float,
                     jitter_ms: float = 0.0) -> None:
    """Assert what an emulated run must show under any load; never skip.

    * every call delivered every byte;
    * the switch log (``out``'s ``emulator/ocs-events.jsonl``; None: the caller has no run
      directory) passes :func:`dark_bounds.switching_problems`: no light before the configured
      delay, the configured delay applied, every switch lit, median overrun within the tests'
      allowance (a doubled delay fails);
    * the verdict blames the run for nothing but timing (a reason's ``timing``): lost bytes,
      a delay other than the configuration's, early light, missing switches or unshaped links
      fail the test whatever the load.

    Overruns in the tail and slow collectives depend on the load (measured in
    :mod:`dark_bounds`); the verdict reports them, and ``make demo`` judges them on a quiet
    machine. Nothing here skips: a test that ran judges its run.
    """
    problems = []
    if summary.get("calls") != summary.get("calls_delivered"):
        problems.append(f"{summary.get('calls_delivered')} of {summary.get('calls')} calls "
                        "delivered every byte")
    if summary.get("bytes_received_scaled") != summary.get("bytes_expected_scaled"):
        problems.append(f"{summary.get('bytes_received_scaled')} of "
                        f"{summary.get('bytes_expected_scaled')} bytes received")
    if out is not None:
        records = switch_log(out)
        if summary.get("reconfigurations") and not records:
            problems.append("the controller switched but the OCS app logged no switch")
        problems += switching_problems(records, delay_ms, jitter_ms)
    for cause in summary.get("fidelity_causes") or ():
        if cause["blame"] == RUN and not cause.get("timing"):
            problems.append(f"blamed on the run: {cause['reason']}")
    assert not problems, "; ".join(problems)


@pytest.fixture
def fidelity_gate() -> Callable[..., None]:
    """:func:`require_fidelity`, for tests that judge a finished run."""
    return require_fidelity


@pytest.fixture
def no_leftovers() -> Iterator[list[str]]:
    """Collects run prefixes; after the test, asserts nothing of those runs remains."""
    prefixes: list[str] = []
    yield prefixes
    for prefix in prefixes:
        left = leftovers(prefix)
        assert not any(left.values()), f"run {prefix} left {left}"
