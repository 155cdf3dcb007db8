"""The losses a torch job printed, and the proof that two runs computed the same ones (pure).

A script reports a loss as a JSON line ``{"step": N, "loss": X}`` on its standard output (the
rank's log); ``X`` is best ``float.hex`` (exact), a number is read as printed. The rails run
must give every (rank, step) loss of the loopback reference bit for bit: every byte of every
collective arrived, and in the same reduction order.
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

Losses = dict[int, dict[int, float]]  # rank -> step -> loss


def parse_loss(value: Any) -> float:
    """A loss as printed: ``float.hex`` text, a decimal string or a number."""
    if isinstance(value, str) and value.strip().lstrip("+-").lower().startswith("0x"):
        return float.fromhex(value)
    return float(value)


def losses_of_log(lines: Iterable[str]) -> dict[int, float]:
    """Step -> loss from one rank's log; lines that are not loss reports are skipped."""
    out: dict[int, float] = {}
    for line in lines:
        line = line.strip()
        if not line.startswith("{"):
            continue
        try:
            data = json.loads(line)
        except ValueError:
            continue
        if isinstance(data, dict) and "step" in data and "loss" in data:
            out[int(data["step"])] = parse_loss(data["loss"])
    return out


@dataclass
class LossComparison:
    """The reference's losses against a run's: the largest difference and what is missing."""

    max_abs_diff: float | None
    compared: int
    missing: list[str] = field(default_factory=list)
    rows: list[dict[str, Any]] = field(default_factory=list)

    @property
    def identical(self) -> bool:
        return self.compared > 0 and not self.missing and self.max_abs_diff == 0.0

    def problem(self) -> str | None:
        """Why the runs differ (None when every loss is bit-identical)."""
        if self.compared == 0 and not self.missing:
            return ('the script printed no losses (one JSON line {"step": N, "loss": X} per '
                    "step on some rank's standard output)")
        if self.missing:
            return "losses missing: " + ", ".join(self.missing[:6]) + (
                f" and {len(self.missing) - 6} more" if len(self.missing) > 6 else "")
        if self.max_abs_diff != 0.0:
            worst = max(self.rows, key=lambda r: r["abs_diff"])
            return (f"losses differ from the loopback reference by up to {self.max_abs_diff!r} "
                    f"(rank {worst['rank']} step {worst['step']}: {worst['reference_hex']} "
                    f"against {worst['run_hex']})")
        return None


def compare_losses(reference: Mapping[int, Mapping[int, float]],
                   run: Mapping[int, Mapping[int, float]]) -> LossComparison:
    """Compare every (rank, step) loss of ``reference`` with ``run``'s, bit for bit."""
    rows: list[dict[str, Any]] = []
    missing = [f"rank {rank} step {step} (the run)" for rank, steps in sorted(reference.items())
               for step in sorted(steps) if step not in run.get(rank, {})]
    missing += [f"rank {rank} step {step} (the reference)" for rank, steps in sorted(run.items())
                for step in sorted(steps) if step not in reference.get(rank, {})]
    for rank, steps in sorted(reference.items()):
        for step, ref in sorted(steps.items()):
            if step not in run.get(rank, {}):
                continue
            got = run[rank][step]
            diff = 0.0 if ref.hex() == got.hex() else abs(got - ref)
            if math.isnan(diff):
                diff = math.inf
            elif ref.hex() != got.hex() and diff == 0.0:  # 0.0 against -0.0: still not the same
                diff = math.ulp(0.0)
            rows.append({"rank": rank, "step": step, "reference": ref, "run": got,
                         "abs_diff": diff, "reference_hex": ref.hex(), "run_hex": got.hex()})
    worst = max((r["abs_diff"] for r in rows), default=None)
    return LossComparison(worst, len(rows), missing, rows)
