"""Fixtures of the workload tests."""

from __future__ import annotations

import pytest
from wl_helpers import paper_config

from workloads import Schedule, generate_schedule


@pytest.fixture(scope="session")
def paper_schedule() -> Schedule:
    return generate_schedule(paper_config())


@pytest.fixture(scope="session")
def paper_schedule_blocks() -> Schedule:
    return generate_schedule(paper_config("block"))
