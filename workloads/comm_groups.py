"""Which process group each traced collective call ran on, from what the traces carry.

Pure and deterministic: no timestamps, no clocks compared across ranks. The inputs are, per
rank, its calls in issue order (kind, message size, the peer's group rank for send/recv), the
groups each call may be on (a named call has one; an unnamed one every group of its rank that
fits it), and *lanes*: calls known to share a group (gloo runs a process group's collectives
on worker threads of its own, so calls whose work ran on one thread are on one group).

A group assignment is consistent when, on every group, every member issued the same sequence
of collectives (kind and size, all-to-all sizes may differ) and, for every ordered pair of
members, the sender's sends and the receiver's receives have the same sizes in order (the
in-order semantics of NCCL communicators and gloo tags). :func:`assign_groups` prunes
each lane's groups to those whose calls have a possible counterpart on every member it must
meet, then searches the rest and accepts exactly one consistent assignment: none is refused
naming the call that cannot be matched, several naming the first call they disagree on.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from workloads.steps import P2P_KINDS as P2P

MAX_SEARCH_NODES = 20_000


class GroupInferenceError(ValueError):
    """No consistent group assignment, or more than one; the message names the call."""


class TracedCall(Protocol):
    """What the inference reads of a call (``workloads.kineto.RawCall`` has it)."""

    kind: str
    size_bytes: int
    candidates: list[str]
    group_peer: int
    source: str


@dataclass(frozen=True)
class GroupView:
    """Every rank's groups: ``members[rank][name]`` and a label for messages."""

    members: Mapping[int, Mapping[str, tuple[int, ...]]]
    label: Callable[[int, str], str]


Key = tuple[int, int]  # (rank, index of the call in the rank's issue order)


def describe(call: TracedCall) -> str:
    """``all_gather of 82176 B``, ``send of 8192 B to group rank 1``."""
    what = f"{call.kind} of {call.size_bytes} B"
    if call.kind in P2P:
        what += f" {'to' if call.kind == 'send' else 'from'} group rank {call.group_peer}"
    return what


def assign_groups(calls: Mapping[int, Sequence[TracedCall]], view: GroupView,
                  lanes: Mapping[Key, object] | None = None) -> dict[Key, str]:
    """The one consistent group of every call (module docstring); raises
    :class:`GroupInferenceError` when there is none or more than one."""
    return _Inference(calls, view, lanes or {}).solve()


