"""vagrant/Vagrantfile: an Ubuntu LTS VM provisioned by the README's set-up, then the tests."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
VAGRANT_DIR = ROOT / "vagrant"
SETUP = "scripts/setup.sh"

# Ways a provisioner would install software itself instead of calling the set-up script.
INSTALLERS = re.compile(r"\b(apt-get|apt|aptitude|dpkg|pip3?|snap)\s+(-\S+\s+)*install\b"
                        r"|\bdpkg\s+-i\b|-m\s+pip\b|-m\s+venv\b|\bcurl\b|\bwget\b")


def code_lines() -> list[str]:
    """The Vagrantfile without Ruby comment lines."""
    text = (VAGRANT_DIR / "Vagrantfile").read_text()
    return [line for line in text.splitlines() if not line.lstrip().startswith("#")]


def provision_steps() -> list[str]:
    """The text of each ``config.vm.provision`` step, in order."""
    code = "\n".join(code_lines())
    starts = [m.start() for m in re.finditer(r"config\.vm\.provision\b", code)]
    ends = [*starts[1:], code.rindex("\nend")]
    return [code[a:b] for a, b in zip(starts, ends, strict=True)]


def test_the_box_is_ubuntu_24_04_lts() -> None:
    code = "\n".join(code_lines())
    box = re.search(r"config\.vm\.box\s*=\s*(.+)", code)
    assert box and re.search(r"ubuntu-?24\.?04", box.group(1)), box


def test_provisioning_loads_openvswitch_then_runs_setup_and_ends_with_make_test() -> None:
    steps = provision_steps()
    assert len(steps) >= 2, steps
    modprobe = [i for i, s in enumerate(steps) if "modprobe openvswitch" in s]
    setup = [i for i, s in enumerate(steps) if re.search(rf"\bbash {re.escape(SETUP)}\b", s)]
    assert modprobe and setup and modprobe[0] < setup[0], steps
    assert re.search(r"\bmake test\b", steps[-1]), f"last step is not `make test`: {steps[-1]}"
    assert all("make test" not in s for s in steps[:-1])


def test_provisioning_calls_the_readme_setup_rather_than_a_copy_of_it() -> None:
    readme = (ROOT / "README.md").read_text()
    makefile = (ROOT / "Makefile").read_text()
    assert SETUP in readme, "the README no longer names the set-up script"
    assert re.search(rf"^setup:\n\tbash {re.escape(SETUP)}$", makefile, re.M)
    code = "\n".join(code_lines())
    assert not INSTALLERS.search(code), INSTALLERS.search(code)
    # No package list of its own: none of the set-up's apt packages is named (make and git are
    # also command names, so they are not telling).
    listed = re.search(r"APT_PACKAGES=\(([^)]*)\)", (ROOT / SETUP).read_text())
    assert listed, "scripts/setup.sh has no APT_PACKAGES list"
    packages = set(listed.group(1).split()) - {"make", "git"}
    named = {p for p in packages if re.search(rf"(?<![\w/.-]){re.escape(p)}(?![\w-])", code)}
    assert not named, f"the Vagrantfile repeats set-up packages: {sorted(named)}"


def test_the_installer_pattern_catches_a_second_copy() -> None:
    for line in ("apt-get update && apt-get install -y mininet", "apt install -y ethtool",
                 "pip install -e .", ".venv/bin/python -m pip install x", "python3 -m venv .venv"):
        assert INSTALLERS.search(line), line
    assert not INSTALLERS.search("cd /opus-testbed && bash scripts/setup.sh")


@pytest.mark.skipif(shutil.which("vagrant") is None,
                    reason="the vagrant binary is not installed; `vagrant validate` not run")
def test_vagrant_validate_passes(tmp_path: Path) -> None:
    # --ignore-provider: validate the configuration without VirtualBox/libvirt on this machine.
    env = {**os.environ, "VAGRANT_CHECKPOINT_DISABLE": "1",
           "VAGRANT_DOTFILE_PATH": str(tmp_path / "dotfile"),
           "VAGRANT_HOME": str(tmp_path / "home")}
    res = subprocess.run(["vagrant", "validate", "--ignore-provider"], cwd=VAGRANT_DIR, env=env,
                         capture_output=True, text=True, timeout=180, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "validated successfully" in res.stdout
