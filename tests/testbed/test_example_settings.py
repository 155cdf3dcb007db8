"""Every example experiment loads to the settings it gave before the config schema (issue 39).

``fixtures/example_settings.json`` was written by :func:`snapshot` on main before the schema
replaced the hand-written parser (``python -m tests.testbed.test_example_settings`` rewrites it:
do so only for a change of settings that is meant). Fields added since are listed in
:data:`ADDED` with the value every example must have (their default), and keys added to
``to_json()`` in :data:`ADDED_JSON` (they must equal their field).
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path
from typing import Any

import pytest

from testbed.experiment.config import load_experiment
from testbed.torchjob.config import is_torch_experiment, load_torch_experiment
from workloads.errors import WorkloadConfigError

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = Path(__file__).with_name("fixtures") / "example_settings.json"
#: settings fields added after the snapshot -> the value every example has
ADDED: dict[str, Any] = {
    # the lab switch's access keys, each an option of the schema's device section (the
    # snapshot's ``ocs_options`` dict is now a property made of them)
    **dict.fromkeys(["device_host", "device_port", "device_username", "device_password_env",
                     "device_credentials_file", "device_timeout_s", "device_devices",
                     "device_size", "device_rails"]),
    "control_plane": "opus", "rotor_slot_ms": None,  # controller.plane (issue 40)
    "relay_paths": "fixed",  # controller.relay_paths (issue 40)
}
#: ``to_json()`` keys added after the snapshot -> the field whose value they carry
ADDED_JSON = {
    "ack_timeout_s": "ack_timeout_s",  # the manifest names every option the schema declares
    "control_plane": "control_plane", "rotor_slot_ms": "rotor_slot_ms",
    "relay_paths": "relay_paths",
}


def _examples() -> list[Path]:
    return sorted((ROOT / "examples").rglob("*.yaml"))


def _settings(path: Path, names: tuple[str, ...] = ()) -> dict[str, Any]:
    """Every settings field and attribute ``names`` (repr, the root folder as ``<ROOT>``) and
    ``to_json()`` of the example at ``path``, or the error it gives."""
    rel = path.relative_to(ROOT)
    try:
        cfg = (load_torch_experiment(rel) if is_torch_experiment(rel) else load_experiment(rel))
    except WorkloadConfigError as exc:
        return {"error": str(exc)}
    every = {f.name for f in dataclasses.fields(cfg) if f.name != "text"} | set(names)
    fields = {name: repr(getattr(cfg, name)).replace(str(ROOT), "<ROOT>") for name in every}
    as_json = json.loads(json.dumps(cfg.to_json(), default=repr).replace(str(ROOT), "<ROOT>"))
    return {"fields": fields, "to_json": as_json}


def snapshot() -> dict[str, Any]:
    """The settings of every example, by path relative to the repository."""
    return {str(p.relative_to(ROOT)): _settings(p) for p in _examples()}


EXPECTED: dict[str, Any] = json.loads(FIXTURE.read_text())


def test_every_example_is_in_the_snapshot() -> None:
    assert sorted(EXPECTED) == [str(p.relative_to(ROOT)) for p in _examples()]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_example_loads_to_the_same_settings(name: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(ROOT)  # sources are relative paths, as the snapshot's
    want = EXPECTED[name]
    got = _settings(ROOT / name, tuple(want.get("fields", ())))
    if "error" in want:  # (the allowed top-level keys it lists grew by controller)
        assert got == {"error": want["error"].replace(", sim", ", sim, controller")}
        return
    fields = got["fields"]
    assert {k: v for k, v in fields.items() if k in want["fields"]} == want["fields"]
    assert {k: v for k, v in fields.items() if k not in want["fields"]} == {
        k: repr(v) for k, v in ADDED.items()}
    for key, attr in ADDED_JSON.items():
        assert repr(got["to_json"].pop(key)) == fields[attr]
    assert got["to_json"] == want["to_json"]


if __name__ == "__main__":
    import os

    os.chdir(ROOT)
    FIXTURE.write_text(json.dumps(snapshot(), indent=1, sort_keys=True) + "\n")
    sys.exit(0)
