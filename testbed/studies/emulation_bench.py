"""``opus-testbed bench emulation``: how much model time the emulator makes per wall second.

Per cluster size (16, 32, 64 and 128 ranks: :data:`SIZES`' example files) one emulated run at
the time dilation ``auto`` picks (or the one asked), and from its summary: the factor, the
model and wall seconds of the run, the **model rank-seconds emulated per wall second**
(ranks x model seconds / wall seconds: what the machine delivers) and whether the run was
``ok``. A size's rate counts as "at fidelity ok" only when its run was ``ok``
(``rank_model_s_per_wall_s_ok``; None otherwise): a degraded run's model time is not the
datacenter's.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from testbed.errors import Say, say_stderr
from testbed.metrics.degraded import RESTS_ON, degraded_labels

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
#: Ranks -> the experiment file of that size.
SIZES: dict[int, Path] = {16: EXAMPLES / "demo.yaml", 32: EXAMPLES / "emulator-32.yaml",
                          64: EXAMPLES / "emulator-64.yaml", 128: EXAMPLES / "emulator-128.yaml"}


def size_row(ranks: int, summary: dict[str, Any]) -> dict[str, Any]:
    """One size's figures from its run's summary."""
    wall, model = summary.get("wall_s") or 0.0, summary.get("model_s") or 0.0
    rate = ranks * model / wall if wall > 0 else None
    ok = summary.get("fidelity") == "ok"
    return {"ranks": ranks, "time_dilation": summary.get("time_dilation"),
            "how": (summary.get("time_dilation_choice") or {}).get("how"),
            "wall_s": wall, "model_s": model, "iteration_time_s": summary.get(
                "iteration_time_s"),
            "rank_model_s_per_wall_s": rate,
            "rank_model_s_per_wall_s_ok": rate if ok else None,
            "fidelity": summary.get("fidelity"), "fidelity_reasons": summary.get(
                "fidelity_reasons"),
            "late_light_pct": (summary.get("dark_overrun_bound") or {}).get("iteration_pct"),
            "call_cost_pct": (summary.get("call_cost_bound") or {}).get("iteration_pct"),
            "calls_delivered": f"{summary.get('calls_delivered')}/{summary.get('calls')}"}


def run_emulation_bench(sizes: Sequence[int], *, time_dilation: float | str | None = None,
                        work_dir: Path | None = None, say: Say = say_stderr
                        ) -> dict[str, Any]:
    """Run the example of every size in ``sizes`` (at ``time_dilation``; None: its file's,
    ``auto`` by default) and report each (:func:`size_row`)."""
    from testbed.emulated.runner import run_emulated
    from testbed.experiment.config import load_experiment
    from testbed.experiment.prepare import prepare

    unknown = [n for n in sizes if n not in SIZES]
    if unknown:
        raise ValueError(f"no example of {unknown} ranks; sizes: {', '.join(map(str, SIZES))}")
    rows, summaries = [], []
    with tempfile.TemporaryDirectory(prefix="opus-bench-emulation-") as tmp:
        base = work_dir if work_dir is not None else Path(tmp)
        for ranks in sizes:
            cfg = load_experiment(SIZES[ranks])
            if time_dilation is not None:
                cfg = cfg.replace(time_dilation=time_dilation)
            say(f"bench emulation: {ranks} ranks ({SIZES[ranks].name})")
            summary = run_emulated(prepare(cfg), base / f"{ranks}-ranks", say)
            summaries.append((f"{ranks} ranks", summary))
            rows.append(size_row(ranks, summary))
    return {"benchmark": "emulation", "sizes": rows, RESTS_ON: degraded_labels(summaries)}
