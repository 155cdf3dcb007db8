"""The docs' pinned figures: check them, re-run their commands, re-pin them.

``docs/figures.yaml`` lists every deterministic figure the docs quote (sim backend, ``workload``,
``cost``, closed-form benches): the command that produces it, where in the command's output the
figure is (a JSON path or a regex), the format the docs print it in, and the pinned value. The
docs quote a figure between markers, ``<!--fig:ID-->+13.5 %<!--/fig-->`` (invisible on GitHub
and in the site), so a quoted figure and its pinned value cannot disagree silently.

    python scripts/figures.py             # re-run every command; exit 1 if a figure drifted
    python scripts/figures.py --static    # only: the docs quote the pinned values (no runs)
    python scripts/figures.py --update    # re-run, re-pin figures.yaml and rewrite the docs
    python scripts/figures.py --only ID,ID --list

Why a script and not only a test: after a model change (a new sim cost model, say) re-pinning is
one command, and ``git diff`` then shows every quoted figure that moved, for a reader to check
the prose around it.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import re
import resource
import shlex
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
LIST = ROOT / "docs" / "figures.yaml"
MARKER = re.compile(r"<!--fig:([A-Za-z0-9_.-]+)-->(.*?)<!--/fig-->")
#: a JSON path step: ``key``, ``key[3]`` or ``key[field=value,field=value]``
STEP = re.compile(r"([^.\[\]]+)?(?:\[([^\]]*)\])?")


@dataclass
class Command:
    """One listed command: its line, and the file under its ``{out}`` directory that holds its
    figures (``None``: its stdout)."""

    run: str
    output: str | None = None


@dataclass
class Figure:
    """One pinned figure of ``docs/figures.yaml``."""

    id: str
    command: str
    value: float
    fmt: str
    json_path: str | None = None
    regex: str | None = None
    tolerance: float = 0.0
    #: the output's value times this is the figure (1000: seconds printed as ms)
    scale: float = 1.0
    #: a second JSON path whose value is subtracted (a difference no output prints)
    minus: str | None = None

    def text(self, value: float | None = None) -> str:
        """The figure as the docs print it."""
        return self.fmt.format(self.value if value is None else value)

    def agrees(self, measured: float) -> bool:
        """Equal as the docs print it, or within the figure's tolerance."""
        if self.tolerance:
            return abs(measured - self.value) <= self.tolerance
        return self.text(measured) == self.text()


def load(path: Path = LIST) -> tuple[dict[str, Command], list[Figure]]:
    """The commands (name -> command line) and the figures of the list; a clear error on a bad
    entry."""
    data = yaml.safe_load(path.read_text())
    commands = {name: Command(run=spec["run"], output=spec.get("output"))
                for name, spec in data["commands"].items()}
    figures = []
    seen: set[str] = set()
    for entry in data["figures"]:
        fid = entry["id"]
        if fid in seen:
            raise ValueError(f"{path}: figure {fid!r} is listed twice")
        seen.add(fid)
        if entry["command"] not in commands:
            raise ValueError(f"{path}: figure {fid!r} names an unknown command "
                             f"{entry['command']!r} (known: {', '.join(commands)})")
        if ("json" in entry) == ("regex" in entry):
            raise ValueError(f"{path}: figure {fid!r} needs exactly one of json, regex")
        figures.append(Figure(id=fid, command=entry["command"], value=float(entry["value"]),
                              fmt=entry.get("format", "{}"), json_path=entry.get("json"),
                              regex=entry.get("regex"),
                              tolerance=float(entry.get("tolerance", 0.0)),
                              scale=float(entry.get("scale", 1.0)),
                              minus=entry.get("minus")))
    return commands, figures


