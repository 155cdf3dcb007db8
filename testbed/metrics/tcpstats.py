"""TCP's own timers in an emulated run: the kernel's counters of each rank's namespace (pure).

Time dilation stretches every modelled time, but not TCP's: the minimum retransmission timeout
(200 ms), the SYN timeout (1 s), the delayed ACK (40 ms) and tail-loss probes run on the wall
clock, so in model time a timeout costs ``1/k`` of what it costs at ``k`` = 1
(docs/validation.md, "Time dilation"). Whether they fire is therefore a figure a dilated run
must carry: each rank records its namespace's counters (``/proc/thread-self/net/snmp`` and
``netstat``: the calling thread's network namespace, which is the rank's own Mininet host)
when it starts and at the end of every iteration, and :func:`iteration_counts` sums what the
measured iterations added.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

#: The counters kept: ``Tcp`` of ``snmp`` and ``TcpExt`` of ``netstat``, by the kernel's names.
COUNTERS: tuple[str, ...] = (
    "RetransSegs",      # segments retransmitted, for any reason
    "TCPTimeouts",      # retransmission timeouts that fired (RTO: >= 200 ms on the wall)
    "TCPSynRetrans",    # SYNs sent again (the first after 1 s on the wall)
    "TCPLossProbes",    # tail-loss probes sent (after ~2 RTTs, >= 10 ms on the wall)
    "TCPFastRetrans",   # retransmissions on duplicate ACKs (no timer)
    "DelayedACKs",      # ACKs sent by the delayed-ACK timer (>= 40 ms on the wall)
    "ActiveOpens",      # connections this namespace opened
    "ListenOverflows",  # SYNs or handshakes' ACKs a listener dropped: its accept queue was full
    "ListenDrops",      # SYNs a listener dropped for any reason (overflows included)
)
#: The counters that are wall-clock timers (their firing costs a fixed wall time).
TIMER_COUNTERS: tuple[str, ...] = ("TCPTimeouts", "TCPSynRetrans", "TCPLossProbes",
                                   "DelayedACKs")
SNMP_PATH = "/proc/thread-self/net/snmp"
NETSTAT_PATH = "/proc/thread-self/net/netstat"


def parse(text: str, sections: tuple[str, ...] = ("Tcp", "TcpExt")) -> dict[str, int]:
    """The counters of ``sections`` in ``/proc/net/snmp`` or ``netstat`` text (a line of names
    followed by a line of values, both prefixed by the section's name)."""
    out: dict[str, int] = {}
    lines = text.splitlines()
    for names, values in zip(lines[::2], lines[1::2], strict=False):
        head, _, rest = names.partition(":")
        vhead, _, vrest = values.partition(":")
        if head != vhead or head not in sections:
            continue
        for name, value in zip(rest.split(), vrest.split(), strict=False):
            if name in COUNTERS:
                out[name] = int(value)
    return out


def read(snmp_path: str = SNMP_PATH, netstat_path: str = NETSTAT_PATH) -> dict[str, int]:
    """The calling thread's namespace's counters (empty where the files cannot be read)."""
    out: dict[str, int] = {}
    for path in (snmp_path, netstat_path):
        try:
            with open(path, encoding="ascii") as fh:
                out.update(parse(fh.read()))
        except OSError:
            continue
    return out


def delta(before: Mapping[str, int], after: Mapping[str, int]) -> dict[str, int]:
    """What happened between two readings of one namespace."""
    return {name: int(after[name]) - int(before.get(name, 0)) for name in after}


def iteration_counts(records: Iterable[Mapping[str, Any]], warmup: int) -> dict[str, Any]:
    """Per counter, what the measured iterations (``it >= warmup``) added over every rank:
    each iteration's reading minus the rank's previous one (its ``started`` reading for the
    first), so a rank restarted after a failure is counted from its new start. Also the
    measured iterations' count and, per counter, the worst rank's share."""
    last: dict[int, Mapping[str, int]] = {}
    total: dict[str, int] = dict.fromkeys(COUNTERS, 0)
    per_rank: dict[int, dict[str, int]] = {}
    iterations: set[int] = set()
    for rec in records:
        tcp = rec.get("tcp")
        if not isinstance(tcp, Mapping) or "rank" not in rec:
            continue
        rank = int(rec["rank"])
        if rec.get("ev") == "iteration":
            it = int(rec["it"])
            prev = last.get(rank)
            if prev is not None and it >= warmup:
                iterations.add(it)
                mine = per_rank.setdefault(rank, dict.fromkeys(COUNTERS, 0))
                for name, value in delta(prev, tcp).items():
                    if name in total:
                        total[name] += value
                        mine[name] += value
        last[rank] = tcp
    worst = {name: max((c[name] for c in per_rank.values()), default=0) for name in COUNTERS}
    return {"iterations": len(iterations), "ranks": len(per_rank), "total": total,
            "worst_rank": worst}


#: Wall-clock cost of one firing, at least (Linux: ``TCP_RTO_MIN`` 200 ms, ``TCP_TIMEOUT_INIT``
#: 1 s for a SYN); what a stalled transfer waits, whatever the dilation.
STALL_MIN_WALL_S: dict[str, float] = {"TCPTimeouts": 0.2, "TCPSynRetrans": 1.0}


def stall_fault(counts: Mapping[str, Any] | None, time_dilation: float = 1.0) -> str | None:
    """The verdict's words when a retransmission timeout or a SYN retransmission fired in the
    measured iterations (else None): each stalls a transfer for a wall-clock time no model
    has and no dilation scales, so the iteration carries an unmodelled wait of at least
    that / ``k`` (a lost frame outside a switch: the emulator's, not the fabric's)."""
    total = (counts or {}).get("total") or {}
    fired = {name: int(total.get(name, 0)) for name in STALL_MIN_WALL_S}
    if not any(fired.values()):
        return None
    wall_s = sum(n * STALL_MIN_WALL_S[name] for name, n in fired.items())
    listener = int(total.get("ListenDrops", 0))
    where = (f"{listener} SYNs were dropped by a rank's full listen queue" if listener else
             "a frame was lost outside a switch, or a retransmission timer fired on a round "
             "trip longer than TCP's 200 ms minimum, the original arriving after it "
             "(docs/performance.md, \"Lost SYNs\" and \"Spurious retransmissions\", name "
             "the causes found)")
    return (f"TCP's own timers fired in the measured iterations ({fired['TCPTimeouts']} "
            f"retransmission timeouts, {fired['TCPSynRetrans']} SYN retransmissions): each "
            f"stalled a transfer for a wall time no model has (>= {wall_s:.1f} s in all, "
            f">= {wall_s / time_dilation:.2f} s of model time at k = {time_dilation:g}); "
            + where)
