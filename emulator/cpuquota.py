"""A CPU quota on a run's rank processes (one cgroup per run), so the fabric keeps its headroom.

Why: on a small machine the rank processes (replayers, torch ranks) and the fabric
(``ovs-vswitchd``, whose main thread also forwards every packet with the userspace datapath,
the OCS app, the Opus controller) share the cores; when the ranks take them all, the light
confirmation and the forwarding wait (``docs/performance.md``, "32 emulated ranks"). Mininet-HiFi
answered the same problem with CPU-limited hosts (Handigol et al., CoNEXT 2012, its
``CPULimitedHost``: a CFS bandwidth limit per host); here the run's rank processes share one
limit, ``run.rank_cpu_quota`` of the machine, and everything else stays outside it.

The cgroup is ``opus-testbed-<prefix>`` (:func:`cgroup_name`) directly under the root of the
hierarchy that carries the ``cpu`` controller: cgroup v2 (``cpu.max``) where its root lists
``cpu`` in ``cgroup.controllers`` (Debian 12's default), else cgroup v1's ``cpu`` hierarchy
(``cpu.cfs_quota_us``; e.g. ``/sys/fs/cgroup/cpu``). A process is placed by its pid
(``cgroup.procs``) as it starts, before it runs anything of its own (:func:`placed_command`: a
shell writes its pid, then execs the command), so every child it forks inherits the cgroup;
placing it from the parent after ``Popen`` returned raced with the children a command forks
at once (a ``timeout``'s child ran outside). A Mininet host mounts a sysfs of its own over
``/sys``, without the cgroup mounts, so the shell reaches ``cgroup.procs`` through the
starting process's root (``/proc/<its pid>/root/sys/fs/cgroup/...``,
:meth:`RankCgroup.command`). Its path is kept in the run record (:mod:`emulator.runstate`), so
teardown and ``opus-testbed clean`` remove it by that name and no other. The throttling
counters (``cpu.stat``) are read before teardown.

Pure parts (detection from a mount table, limits, ``cpu.stat`` parsing) are apart from the
:class:`RankCgroup` shell, so tests can run them on a fake cgroup root.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

#: Every cgroup this project creates is named so, followed by the run's prefix.
CGROUP_PREFIX = "opus-testbed-"
CGROUP_NAME_RE = re.compile(r"^opus-testbed-ot[0-9a-z]{3}$")
#: CFS period of the quota (the kernel's default; Mininet-HiFi used the same).
PERIOD_US = 100_000
#: ``auto``: what the fabric is left, in cores. On this 2-core machine a 32-rank run's fabric
#: (ovs-vswitchd 0.12-0.39 cores, controller and runner 0.14, OCS app 0.02, Mininet shells
#: 0.04) took up to ~0.6 cores (``docs/performance.md``, "Emulator: TCP on shaped links").
AUTO_RESERVE_CORES = 0.6
#: ``auto`` never leaves the ranks less than this share of the machine.
AUTO_MIN_FRACTION = 0.25
AUTO = "auto"
MOUNTS = Path("/proc/self/mounts")


class CgroupUnavailable(RuntimeError):
    """No usable cgroup ``cpu`` controller (the message says what is missing)."""


@dataclass(frozen=True)
class CpuController:
    """Where the ``cpu`` controller is mounted: ``version`` 1 or 2, at ``root``."""

    version: int
    root: Path

    def describe(self) -> str:
        return f"cgroup v{self.version} cpu controller at {self.root}"


def validate_setting(value: Any) -> float | str | None:
    """``run.rank_cpu_quota`` as given: None (off), ``"auto"``, or a fraction of the machine in
    (0, 1]; raises ValueError saying what is accepted."""
    if value is None:
        return None
    if value == AUTO:
        return AUTO
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"must be null (no quota), 'auto' or a fraction of the machine's CPU "
                         f"in (0, 1], got {value!r}")
    if not 0 < value <= 1:
        raise ValueError(f"must be a fraction of the machine's CPU in (0, 1] (0.5: half its "
                         f"CPU time), got {value!r}")
    return float(value)


def resolve_fraction(setting: float | str | None, cpus: int) -> float | None:
    """The share of the machine the ranks get: the setting, or for ``auto`` all but
    :data:`AUTO_RESERVE_CORES` (at least :data:`AUTO_MIN_FRACTION`); None: no quota."""
    if setting is None:
        return None
    if setting == AUTO:
        return max(AUTO_MIN_FRACTION, 1.0 - AUTO_RESERVE_CORES / max(1, cpus))
    return float(setting)


def quota_us(fraction: float, cpus: int, period_us: int = PERIOD_US) -> int:
    """CPU time the ranks may use per period, over all cores (at least 1 ms, the kernel's
    floor)."""
    return max(1000, round(fraction * cpus * period_us))


def limit_files(version: int, fraction: float, cpus: int) -> dict[str, str]:
    """The files (in order) and values that set the quota on a cgroup of ``version``."""
    quota = quota_us(fraction, cpus)
    if version == 2:
        return {"cpu.max": f"{quota} {PERIOD_US}"}
    return {"cpu.cfs_period_us": str(PERIOD_US), "cpu.cfs_quota_us": str(quota)}


def placed_command(procs_file: Path, args: list[str]) -> list[str]:
    """``args`` started so that the process first writes its own pid to ``procs_file`` (a
    cgroup's ``cgroup.procs``) and then execs ``args`` under the same pid (its command line is
    then exactly ``args``); a failed write ends it with the shell's error."""
    return ["sh", "-c", 'echo $$ > "$0" && exec "$@"', str(procs_file), *args]


