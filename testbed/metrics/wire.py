"""What the wire saw: each switch's dark period and the one-to-one rule, from the capture alone.

The capture (:mod:`emulator.wirecap`) holds, for every port of every OCS rail, the heads of the
frames that entered the switch there (their source is the port's own NIC) and of those that
left it there (any other source), with kernel timestamps. Nothing here reads the OCS app's
record: the analysis takes the pcap files, the port map (``wire.json``), and from the
controller's event log only what was *commanded* (which circuits each switch removed and added,
when the controller asked and when it was told the switch ended). The app's record is read only
to say how far it agrees with the wire (:func:`agreement`).

* **Forwarding**: a frame that entered at port ``p`` and left at port ``q`` (the same head
  bytes) crossed the circuit ``{p, q}`` when it entered: the switch forwards a frame as it
  arrives, and the time to its exit is the exit port's shaped queue, which in a datacenter is
  the NIC's and the fibre's, past the OCS. A frame that entered and never left was dropped (a
  dark or unconnected port). Every time below is a time of entry.
* **Dark period of a switch on the wire**: for a port whose circuit to ``old`` was removed and
  to ``new`` added by one switch, the dark period began between the last frame across
  ``{p, old}`` and the first frame of ``p`` that was dropped after it, and ended between the
  last dropped frame of ``p`` and the first frame across ``{p, new}``. Its estimate is the gap
  between the two brackets' midpoints. ``upper`` holds however late the switch read its
  ports: it forwarded a frame between its entry and its exit, so the dark period is at most
  the first new frame's exit minus the last old frame's entry. ``lower``, the time between
  the first and the last dropped frame, holds when the switch read those two as promptly as
  each other (a busy switch may not). The probe streams keep every port busy, so on a quiet
  machine the brackets are about one probe interval wide. Of a switch's ports, the one with
  the narrowest brackets gives the switch's figure.
* **Early light**: a switch is early on the wire when even ``upper`` is shorter than the
  shortest configured delay (less the clock's slack of :func:`testbed.metrics.darktime
  .early_slack_ms`), or when a new circuit carried a frame sooner than that after the
  controller asked for the switch (which precedes the switch going dark): both are certain,
  since they take each frame's exit (the latest the switch can have forwarded it) for the new
  circuit and its entry (the earliest) for the old one.
* **Non-peer frames**: a frame crossing ``{p, q}`` at a time no commanded configuration
  allowed it (from the controller's request to add it to its being told the removal ended).
* **Lost frames**: IPv4 frames dropped at a port outside every switch that touched the port
  (from the request to the confirmation): the ranks send only on lit circuits.

A port that changes hands (a spare taking a rank over: its NIC takes the rank's address) is
followed through the runner's ``spare_assigned`` events (:func:`port_macs`); a port whose link
a fault cut (the runner's ``fault`` events, :func:`cut_ports`) gives no dark period while cut.
Circuits installed outside the controller's log (the static plane's, :func:`standing_circuits`)
are judged by the non-peer and lost-frame rules only.

Times are the wall clock (the kernel's capture stamps and the controller's ``time.time()``).
"""

from __future__ import annotations

import bisect
import json
from collections import defaultdict, deque
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from testbed.metrics.darktime import ErrorStats, ExpectedDelay, Interval, Switch, early_slack_ms

Record = Mapping[str, Any]
PROBE_ETHERTYPE = 0x88B5
IPV4_ETHERTYPE = 0x0800
#: How far the app's dark period may fall outside the wire's bounds before it disagrees (ms):
#: the app stamps its light when the switch's barrier reply reaches it, up to a round trip
#: (0.2-0.5 ms, ``bench counters``) after the circuit carried light.
AGREEMENT_SLACK_MS = 1.0


@dataclass(frozen=True)
class PortMap:
    """One captured port: its rail and OpenFlow number, and its NIC's address (bytes) when the
    capture started."""

    rail: int
    port: int
    intf: str
    mac: bytes
    host: int = -1  # the rank or spare host behind it (-1: a shadow port's far end)


@dataclass(frozen=True)
class Frame:
    """One captured frame head at a port: when, and whether it entered or left the switch."""

    t_s: float
    rail: int
    port: int
    entered: bool
    head: bytes
    #: its source is the port's own address, but another port answers to it too (a spare that
    #: took a rank over, and the failed host it replaced): :func:`forwarding` decides
    shared: bool = False

    @property
    def ethertype(self) -> int:
        return int.from_bytes(self.head[12:14], "big") if len(self.head) >= 14 else 0


@dataclass(frozen=True)
class Crossing:
    """A frame that crossed circuit ``{src, dst}`` of ``rail``: ``t_s`` when it entered the
    switch (the circuit carried it then), ``t_exit_s`` when it left (later by the shaped link's
    queue at the exit port, which lies past the switch: up to tens of ms on a busy port)."""

    t_s: float
    rail: int
    src: int
    dst: int
    t_exit_s: float


