"""Run records and cleanup: what a run created, so that it and only it can be removed.

A live run keeps ``/run/opus-testbed/<prefix>.json`` (``OPUS_STATE_DIR`` overrides): its owner
pid, the pids of every process it started (with a marker that must appear in the process's
command line, guarding against pid reuse), its bridges and its named network namespaces.
:func:`clean` removes the leftovers of runs whose owner is gone: processes by recorded pid,
bridges and root-namespace interfaces by our name pattern (:data:`emulator.naming
.OWNED_NAME_RE`), named namespaces (rail-state's shadow namespace) by theirs
(:data:`emulator.naming.OWNED_NETNS_RE`), its recorded cgroups (the ranks' CPU
quota, :mod:`emulator.cpuquota`) by recorded path if named as ours, and the directories recorded
with :func:`owned_dir` (``<state dir>/dirs/``; e.g. a torch run's scale-up sockets) by their
recorded path. Nothing else is touched.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

from emulator import cpuquota, naming


def state_dir() -> Path:
    return Path(os.environ.get("OPUS_STATE_DIR", "/run/opus-testbed"))


@dataclass
class RecordedProcess:
    pid: int
    marker: str  # substring of /proc/<pid>/cmdline that identifies our process


@dataclass
class RunRecord:
    prefix: str
    owner_pid: int
    slot: int = 0
    created_s: float = field(default_factory=time.time)
    processes: list[RecordedProcess] = field(default_factory=list)
    bridges: list[str] = field(default_factory=list)
    cgroups: list[str] = field(default_factory=list)  # paths (emulator.cpuquota)
    namespaces: list[str] = field(default_factory=list)  # `ip netns` names (rail-state)

    @property
    def path(self) -> Path:
        return state_dir() / f"{self.prefix}.json"

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self), indent=1))
        tmp.replace(self.path)

    def add_process(self, pid: int, marker: str) -> None:
        self.processes.append(RecordedProcess(pid, marker))
        self.save()

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)

    @classmethod
    def load(cls, path: Path) -> RunRecord:
        data = json.loads(path.read_text())
        if not isinstance(data, dict) or not naming.PREFIX_RE.match(str(data.get("prefix"))):
            raise ValueError(f"{path}: not a run record")
        if path.stem != data["prefix"]:
            raise ValueError(f"{path}: record of {data['prefix']} under another name")
        procs = [RecordedProcess(**p) for p in data.pop("processes", [])]
        return cls(processes=procs, **data)


def load_records() -> list[RunRecord]:
    out: list[RunRecord] = []
    directory = state_dir()
    if not directory.is_dir():
        return out
    for path in sorted(directory.glob("ot???.json")):
        try:
            out.append(RunRecord.load(path))
        except (OSError, ValueError, TypeError):
            continue
    return out


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def cmdline(pid: int) -> str:
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return ""
    return raw.replace(b"\0", b" ").decode(errors="replace")


def stop_process(pid: int, marker: str, timeout_s: float = 3.0) -> bool:
    """SIGTERM then SIGKILL one recorded process, only if its command line has ``marker``."""
    if not pid_alive(pid) or marker not in cmdline(pid):
        return False
    try:
        os.kill(pid, signal.SIGTERM)
    except ProcessLookupError:
        return False
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pid_alive(pid) or marker not in cmdline(pid):
            return True
        _reap(pid)
        time.sleep(0.02)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    _reap(pid)
    return True


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def owned_bridges() -> list[str]:
    try:
        out = subprocess.run(["ovs-vsctl", "--timeout=5", "list-br"], capture_output=True,
                             text=True, check=False).stdout
    except FileNotFoundError:
        return []
    return [b for b in out.split() if naming.OWNED_NAME_RE.match(b)]


def owned_links() -> list[str]:
    out = subprocess.run(["ip", "-o", "link", "show"], capture_output=True, text=True,
                         check=False).stdout
    names = []
    for line in out.splitlines():
        parts = line.split(":", 2)
        if len(parts) > 1:
            name = parts[1].strip().split("@")[0]
            if naming.OWNED_NAME_RE.match(name):
                names.append(name)
    return names


def owned_netns() -> list[str]:
    """The named network namespaces (``ip netns``) named as ours."""
    try:
        out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True,
                             check=False).stdout
    except FileNotFoundError:
        return []
    names = (line.split()[0] for line in out.splitlines() if line.strip())
    return [n for n in names if naming.OWNED_NETNS_RE.match(n)]


def remove_netns(name: str) -> None:
    """Delete named namespace ``name`` (its interfaces go with it, and a veth's root end with
    its far end); only a name of ours."""
    if not naming.OWNED_NETNS_RE.match(name):
        raise ValueError(f"not a namespace of ours: {name!r}")
    subprocess.run(["ip", "netns", "del", name], capture_output=True, check=False)


def live_prefixes() -> set[str]:
    return {r.prefix for r in load_records() if pid_alive(r.owner_pid)}


def remove_bridge(name: str) -> None:
    subprocess.run(["ovs-vsctl", "--timeout=10", "--if-exists", "del-br", name],
                   capture_output=True, check=False)


def remove_link(name: str) -> None:
    subprocess.run(["ip", "link", "del", name], capture_output=True, check=False)


# --- directories a run owns (removed by clean when the run died) ---------------------------

DIR_MARKER = ".opus-testbed-owned"  # written into every recorded directory


def dirs_dir() -> Path:
    return state_dir() / "dirs"


@contextlib.contextmanager
def owned_dir(path: Path) -> Iterator[Path]:
    """Create ``path`` (or take it as it is), record it for :func:`clean_dirs` under this process,
    and remove it and its record on the way out. Should the process be killed first, ``clean``
    removes it by the recorded name."""
    path.mkdir(parents=True, exist_ok=True)
    (path / DIR_MARKER).write_text(f"{os.getpid()}\n")
    record = dirs_dir() / f"{os.getpid()}-{time.monotonic_ns()}.json"
    record.parent.mkdir(parents=True, exist_ok=True)
    record.write_text(json.dumps({"owner_pid": os.getpid(), "path": str(path.resolve())}))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
        record.unlink(missing_ok=True)


def clean_dirs(include_live: bool = False) -> list[str]:
    """Remove the recorded directories of dead owners (every owner with ``include_live``):
    only a recorded path that still holds the marker written when it was created."""
    removed = []
    directory = dirs_dir()
    for record in sorted(directory.glob("*.json")) if directory.is_dir() else []:
        try:
            data = json.loads(record.read_text())
            owner, path = int(data["owner_pid"]), Path(str(data["path"]))
        except (OSError, ValueError, TypeError, KeyError):
            continue
        if pid_alive(owner) and not include_live:
            continue
        if (path / DIR_MARKER).is_file():
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
        record.unlink(missing_ok=True)
    return removed


def clean(include_live: bool = False) -> dict[str, list[str]]:
    """Remove leftovers of dead runs (or of every run with ``include_live``)."""
    removed: dict[str, list[str]] = {"processes": [], "bridges": [], "links": [], "records": [],
                                     "cgroups": [], "namespaces": [],
                                     "dirs": clean_dirs(include_live)}
    live = set() if include_live else live_prefixes()
    for record in load_records():
        if record.prefix in live:
            continue
        for proc in record.processes:
            if stop_process(proc.pid, proc.marker):
                removed["processes"].append(f"{proc.pid} ({proc.marker})")
        removed["cgroups"] += remove_cgroups(record)
        record.remove()
        removed["records"].append(record.prefix)
    for bridge in owned_bridges():
        if naming.prefix_of(bridge) not in live:
            remove_bridge(bridge)
            removed["bridges"].append(bridge)
    for name in owned_netns():
        if name[:5] not in live:
            remove_netns(name)
            removed["namespaces"].append(name)
    for link in owned_links():
        if naming.prefix_of(link) not in live:
            remove_link(link)
            removed["links"].append(link)
    return removed


def remove_cgroups(record: RunRecord) -> list[str]:
    """Remove the cgroups ``record`` names, each only if it is named as this run's and sits
    under a mounted hierarchy's root (:func:`emulator.cpuquota.owned_cgroup`); returns the
    paths removed (one whose processes will not die is left for a later ``clean``)."""
    gone = []
    for text in record.cgroups:
        path = Path(text)
        if not path.is_dir() or not cpuquota.owned_cgroup(path, record.prefix):
            continue
        with contextlib.suppress(OSError):
            cpuquota.remove_cgroup(path)
            gone.append(text)
    return gone


def leftovers(prefix: str) -> dict[str, list[str]]:
    """What of run ``prefix`` still exists on this machine (for tests and teardown checks)."""
    procs = []
    for pid_dir in Path("/proc").iterdir():
        if pid_dir.name.isdigit():
            line = cmdline(int(pid_dir.name))
            if (f"mininet:{prefix}" in line or f"{prefix}/ocs.json" in line
                    or (line.startswith(("ovsdb-server ", "ovs-vswitchd "))
                        and f"/{prefix}" in line)):  # emulator.ovs_instance's daemons
                procs.append(f"{pid_dir.name}: {line.strip()}")
    return {
        "bridges": [b for b in owned_bridges() if naming.prefix_of(b) == prefix],
        "links": [link for link in owned_links() if naming.prefix_of(link) == prefix],
        "processes": procs,
        "records": [str(p) for p in state_dir().glob(f"{prefix}.json")],
        "cgroups": [str(p) for p in _mounted_cgroups(prefix)],
        "namespaces": [n for n in owned_netns() if n[:5] == prefix],
    }


def _mounted_cgroups(prefix: str) -> list[Path]:
    """Run ``prefix``'s cgroup where it would be, if it exists."""
    try:
        found = cpuquota.find_cpu_controller(cpuquota.MOUNTS.read_text())
    except OSError:
        return []
    if isinstance(found, str):
        return []
    path = found.root / cpuquota.cgroup_name(prefix)
    return [path] if path.is_dir() else []
