"""Emulation tests build real Mininet networks on real Open vSwitch: they need root.

Without root or a running OVS they are skipped with the reason, not failed. CI runs as root
after `make test` has installed and started everything, so there they always run.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator

import pytest

from emulator.runstate import leftovers


def _unavailable() -> str | None:
    if os.geteuid() != 0:
        return "emulation tests need root (Mininet, Open vSwitch); run `sudo make test`"
    try:
        import mininet.net  # noqa: F401
    except ImportError as exc:
        return f"mininet not importable ({exc}); run `make setup`"
    res = subprocess.run(["ovs-vsctl", "--timeout=5", "show"], capture_output=True, check=False)
    if res.returncode != 0:
        return "Open vSwitch is not running; run `make setup`"
    return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    reason = _unavailable()
    for item in items:
        if "tests/emulation" in str(item.path):
            item.add_marker(pytest.mark.emulation)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


@pytest.fixture
def no_leftovers() -> Iterator[list[str]]:
    """Collects run prefixes; after the test, asserts nothing of those runs remains."""
    prefixes: list[str] = []
    yield prefixes
    for prefix in prefixes:
        left = leftovers(prefix)
        assert not any(left.values()), f"run {prefix} left {left}"