@dataclass(frozen=True)
class Commanded:
    """One switch the controller commanded: what it removed and added, and when it asked
    (``t_request_s``) and was told the switch ended (``t_end_s``; None: never told)."""

    rail: int
    t_request_s: float
    t_end_s: float | None
    removed: frozenset[frozenset[int]]
    added: frozenset[frozenset[int]]

    @property
    def ports(self) -> set[int]:
        return {p for c in self.removed | self.added for p in c}


@dataclass(frozen=True)
class WireSwitch:
    """A commanded switch as the wire saw it (times in s; None where unseen)."""

    rail: int
    t_request_s: float
    port: int | None = None  # the port whose brackets give the figure
    dark_lower_s: float | None = None  # dark for certain
    dark_upper_s: float | None = None  # at least the dark period
    t_dark_s: float | None = None  # estimated start
    t_light_s: float | None = None  # estimated light
    first_light_after_request_s: float | None = None  # earliest new-circuit frame - request

    @property
    def measured(self) -> bool:
        """The wire saw both ends of its dark period."""
        return self.t_dark_s is not None and self.t_light_s is not None

    @property
    def observed(self) -> bool:
        """The wire saw its dark period, or at least its first light (a port that was not
        lit before: only early light can be judged)."""
        return self.measured or self.first_light_after_request_s is not None

    def as_switch(self, low_ms: float, high_ms: float) -> Switch | None:
        """The estimate as a :class:`~testbed.metrics.darktime.Switch` (for the late-light
        bound), or None when the wire did not see both ends."""
        if self.t_dark_s is None or self.t_light_s is None:
            return None
        return Switch(self.rail, self.t_dark_s, self.t_light_s, low_ms, high_ms)


def read_port_map(wire_json: Mapping[str, Any]) -> list[PortMap]:
    return [PortMap(int(p["rail"]), int(p["port"]), str(p["intf"]),
                    bytes.fromhex(str(p["mac"]).replace(":", "")), int(p.get("host", -1)))
            for p in wire_json["ports"]]


#: (rail, port) -> [(from t_s, the NIC address the port's host takes on then)], in time order
MacTimeline = dict[tuple[int, int], list[tuple[float, bytes]]]


def port_macs(ports: Sequence[PortMap], controller_events: Iterable[Record]) -> MacTimeline:
    """Who holds each port over the run, as the addresses its NIC answers to: its own from
    the start, and, when a spare takes a rank over (the runner's ``spare_assigned`` events:
    the takeover is the runner's decision, not the OCS app's), the rank's. The spare's port
    ``k`` takes the address port ``k`` of the host it replaces held then, from when the
    identity moved (``identity_t_s``: just before the event) on. A spare keeps its own address
    as well: its probe frames were set up with it."""
    timeline: MacTimeline = {(p.rail, p.port): [(float("-inf"), p.mac)] for p in ports}
    takeovers = sorted((e for e in controller_events if e.get("event") == "spare_assigned"),
                       key=lambda e: float(e.get("identity_t_s", e["t_s"])))
    for e in takeovers:
        rail, t_s = int(e["rail"]), float(e.get("identity_t_s", e["t_s"]))
        for old, new in zip(e.get("old_ports") or (), e.get("new_ports") or (), strict=False):
            held = timeline.get((rail, int(old)))
            if held is None or (rail, int(new)) not in timeline:
                continue
            timeline[(rail, int(new))].append((t_s, held[-1][1]))
    return timeline


def own_macs(timeline: Sequence[tuple[float, bytes]], t_s: float) -> set[bytes]:
    """The addresses a port's NIC has answered to up to ``t_s``: a frame from one entered the
    switch at that port."""
    return {mac for t0, mac in timeline if t0 <= t_s}


def shared_macs(timeline: MacTimeline) -> dict[bytes, float]:
    """Addresses two ports answer to, and from when (a spare that took a rank over answers as
    the rank, and so does the failed host's NIC until its links are cut)."""
    held: dict[bytes, list[float]] = defaultdict(list)
    for changes in timeline.values():
        firsts: dict[bytes, float] = {}
        for t0, mac in changes:
            firsts.setdefault(mac, t0)
        for mac, t0 in firsts.items():
            held[mac].append(t0)
    return {mac: sorted(ts)[1] for mac, ts in held.items() if len(ts) > 1}


#: Injected faults that take a port's link down (the runner's ``fault`` events): frames sent
#: to such a port cross the switch but are never seen leaving it, so they look dropped
CUT_FAULTS = ("link_down", "nic_down", "port_failed")


