"""Prerequisite checks for ``opus-testbed check``: each one says what it found and how to fix it."""

from __future__ import annotations

import importlib
import importlib.metadata
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path

SETUP_HINT = "run `make setup` (or scripts/setup.sh) as root"
#: Values of the environment variable ``CI`` that mean "this is a CI run" (any case, trimmed).
CI_TRUE = ("1", "true", "yes", "on")


def ci_requested(env: Mapping[str, str] | None = None) -> bool:
    """True when ``CI`` (in ``env``, default ``os.environ``) is a true value (:data:`CI_TRUE`;
    ``.ci/run`` sets ``CI=true``, other CI systems ``CI=1``). The one test of "under CI":
    there a missing prerequisite (Open vSwitch, torch) fails instead of skipping."""
    value = (os.environ if env is None else env).get("CI", "")
    return value.strip().lower() in CI_TRUE


@dataclass(frozen=True)
class Check:
    """One prerequisite; an ``optional`` one that fails only disables a feature (its detail
    says which) and does not fail ``opus-testbed check``."""

    name: str
    ok: bool
    detail: str
    fix: str = ""
    optional: bool = False

    @property
    def passes(self) -> bool:
        return self.ok or self.optional

    def to_json(self) -> dict[str, object]:
        return asdict(self)


def _run(args: list[str], timeout_s: float = 5.0) -> subprocess.CompletedProcess[str] | None:
    try:
        return subprocess.run(args, capture_output=True, text=True, timeout=timeout_s,
                              check=False)
    except (FileNotFoundError, subprocess.TimeoutExpired):
        return None


def check_root() -> Check:
    ok = os.geteuid() == 0
    return Check("root", ok, "running as root" if ok else f"running as uid {os.geteuid()}",
                 "" if ok else "Mininet and Open vSwitch need root: run with sudo")


def check_ovs() -> Check:
    """Open vSwitch answers where the emulator will look: ``ovs-vsctl`` reads ``OVS_RUNDIR``
    from the environment (default /var/run/openvswitch), and so does this check."""
    if shutil.which("ovs-vsctl") is None:
        return Check("openvswitch", False, "ovs-vsctl not found",
                     f"apt-get install openvswitch-switch, or {SETUP_HINT}")
    res = _run(["ovs-vsctl", "--timeout=3", "show"])
    if res is None or res.returncode != 0:
        err = (res.stderr.strip() if res else "timed out")[:200]
        rundir = os.environ.get("OVS_RUNDIR")
        elsewhere = (f"; or unset OVS_RUNDIR (it points at {rundir}, where no ovsdb-server "
                     "listens)" if rundir else "")
        return Check("openvswitch", False, f"ovs-vswitchd/ovsdb not answering: {err}",
                     "start it: /usr/share/openvswitch/scripts/ovs-ctl start "
                     f"--system-id=random (scripts/setup.sh does this){elsewhere}")
    version = next((line.split(":", 1)[1].strip().strip('"') for line in res.stdout.splitlines()
                    if "ovs_version" in line), "unknown")
    kernel = Path("/sys/module/openvswitch").exists()
    datapath = "kernel (openvswitch module loaded)" if kernel else "userspace (netdev)"
    return Check("openvswitch", True, f"running, version {version}, datapath {datapath}")


def check_ovs_per_rail() -> Check:
    """The mode of the emulated OCS bridges (:mod:`emulator.ovs_instance`): with one Open
    vSwitch per rail, its programs and schema must be installed."""
    from emulator.ovs_instance import PER_RAIL_ENV, missing_programs, per_rail_default

    if not per_rail_default():
        return Check("ovs-per-rail", True, "off: every bridge in the system Open vSwitch "
                     f"({PER_RAIL_ENV}=1 or network.ovs_per_rail: true to turn it on)")
    missing = missing_programs()
    if missing:
        return Check("ovs-per-rail", False, f"on, but missing: {', '.join(missing)}",
                     f"apt-get install openvswitch-switch, or set {PER_RAIL_ENV}=0")
    return Check("ovs-per-rail", True, "on: each rail bridge gets its own ovsdb-server and "
                 f"ovs-vswitchd ({PER_RAIL_ENV}=0 or network.ovs_per_rail: false to turn it "
                 "off)")


def check_import(module: str, dist: str, fix: str) -> Check:
    try:
        importlib.import_module(module)
    except Exception as exc:  # any import failure is a missing prerequisite
        return Check(module, False, f"cannot import {module}: {exc}", fix)
    try:
        version = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        version = "unknown version"
    return Check(module, True, f"importable ({dist} {version})")


def check_mininet() -> Check:
    found = check_import("mininet.net", "mininet",
                         "apt-get install mininet and use a venv made with "
                         f"--system-site-packages; or {SETUP_HINT}")
    if found.ok and shutil.which("mnexec") is None:
        return Check("mininet.net", False, "mininet importable but mnexec missing",
                     "apt-get install mininet")
    return found


def check_offload() -> Check:
    """TCP through userspace OVS needs TX checksum offload off on host interfaces (ethtool)."""
    if shutil.which("ethtool") is None:
        return Check("offload", False, "ethtool not found: cannot disable TX checksum offload, "
                     "TCP would stall on the userspace datapath", "apt-get install ethtool")
    kernel = Path("/sys/module/openvswitch").exists()
    need = "not needed with the kernel datapath" if kernel else "needed (userspace datapath)"
    return Check("offload", True, f"ethtool present; TX checksum offload is turned off on every "
                 f"host interface at start-up ({need})")


def check_tools() -> Check:
    missing = [t for t in ("ip", "tc", "ping", "iperf3", "tcpdump") if shutil.which(t) is None]
    if missing:
        return Check("tools", False, f"missing: {', '.join(missing)} (tcpdump: the wire check "
                     "of every emulated run, run.wire_check)",
                     f"apt-get install iproute2 iputils-ping iperf3 tcpdump, or {SETUP_HINT}")
    return Check("tools", True, "ip, tc, ping, iperf3, tcpdump present")


def check_cpu_quota() -> Check:
    """Whether ``run.rank_cpu_quota`` can be honoured: a writable cgroup cpu controller
    (:mod:`emulator.cpuquota`). Optional: only runs that ask for a quota need it."""
    from emulator.cpuquota import CgroupUnavailable, cpu_controller

    try:
        found = cpu_controller()
    except CgroupUnavailable as exc:
        return Check("cpu quota", False, f"unavailable: {exc}; runs with run.rank_cpu_quota "
                     "are refused (other runs are unaffected)",
                     "mount cgroup v2 with the cpu controller (Debian 12's default) or cgroup "
                     "v1's cpu hierarchy, and run as root", optional=True)
    return Check("cpu quota", True, f"available: {found.describe()} (run.rank_cpu_quota)",
                 optional=True)


def run_checks() -> list[Check]:
    checks: list[Callable[[], Check]] = [
        check_root,
        check_ovs,
        check_ovs_per_rail,
        check_mininet,
        lambda: check_import("os_ken", "os-ken", f"pip install os-ken, or {SETUP_HINT}"),
        check_offload,
        check_tools,
        lambda: check_import("scapy.all", "scapy", f"pip install scapy, or {SETUP_HINT}"),
        lambda: Check("python", sys.version_info >= (3, 11), sys.version.split()[0],
                      "Python 3.11 or newer is needed"),
        check_cpu_quota,
    ]
    return [c() for c in checks]
