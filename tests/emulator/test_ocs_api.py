"""The OCS service's management API apart from HTTP (:class:`emulator.ocs_service.OcsApi`):
its routes over a stand-in fabric that records what it is asked."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

import pytest

from emulator.ocs_service import OcsApi


class _Fabric:
    """Only what the routes below touch."""

    rails = (0, 1)

    def __init__(self) -> None:
        self.delay_ms = {0: 10.0, 1: 10.0}

    def connected_rails(self) -> list[int]:
        return [0]

    def set_delay_ms(self, rail: int, delay_ms: float) -> None:
        self.delay_ms[rail] = delay_ms


def _never() -> Any:
    raise AssertionError("the body is read only once the path is known")


def test_health_and_unknown_paths() -> None:
    api = OcsApi(_Fabric())
    status, body = api.get("/v1/health")
    assert status == HTTPStatus.OK and body["connected_rails"] == [0] and body["rails"] == 2
    assert api.get("/v1/nothing")[0] == HTTPStatus.NOT_FOUND
    assert api.get("/v1/tickets/7")[0] == HTTPStatus.NOT_FOUND
    assert api.post("/v1/nothing", _never)[0] == HTTPStatus.NOT_FOUND
    assert api.put("/v1/rails/0/circuits", _never)[0] == HTTPStatus.NOT_FOUND


def test_a_rail_delay_is_set_and_echoed() -> None:
    fabric = _Fabric()
    status, body = OcsApi(fabric).put("/v1/rails/1/delay", lambda: {"switching_delay_ms": 25})
    assert status == HTTPStatus.OK and body == {"rail": 1, "switching_delay_ms": 25.0}
    assert fabric.delay_ms[1] == 25.0


def test_a_reconfiguration_without_its_list_is_refused() -> None:
    with pytest.raises(ValueError, match="'reconfigurations' list"):
        OcsApi(_Fabric()).post("/v1/reconfigure", lambda: {"add": []})