def cut_ports(ports: Sequence[PortMap], controller_events: Iterable[Record]
              ) -> dict[tuple[int, int], list[Interval]]:
    """When an injected fault had each port's link down, from the runner's own records: from
    the ``fault`` event (a rank's ports, followed across ``spare_assigned``, or the failed
    OCS port) to the ``ranks_resumed`` that restarts the job on the same hosts (links up
    again), or to the end of the run once a spare took the rank over."""
    held: dict[int, list[tuple[int, int]]] = defaultdict(list)
    for pm in ports:
        if pm.host >= 0:
            held[pm.host].append((pm.rail, pm.port))  # a rank's host number is the rank's
    down: dict[tuple[int, int], float] = {}
    out: dict[tuple[int, int], list[Interval]] = defaultdict(list)
    for e in sorted((e for e in controller_events if "t_s" in e), key=lambda e: float(e["t_s"])):
        t_s, event = float(e["t_s"]), e.get("event")
        if event == "spare_assigned":
            held[int(e["rank"])] = [(int(e["rail"]), int(q)) for q in e.get("new_ports") or ()]
        elif event == "fault" and e.get("kind") in CUT_FAULTS:
            keys = ([(int(e["rail"]), int(e["port"]))] if e.get("kind") == "port_failed"
                    else held.get(int(e["rank"]), []) if e.get("rank") is not None else [])
            for key in keys:
                down.setdefault(key, t_s)
        elif event == "ranks_resumed" and e.get("policy") != "spares":
            for key, t0 in down.items():
                out[key].append((t0, t_s))
            down.clear()
    for key, t0 in down.items():
        out[key].append((t0, float("inf")))
    return out


def read_frames(capture_dir: Path, ports: Sequence[PortMap],
                timeline: MacTimeline | None = None) -> list[Frame]:
    """Every frame of every port's pcap file (scapy's reader), tagged entered/left by its
    source address (the port's own, or across a takeover, ``timeline``'s), in time order."""
    from scapy.utils import RawPcapReader

    frames: list[Frame] = []
    shared = shared_macs(timeline or {})
    for pm in ports:
        path = capture_dir / f"{pm.intf}.pcap"
        if not path.exists() or path.stat().st_size <= 24:
            continue
        held = (timeline or {}).get((pm.rail, pm.port), [])
        moved = len(held) > 1
        with RawPcapReader(str(path)) as reader:
            nano = bool(getattr(reader, "nano", False))
            for data, meta in reader:
                t_s = _stamp(meta, nano)
                src = bytes(data[6:12])
                entered = src in own_macs(held, t_s) if moved else src == pm.mac
                t_shared = shared.get(src) if entered else None
                frames.append(Frame(t_s, pm.rail, pm.port, entered, bytes(data),
                                    t_shared is not None and t_s >= t_shared))
    frames.sort(key=lambda f: f.t_s)
    return frames


def _stamp(meta: Any, nano: bool) -> float:
    """A pcap record's time (s). A classic pcap file says its resolution once, in its header's
    magic number (``nano``: nanoseconds); the record's fraction field alone cannot tell, since
    a nanosecond fraction below 10^6 (a frame in the first millisecond of a second) looks like
    microseconds. Guessing from the value once put those frames up to a second late: the
    "frames at a non-peer" of ``docs/wire.md``."""
    if hasattr(meta, "tshigh"):  # pcapng: each block gives its interface's resolution
        return float(((meta.tshigh << 32) | meta.tslow) / meta.tsresol)
    return float(meta.sec) + float(meta.usec) / (1e9 if nano else 1e6)


def forwarding(frames: Iterable[Frame]) -> tuple[list[Crossing], list[Frame], int]:
    """(crossings, dropped frames, frames that left without having entered) of a capture.

    A frame that left at ``q`` is matched to the earliest unmatched frame with the same head
    that entered the same rail before it. A frame from an address two ports answer to
    (:attr:`Frame.shared`) entered where it was first seen: seen again at another port, with
    the same head, it left there (no two senders' frames share a head).
    """
    pending: dict[tuple[int, bytes], deque[Frame]] = defaultdict(deque)
    matched: set[int] = set()
    exits: set[int] = set()
    crossings: list[Crossing] = []
    unmatched_exits = 0
    ordered = sorted(frames, key=lambda f: (f.t_s, not f.entered))
    for f in ordered:
        key = (f.rail, f.head)
        queue = pending.get(key)
        if f.entered and not (f.shared and queue and any(x.port != f.port for x in queue)):
            pending[key].append(f)
            continue
        if not queue:
            unmatched_exits += 1
            continue
        src = (queue.popleft() if not f.shared else
               next(x for x in queue if x.port != f.port))
        if f.shared:
            queue.remove(src)
            exits.add(id(f))
        matched.add(id(src))
        crossings.append(Crossing(src.t_s, f.rail, src.port, f.port, f.t_s))
    dropped = [f for f in ordered if f.entered and id(f) not in matched and id(f) not in exits]
    return crossings, dropped, unmatched_exits