def seen_from_anywhere(path: Path, pid: int | None = None) -> Path:
    """``path`` (absolute) as a process in another mount namespace, but the same pid and proc
    mount, reaches it: through ``/proc/<pid>/root`` of this process (or ``pid``)."""
    return Path(f"/proc/{pid or os.getpid()}/root") / path.relative_to("/")


def cgroup_name(prefix: str) -> str:
    return f"{CGROUP_PREFIX}{prefix}"


def find_cpu_controller(mounts: str, read: Callable[[Path], str] | None = None
                        ) -> CpuController | str:
    """The ``cpu`` controller's hierarchy from a mount table (``/proc/self/mounts``'s text), or
    why there is none. cgroup v2 counts only when its root lists ``cpu`` in
    ``cgroup.controllers`` (on a hybrid machine ``cpu`` is bound to v1 and v2 has none)."""
    read = read or (lambda p: p.read_text())
    v1: CpuController | None = None
    seen_v2 = []
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 4:
            continue
        root, fstype, options = Path(fields[1]), fields[2], fields[3].split(",")
        if fstype == "cgroup2":
            seen_v2.append(str(root))
            try:
                controllers = read(root / "cgroup.controllers").split()
            except OSError:
                continue
            if "cpu" in controllers:
                return CpuController(2, root)
        elif fstype == "cgroup" and "cpu" in options and v1 is None:
            v1 = CpuController(1, root)
    if v1 is not None:
        return v1
    if seen_v2:
        return (f"the cgroup v2 hierarchy ({', '.join(seen_v2)}) does not offer the cpu "
                "controller and no cgroup v1 cpu hierarchy is mounted")
    return "no cgroup hierarchy with the cpu controller is mounted"


def cpu_controller() -> CpuController:
    """This machine's ``cpu`` controller; raises :class:`CgroupUnavailable` naming why not."""
    try:
        found = find_cpu_controller(MOUNTS.read_text())
    except OSError as exc:
        raise CgroupUnavailable(f"cannot read {MOUNTS}: {exc.strerror}") from exc
    if isinstance(found, str):
        raise CgroupUnavailable(found)
    if not os.access(found.root, os.W_OK):
        raise CgroupUnavailable(f"{found.describe()} is not writable (run as root)")
    return found


@dataclass(frozen=True)
class Throttling:
    """A cgroup's throttling counters: CFS periods with runnable tasks, periods in which the
    quota ran out, and the time its tasks were held back (``throttled_s``)."""

    nr_periods: int
    nr_throttled: int
    throttled_s: float

    @property
    def throttled_share(self) -> float | None:
        """Share of the periods in which the quota ran out (None: no period yet)."""
        return self.nr_throttled / self.nr_periods if self.nr_periods else None


def parse_cpu_stat(text: str, version: int) -> Throttling:
    """``cpu.stat``: v1's ``throttled_time`` is in ns, v2's ``throttled_usec`` in µs."""
    values = {}
    for line in text.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[1].lstrip("-").isdigit():
            values[parts[0]] = int(parts[1])
    throttled = (values.get("throttled_usec", 0) / 1e6 if version == 2
                 else values.get("throttled_time", 0) / 1e9)
    return Throttling(values.get("nr_periods", 0), values.get("nr_throttled", 0), throttled)


def quota_summary(setting: float | str | None, fraction: float | None, cpus: int,
                  cgroup: str | None, version: int | None, stats: Throttling | None
                  ) -> dict[str, Any] | None:
    """The summary's ``rank_cpu_quota`` (None: no quota)."""
    if fraction is None:
        return None
    return {"setting": setting, "fraction": fraction, "cores": round(fraction * cpus, 3),
            "period_us": PERIOD_US, "cgroup": cgroup, "cgroup_version": version,
            "nr_periods": stats.nr_periods if stats else None,
            "nr_throttled": stats.nr_throttled if stats else None,
            "throttled_s": stats.throttled_s if stats else None,
            "throttled_share": stats.throttled_share if stats else None}


