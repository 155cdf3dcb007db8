"""Collective algorithms as data: the algorithms of each kind, their steps and their circuits.

A collective is lowered by a named algorithm to a :class:`~workloads.steps.StepPlan`: steps of
concurrent transfers, and **units**, runs of steps that one set of circuits serves (a unit's
``pairs``). The replay (:mod:`testbed.plan.replay`) packs consecutive units into **segments**
that fit the ranks' K ports (:func:`pack_segments`); each segment is one Opus call, so the
optical switch is rewired between segments. Every backend runs the same segments.

Each algorithm is one :class:`Algorithm` record (:data:`ALGORITHM`, by name): the kinds it
serves, its lowering, its step count, the ports per rank it needs, whether it is segmented and
whether its circuits are the group's mesh or its ring. Adding an algorithm is one lowering and
one record. The closed-form models the collective benches set their measurements against
(:func:`alltoall_model_s`, :func:`stragglar_model_s`) are at the end.

The algorithms (the first of each kind is the default, the lowering of :mod:`workloads.steps`):

* ``ring`` (all-gather, reduce-scatter, all-reduce) and ``pairwise`` (send/recv, and the
  all-to-all's pairwise exchange over the group's full mesh): :mod:`workloads.steps`.
* ``matchings`` (all-to-all): the ``n - 1`` perfect matchings of a 1-factorization of the
  complete graph (the circle method; odd ``n`` adds a dummy rank, ``n`` rounds, rank ``r``
  idle in round ``r``). In each round the two ranks of a pair exchange their blocks over one
  circuit. Each round needs one port per rank, so K ports carry K rounds per segment. An OCS
  serving all-to-all as a sequence of one-to-one matchings is PipSwitch's design (Ding & Singh,
  arXiv 2501.18136, up to 32 ports).
* ``multihop`` (all-to-all): forwarding over the group's lit ring (the photonic-rails paper,
  §5: "multi-hopping through connected GPUs in the same rail"), both directions of the
  full-duplex circuits: block ``o -> d`` at ring distance ``h = (d - o) mod n`` goes clockwise
  if ``h < n - h``, counter-clockwise if ``h > n - h``, half each way if ``h = n / 2``. Step
  ``s`` (``1..floor(n/2)``): rank ``i`` sends to ``i + 1`` the clockwise blocks of origin
  ``i - (s - 1)`` still ``>= s`` hops from home, and to ``i - 1`` the counter-clockwise ones of
  origin ``i + (s - 1)``. Each directed link carries ``n^2 / 8`` blocks (even ``n``); it never
  switches, but needs the ring (two ports per rank).
* ``stragglar`` (all-reduce with a persistent straggler; Devraj, Ding, Vijaya Kumar, Kleinberg,
  Singh, "Accelerating AllReduce with a Persistent Straggler", arXiv 2505.23523; its schedule
  structure as in the authors' artifact ``arjundevraj/stragglar``): the buffer is cut into
  ``n - 1`` chunks. While the straggler is late, the ``n - 1`` others run a ring
  reduce-scatter among themselves (unit ``rs``), so that non-straggler ``g`` holds the partial
  sum of chunk ``g``. Once the straggler arrives, ``n - 2 + log2 n`` rounds (``n`` a power of
  two) complete the all-reduce; each round is a matching and moves one chunk per transfer. In
  round ``t <= n - 2`` the straggler and non-straggler ``t`` swap chunk ``t`` (partial sum one
  way, the straggler's own chunk the other) and both add, so both hold the reduced chunk; the
  other ranks spread reduced chunks by copies and two-way swaps. These rounds are ``sync``:
  a rank leaves a round when its own sends have arrived (a round of NCCL sends and receives
  ends when they complete). Groups without the straggler use ``ring``.

The post-arrival rounds come from :func:`stragglar_rounds`, our construction (not the
artifact's synthesizer) of a schedule with the published round count, checked by the tests.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from functools import lru_cache

from workloads.steps import P2P_KINDS, Block, StepPlan, Transfer, Unit, chunk_sizes
from workloads.steps import lower as lower_default

Pair = tuple[int, int]
# A post-arrival move of StragglAR: ("X", a, straggler, chunk) swaps and adds both ways;
# ("C", src, dst, chunk) copies a reduced chunk.
Move = tuple[str, int, int, int]


def is_power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


# ----------------------------------------------------------------------- matchings

def one_factorization(n: int) -> list[list[Pair]]:
    """Rounds of disjoint pairs that together join every pair of ``0..n-1`` exactly once.

    The circle method: even ``n`` gives ``n - 1`` perfect matchings (round ``r`` pairs
    ``n - 1`` with ``r`` and ``i`` with ``(2 r - i) mod (n - 1)``); odd ``n`` runs it on
    ``n + 1`` ranks and drops the dummy, giving ``n`` rounds where rank ``r`` idles in round
    ``r``. Pairs are ``(low, high)``, sorted.
    """
    if n < 2:
        return []
    m = n if n % 2 == 0 else n + 1
    rounds = []
    for r in range(m - 1):
        pairs = []
        for i in range(m - 1):
            p = (2 * r - i) % (m - 1)
            if i == p:
                p = m - 1
            if i < p < n:
                pairs.append((i, p))
        rounds.append(sorted(pairs))
    return rounds


def _lower_matchings(cid: str, ranks: tuple[int, ...], splits: Sequence[Sequence[int]],
                     with_blocks: bool) -> StepPlan:
    n = len(ranks)
    steps: list[tuple[Transfer, ...]] = []
    units: list[Unit] = []
    for r, pairs in enumerate(one_factorization(n)):
        step = []
        for a, b in pairs:
            for src, dst in ((a, b), (b, a)):
                if splits[src][dst]:
                    step.append(Transfer(ranks[src], ranks[dst], splits[src][dst],
                                         ((src * n + dst, "copy"),) if with_blocks else ()))
        steps.append(tuple(step))
        units.append(Unit("m", r, 1, tuple(sorted(ranks[x] for p in pairs for x in p)),
                          tuple(_edge(ranks[a], ranks[b]) for a, b in pairs)))
    return StepPlan(cid, "all_to_all", "matchings", ranks, tuple(steps), units=tuple(units),
                    blocks=_a2a_blocks(ranks, splits) if with_blocks else ())


def _a2a_blocks(ranks: tuple[int, ...], splits: Sequence[Sequence[int]]) -> tuple[Block, ...]:
    n = len(ranks)
    return tuple(Block(o * n + d, splits[o][d], (ranks[o],), (ranks[d],))
                 for o in range(n) for d in range(n) if o != d)


# ------------------------------------------------------------------------ multihop

@dataclass(frozen=True)
class _Piece:
    """A block, or half of one, travelling ``hops`` one way round the ring."""

    block_id: int
    origin: int
    dest: int
    size_bytes: int
    clockwise: bool
    hops: int


def _pieces(splits: Sequence[Sequence[int]]) -> list[_Piece]:
    n = len(splits)
    out = []
    for o in range(n):
        for d in range(n):
            if o == d:
                continue
            h, b, bid = (d - o) % n, splits[o][d], o * n + d
            if 2 * h < n:
                out.append(_Piece(bid, o, d, b, True, h))
            elif 2 * h > n:
                out.append(_Piece(bid, o, d, b, False, n - h))
            else:  # antipodal: split over both directions
                out.append(_Piece(bid, o, d, (b + 1) // 2, True, h))
                out.append(_Piece(n * n + bid, o, d, b // 2, False, h))
    return out


def _lower_multihop(cid: str, ranks: tuple[int, ...], sizes: Sequence[int],
                    splits: Sequence[Sequence[int]], with_blocks: bool) -> StepPlan:
    n = len(ranks)
    if n <= 2:  # the ring is one pair: forwarding is the pairwise exchange
        plan = _lower_pairwise(cid, "all_to_all", ranks, sizes, splits, with_blocks)
        return replace(plan, algorithm="multihop")
    pieces = _pieces(splits)
    by_origin: dict[tuple[int, bool], list[_Piece]] = {}
    for pc in pieces:
        by_origin.setdefault((pc.origin, pc.clockwise), []).append(pc)
    steps = []
    for s in range(1, n // 2 + 1):
        step = []
        for i in range(n):
            for clockwise, origin, to in ((True, (i - s + 1) % n, (i + 1) % n),
                                          (False, (i + s - 1) % n, (i - 1) % n)):
                carried = [pc for pc in by_origin.get((origin, clockwise), ()) if pc.hops >= s]
                size = sum(pc.size_bytes for pc in carried)
                if size:
                    step.append(Transfer(ranks[i], ranks[to], size,
                                         tuple((pc.block_id, "copy") for pc in carried)
                                         if with_blocks else ()))
        steps.append(tuple(step))
    blocks = tuple(Block(pc.block_id, pc.size_bytes, (ranks[pc.origin],), (ranks[pc.dest],))
                   for pc in pieces) if with_blocks else ()
    return StepPlan(cid, "all_to_all", "multihop", ranks, tuple(steps),
                    units=(Unit("", 0, len(steps), ranks, None),), blocks=blocks)


# ----------------------------------------------------------------------- stragglar

def stragglar_rounds(n: int) -> tuple[tuple[Move, ...], ...]:
    """StragglAR's rounds after the straggler's arrival, for ``n`` ranks (a power of two).

    Labels: ``0..n-2`` are the non-stragglers (``g`` holds the partial sum of chunk ``g``),
    ``n - 1`` is the straggler. ``n - 2 + log2 n`` rounds; each is a matching, each rank sends
    and receives at most one chunk per round, and every rank ends with every reduced chunk.

    Construction (ours). Write ``L = log2 n``. Chunk ``c`` is reduced in round ``c`` (the
    swap ``c <-> straggler``) and then spreads by doubling: its *lineage* (the non-stragglers
    holding it) has ``2^(j-1)`` members in its ``j``-th round after that and, after ``L``
    rounds, all ``n - 1``. In round ``s`` each member of a lineage younger than ``L`` sends
    its chunk to a *free* rank: one of the lineage that completes this round (which sends
    that chunk back: a two-way swap) or, early on, a rank holding nothing. The straggler is
    busy with its swaps until round ``n - 2`` and then helps spread the last chunk. Rank
    ``r`` must be free in round ``r`` (its swap): so in round ``r - L + 1`` it is *seeded*
    into the lineage of chunk ``r - L``, which reaches ``L`` rounds exactly then, by a copy
    from rank ``r - L``; free ranks are otherwise given to lineages so that each is free
    again by the round it must be (earliest deadline to the oldest lineage). The counting
    argument: in a steady round the lineages' ``2^(L-1) - 1`` senders match the completing
    lineage's ``2^(L-1) - 1`` free members exactly, so no round is wasted.
    """
    if not is_power_of_two(n) or n < 2:
        raise ValueError(f"StragglAR needs a power-of-two group (>= 2 ranks), got {n}")
    log_n = n.bit_length() - 1
    straggler, last = n - 1, n - 2
    lineage: dict[int, int | None] = dict.fromkeys(range(n - 1))
    held: list[set[int]] = [set() for _ in range(n)]
    rounds: list[tuple[Move, ...]] = []
    s = 0
    while any(len(h) < n - 1 for h in held):
        if s > 2 * n + log_n:
            raise AssertionError(f"StragglAR schedule for n={n} does not converge")
        moves: list[Move] = []
        busy: set[int] = set()
        if s <= last:
            moves.append(("X", s, straggler, s))
            busy = {s, straggler}

        age = {r: log_n if c is None else s - c for r, c in lineage.items()}
        # the youngest lineage a rank may join now and still be free in the round it must be
        # (its swap, or its seeding L - 1 rounds before)
        lowest = {r: s + log_n - due if (due := r if r < log_n else r - log_n + 1) > s else -1
                  for r in lineage}
        free = [r for r in lineage if r not in busy and age[r] >= log_n]
        senders = [(age[r], r, c) for r, c in lineage.items()
                   if c is not None and r not in busy and age[r] < log_n]
        if straggler not in busy:
            senders.append((s - last, straggler, last))
        pairs: list[tuple[int, int, int]] = []  # (sender, free rank, chunk)
        seeded = s + log_n - 1
        if 1 <= s <= last + 1 and seeded <= last and seeded != s:
            senders.remove((1, s - 1, s - 1))
            free.remove(seeded)
            pairs.append((s - 1, seeded, s - 1))
        free.sort(key=lambda r: (-lowest[r], r))
        for stage, sender, chunk in sorted(senders, key=lambda x: (-x[0], x[1])):
            pick = next((r for r in free if lowest[r] <= stage), None)
            if pick is not None:
                free.remove(pick)
                pairs.append((sender, pick, chunk))
        for sender, rank, chunk in pairs:
            moves.append(("C", sender, rank, chunk))
            back = lineage[rank]
            if back is not None and sender != straggler and back not in held[sender]:
                moves.append(("C", rank, sender, back))
        for kind, a, b, c in moves:
            held[b].add(c)
            if kind == "X":
                held[a].add(c)
        for _sender, rank, chunk in pairs:
            lineage[rank] = chunk
        if s <= last:
            lineage[s] = s
        rounds.append(tuple(moves))
        s += 1
    return tuple(rounds)


def _lower_stragglar(cid: str, ranks: tuple[int, ...], size_bytes: int, straggler: int,
                     with_blocks: bool) -> StepPlan:
    n = len(ranks)
    post = stragglar_rounds(n)
    at = ranks.index(straggler)
    others = tuple(ranks[(at + 1 + j) % n] for j in range(n - 1))  # ring order after it
    m = n - 1
    chunks = chunk_sizes(size_bytes, m)

    def rank_of(label: int) -> int:
        return others[label] if label < m else straggler

    def moved(src: int, dst: int, chunk: int, op: str) -> Transfer:
        return Transfer(src, dst, chunks[chunk], ((chunk, op),) if with_blocks else ())

    steps: list[tuple[Transfer, ...]] = [
        tuple(moved(others[j], others[(j + 1) % m], (j - k - 1) % m, "add") for j in range(m))
        for k in range(m - 1)]
    units = [Unit("rs", 0, m - 1, tuple(sorted(others)), _ring_pairs(others), False)] \
        if m > 1 else []
    for t, moves in enumerate(post):
        step: list[Transfer] = []
        pairs: list[Pair] = []
        for kind, a, b, c in moves:
            src, dst = rank_of(a), rank_of(b)
            if kind == "X":
                step += [moved(src, dst, c, "add"), moved(dst, src, c, "add")]
            else:
                step.append(moved(src, dst, c, "copy"))
            if _edge(src, dst) not in pairs:
                pairs.append(_edge(src, dst))
        units.append(Unit("p", len(steps), 1, tuple(sorted({x for p in pairs for x in p})),
                          tuple(pairs), t > 0))
        steps.append(tuple(step))
    sync = (False,) * (m - 1) + (True,) * len(post)
    blocks = tuple(Block(c, chunks[c], ranks, ranks) for c in range(m)) if with_blocks else ()
    return StepPlan(cid, "all_reduce", "stragglar", ranks, tuple(steps), sync, tuple(units),
                    blocks)


# ------------------------------------------------------------------------ defaults

def ring_block(kind: str, n: int, position: int, step: int) -> tuple[int, str]:
    """The chunk (or input block) the member at ``position`` sends at ``step`` of a ring
    collective, and what its successor does with it (see :mod:`workloads.steps`)."""
    if kind == "all_gather":
        return (position - step) % n, "copy"
    if step < n - 1:  # reduce-scatter, or the first half of an all-reduce
        return (position - step - 1) % n, "add"
    return (position - step + n - 1) % n, "copy"


def _lower_pairwise(cid: str, kind: str, ranks: tuple[int, ...], sizes: Sequence[int],
                    splits: Sequence[Sequence[int]] | None, with_blocks: bool) -> StepPlan:
    """The default lowering of :mod:`workloads.steps`, with its data semantics if asked."""
    plan = lower_default(cid, kind, ranks, sizes, splits)
    if not with_blocks:
        return plan
    n = len(ranks)
    if kind in P2P_KINDS:
        steps = tuple(tuple(replace(t, blocks=((0, "copy"),)) for t in s) for s in plan.steps)
        return replace(plan, steps=steps, blocks=(Block(0, sizes[0], ranks[:1], ranks[1:]),))
    if kind == "all_to_all":
        assert splits is not None
        steps = tuple(tuple(replace(t, blocks=((i * n + (i + k + 1) % n, "copy"),))
                            for i, t in enumerate(s)) for k, s in enumerate(plan.steps))
        return replace(plan, steps=steps, blocks=_a2a_blocks(ranks, splits))
    steps = tuple(tuple(replace(t, blocks=(ring_block(kind, n, i, k),)) for i, t in enumerate(s))
                  for k, s in enumerate(plan.steps))
    if kind == "all_gather":
        blocks = tuple(Block(j, sizes[j], (ranks[j],), ranks) for j in range(n))
    else:
        chunks = chunk_sizes(sizes[0], n)
        blocks = tuple(Block(c, chunks[c], ranks,
                             (ranks[c],) if kind == "reduce_scatter" else ranks)
                       for c in range(n))
    return replace(plan, steps=steps, blocks=blocks)


# ----------------------------------------------------------------------- the records

def _lower_default(cid: str, kind: str, ranks: tuple[int, ...], sizes: Sequence[int],
                   splits: Sequence[Sequence[int]] | None, straggler: int | None,
                   with_blocks: bool) -> StepPlan:
    return _lower_pairwise(cid, kind, ranks, sizes, splits, with_blocks)


def _lower_matchings_of(cid: str, kind: str, ranks: tuple[int, ...], sizes: Sequence[int],
                        splits: Sequence[Sequence[int]] | None, straggler: int | None,
                        with_blocks: bool) -> StepPlan:
    assert splits is not None
    return _lower_matchings(cid, ranks, splits, with_blocks)


def _lower_multihop_of(cid: str, kind: str, ranks: tuple[int, ...], sizes: Sequence[int],
                       splits: Sequence[Sequence[int]] | None, straggler: int | None,
                       with_blocks: bool) -> StepPlan:
    assert splits is not None
    return _lower_multihop(cid, ranks, sizes, splits, with_blocks)


def _lower_stragglar_of(cid: str, kind: str, ranks: tuple[int, ...], sizes: Sequence[int],
                        splits: Sequence[Sequence[int]] | None, straggler: int | None,
                        with_blocks: bool) -> StepPlan:
    if straggler is None or len(ranks) < 2:  # a group without the straggler runs the ring
        return _lower_pairwise(cid, kind, ranks, sizes, splits, with_blocks)
    return _lower_stragglar(cid, ranks, sizes[0], straggler, with_blocks)


#: ``(collective_id, kind, ranks, sizes, splits, straggler, with_blocks) -> StepPlan``
Lowering = Callable[[str, str, tuple[int, ...], Sequence[int], Sequence[Sequence[int]] | None,
                     int | None, bool], StepPlan]


@dataclass(frozen=True)
class Algorithm:
    """Everything that choosing a collective algorithm by name decides.

    ``steps`` and ``ports`` are given for groups of two or more and collectives that are not
    send/recv (:meth:`step_count` and :meth:`min_ports` add the rest). ``mesh``: the circuits
    a group needs over the whole collective are the group's full mesh (else its ring).
    ``needs_straggler``: the algorithm exists for a group with a straggler; any other group
    runs ``ring`` instead. ``port_reason`` says why it needs its ports, for refusals.
    """

    name: str
    kinds: tuple[str, ...]
    lowering: Lowering
    steps: Callable[[str, int], int]
    ports: Callable[[str, int], int]
    segmented: bool
    mesh: bool
    port_reason: str
    needs_straggler: bool = False

    def lower(self, collective_id: str, kind: str, ranks: tuple[int, ...],
              sizes: Sequence[int], splits: Sequence[Sequence[int]] | None = None, *,
              straggler: int | None = None, with_blocks: bool = False) -> StepPlan:
        """This algorithm's :class:`~workloads.steps.StepPlan` of one collective."""
        return self.lowering(collective_id, kind, ranks, sizes, splits, straggler, with_blocks)

    def step_count(self, kind: str, n: int) -> int:
        """Steps of the lowering over ``n`` ranks (the alpha term of the modeled duration)."""
        if kind in P2P_KINDS:
            return 1
        return self.steps(kind, n) if n >= 2 else 0

    def min_ports(self, kind: str, n: int) -> int:
        """Ports per rank the largest unit needs on a rail with ``n`` members."""
        if kind in P2P_KINDS or n < 2:
            return 1
        return self.ports(kind, n)

    def runs_as(self, n: int, has_straggler: bool) -> Algorithm:
        """The algorithm a group of ``n`` really runs (``stragglar`` needs its straggler)."""
        if self.needs_straggler and (not has_straggler or n < 2):
            return RING
        return self