def commanded_switches(controller_events: Iterable[Record]) -> list[Commanded]:
    """The switches the controller commanded (``reconfig_start``, matched to its
    ``reconfig_end`` by decision and rail), in request order."""
    ends: dict[tuple[Any, int], float] = {}
    starts: list[Record] = []
    for e in controller_events:
        if e.get("event") == "reconfig_end":
            ends[(e.get("decision"), int(e["rail"]))] = float(e["t_s"])
        elif e.get("event") == "reconfig_start" and (e.get("add") or e.get("remove")):
            starts.append(e)
    return [Commanded(int(e["rail"]), float(e["t_s"]), ends.get((e.get("decision"),
                                                                 int(e["rail"]))),
                      frozenset(frozenset(int(p) for p in c) for c in e.get("remove") or ()),
                      frozenset(frozenset(int(p) for p in c) for c in e.get("add") or ()))
            for e in starts]


def allowed_intervals(commanded: Sequence[Commanded]
                      ) -> dict[tuple[int, frozenset[int]], list[Interval]]:
    """When each circuit may carry light: from the request that adds it to the confirmation of
    the switch that removes it (open-ended if never removed)."""
    opened: dict[tuple[int, frozenset[int]], float] = {}
    out: dict[tuple[int, frozenset[int]], list[Interval]] = defaultdict(list)
    for c in sorted(commanded, key=lambda c: c.t_request_s):
        for circuit in c.removed:
            key = (c.rail, circuit)
            start = opened.pop(key, None)
            if start is not None:
                out[key].append((start, c.t_end_s if c.t_end_s is not None else float("inf")))
        for circuit in c.added:
            opened.setdefault((c.rail, circuit), c.t_request_s)
    for key, start in opened.items():
        out[key].append((start, float("inf")))
    return out


def non_peer(crossings: Iterable[Crossing], commanded: Sequence[Commanded]) -> list[Crossing]:
    """Crossings of a circuit at a moment no commanded configuration allowed it. The switch
    forwarded a frame somewhere between its entry and its exit (a busy switch reads its ports
    late, and the exit port's queue holds it after), so a crossing is allowed when an
    allowed interval of its circuit meets that span."""
    allowed = allowed_intervals(commanded)
    return [x for x in crossings
            if not any(a <= x.t_exit_s and x.t_s <= b for a, b in allowed.get(
                (x.rail, frozenset((x.src, x.dst))), ()))]


def _by_circuit(crossings: Iterable[Crossing]
                ) -> dict[tuple[int, frozenset[int]], list[tuple[float, float]]]:
    """(entry, exit) of every crossing, per circuit, in entry order."""
    out: dict[tuple[int, frozenset[int]], list[tuple[float, float]]] = defaultdict(list)
    for x in crossings:
        out[(x.rail, frozenset((x.src, x.dst)))].append((x.t_s, x.t_exit_s))
    for times in out.values():
        times.sort()
    return out


def _first_crossing(spans: Sequence[tuple[float, float]], t: float) -> tuple[float, float] | None:
    k = bisect.bisect_left(spans, (t, float("-inf")))
    return spans[k] if k < len(spans) else None


def _last_crossing(spans: Sequence[tuple[float, float]], t: float) -> tuple[float, float] | None:
    k = bisect.bisect_left(spans, (t, float("-inf")))
    return spans[k - 1] if k else None


def _by_port(frames: Iterable[Frame]) -> dict[tuple[int, int], list[float]]:
    out: dict[tuple[int, int], list[float]] = defaultdict(list)
    for f in frames:
        out[(f.rail, f.port)].append(f.t_s)
    for times in out.values():
        times.sort()
    return out


def _first_at_or_after(times: Sequence[float], t: float) -> float | None:
    k = bisect.bisect_left(times, t)
    return times[k] if k < len(times) else None


def _last_before(times: Sequence[float], t: float) -> float | None:
    k = bisect.bisect_left(times, t)
    return times[k - 1] if k else None


