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


def apt_can_install(package: str) -> bool:
    """Whether apt offers a candidate version of ``package`` on this machine."""
    if shutil.which("apt-cache") is None:
        return False
    res = subprocess.run(["apt-cache", "policy", package], capture_output=True, text=True,
                         timeout=60, check=False)
    cand = re.search(r"Candidate:\s*(\S+)", res.stdout)
    return bool(cand) and cand.group(1) != "(none)"


def vagrant_or_skip() -> str:
    """The vagrant binary. scripts/setup.sh (run by `make test`) installs it where apt offers it,
    so a missing binary is a failure there, and a skip only where apt has no package."""
    binary = shutil.which("vagrant")
    if binary is not None:
        return binary
    if apt_can_install("vagrant"):
        pytest.fail("apt offers `vagrant` but it is not installed: run `make setup` "
                    "(scripts/setup.sh installs it for this test)")
    pytest.skip("the vagrant binary is not installed and apt offers no `vagrant` package here")


def has_libvirt_plugin(vagrant: str, env: dict[str, str]) -> bool:
    res = subprocess.run([vagrant, "plugin", "list"], env=env, capture_output=True, text=True,
                         timeout=120, check=False)
    return res.returncode == 0 and re.search(r"^vagrant-libvirt\b", res.stdout, re.M) is not None


def test_vagrant_validate_passes(tmp_path: Path) -> None:
    """The whole Vagrantfile validates, offline. With the vagrant-libvirt plugin (set-up installs
    it with vagrant) the libvirt block is validated too; VirtualBox's cannot be (no plugin on
    Debian), so without libvirt every provider block is ignored."""
    vagrant = vagrant_or_skip()
    env = {**os.environ, "VAGRANT_CHECKPOINT_DISABLE": "1",
           "VAGRANT_DOTFILE_PATH": str(tmp_path / "dotfile"),
           "VAGRANT_HOME": str(tmp_path / "home")}
    if has_libvirt_plugin(vagrant, env):
        cmd, env = [vagrant, "validate"], {**env, "VAGRANT_DEFAULT_PROVIDER": "libvirt"}
    else:
        cmd = [vagrant, "validate", "--ignore-provider"]
    res = subprocess.run(cmd, cwd=VAGRANT_DIR, env=env, capture_output=True, text=True,
                         timeout=180, check=False)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "validated successfully" in res.stdout


def test_vagrant_validate_catches_a_bad_setting(tmp_path: Path) -> None:
    """The check above can fail: a misspelt setting in the VM or libvirt block is refused."""
    vagrant = vagrant_or_skip()
    env = {**os.environ, "VAGRANT_CHECKPOINT_DISABLE": "1",
           "VAGRANT_DOTFILE_PATH": str(tmp_path / "dotfile"),
           "VAGRANT_HOME": str(tmp_path / "home"), "VAGRANT_DEFAULT_PROVIDER": "libvirt"}
    text = (VAGRANT_DIR / "Vagrantfile").read_text()
    cases = [("config.vm.hostname =", "config.vm.hostnamx =", ["--ignore-provider"])]
    if has_libvirt_plugin(vagrant, env):
        cases.append(("lv.cpus =", "lv.cpuz =", []))
    for old, new, flags in cases:
        assert old in text, old
        bad = tmp_path / new.split()[0]
        bad.mkdir()
        (bad / "Vagrantfile").write_text(text.replace(old, new))
        res = subprocess.run([vagrant, "validate", *flags], cwd=bad, env=env,
                             capture_output=True, text=True, timeout=180, check=False)
        assert res.returncode != 0, f"{new!r} passed: {res.stdout}"
        assert new.split(".")[-1].split()[0] in res.stdout + res.stderr, res.stdout + res.stderr
