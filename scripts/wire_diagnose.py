"""Two diagnoses of a finished run's wire capture (docs/wire.md).

    python scripts/wire_diagnose.py edges RUN_DIR    # the dark edge
    python scripts/wire_diagnose.py order RUN_DIR    # capture stamps against file order

``edges``: for every port whose circuit a commanded switch removed, when the last frame crossed
the old circuit and when the port's first frame was dropped, against the OCS app's own edges of
the same switch (its ``dark`` record: the removal sent, ``t_applied_s`` its barrier reply,
``t_purged_s`` the purge's end), in ms after the removal was sent ("The dark edge").

``order``: records stamped more than 2 ms after the next record of the same pcap file (the
kernel writes each port's ring in order, so a stamp far ahead of its successor was misread or
taken late); with the file's resolution read from its header there are none ("Frames at a
non-peer: a misread clock").
"""

from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path
from typing import Any

from controller.stats import percentile
from testbed.metrics import wire as W


def _jsonl(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def edges(run: Path) -> None:
    events = _jsonl(run / "controller-events.jsonl")
    darks = [e for e in _jsonl(run / "emulator" / "ocs-events.jsonl")
             if e.get("event") == "dark" and "t_purged_s" in e]
    ports = W.read_port_map(json.loads((run / "wire" / "wire.json").read_text()))
    stamps = [float(e["t_s"]) for e in events if "t_s" in e]
    frames = [f for f in W.read_frames(run / "wire", ports) if min(stamps) <= f.t_s <= max(stamps)]
    crossings, dropped, _ = W.forwarding(frames)
    circuits, drops = W._by_circuit(crossings), W._by_port(dropped)
    rows: list[tuple[float, float, float, float]] = []
    for c in W.commanded_switches(events):
        for port in sorted(c.ports):
            old = next((x for x in c.removed if port in x), None)
            mine = [e for e in darks if int(e["rail"]) == c.rail and port in e["ports"]
                    and c.t_request_s - 1e-4 <= e["t_s"] <= c.t_request_s + 2.0]
            if old is None or not mine:
                continue
            d = min(mine, key=lambda e: e["t_s"])
            last = W._last_crossing(circuits.get((c.rail, old), []), d["t_purged_s"] + 0.05)
            first_drop = W._first_at_or_after(drops.get((c.rail, port), []), d["t_s"])
            if last is None or first_drop is None:
                continue
            t0 = d["t_s"]
            rows.append((1e3 * (last[0] - t0), 1e3 * (first_drop - t0),
                         1e3 * (d["t_applied_s"] - t0), 1e3 * (d["t_purged_s"] - t0)))
    if not rows:
        print("no switch with the app's edges (a run before t_applied_s was logged?)")
        return
    print(f"ms after the removal was sent, {len(rows)} (switch, port) pairs")
    names = ("last frame across the old circuit", "first frame dropped at the port",
             "the removal's barrier reply", "the purge's end")
    for i, name in enumerate(names):
        v = [r[i] for r in rows]
        print(f"  {name:34s} p50 {percentile(v, 50):+7.2f} p90 {percentile(v, 90):+7.2f} "
              f"p99 {percentile(v, 99):+7.2f} max {max(v):+7.2f}")
    print(f"old frames after the barrier reply: {sum(r[0] > r[2] for r in rows)}, "
          f"after the purge's end: {sum(r[0] > r[3] for r in rows)}")


def order(run: Path) -> None:
    from scapy.utils import RawPcapReader

    meta = json.loads((run / "wire" / "wire.json").read_text())
    for p in meta["ports"]:
        with RawPcapReader(str(run / "wire" / f"{p['intf']}.pcap")) as reader:
            nano = bool(getattr(reader, "nano", False))
            times = [W._stamp(m, nano) for _data, m in reader]
        ahead = [1e3 * (a - b) for a, b in itertools.pairwise(times) if a - b > 2e-3]
        worst = f", worst {max(ahead):.1f} ms" if ahead else ""
        print(f"{p['intf']}: {len(times)} records, {len(ahead)} stamped > 2 ms ahead of the "
              f"next{worst}")


if __name__ == "__main__":
    if len(sys.argv) != 3 or sys.argv[1] not in ("edges", "order"):
        sys.exit(__doc__)
    (edges if sys.argv[1] == "edges" else order)(Path(sys.argv[2]))