def wire_switches(crossings: Sequence[Crossing], dropped: Sequence[Frame],
                  commanded: Sequence[Commanded],
                  cut: Mapping[tuple[int, int], Sequence[Interval]] | None = None
                  ) -> list[WireSwitch]:
    """Every commanded switch as the wire saw it (see the module docstring). A port is not
    used for the dark period when either end of its old circuit had its link cut by a fault
    (``cut``: :func:`cut_ports`) between its last old frame and its first new one: its frames
    then look dropped for as long as the link was down, not as the switch was dark."""
    circuits = _by_circuit(crossings)
    drops = _by_port(dropped)
    out = []
    for c in commanded:
        first_new = [x for circuit in c.added
                     if (x := _first_crossing(circuits.get((c.rail, circuit), []),
                                              c.t_request_s)) is not None]
        best: tuple[float, int, float, float, float, float] | None = None
        for port in sorted(c.ports):
            old = next((cc for cc in c.removed if port in cc), None)
            new = next((cc for cc in c.added if port in cc), None)
            if old is None or new is None:
                continue
            x_new = _first_crossing(circuits.get((c.rail, new), []), c.t_request_s)
            if x_new is None:
                continue
            x_old = _last_crossing(circuits.get((c.rail, old), []), x_new[0])
            if x_old is None:
                continue
            t_old, t_new = x_old[0], x_new[0]
            if any(a <= t_new and t_old <= b for q in old
                   for a, b in (cut or {}).get((c.rail, q), ())):
                continue
            port_drops = drops.get((c.rail, port), [])
            d_first = _first_at_or_after(port_drops, t_old)
            d_last = _last_before(port_drops, t_new)
            if d_first is None or d_first > t_new or d_last is None or d_last < t_old:
                d_first, d_last = t_new, t_old  # no drop seen between: the brackets meet
            width = (d_first - t_old) + (t_new - d_last)
            if best is None or width < best[0]:
                # upper: the switch forwarded each frame between its entry and its exit, so
                # its last old and first new decisions lie at most new exit - old entry apart;
                # lower: dark between the first and last dropped frame (if the switch read
                # them as late as each other)
                best = (width, port, max(0.0, d_last - d_first), x_new[1] - t_old,
                        (t_old + d_first) / 2, (d_last + t_new) / 2)
        light_after = (min(x[1] for x in first_new) - c.t_request_s) if first_new else None
        if best is None:
            out.append(WireSwitch(c.rail, c.t_request_s, first_light_after_request_s=light_after))
        else:
            _w, port, lower, upper, t_dark, t_light = best
            out.append(WireSwitch(c.rail, c.t_request_s, port, lower, upper, t_dark, t_light,
                                  light_after))
    return out


def lost_frames(dropped: Iterable[Frame], commanded: Sequence[Commanded],
                t_end_s: float | None = None) -> list[Frame]:
    """IPv4 frames dropped at a port outside every switch that touched it (request to
    confirmation; an unconfirmed switch to ``t_end_s``)."""
    windows: dict[tuple[int, int], list[Interval]] = defaultdict(list)
    for c in commanded:
        end = c.t_end_s if c.t_end_s is not None else (t_end_s or float("inf"))
        for port in c.ports:
            windows[(c.rail, port)].append((c.t_request_s, end))
    return [f for f in dropped if f.ethertype == IPV4_ETHERTYPE
            and not any(a <= f.t_s <= b for a, b in windows.get((f.rail, f.port), ()))]


