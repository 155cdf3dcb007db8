"""What a results folder holds: one run, a sweep, or ``run --baseline``'s pair of runs.

``run CONFIG --baseline --out DIR`` writes two runs, ``DIR/baseline`` and ``DIR/MODE``; ``DIR``
itself holds no ``summary.json``. The commands that read results (``report``, ``export
perfetto``, ``compare``) take such a folder too: :func:`classify` says what a folder is, and
:func:`not_a_results_folder` says, when it is none of them, which folders inside it are.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

#: The modes a switched run of a pair may have (its folder's name: ``run --baseline``).
SWITCHED_MODES = ("on-demand", "provisioning", "degree-aware")
RUN, SWEEP, PAIR = "run", "sweep", "pair"
#: How a message names each kind of folder.
KIND_TEXT = {RUN: "a run", SWEEP: "a sweep", PAIR: "run --baseline: baseline and MODE"}


def is_run(path: Path) -> bool:
    """A run directory: it holds the run's ``summary.json``."""
    return (path / "summary.json").is_file()


def is_sweep(path: Path) -> bool:
    """A sweep directory: it holds ``sweep.csv``."""
    return (path / "sweep.csv").is_file()


@dataclass(frozen=True)
class Folder:
    """A results folder: its ``kind`` (:data:`RUN`, :data:`SWEEP` or :data:`PAIR`) and its
    runs (the run; the sweep's points; a pair's baseline then its switched run)."""

    path: Path
    kind: str
    runs: tuple[Path, ...]

    @property
    def baseline(self) -> Path | None:
        """A pair's baseline run, else None."""
        return self.runs[0] if self.kind == PAIR else None

    @property
    def switched(self) -> Path:
        """The run that stands for the folder: a pair's switched run, a run itself."""
        return self.runs[-1]


def pair_runs(path: Path) -> tuple[Path, Path] | None:
    """``(DIR/baseline, DIR/MODE)`` when ``path`` is ``run --baseline``'s folder: no summary
    of its own, a baseline run and exactly one switched run inside; else None."""
    if is_run(path) or is_sweep(path) or not is_run(path / "baseline"):
        return None
    switched = [path / m for m in SWITCHED_MODES if is_run(path / m)]
    return (path / "baseline", switched[0]) if len(switched) == 1 else None


def classify(path: Path) -> Folder | None:
    """What ``path`` holds, or None when it is neither a run, a sweep nor a pair."""
    if is_sweep(path):
        points = tuple(sorted(p for p in path.iterdir() if p.is_dir() and is_run(p)))
        return Folder(path, SWEEP, points)
    if is_run(path):
        return Folder(path, RUN, (path,))
    pair = pair_runs(path)
    return Folder(path, PAIR, pair) if pair else None


def results_inside(path: Path, depth: int = 2) -> list[tuple[Path, str]]:
    """The runs, sweeps and pairs below ``path`` (``depth`` levels at most; not below one)."""
    found: list[tuple[Path, str]] = []
    if not path.is_dir() or depth <= 0:
        return found
    for sub in sorted(p for p in path.iterdir() if p.is_dir()):
        folder = classify(sub)
        if folder is not None:
            found.append((sub, folder.kind))
        else:
            found += results_inside(sub, depth - 1)
    return found


def not_a_results_folder(path: Path, wanted: str = "a run, a sweep or a run --baseline folder"
                         ) -> str:
    """Why ``path`` was refused, and which folders inside it would do (at most 8 named)."""
    if not path.exists():
        return f"{path} does not exist (wanted {wanted})"
    if not path.is_dir():
        return f"{path} is not a folder (wanted {wanted})"
    why = (f"{path} is not {wanted}: it holds no summary.json (a run), no sweep.csv (a sweep), "
           "nor baseline/ beside one of " + "/, ".join(SWITCHED_MODES) + "/ (run --baseline)")
    inside = results_inside(path)
    if not inside:
        return why
    named = ", ".join(f"{p} ({KIND_TEXT[kind]})" for p, kind in inside[:8])
    more = f" and {len(inside) - 8} more" if len(inside) > 8 else ""
    return f"{why}; give one of the folders inside: {named}{more}"