def doc_files() -> list[Path]:
    """Where figures are quoted: the README and every page of the docs."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def quotes() -> list[tuple[Path, int, str, str]]:
    """Every marked figure in the docs: (file, line, id, quoted text)."""
    found = []
    for path in doc_files():
        fenced = False
        for lineno, line in enumerate(path.read_text().splitlines(), 1):
            if line.lstrip().startswith("```"):
                fenced = not fenced
            elif not fenced:  # a marker in code (a block or a `span`) is an example
                prose = re.sub(r"`[^`]*`", "", line)
                found += [(path, lineno, m.group(1), m.group(2)) for m in MARKER.finditer(prose)]
    return found


def static_problems(figures: list[Figure]) -> list[str]:
    """Quotes that name no figure or differ from its pinned value, and figures never quoted."""
    by_id = {f.id: f for f in figures}
    problems, quoted = [], set()
    for path in doc_files():  # Markdown takes a line that opens with a comment for raw HTML
        problems += [f"{path.relative_to(ROOT)}:{n}: a line may not start with a marker "
                     "(Markdown would end the paragraph there): move it off the line's start"
                     for n, line in enumerate(path.read_text().splitlines(), 1)
                     if line.startswith("<!--fig:")]
    for path, lineno, fid, text in quotes():
        where = f"{path.relative_to(ROOT)}:{lineno}"
        quoted.add(fid)
        if fid not in by_id:
            problems.append(f"{where}: quotes figure {fid!r}, which docs/figures.yaml lacks")
        elif text != by_id[fid].text():
            problems.append(f"{where}: quotes {fid} as {text!r}, pinned {by_id[fid].text()!r}")
    problems += [f"docs/figures.yaml: {f.id} is quoted nowhere (quote it or drop it)"
                 for f in figures if f.id not in quoted]
    return problems


def json_get(data: Any, path: str) -> Any:
    """``data`` at a path of ``key``, ``key[3]`` and ``key[field=value,...]`` steps (a filter
    must match exactly one element; values compare as numbers when both parse as numbers)."""
    here = data
    for raw in _split(path):
        m = STEP.fullmatch(raw)
        if not m:
            raise KeyError(f"bad path step {raw!r} in {path!r}")
        key, sel = m.groups()
        if key:
            if not isinstance(here, dict) or key not in here:
                raise KeyError(f"{path!r}: no key {key!r} (have {sorted(here)[:20]})"
                               if isinstance(here, dict) else f"{path!r}: {key!r} of a list")
            here = here[key]
        if sel is None:
            continue
        if sel.lstrip("-").isdigit():
            here = here[int(sel)]
            continue
        conds = [c.split("=", 1) for c in sel.split(",")]
        hits = [e for e in here if all(_same(e.get(k), v) for k, v in conds)]
        if len(hits) != 1:
            raise KeyError(f"{path!r}: [{sel}] matches {len(hits)} elements, not 1")
        here = hits[0]
    return here


def _split(path: str) -> list[str]:
    steps, depth, cur = [], 0, ""
    for ch in path:
        depth += ch == "["
        depth -= ch == "]"
        if ch == "." and depth == 0:
            steps.append(cur)
            cur = ""
        else:
            cur += ch
    return [*steps, cur]


def _same(have: Any, want: str) -> bool:
    if have is None:
        return want in ("null", "None")
    try:
        return math.isclose(float(have), float(want))
    except (TypeError, ValueError):
        return str(have) == want


def run_command(line: str, out_dir: Path) -> str:
    """Run one listed command from the repository root (``opus-testbed`` as this interpreter's
    ``python -m testbed.cli.main``, ``{out}`` a fresh directory); its stdout."""
    words = shlex.split(line.replace("{out}", str(out_dir)))
    if words[0] == "opus-testbed":
        words = [sys.executable, "-m", "testbed.cli.main", *words[1:]]
    res = subprocess.run(words, cwd=ROOT, capture_output=True, text=True, check=False,
                         env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin",
                              "MPLBACKEND": "Agg"})
    if res.returncode != 0:
        raise RuntimeError(f"{line}: exit {res.returncode}\n{res.stderr[-2000:]}")
    return res.stdout


def extract(fig: Figure, stdout: str) -> float:
    """The figure's value in its command's output."""
    if fig.json_path is not None:
        data = json.loads(stdout)
        value = float(json_get(data, fig.json_path))
        if fig.minus is not None:
            value -= float(json_get(data, fig.minus))
        return value * fig.scale
    assert fig.regex is not None
    m = re.search(fig.regex, stdout, re.M)
    if not m:
        raise KeyError(f"{fig.id}: /{fig.regex}/ matches nothing in the output")
    return float(m.group(1)) * fig.scale


def measure(commands: dict[str, Command], figures: Iterable[Figure], jobs: int = 2,
            log: Any = sys.stderr) -> tuple[dict[str, float], float]:
    """Run each command the figures need once, ``jobs`` at a time; (figure id -> measured
    value, CPU seconds of all the commands). A command's figures are read from its stdout, or
    from the file its ``output:`` names under its ``{out}`` directory."""
    figures = list(figures)
    names = list(dict.fromkeys(f.command for f in figures))
    before = _children_cpu_s()

    def one(name: str) -> str:
        with tempfile.TemporaryDirectory(prefix="figures-") as tmp:
            t0 = time.monotonic()
            command = commands[name]
            stdout = run_command(command.run, Path(tmp) / "out")
            print(f"{name}: {time.monotonic() - t0:.1f} s wall", file=log)
            return (Path(tmp, "out", command.output).read_text() if command.output
                    else stdout)

    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        outputs = dict(zip(names, pool.map(one, names), strict=True))
    cpu_s = _children_cpu_s() - before
    print(f"{len(names)} commands: {cpu_s:.1f} s CPU", file=log)
    return {f.id: extract(f, outputs[f.command]) for f in figures}, cpu_s


def _children_cpu_s() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def repin(figures: list[Figure], measured: dict[str, float], path: Path = LIST) -> list[str]:
    """Write the measured values into the list and the docs' quotes; the ids that moved."""
    moved = [f for f in figures if f.id in measured and not f.agrees(measured[f.id])]
    text = path.read_text()
    for f in moved:
        block = re.compile(rf"(- id: {re.escape(f.id)}\n(?:[ \t]+.*\n)*?[ \t]+value: )(\S+)")
        value = repr(measured[f.id])

        def pinned(m: re.Match[str], value: str = value) -> str:
            return m.group(1) + value

        text, n = block.subn(pinned, text, count=1)
        if n != 1:
            raise ValueError(f"{path}: cannot find the value line of {f.id}")
    if moved:
        text = re.sub(r"(?m)^pinned_on: .*$", f"pinned_on: {datetime.date.today().isoformat()}",
                      text, count=1)
    path.write_text(text)
    new = {f.id: f.text(measured[f.id] if f in moved else f.value) for f in figures}
    for doc in doc_files():
        old = doc.read_text()
        lines, fenced = [], False
        for line in old.split("\n"):
            if line.lstrip().startswith("```"):
                fenced = not fenced
            elif not fenced:
                line = MARKER.sub(lambda m: _quote(m, new), line)
            lines.append(line)
        if "\n".join(lines) != old:
            doc.write_text("\n".join(lines))
    return [f.id for f in moved]