@dataclass(frozen=True)
class WireCheck:
    """A run's switching judged from the capture: see the module docstring."""

    expected: ExpectedDelay
    switches: tuple[WireSwitch, ...] = ()
    non_peer: tuple[Crossing, ...] = ()
    lost: int = 0
    frames: int = 0
    unmatched_exits: int = 0
    kernel_drops: int = 0
    probe_interval_ms: float | None = None
    scale: float = 1.0  # configured delay x scale = the delay on the wire (time dilation)
    problems: tuple[str, ...] = ()  # the capture's own (a failed tcpdump): the check is unrated
    #: switches the controller commanded on every rail, captured or not (None: ``switches``)
    commanded: int | None = None
    ports: int = 0  # ports captured
    ports_seen: int = 0  # of which carried a frame during the run
    standing: int = 0  # circuits installed outside the controller's log (the static plane)
    takeovers: int = 0  # ports whose NIC took on another host's address (a spare)
    #: the probe sender's frames: "sent", and "skipped" on ports that carried data meanwhile
    probe_frames: Mapping[str, int] = field(default_factory=dict)

    def _range_ms(self, rail: int) -> Interval:
        low, high = self.expected.range_ms(rail)
        return low * self.scale, high * self.scale

    def as_switches(self) -> list[Switch]:
        """The measured switches as :class:`Switch` (their estimates), for the late-light
        bound computed from the wire."""
        return [s for w in self.switches if (s := w.as_switch(*self._range_ms(w.rail)))]

    def early(self) -> list[WireSwitch]:
        """Switches whose light came, for certain, before the configured delay had passed."""
        out = []
        for w in self.switches:
            low, _high = self._range_ms(w.rail)
            limit_s = (low - early_slack_ms(low)) / 1e3
            if (w.dark_upper_s is not None and w.dark_upper_s < limit_s) or (
                    w.first_light_after_request_s is not None
                    and w.first_light_after_request_s < limit_s):
                out.append(w)
        return out

    def errors_ms(self) -> list[float]:
        return [s.error_ms for s in self.as_switches()]

    def run_faults(self) -> list[str]:
        """Early light on the wire: the run's fault, whatever the machine's load (a switch
        that forwards on a new circuit sooner than the delay after its request is no OCS)."""
        early = self.early()
        if not early:
            return []
        w = early[0]
        seen = (f"dark at most {1e3 * w.dark_upper_s:.2f} ms" if w.dark_upper_s is not None
                else f"light {1e3 * (w.first_light_after_request_s or 0.0):.2f} ms after "
                "the request")
        scaled = f" x {self.scale:g}" if self.scale != 1 else ""
        return [f"the wire saw {len(early)} of {len(self.switches)} switches light early: "
                f"{seen} on rail {w.rail} against the configured {self.expected.text()}"
                f"{scaled}"]

    def timing_faults(self) -> list[str]:
        """Frames at a non-peer: the run's fault on a quiet machine; a busy one shares the
        blame, as for an overrun (:func:`testbed.metrics.fidelity.overrun_reason`): a switch
        that reads its ports late forwards a frame long after its entry. (Every one seen
        before 2026-12-07 was a misread capture time, :func:`_stamp`, not a crossing.)"""
        if not self.non_peer:
            return []
        x = self.non_peer[0]
        return [f"the wire saw {len(self.non_peer)} frames cross a circuit the controller had "
                f"not commanded: first rail {x.rail} port {x.src} -> {x.dst}, held "
                f"{1e3 * (x.t_exit_s - x.t_s):.1f} ms by the switch"]

    def to_summary(self) -> dict[str, Any]:
        measured = [w for w in self.switches if w.measured]
        return {"switches": len(self.switches), "measured": len(measured),
                "observed": sum(1 for w in self.switches if w.observed),
                "commanded": len(self.switches) if self.commanded is None else self.commanded,
                "error_ms": ErrorStats.of(self.errors_ms()).to_summary(),
                "early": len(self.early()), "non_peer_frames": len(self.non_peer),
                "lost_frames": self.lost, "frames": self.frames,
                "unmatched_exits": self.unmatched_exits, "kernel_drops": self.kernel_drops,
                "probe_interval_ms": self.probe_interval_ms, "scale": self.scale,
                "ports": self.ports, "ports_seen": self.ports_seen,
                "standing_circuits": self.standing, "ports_taken_over": self.takeovers,
                "probe_frames": dict(self.probe_frames),
                "resolution_ms": ErrorStats.of(
                    1e3 * ((w.dark_upper_s or 0.0) - (w.dark_lower_s or 0.0)) / 2
                    for w in measured).to_summary(),
                "problems": list(self.problems)}


def standing_circuits(record: Mapping[str, Any]) -> list[Commanded]:
    """Circuits installed outside the controller's log and never switched (the static plane's,
    ``plane-circuits.json`` written by the runner: when it asked, when the driver returned,
    and each rail's circuits), as commanded additions: the non-peer and lost-frame rules
    judge against them, and no dark period is timed (a dark port lit once has none)."""
    t_request, t_end = float(record["t_request_s"]), record.get("t_end_s")
    return [Commanded(int(r["rail"]), t_request, None if t_end is None else float(t_end),
                      frozenset(), frozenset(frozenset(int(p) for p in c)
                                             for c in r["circuits"]))
            for r in record["rails"]]


def check_wire(capture_dir: Path, controller_events: Sequence[Record],
               expected: ExpectedDelay, *, scale: float = 1.0,
               standing: Sequence[Commanded] = ()) -> WireCheck:
    """Read a run's capture (``capture_dir`` with ``wire.json`` and the pcap files) and judge
    the commanded switches on it; ``standing``: circuits installed outside the controller's
    log (:func:`standing_circuits`), which only the one-to-one and lost-frame rules judge.
    Ports that change hands (a spare taking a rank over) are followed through the run's
    ``spare_assigned`` events (:func:`port_macs`)."""
    meta = json.loads((capture_dir / "wire.json").read_text())
    ports = read_port_map(meta)
    # the run's span: its controller's log (and a standing install, which precedes the ranks);
    # the capture also holds the set-up and teardown
    stamps = [float(e["t_s"]) for e in controller_events if "t_s" in e]
    stamps += [t for c in standing for t in (c.t_request_s, c.t_end_s) if t is not None]
    timeline = port_macs(ports, controller_events)
    frames = [f for f in read_frames(capture_dir, ports, timeline)
              if stamps and min(stamps) <= f.t_s <= max(stamps)]
    crossings, dropped, unmatched = forwarding(frames)
    commanded = commanded_switches(controller_events)
    total = len(commanded)
    rails = {p.rail for p in ports}
    commanded = [c for c in commanded if c.rail in rails]
    allowed = commanded + [c for c in standing if c.rail in rails]
    t_end = max((f.t_s for f in frames), default=None)
    problems = [str(e) for e in meta.get("errors", [])]
    drops = sum(int(v) for v in meta.get("kernel_drops", {}).values())
    if drops:
        problems.append(f"the capture lost {drops} frames in the kernel")
    cut = cut_ports(ports, controller_events)
    return WireCheck(expected, tuple(wire_switches(crossings, dropped, commanded, cut)),
                     tuple(non_peer(crossings, allowed)),
                     len(lost_frames(dropped, allowed, t_end)), len(frames), unmatched, drops,
                     meta.get("probe_interval_ms"), scale, tuple(problems), total,
                     ports=len(ports), ports_seen=len({(f.rail, f.port) for f in frames}),
                     standing=sum(len(c.added) for c in standing),
                     takeovers=sum(len(v) - 1 for v in timeline.values()),
                     probe_frames={k: int(v) for k, v in
                                   (meta.get("probe_frames") or {}).items()})