class _Inference:
    def __init__(self, calls: Mapping[int, Sequence[TracedCall]], view: GroupView,
                 lanes: Mapping[Key, object]) -> None:
        self.calls = calls
        self.view = view
        self.ranks = sorted(calls)
        # a variable per lane (calls sharing a group), its domain the groups all of them fit
        self.var_of: dict[Key, int] = {}
        self.keys_of: list[list[Key]] = []
        by_lane: dict[tuple[int, object], int] = {}
        for r in self.ranks:
            for i in range(len(calls[r])):
                lane = lanes.get((r, i))
                slot = (r, lane) if lane is not None else (r, ("call", i))
                if slot not in by_lane:
                    by_lane[slot] = len(self.keys_of)
                    self.keys_of.append([])
                self.var_of[(r, i)] = by_lane[slot]
                self.keys_of[by_lane[slot]].append((r, i))
        self.domains = [sorted(set.intersection(*(set(self.call(k).candidates) for k in keys)))
                        for keys in self.keys_of]
        self.nodes = 0
        self.failure = ""

    def call(self, key: Key) -> TracedCall:
        return self.calls[key[0]][key[1]]

    def members(self, rank: int, group: str) -> tuple[int, ...] | None:
        return self.view.members.get(rank, {}).get(group)

    # --- pruning ---------------------------------------------------------------------------

    def _counterpart(self, key: Key, group: str, other: Key) -> bool:
        """Whether ``other`` (on another member) can meet the call ``key`` on ``group``."""
        c, d = self.call(key), self.call(other)
        members = self.members(key[0], group)
        if members is None or self.members(other[0], group) != members:
            return False
        if c.kind in P2P:
            want = "recv" if c.kind == "send" else "send"
            return (d.kind == want and d.size_bytes == c.size_bytes
                    and members[c.group_peer] == other[0]
                    and 0 <= d.group_peer < len(members) and members[d.group_peer] == key[0])
        return d.kind == c.kind and (d.size_bytes == c.size_bytes or c.kind == "all_to_all")

    def _partners(self, key: Key, group: str) -> list[int]:
        members = self.members(key[0], group) or ()
        c = self.call(key)
        if c.kind in P2P:
            return [members[c.group_peer]] if 0 <= c.group_peer < len(members) else []
        return [m for m in members if m != key[0]]

    def _supported(self, key: Key, group: str, domains: list[list[str]]) -> bool:
        for m in self._partners(key, group):
            if not any(group in domains[self.var_of[(m, j)]]
                       and self._counterpart(key, group, (m, j))
                       for j in range(len(self.calls.get(m, ())))):
                return False
        return True

    def prune(self, domains: list[list[str]]) -> Key | None:
        """Drop groups without counterparts until nothing changes; the call left with none."""
        changed = True
        while changed:
            changed = False
            for v, keys in enumerate(self.keys_of):
                keep = [g for g in domains[v] if all(self._supported(k, g, domains)
                                                     for k in keys)]
                if keep != domains[v]:
                    domains[v] = keep
                    changed = True
                if not keep:
                    return next((k for k in keys if not any(
                        self._supported(k, g, domains) for g in self.call(k).candidates)),
                        keys[0])
        return None

    # --- consistency of (partial) assignments ------------------------------------------------

    def _sequence(self, rank: int, group: str, domains: list[list[str]], p2p: str = "",
                  peer: int = -1) -> tuple[list[Key], bool]:
        """The collectives (or, with ``p2p``, the sends/recvs with group peer ``peer``) of
        ``rank`` surely on ``group``, up to the first one that may or may not be on it; and
        whether that list is complete."""
        out: list[Key] = []
        for i, call in enumerate(self.calls[rank]):
            dom = domains[self.var_of[(rank, i)]]
            wanted = (call.kind == p2p and call.group_peer == peer) if p2p \
                else call.kind not in P2P
            if group not in dom or not wanted:
                continue
            if len(dom) > 1:
                return out, False
            out.append((rank, i))
        return out, True

    def conflict(self, domains: list[list[str]]) -> str | None:
        """Why the groups settled so far cannot all be right, or None."""
        seen: set[tuple[str, tuple[int, ...]]] = set()
        for r in self.ranks:
            for g in sorted({g for i in range(len(self.calls[r]))
                             for g in domains[self.var_of[(r, i)]]}):
                members = self.members(r, g)
                if members is None or (g, members) in seen:
                    continue
                seen.add((g, members))
                problem = self._group_conflict(g, members, domains)
                if problem:
                    return problem
        return None

    def _group_conflict(self, g: str, members: tuple[int, ...],
                        domains: list[list[str]]) -> str | None:
        present = [m for m in members if m in self.calls]
        colls = {m: self._sequence(m, g, domains) for m in present}
        problem = self._compare(g, colls)
        if problem:
            return problem
        for a in present:
            for b in present:
                if a == b:
                    continue
                sends = self._sequence(a, g, domains, "send", members.index(b))
                recvs = self._sequence(b, g, domains, "recv", members.index(a))
                problem = self._compare(g, {a: sends, b: recvs})
                if problem:
                    return problem
        return None

    def _compare(self, g: str, seqs: Mapping[int, tuple[list[Key], bool]]) -> str | None:
        """Whether sequences on one group can still agree: the k-th calls meet, and a complete
        sequence is as long as the others."""
        ranks = list(seqs)
        first = ranks[0]
        for m in ranks[1:]:
            (a, a_done), (b, b_done) = seqs[first], seqs[m]
            for k, (ka, kb) in enumerate(zip(a, b, strict=False)):
                if not self._counterpart(ka, g, kb):
                    return (f"{self.call(ka).source}: rank {first} {describe(self.call(ka))} "
                            f"is its call {k + 1} on group {self.view.label(first, g)}, but "
                            f"rank {m}'s call {k + 1} there is {describe(self.call(kb))} "
                            f"({self.call(kb).source})")
            for (x, x_done, xr), (y, yr) in (((a, a_done, first), (b, m)),
                                             ((b, b_done, m), (a, first))):
                if x_done and len(y) > len(x):
                    extra = y[len(x)]
                    return (f"{self.call(extra).source}: rank {yr} "
                            f"{describe(self.call(extra))} on group "
                            f"{self.view.label(yr, g)} has no counterpart on rank {xr}, "
                            f"which has {len(x)} such calls there (ranks whose traces "
                            "disagree, or traces of another run or step)")
        return None

    # --- search -----------------------------------------------------------------------------

    def solve(self) -> dict[Key, str]:
        domains = [list(d) for d in self.domains]
        for v, keys in enumerate(self.keys_of):
            if not domains[v]:
                self._refuse_lane(keys)
        stuck = self.prune(domains)
        if stuck is not None:
            raise GroupInferenceError(self._unmatched(stuck))
        found: list[list[list[str]]] = []
        self._search(domains, found)
        if not found:
            raise GroupInferenceError(self.failure or "no consistent group assignment")
        if len(found) > 1:
            self._refuse_ambiguous(found[0], found[1])
        return {k: found[0][v][0] for k, v in self.var_of.items()}

    def _search(self, domains: list[list[str]], found: list[list[list[str]]]) -> None:
        if len(found) > 1:
            return
        self.nodes += 1
        if self.nodes > MAX_SEARCH_NODES:
            open_keys = [self.keys_of[v][0] for v, d in enumerate(domains) if len(d) > 1]
            raise GroupInferenceError(
                f"{self.call(open_keys[0]).source}: too many ways to place the calls on "
                f"groups ({MAX_SEARCH_NODES} tried; {len(open_keys)} calls or lanes "
                "undecided); the traces carry too little to tell the groups apart")
        problem = self.conflict(domains)
        if problem is not None:
            self.failure = self.failure or problem
            return
        undecided = [v for v, d in enumerate(domains) if len(d) > 1]
        if not undecided:
            found.append([list(d) for d in domains])
            return
        v = min(undecided, key=lambda u: (self.keys_of[u][0][1], self.keys_of[u][0][0]))
        for g in domains[v]:
            trial = [list(d) for d in domains]
            trial[v] = [g]
            stuck = self.prune(trial)
            if stuck is None:
                self._search(trial, found)
            elif not self.failure:
                self.failure = self._unmatched(stuck)
            if len(found) > 1:
                return

    # --- refusals ---------------------------------------------------------------------------

    def _groups_text(self, key: Key, groups: Sequence[str]) -> str:
        return " or ".join(self.view.label(key[0], g) for g in groups)

    def _refuse_lane(self, keys: list[Key]) -> None:
        k = keys[0]
        raise GroupInferenceError(
            f"{self.call(k).source}: rank {k[0]}'s calls that ran on one worker thread "
            f"({', '.join(describe(self.call(x)) for x in keys)}) fit no common process group")

    def _unmatched(self, key: Key) -> str:
        c = self.call(key)
        return (f"{c.source}: rank {key[0]} {describe(c)} could be on group "
                f"{self._groups_text(key, c.candidates)}, but no other member has a matching "
                "call for it (ranks whose traces disagree, or a trace of another run or step)")

    def _refuse_ambiguous(self, a: list[list[str]], b: list[list[str]]) -> None:
        v = next(v for v in range(len(a)) if a[v] != b[v])
        key = self.keys_of[v][0]
        raise GroupInferenceError(
            f"{self.call(key).source}: rank {key[0]} {describe(self.call(key))} fits group "
            f"{self._groups_text(key, [a[v][0], b[v][0]])} alike: both place every call of "
            "every trace consistently, and the trace does not name the group (no 'Process "
            "Group Name'/'Ranks' on the call); profile with a torch whose record_param_comms "
            "names it (NCCL, about torch 2.4 on)")
