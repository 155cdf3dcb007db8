"""What the trace importers share: collective names and element types, the result of an import,
the world group's default axis, and writing ``workload.json`` + ``experiment.yaml``.

The importers (:mod:`workloads.kineto` for ``torch.profiler`` Chrome traces,
:mod:`workloads.exec_trace` for PyTorch execution traces) differ in how they find the calls;
what the calls are called, how large they are and where the result goes is the same here.
"""

from __future__ import annotations

import gzip
import json
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, TypeVar

from workloads.captured import CaptureError
from workloads.schedule import Schedule

#: c10d / NCCL / gloo collective names (lower case, prefix and trailing "_" removed) -> kind
KIND_OF_NAME = {
    "allreduce": "all_reduce", "all_reduce": "all_reduce", "allreduce_coalesced": "all_reduce",
    "_allgather_base": "all_gather", "allgather": "all_gather", "all_gather": "all_gather",
    "_all_gather_base": "all_gather", "allgather_into_tensor_coalesced": "all_gather",
    "all_gather_into_tensor": "all_gather", "allgather_coalesced": "all_gather",
    "all_gather_single": "all_gather",
    "_reduce_scatter_base": "reduce_scatter", "reduce_scatter": "reduce_scatter",
    "reduce_scatter_tensor_coalesced": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "reducescatter": "reduce_scatter", "reduce_scatter_single": "reduce_scatter",
    "send": "send", "recv": "recv",
    "all_to_allv": "all_to_all", "all_to_all": "all_to_all", "alltoall_base": "all_to_all",
    "alltoall": "all_to_all", "all_to_all_single": "all_to_all",
}
DTYPE_BYTES = {
    "float": 4, "float32": 4, "Float": 4, "double": 8, "float64": 8, "Double": 8,
    "c10::Half": 2, "Half": 2, "float16": 2, "c10::BFloat16": 2, "BFloat16": 2, "bfloat16": 2,
    "long int": 8, "Long": 8, "int64": 8, "int": 4, "Int": 4, "int32": 4,
    "short int": 2, "Short": 2, "int16": 2, "unsigned char": 1, "Byte": 1, "uint8": 1,
    "signed char": 1, "Char": 1, "int8": 1, "bool": 1, "Bool": 1,
    "c10::Float8_e4m3fn": 1, "Float8_e4m3fn": 1, "c10::Float8_e5m2": 1, "Float8_e5m2": 1,
}
WORLD_DESC = "default_pg"


class TraceImportError(CaptureError):
    """A trace that cannot be imported; the message names the file, the event and why.

    (What the traces show but a schedule cannot hold is a :class:`CaptureError` too.)"""


@dataclass
class Group:
    """A process group of one trace's ``pg_config``."""

    name: str
    desc: str
    ranks: tuple[int, ...]



@dataclass
class Imported:
    """The result of an import: the schedule and what it was made from."""

    schedule: Schedule
    layouts: dict[int, str]
    step: str
    calls: dict[int, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)  # choices made for the user, to print

    command: str = "import kineto"  # the command that made it, for experiment.yaml
    #: ocs.ports_per_rank chosen for the rails (testbed.experiment.railfit), with its notes;
    #: None: guessed from the groups (:func:`_ports`)
    ports_per_rank: int | None = None
    rail_notes: list[str] = field(default_factory=list)


def read_json(path: str, error: type[TraceImportError], what: str) -> Any:
    """The JSON document of a ``.json`` or ``.json.gz`` file; ``error`` (naming the file) when
    it cannot be read, is empty, truncated (a trace still being written) or not JSON."""
    try:
        opener = gzip.open if path.endswith(".gz") else open
        with opener(path, "rt") as fh:
            text = fh.read()
    except EOFError as exc:
        raise error(f"{path}: truncated: the compressed file ends early ({exc}); was the "
                    "trace still being written?") from exc
    except (UnicodeDecodeError, gzip.BadGzipFile) as exc:
        raise error(f"{path}: not {what} (JSON): {exc}") from exc
    except OSError as exc:
        raise error(f"{path}: cannot read it: {exc}") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        if not text.strip():
            raise error(f"{path}: empty file (0 bytes of JSON)") from exc
        if exc.pos >= len(text.rstrip()):
            raise error(f"{path}: truncated: the JSON ends at byte {len(text)} in the "
                        "middle of the document; was the trace still being written?") from exc
        raise error(f"{path}: not {what} (JSON): {exc}") from exc


def kind_of(name: str) -> str | None:
    """The schedule kind of a collective name in any spelling, None if it has none."""
    base = name
    for prefix in ("c10d::", "nccl:", "gloo:", "opus:"):
        base = base.removeprefix(prefix)
    base = base.lower()
    return KIND_OF_NAME.get(base, KIND_OF_NAME.get(base.rstrip("_")))


def to_int(value: Any) -> int:
    """An int from an int or its string form (``"1024"``, ``"1024.0"``)."""
    return int(float(value)) if isinstance(value, str) else int(value)


def int_list(value: Any) -> list[int] | None:
    """A list of ints from a list or its string form ``"[1, 2]"``; None if truncated/absent."""
    if isinstance(value, list):
        return [to_int(v) for v in value]
    if isinstance(value, str) and value.strip().startswith("["):
        if "..." in value or "\u2026" in value:
            return None
        inner = value.strip()[1:-1].strip()
        return [int(x) for x in inner.split(",")] if inner else []
    return None