@dataclass(frozen=True)
class Agreement:
    """How far the OCS app's own dark periods agree with the wire's (ms: app - wire)."""

    differences_ms: tuple[float, ...] = ()
    #: app dark periods longer than the wire's upper bound: reported, not judged (the app
    #: stamps its light when the switch's confirmation reaches it, which a busy machine
    #: delays; an app that lights early and says otherwise is early light on the wire)
    longer: tuple[str, ...] = ()
    shorter: tuple[str, ...] = ()  # app dark periods shorter than the wire saw dark

    @property
    def outside(self) -> int:
        """App dark periods outside the wire's bounds by more than the slack."""
        return len(self.longer) + len(self.shorter)

    def to_summary(self) -> dict[str, Any]:
        return {**ErrorStats.of(self.differences_ms).to_summary(), "outside": self.outside,
                "longer_than_wire": len(self.longer), "shorter_than_wire": len(self.shorter),
                "slack_ms": AGREEMENT_SLACK_MS}

    def _text(self, examples: Sequence[str], how: str) -> str:
        return (f"the OCS app's record disagrees with the wire on {len(examples)} of "
                f"{len(self.differences_ms)} switches ({how}, beyond {AGREEMENT_SLACK_MS:g} "
                "ms): " + "; ".join(examples[:2]))

    def timing_fault(self) -> str | None:
        """The app recorded a dark period shorter than the wire's lower bound: the run's
        fault on a quiet machine, while a busy switch can read its ports late."""
        return self._text(self.shorter, "it recorded shorter dark periods than the wire "
                          "saw dark") if self.shorter else None


def agreement(wire: WireCheck, ocs_events: Iterable[Record]) -> Agreement:
    """Match each measured wire switch to the app's ``light`` record of the same rail whose
    ``t_dark_s`` is nearest the wire's estimated start, and compare. The estimate is a
    bracket's midpoint, so it can precede the app's stamp by up to half a probe interval or
    more: the latest record before it would then be the rail's previous switch."""
    lights: dict[int, list[tuple[float, float]]] = defaultdict(list)
    for e in ocs_events:
        if e.get("event") == "light":
            lights[int(e["rail"])].append((float(e["t_dark_s"]), float(e["t_light_s"])))
    for v in lights.values():
        v.sort()
    diffs, longer, shorter = [], [], []
    for w in wire.switches:
        if not w.measured or w.t_dark_s is None:
            continue
        cands = lights.get(w.rail, [])
        k = bisect.bisect_right(cands, (w.t_dark_s, float("inf")))
        near = cands[max(0, k - 1):k + 1]
        if not near:
            continue
        t_dark_s = w.t_dark_s
        t_dark, t_light = min(near, key=lambda c: abs(c[0] - t_dark_s))
        app_s = t_light - t_dark
        wire_s = (w.t_light_s or 0.0) - w.t_dark_s
        diffs.append(1e3 * (app_s - wire_s))
        lower, upper = w.dark_lower_s or 0.0, w.dark_upper_s or 0.0
        slack = AGREEMENT_SLACK_MS / 1e3
        text = (f"rail {w.rail}: app {1e3 * app_s:.2f} ms, wire {1e3 * lower:.2f}-"
                f"{1e3 * upper:.2f} ms")
        if app_s > upper + slack:
            longer.append(text)
        elif app_s < lower - slack:
            shorter.append(text)
    return Agreement(tuple(diffs), tuple(longer), tuple(shorter))