def _ring_ports(_kind: str, n: int) -> int:
    return 2 if n >= 3 else 1


RING = Algorithm(
    "ring", ("all_gather", "reduce_scatter", "all_reduce"), _lower_default,
    steps=lambda kind, n: 2 * (n - 1) if kind == "all_reduce" else n - 1,
    ports=_ring_ports, segmented=False, mesh=False,
    port_reason="a ring of three or more needs two circuits per rank")
PAIRWISE = Algorithm(
    "pairwise", ("all_to_all", "send", "recv"), _lower_default,
    steps=lambda _kind, n: n - 1, ports=lambda _kind, n: n - 1, segmented=False, mesh=True,
    port_reason="the exchange needs the group's full mesh")
MATCHINGS = Algorithm(
    "matchings", ("all_to_all",), _lower_matchings_of,
    steps=lambda _kind, n: n - 1 if n % 2 == 0 else n, ports=lambda _kind, _n: 1,
    segmented=True, mesh=True, port_reason="its rounds")
MULTIHOP = Algorithm(
    "multihop", ("all_to_all",), _lower_multihop_of,
    steps=lambda _kind, n: max(1, n // 2), ports=_ring_ports, segmented=False, mesh=False,
    port_reason="it forwards over the group's ring")
STRAGGLAR = Algorithm(
    "stragglar", ("all_reduce",), _lower_stragglar_of,
    steps=lambda _kind, n: (n - 2) + (n - 2 + n.bit_length() - 1),
    # the reduce-scatter's ring of the n - 1 others; the rounds need one port
    ports=lambda _kind, n: 2 if n - 1 >= 3 else 1, segmented=True, mesh=False,
    port_reason="its reduce-scatter runs on a ring of the others", needs_straggler=True)

#: Every algorithm by name; the order sets each kind's default (its first).
ALGORITHM: dict[str, Algorithm] = {a.name: a for a in (RING, PAIRWISE, MATCHINGS, MULTIHOP,
                                                       STRAGGLAR)}
KINDS = ("all_gather", "reduce_scatter", "all_reduce", "all_to_all", "send", "recv")
#: The algorithms of each collective kind, its default first.
ALGORITHMS: dict[str, tuple[str, ...]] = {
    kind: tuple(a.name for a in ALGORITHM.values() if kind in a.kinds) for kind in KINDS}
DEFAULT_ALGORITHM = {kind: names[0] for kind, names in ALGORITHMS.items()}


def check_algorithm(kind: str, algorithm: str) -> Algorithm:
    """The record of ``algorithm`` for ``kind``; ``ValueError`` naming the choices if there is
    none."""
    names = ALGORITHMS.get(kind)
    if names is None:
        raise ValueError(f"unknown collective kind {kind!r}; known: {', '.join(ALGORITHMS)}")
    if algorithm not in names:
        raise ValueError(f"algorithm {algorithm!r} does not exist for {kind}; choose "
                         f"{' or '.join(names)}")
    return ALGORITHM[algorithm]


def lower(collective_id: str, kind: str, algorithm: str, ranks: tuple[int, ...],
          sizes: Sequence[int], splits: Sequence[Sequence[int]] | None = None, *,
          straggler: int | None = None, with_blocks: bool = False) -> StepPlan:
    """Lower one collective over ``ranks`` (ring order) with ``algorithm``.

    ``sizes``/``splits`` as for :func:`workloads.steps.lower`; ``straggler`` is the group's
    straggler rank (``stragglar`` falls back to ``ring`` without one). ``with_blocks`` fills
    the data semantics (:class:`~workloads.steps.Block`, ``Transfer.blocks``).
    """
    return check_algorithm(kind, algorithm).lower(collective_id, kind, ranks, sizes, splits,
                                                  straggler=straggler, with_blocks=with_blocks)


@lru_cache(maxsize=4096)
def lower_positions(kind: str, algorithm: str, n: int, sizes: tuple[int, ...],
                    splits: tuple[tuple[int, ...], ...] | None,
                    straggler_position: int | None) -> StepPlan:
    """:func:`lower` over positions ``0..n-1`` (cached: groups of one shape share it)."""
    return lower("", kind, algorithm, tuple(range(n)), sizes, splits,
                 straggler=straggler_position)


# ------------------------------------------------------------------------- segments

@dataclass(frozen=True)
class Segment:
    """Units packed into one Opus call: steps ``[first, first + count)`` over ``pairs``."""

    name: str
    first: int
    count: int
    ranks: tuple[int, ...]
    pairs: tuple[Pair, ...] | None  # None: the comm group itself


def pack_segments(units: Sequence[Unit], ports_per_rank: int | None) -> tuple[Segment, ...]:
    """Consecutive units merged while their circuits fit ``ports_per_rank`` ports at every rank
    (``None``: no limit, as on an electrical rail) and the later one may join.

    Greedy longest runs are optimal: any run inside a run that fits fits too. A unit that
    alone needs more ports than K stays alone (the job's port check refuses it).
    """
    runs: list[list[Unit]] = []
    for u in units:
        cur = runs[-1] if runs else None
        if (cur is not None and u.joins_previous and u.phase == cur[0].phase
                and u.pairs is not None and cur[0].pairs is not None
                and _fits([p for x in cur for p in x.pairs or ()] + list(u.pairs),
                          ports_per_rank)):
            cur.append(u)
        else:
            runs.append([u])
    count: dict[str, int] = {}
    out = []
    for run in runs:
        phase = run[0].phase
        j = count[phase] = count.get(phase, -1) + 1
        pairs = (None if run[0].pairs is None
                 else tuple(dict.fromkeys(p for u in run for p in u.pairs or ())))
        ranks = tuple(sorted({r for u in run for r in u.ranks}))
        out.append(Segment(f"{phase}{j}" if phase else "", run[0].first,
                           sum(u.count for u in run), ranks, pairs))
    return tuple(out)


def _fits(pairs: Sequence[Pair], ports_per_rank: int | None) -> bool:
    if ports_per_rank is None:
        return True
    degree: dict[int, int] = {}
    for a, b in set(pairs):
        degree[a] = degree.get(a, 0) + 1
        degree[b] = degree.get(b, 0) + 1
    return max(degree.values(), default=0) <= ports_per_rank


def _edge(a: int, b: int) -> Pair:
    return (a, b) if a < b else (b, a)


def _ring_pairs(ring: Sequence[int]) -> tuple[Pair, ...]:
    n = len(ring)
    if n < 2:
        return ()
    return tuple(dict.fromkeys(_edge(ring[i], ring[(i + 1) % n]) for i in range(n)))


# ------------------------------------------------------------------- closed-form models

@dataclass(frozen=True)
class IdealRail:
    """The costs of the closed-form models: each of a rank's ``ports_per_rank`` ports runs at
    ``rail_gbps``, every step costs ``latency_us``, and nothing else (no emulator costs)."""

    rail_gbps: float
    latency_us: float
    ports_per_rank: int


def matching_segments(n: int, ports_per_rank: int) -> int:
    """Opus calls (switches) of one all-to-all by ``matchings`` over ``n`` ranks."""
    plan = lower_positions("all_to_all", "matchings", n, (n,) * n,
                           tuple(tuple(1 for _ in range(n)) for _ in range(n)), None)
    return len(pack_segments(plan.units, ports_per_rank))


def alltoall_model_s(algorithm: str, n: int, per_rank_bytes: int, delay_ms: float,
                     rail: IdealRail, *, shared_nic: bool = False) -> float:
    """Time per all-to-all of ``per_rank_bytes`` per rank (split evenly) by ``matchings``,
    ``multihop`` or ``electrical`` (the pairwise exchange on a packet-switched rail), at
    ``rail``'s costs; ``shared_nic``: the K ports share one NIC of the rail rate, so
    multihop's two directions each get half."""
    block_s = per_rank_bytes / n * 8 / (rail.rail_gbps * 1e9)
    alpha = rail.latency_us * 1e-6
    if algorithm == "multihop":
        links = (n * n if n % 2 == 0 else n * n - 1) / 8
        return (MULTIHOP.step_count("all_to_all", n) * alpha
                + links * block_s * (rail.ports_per_rank if shared_nic else 1))
    if algorithm == "electrical":
        return PAIRWISE.step_count("all_to_all", n) * (alpha + block_s)
    return (MATCHINGS.step_count("all_to_all", n) * (alpha + block_s)
            + matching_segments(n, rail.ports_per_rank) * delay_ms / 1e3)


def stragglar_model_s(algorithm: str, n: int, size_bytes: int, straggler_delay_ms: float,
                      switching_delay_ms: float | None, rail: IdealRail) -> float:
    """Time of an all-reduce of ``size_bytes`` by ``ring`` or ``stragglar`` after the
    straggler's arrival, at ``rail``'s costs (electrical rails when ``switching_delay_ms`` is
    None; on circuits the ring stays lit and StragglAR switches for its reduce-scatter and
    each post segment)."""
    alpha = rail.latency_us * 1e-6
    bps = rail.rail_gbps * 1e9
    if algorithm == "ring":
        return RING.step_count("all_reduce", n) * (alpha + size_bytes * 8 / n / bps)
    chunk_s = alpha + size_bytes * 8 / (n - 1) / bps
    t_rs = (n - 2) * chunk_s
    t_post = len(stragglar_rounds(n)) * chunk_s
    if switching_delay_ms is None:
        return max(0.0, t_rs - straggler_delay_ms / 1e3) + t_post
    d = switching_delay_ms / 1e3
    plan = lower_positions("all_reduce", "stragglar", n, (size_bytes,) * n, None, n - 1)
    post = len(pack_segments(plan.units, rail.ports_per_rank)) - 1
    return max(0.0, d + t_rs - straggler_delay_ms / 1e3) + post * d + t_post