def numel(dims: Any) -> int:
    """Elements of a tensor's dims, or summed over a (nested) list of tensors."""
    if isinstance(dims, list) and all(isinstance(d, int) for d in dims):
        n = 1
        for d in dims:
            n *= d
        return n
    if isinstance(dims, list) and all(isinstance(d, list) for d in dims):
        return sum(numel(d) for d in dims)
    raise ValueError(f"unreadable dims {dims!r}")


def default_axes(descs: set[str], axes: dict[str, str] | None) -> dict[str, str]:
    """``axes`` with ``default_pg`` -> ``dp`` when every call is on the world group (``descs``
    are the descriptors of the groups the calls used): plain DDP, whose only group is the one
    torch names ``default_pg``. With any other axis in the job the world group's role (a sync,
    a data-parallel axis, ...) is the user's to name."""
    out = dict(axes or {})
    if descs == {WORLD_DESC} and WORLD_DESC not in out:
        out[WORLD_DESC] = "dp"
    return out


def world_note(axes: dict[str, str], given: dict[str, str]) -> list[str]:
    """The note printed when :func:`default_axes` chose the world group's axis."""
    return [f"{WORLD_DESC} (torch's world group, the only group the job uses) taken as the dp "
            f"axis; --axis {WORLD_DESC}=AXIS names another"] if axes != given else []


def experiment_yaml(imported: Imported, name: str, schedule_file: str = "workload.json") -> str:
    """A runnable experiment file for an imported schedule (``workload: {schedule: ...}``)."""
    s = imported.schedule
    sources = (s.origin or {}).get("sources", [])
    ports = (_ports(s) if imported.ports_per_rank is None else
             f", ports_per_rank: {imported.ports_per_rank}" if imported.ports_per_rank > 1
             else "")
    why = "".join(f"# {line}\n" for note in imported.rail_notes
                  for line in textwrap.wrap(note, 94))
    return (f"# Imported by `opus-testbed {imported.command}` ({imported.step}) from:\n"
            + "".join(f"#   {p}\n" for p in sources)
            + (f"# Chosen for the rails:\n{why}" if why else "")
            + f"name: {json.dumps(name)}\n"
            f"cluster: {{servers: {s.cluster.servers}, gpus_per_server: "
            f"{s.cluster.gpus_per_server}}}\n"
            f"workload: {{schedule: {schedule_file}}}\n"
            "mode: on-demand\n"
            f"ocs: {{switching_delay: 10{ports}}}\n"
            "run: {warmup: 1, iterations: 2}\n")


def _ports(s: Schedule) -> str:
    """``, ports_per_rank: 2`` when a group of more than two ranks spans servers: its ring
    needs two circuits at each rank on the rail OCS (the default is one port per rank)."""
    gps = s.cluster.gpus_per_server
    for gs in s.groups.values():
        for members in gs.ranks.tolist():
            if len(members) > 2 and len({r // gps for r in members}) > 1:
                return ", ports_per_rank: 2"
    return ""


def check_out_dir(out_dir: str | Path) -> Path:
    """``out_dir`` if it is new or an empty directory; refused otherwise (nothing written)."""
    out = Path(out_dir)
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise TraceImportError(f"{out}: exists and is not an empty directory; nothing was written")
    return out


def write_import(imported: Imported, out_dir: str | Path, name: str) -> list[Path]:
    """Write ``workload.json`` and ``experiment.yaml`` into a new or empty ``out_dir``."""
    out = check_out_dir(out_dir)
    created = not out.exists()
    files = [out / "workload.json", out / "experiment.yaml"]
    try:
        out.mkdir(parents=True, exist_ok=True)
        imported.schedule.to_json(str(files[0]))
        files[1].write_text(experiment_yaml(imported, name))
    except OSError as exc:
        for f in files:
            f.unlink(missing_ok=True)
        if created and out.exists():
            out.rmdir()
        raise TraceImportError(f"{out}: cannot write the import: {exc}") from exc
    return files


class RankTrace(Protocol):
    """What :func:`by_rank` reads of one rank's trace (Kineto's or an execution trace's)."""

    @property
    def path(self) -> object: ...  # named in messages

    @property
    def rank(self) -> int: ...

    @property
    def world_size(self) -> int: ...


TraceT = TypeVar("TraceT", bound=RankTrace)


def by_rank(traces: Iterable[TraceT], error: type[Exception], world_key: str
            ) -> tuple[dict[int, TraceT], list[int]]:
    """The traces by rank and the ranks of the world without one; ``error`` (its message naming
    the file) for a rank given twice or a world size (``world_key`` in the message) that
    disagrees with the first trace's. Needs at least one trace."""
    out: dict[int, TraceT] = {}
    for t in traces:
        if t.rank in out:
            raise error(f"{t.path}: rank {t.rank} again (also {out[t.rank].path})")
        out[t.rank] = t
    first = next(iter(out.values()))
    for t in out.values():
        if t.world_size != first.world_size:
            raise error(f"{t.path}: {world_key} {t.world_size}, but {first.path} says "
                        f"{first.world_size}")
    return out, sorted(set(range(first.world_size)) - set(out))