@dataclass(frozen=True)
class WireVerdict:
    """A run's wire check and the app's agreement with it: what the verdict and the summary
    take from the capture."""

    check: WireCheck
    agreement: Agreement

    def run_faults(self) -> list[str]:
        """Early light on the wire: the run's fault, whatever the load."""
        return self.check.run_faults()

    def timing_faults(self) -> list[str]:
        """Frames at a non-peer and an app record shorter than the wire saw dark: blamed like
        a dark overrun (on the machine when its CPU was busy)."""
        fault = self.agreement.timing_fault()
        return self.check.timing_faults() + ([fault] if fault else [])

    def bound_switches(self, app: Sequence[Switch]) -> list[Switch]:
        """The switches the late-light bound is computed from: the wire's where it measured
        them, the app's record for the others (an app switch is the wire's when a measured
        wire switch of its rail began inside its dark period)."""
        wire = self.check.as_switches()
        starts: dict[int, list[float]] = defaultdict(list)
        for s in wire:
            starts[s.rail].append(s.t_dark_s)
        for v in starts.values():
            v.sort()
        others = [s for s in app
                  if (t := _first_at_or_after(starts.get(s.rail, []), s.t_dark_s)) is None
                  or t > s.t_light_s]
        return sorted(wire + others, key=lambda s: s.t_dark_s)

    def to_summary(self) -> dict[str, Any]:
        return {**self.check.to_summary(), "app_minus_wire_ms": self.agreement.to_summary()}


def skipped_summary(reason: str, controller_events: Iterable[Record]) -> dict[str, Any]:
    """``summary["wire"]`` of a switched run without a capture: why, and how many of its
    commanded switches the wire saw (none), so the summary never passes it off as checked."""
    return {"skipped": reason, "commanded": len(commanded_switches(controller_events)),
            "observed": 0}


def wire_cost(cpu: Mapping[str, Any] | None) -> dict[str, float] | None:
    """What the check itself cost the run, from its CPU breakdown (``summary["cpu"]``): the
    cores of its captures and probe sender, and of the OCS switches (ovs-vswitchd), which
    forward or drop every probe frame (their share of it shows against a run without the
    check: docs/wire.md, "Cost"). None: no breakdown, or no wire check in it."""
    parts = (cpu or {}).get("component_cores_mean") or {}
    if "wire check" not in parts:
        return None
    return {"wire_check_cores": round(float(parts["wire check"]), 3),
            "vswitchd_cores": round(sum(float(v) for k, v in parts.items()
                                        if k.startswith("ovs-vswitchd")), 3)}


def cost_text(wire: Mapping[str, Any]) -> str:
    """The check's own cost, as the wire line ends: cores, and the probes sent and skipped."""
    cost, probes = wire.get("cost") or {}, wire.get("probe_frames") or {}
    parts = []
    if cost:
        parts.append(f"{cost['wire_check_cores']:.2f} cores (tcpdump + probe sender; the "
                     f"vswitchds, which forward the probes, {cost['vswitchd_cores']:.2f})")
    if probes:
        every = wire.get("probe_interval_ms")
        parts.append(f"{probes.get('sent', 0)} probes sent"
                     + (f" (every {every:g} ms a port)" if every else "")
                     + f", {probes.get('skipped', 0)} skipped on ports busy with data")
    return "; check's cost: " + ", ".join(parts) if parts else ""


def wire_text(wire: Mapping[str, Any] | None) -> str:
    """The summary's line on the wire check (``summary["wire"]``), its own cost last."""
    if not wire:
        return "not checked"
    if wire.get("skipped"):
        seen = (f"0 of {wire['commanded']} switches seen on the wire; "
                if wire.get("commanded") else "")
        return f"not checked: {seen}{wire['skipped']}"
    err, agree = wire["error_ms"], wire["app_minus_wire_ms"]
    commanded = wire.get("commanded", wire["switches"])
    if wire.get("standing_circuits") and not commanded:  # the static plane: nothing switched
        text = (f"watched {wire['standing_circuits']} circuits installed before the ranks "
                f"started (no switch to time) on {wire.get('ports_seen', 0)} of "
                f"{wire.get('ports', 0)} ports")
    else:
        text = (f"saw {wire.get('observed', wire['measured'])} of {commanded} switches, "
                f"{wire['measured']} dark periods measured")
    if wire.get("ports_taken_over"):
        text += f", {wire['ports_taken_over']} ports taken over by a spare followed"
    if err.get("count"):
        text += (f", error p50 {err['p50']:+.2f} ms, p99 {err['p99']:+.2f} ms, max "
                 f"{err['max']:+.2f} ms (+- {wire['resolution_ms']['p50']:.2f} ms)")
    if agree.get("count"):
        text += f"; app - wire p50 {agree['p50']:+.2f} ms, p99 {agree['p99']:+.2f} ms"
    text += (f"; {wire['early']} early, {wire['non_peer_frames']} frames at a non-peer, "
             f"{wire['lost_frames']} lost outside switches")
    if wire.get("problems"):
        text += "; capture problems: " + "; ".join(wire["problems"])
    return text + cost_text(wire)