def quota_text(quota: dict[str, Any] | None) -> str:
    """The printed summary's line: the quota and how often it held the ranks back."""
    if not quota:
        return "off (the ranks share every core with the fabric)"
    text = (f"{quota['fraction']:.2f} of the machine ({quota['cores']:g} cores; "
            f"{quota['setting']}) for the ranks, cgroup v{quota['cgroup_version']}")
    share = quota.get("throttled_share")
    if quota.get("nr_periods") is None:
        return text + "; throttling not read"
    return (text + f"; throttled in {quota['nr_throttled']}/{quota['nr_periods']} periods"
            + ("" if share is None else f" ({100 * share:.0f} %)")
            + f", {quota['throttled_s']:.2f} s held back")


# --- the shell: one cgroup on this machine ---------------------------------------------------


@dataclass
class RankCgroup:
    """The cgroup of one run's rank processes (created by :meth:`create`)."""

    path: Path
    version: int
    setting: float | str
    fraction: float
    cpus: int

    @classmethod
    def create(cls, prefix: str, setting: float | str, controller: CpuController | None = None,
               cpus: int | None = None) -> RankCgroup:
        """Make ``opus-testbed-<prefix>`` with the quota; raises :class:`CgroupUnavailable`."""
        ctrl = controller or cpu_controller()
        cpus = cpus or len(os.sched_getaffinity(0))
        fraction = resolve_fraction(setting, cpus)
        assert fraction is not None
        if ctrl.version == 2:
            _require_cpu(ctrl.root)
        path = ctrl.root / cgroup_name(prefix)
        try:
            path.mkdir()
            for name, value in limit_files(ctrl.version, fraction, cpus).items():
                (path / name).write_text(value)
        except OSError as exc:
            with contextlib.suppress(OSError):
                path.rmdir()
            raise CgroupUnavailable(f"cannot create {path} with a CPU quota: "
                                    f"{exc.strerror or exc}") from exc
        return cls(path, ctrl.version, setting, fraction, cpus)

    def place(self, pid: int) -> None:
        """Move process ``pid`` (every thread of it) into the cgroup."""
        (self.path / "cgroup.procs").write_text(f"{pid}\n")

    def command(self, args: list[str]) -> list[str]:
        """``args`` started inside the cgroup (:func:`placed_command`), also from another mount
        namespace (a Mininet host's): ``cgroup.procs`` is named through this process's root."""
        return placed_command(seen_from_anywhere(self.path / "cgroup.procs"), args)

    def pids(self) -> list[int]:
        return member_pids(self.path)

    def throttling(self) -> Throttling:
        return parse_cpu_stat((self.path / "cpu.stat").read_text(), self.version)

    def summary(self, stats: Throttling | None) -> dict[str, Any] | None:
        return quota_summary(self.setting, self.fraction, self.cpus, self.path.name,
                             self.version, stats)


def _require_cpu(root: Path) -> None:
    """cgroup v2: the root must hand the ``cpu`` controller to its children (systemd does when
    a unit asks for it). The run does not turn it on itself: that would change the whole
    machine's cgroups for good, and a container's root cannot (it holds processes)."""
    control = root / "cgroup.subtree_control"
    try:
        handed_out = "cpu" in control.read_text().split()
    except OSError as exc:
        raise CgroupUnavailable(f"cannot read {control}: {exc.strerror or exc}") from exc
    if not handed_out:
        raise CgroupUnavailable(f"{control} does not hand out the cpu controller (as root: "
                                f"echo +cpu > {control})")


def member_pids(path: Path) -> list[int]:
    try:
        return [int(x) for x in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def owned_cgroup(path: Path, prefix: str) -> bool:
    """Whether ``path`` is this project's cgroup of run ``prefix`` directly under a mounted
    hierarchy's root (a record is never trusted further than that)."""
    if path.name != cgroup_name(prefix) or not CGROUP_NAME_RE.match(path.name):
        return False
    try:
        found = find_cpu_controller(MOUNTS.read_text())
    except OSError:
        return False
    return isinstance(found, CpuController) and path.parent == found.root


def remove_cgroup(path: Path, timeout_s: float = 3.0) -> list[int]:
    """Remove a run's cgroup (gone already: nothing to do). Its processes are the run's (placed
    there by pid, or their children): any still in it are killed by pid first. Returns them."""
    if not path.is_dir():
        return []
    killed: list[int] = []
    deadline = time.monotonic() + timeout_s
    while True:
        members = member_pids(path)
        if not members:
            with contextlib.suppress(FileNotFoundError):
                path.rmdir()
            return killed
        if time.monotonic() > deadline:
            raise OSError(f"{path} still holds processes {members}")
        for pid in members:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                if pid not in killed:
                    killed.append(pid)
        time.sleep(0.02)