def _quote(m: re.Match[str], texts: dict[str, str]) -> str:
    fid = m.group(1)
    return f"<!--fig:{fid}-->{texts[fid]}<!--/fig-->" if fid in texts else m.group(0)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--static", action="store_true",
                    help="only check that the docs quote the pinned values (runs nothing)")
    ap.add_argument("--update", action="store_true",
                    help="re-pin: write the measured values into docs/figures.yaml and the docs")
    ap.add_argument("--only", default="", help="comma-separated figure ids or command names")
    ap.add_argument("--list", action="store_true", help="list the figures and exit")
    ap.add_argument("--jobs", type=int, default=2, help="commands run at once (default: 2)")
    args = ap.parse_args(argv)
    commands, figures = load()
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {f.id for f in figures} - set(commands)
        if unknown:
            ap.error(f"--only: unknown {', '.join(sorted(unknown))}")
        figures = [f for f in figures if f.id in wanted or f.command in wanted]
    if args.list:
        for f in figures:
            print(f"{f.id:48} {f.text():>12}  {f.command}")
        return 0
    problems = static_problems(load()[1])
    for p in problems:
        print(p)
    if args.static:
        return 1 if problems else 0
    measured, _ = measure(commands, figures, jobs=args.jobs)
    if args.update:
        moved = repin(figures, measured)
        print(f"re-pinned {len(moved)} of {len(figures)} figures"
              + (": " + ", ".join(moved) if moved else ""))
        return 0
    drift = [f for f in figures if not f.agrees(measured[f.id])]
    for f in drift:
        print(f"DRIFT {f.id}: pinned {f.text()}, now {f.text(measured[f.id])} "
              f"({f.command}: {commands[f.command].run})")
    print(f"{len(figures) - len(drift)} of {len(figures)} figures as pinned"
          + ("; re-pin with: python scripts/figures.py --update" if drift else ""))
    return 1 if drift or problems else 0


if __name__ == "__main__":
    sys.exit(main())
