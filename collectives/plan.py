"""Weight-sync planning (pure): shard-scatter across boundaries in waves, then intra-PoD trees.

Design note
-----------
The goal (RollMux §5.2, OrchestrRL App. E) is that *exactly one copy* of every slice crosses each
boundary on its way to the generators, and that the fast intra-PoD fabric does the replication:

1. :mod:`collectives.slicing` cuts the model into pieces, gives each piece one origin trainer rank
   (balanced shards) and groups pieces into blocks by origin and receiver set.
2. **Phase A (App. E.1).** Each block is sent from its origin to one *seed* receiver per
   destination PoD (``direct``), or -- when every trainer-to-generator edge shares one slow
   cross-cluster link -- to one seed in a single *home* PoD, from which it is relayed seed to seed
   through every other generator PoD (``relay``), so one copy crosses the shared link and no seed
   sends a block more than once. Seeds are the receivers
   with the least seeded bytes, so ingress spreads over NICs. Inter-PoD edges are packed into
   *waves* first-fit-decreasing so that no PoD exceeds its boundary concurrency budget ``d_p``
   in any wave; within a wave, circuits are added greedily to the bottleneck edge while both its
   PoDs have budget left (bottleneck equalisation).
3. **Phase B (App. E.2).** In every PoD a block gets its own k-ary tree rooted at its seed, over
   the PoD's receivers of that block; the member order rotates with the block so interior nodes
   (and roots) differ between blocks and no single NIC carries the fan-out. ``k`` is chosen per PoD
   to minimise busiest-NIC time plus pipeline depth.
4. Steps: every edge out of a non-origin rank starts one step after the edge into it (see
   :mod:`collectives.schedule`), so Phase B streams while Phase A is still arriving.

``strategy="auto"`` uses ``direct`` on an OCS fabric (OrchestrRL's weight-sync template connects
only train PoDs to generator PoDs) and, when a shared cross-cluster link exists
(``FabricLinks.cross_bps``), builds both and keeps the one with the smaller predicted completion
time (ties go to ``direct``, which has fewer hops).
"""

from __future__ import annotations

import heapq
from collections import Counter
from typing import Sequence

from orchestrl.fabric.errors import ConfigError, InfeasiblePlanError

from orchestrl.collectives.layout import FabricLinks, GeneratorLayout, ParamSpec, TrainerLayout
from orchestrl.collectives.schedule import Block, Edge, Schedule, Wave
from orchestrl.collectives.slicing import assign_origins, group_blocks, split_pieces

__all__ = ["DEFAULT_CHUNK_BYTES", "STRATEGIES", "plan_weight_sync", "make_blocks", "check_names"]

#: Chunk (bucket) size: the unit of pipelining and the bound on per-stream buffer memory.
DEFAULT_CHUNK_BYTES = 4 << 20

#: Strategies; "auto" picks the faster predicted one (see the module note).
STRATEGIES = ("auto", "direct", "relay", "chain")

#: "auto" keeps a chain unless another strategy is predicted faster by more than this share: the
#: link model is fluid, but several TCP flows sharing a NIC lose throughput to each other (a relay
#: tree measured 24% slower than a chain at equal link rates in bench/weight_sync.py).
CHAIN_PREFERENCE = 0.10


def plan_weight_sync(params: Sequence[ParamSpec], trainer: TrainerLayout, generator: GeneratorLayout,
                     links: FabricLinks, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES, strategy: str = "auto",
                     max_block_bytes: int = 0) -> Schedule:
    """Return the weight-sync schedule from a trainer layout to a generator layout.

    Parameters
    ----------
    params : sequence of ParamSpec
        The model, unsharded shapes; names must be unique.
    trainer, generator : TrainerLayout, GeneratorLayout
        Who holds which slices, and who needs which.
    links : FabricLinks
        NIC and circuit rates, per-PoD boundary budgets, optional shared cross-cluster link.
    chunk_bytes : int
        Pipelining unit (bucket size); bounds buffer memory per stream.
    strategy : {"auto", "direct", "relay"}
        Phase A strategy (see the module note); "auto" considers "relay" only with a cross link.
    max_block_bytes : int
        If > 0, split shards into blocks of at most this many bytes, so one shard is spread over
        several seeds and trees.

    Returns
    -------
    Schedule
        Blocks, edges with start steps, waves, and the predicted completion time.

    Raises
    ------
    ConfigError
        For malformed input (duplicate names, sizes not divisible by a TP degree, bad strategy).
    InfeasiblePlanError
        If no strategy fits the boundary budgets (e.g. a budget of 0 where a block must cross).

    Notes
    -----
    O(P log P + U * W * D + B * M * log M) for P pieces, U Phase A units, W waves, D PoDs,
    B blocks and M receivers per PoD.

    Examples
    --------
    >>> params = [ParamSpec("w", (8, 4), "float32", tp_dim=0)]
    >>> gen = GeneratorLayout.uniform(pods=(1, 2), ranks_per_pod=2, tp=1)
    >>> s = plan_weight_sync(params, TrainerLayout(tp=2, pods=(0, 0)), gen, FabricLinks(nic_bps=8e9))
    >>> s.strategy, [(e.phase, e.src, e.dst) for e in s.edges if e.phase == "A"]
    ('direct', [('A', 0, 2), ('A', 0, 4), ('A', 1, 3), ('A', 1, 5)])
    >>> s.validate()
    """
    if strategy not in STRATEGIES:
        raise ConfigError("plan_weight_sync", "strategy", f"unknown strategy {strategy!r}", ", ".join(STRATEGIES))
    if chunk_bytes < 1:
        raise ConfigError("plan_weight_sync", "chunk_bytes", f"expected >= 1, got {chunk_bytes}", "bytes >= 1")
    blocks = make_blocks(params, trainer, generator, max_block_bytes)
    best: Schedule | None = None
    failures: list[InfeasiblePlanError] = []
    auto = ("direct", "relay", "chain") if links.cross_bps else ("direct",)
    built: dict[str, Schedule] = {}
    for s in (auto if strategy == "auto" else (strategy,)):
        try:
            build = _build_chain if s == "chain" else _build
            built[s] = build(s, tuple(params), trainer, generator, links, blocks, chunk_bytes)
        except InfeasiblePlanError as exc:
            failures.append(exc)
    if not built:
        raise failures[0]
    best = min(built.values(), key=lambda c: (c.predicted_s, STRATEGIES.index(c.strategy)))
    chain = built.get("chain")
    if chain is not None and chain.predicted_s <= best.predicted_s * (1 + CHAIN_PREFERENCE):
        return chain
    return best


def make_blocks(params: Sequence[ParamSpec], trainer: TrainerLayout, generator: GeneratorLayout,
                max_block_bytes: int = 0) -> list[Block]:
    """Return the blocks (origin, pieces, receivers as schedule ranks) for the layouts."""
    check_names(params, trainer)
    infos = split_pieces(params, trainer, generator)
    groups = group_blocks(assign_origins(infos, [p.row_bytes for p in params]), max_block_bytes)
    t = trainer.world_size
    return [Block(i, o, pcs, sum(p.nbytes for p in pcs), tuple(t + g for g in needers))
            for i, (o, needers, pcs) in enumerate(groups)]


def check_names(params: Sequence[ParamSpec], trainer: TrainerLayout | None = None) -> None:
    """Raise ConfigError unless engine names (aliases included) are unique, and trainer names are unique
    on each trainer rank that holds them.

    A trainer name is looked up on the ranks that hold the parameter, so the same local name may
    stand for different tensors on different pipeline stages (Megatron numbers layers from 0 on
    each) and on different expert ranks (local experts from 0 on each).
    """
    if not params:
        raise ConfigError("plan_weight_sync", "params", "is empty", "a non-empty list of parameters")
    ep = trainer.ep if trainer is not None else 1

    def holder(p: ParamSpec) -> tuple[int, int]:
        owner = -1 if p.expert is None else p.expert // max(1, (p.num_experts or ep) // ep)
        return p.pp_stage, owner

    sources = [f"{p.source_name} (stage {holder(p)[0]}{'' if holder(p)[1] < 0 else f', expert rank {holder(p)[1]}'})"
               for p in params]
    for what, names in (("name", [n for p in params for n in p.names]), ("source", sources)):
        dup = [n for n, c in Counter(names).items() if c > 1]
        if dup:
            raise ConfigError("plan_weight_sync", f"params[].{what}", f"duplicate names {dup[:3]}",
                              "one ParamSpec per tensor; tied weights as one spec with aliases")


# -- one strategy ------------------------------------------------------------------------------


def _build(strategy: str, params: tuple[ParamSpec, ...], trainer: TrainerLayout, generator: GeneratorLayout,
           links: FabricLinks, blocks: list[Block], chunk_bytes: int) -> Schedule:
    t = trainer.world_size
    pod = list(trainer.pods) + [r.pod for r in generator.ranks]
    chunks = [max(1, -(-b.nbytes // chunk_bytes)) for b in blocks]

    # Phase A units: the inter-PoD edges of one block that must run in the same wave.
    seed_load: Counter[int] = Counter()
    home_load: Counter[int] = Counter()
    units: list[list[tuple[int, int, int, str]]] = []
    for b in sorted(blocks, key=lambda x: (-x.nbytes, x.id)):
        by_pod: dict[int, list[int]] = {}
        for r in b.receivers:
            by_pod.setdefault(pod[r], []).append(r)

        def pick(p: int) -> int:
            members = by_pod[p]
            s = min(range(len(members)), key=lambda i: (seed_load[members[i]], (i - b.id) % len(members)))
            seed_load[members[s]] += b.nbytes
            return members[s]

        pods_b = sorted(by_pod)
        if strategy == "direct":
            units.extend([[(b.id, b.origin, pick(p), "A")] for p in pods_b])
        else:
            home = min(pods_b, key=lambda p: (home_load[p], (pods_b.index(p) - b.id) % len(pods_b)))
            home_load[home] += b.nbytes
            others = [p for p in pods_b if p != home]
            shift = b.id % len(others) if others else 0
            seeds = [pick(p) for p in [home] + others[shift:] + others[:shift]]
            # The copy that crossed goes PoD to PoD along a chain of seeds, so no seed sends it more than
            # once (a star from the home seed would make its NIC carry one copy per PoD).
            units.append([(b.id, b.origin, seeds[0], "A")] + [(b.id, a, c, "A-relay") for a, c in zip(seeds, seeds[1:])])

    # Waves: first-fit decreasing under every PoD's boundary budget.
    wave_units: list[list[int]] = []
    wave_use: list[Counter[int]] = []
    for u, edges in enumerate(units):
        inc: Counter[int] = Counter()
        for _, src, dst, _ in edges:
            if pod[src] != pod[dst]:
                inc[pod[src]] += 1
                inc[pod[dst]] += 1
        for p, need in inc.items():
            if need > links.budget(p):
                raise InfeasiblePlanError(
                    f"strategy {strategy!r}: block {edges[0][0]} needs {need} concurrent boundary circuit(s) at "
                    f"PoD {p}, whose budget is {links.budget(p)}; raise FabricLinks.budgets[{p}] to >= {need}"
                    + (" or use strategy='direct'" if strategy == "relay" else ""))
        for w, use in enumerate(wave_use):
            if all(use[p] + n <= links.budget(p) for p, n in inc.items()):
                wave_units[w].append(u)
                use.update(inc)
                break
        else:
            wave_units.append([u])
            wave_use.append(Counter(inc))

    edges: list[Edge] = []
    arrival: dict[tuple[int, int], int] = {}  # (block, rank) -> step chunk 0 arrives
    waves: list[Wave] = []
    step = 0
    phase_a_s = 0.0
    for w, members in enumerate(wave_units):
        flat = [e for u in members for e in units[u]]
        circuits = _equalise(flat, pod, blocks, links, wave_use[w])
        wave_s = _wave_time(flat, circuits, pod, blocks, links, t)
        hop = [k for u in members for k in range(len(units[u]))]  # position along the unit's relay chain
        for (b, src, dst, phase), c, k in zip(flat, circuits, hop):
            start = step + k
            edges.append(Edge(b, src, dst, phase, start, w, c if pod[src] != pod[dst] else 0))
            arrival[(b, dst)] = start
        # Each relay hop runs one step behind the one before, so the unit holds its circuits that much longer.
        steps = max(chunks[units[u][0][0]] + len(units[u]) - 1 for u in members)
        waves.append(Wave(w, step, steps, wave_s, dict(wave_use[w])))
        step += steps
        phase_a_s += wave_s

    tree_edges, egress, tail_s, tail_hops = _phase_b(blocks, pod, arrival, links, chunk_bytes, t)
    edges.extend(tree_edges)
    for e in edges:
        if e.phase == "A-relay":
            egress[e.src] += blocks[e.block].nbytes
    ingress: Counter[int] = Counter()
    for e in edges:
        if e.dst >= t:
            ingress[e.dst] += blocks[e.block].nbytes
    busiest = max(list(egress.values()) + list(ingress.values()) + [0])
    relay_hop = max((len(units[u]) - 1 for u in range(len(units))), default=0) if strategy == "relay" else 0
    return Schedule(
        params=params, trainer=trainer, generator=generator, links=links, blocks=tuple(blocks),
        edges=tuple(sorted(edges, key=lambda e: (e.start_step, e.block, e.src, e.dst))), waves=tuple(waves),
        chunk_bytes=chunk_bytes, strategy=strategy, predicted_phase_a_s=phase_a_s,
        predicted_phase_b_s=8.0 * busiest / links.nic_bps,
        predicted_tail_s=tail_s + relay_hop * 8.0 * chunk_bytes / links.nic_bps, tail_hops=tail_hops + relay_hop,
    )


def _build_chain(strategy: str, params: tuple[ParamSpec, ...], trainer: TrainerLayout, generator: GeneratorLayout,
                 links: FabricLinks, blocks: list[Block], chunk_bytes: int) -> Schedule:
    """One pipelined chain per receiver group: every link carries one flow, every boundary one copy.

    The blocks needed by the same generator ranks follow each other through one chain of those
    ranks, PoD after PoD (their origins take turns feeding its head); chains of different groups
    run side by side. The group's start member rotates, so chain heads and tails differ.
    """
    t = trainer.world_size
    pod = list(trainer.pods) + [r.pod for r in generator.ranks]
    groups: dict[tuple[int, ...], list[Block]] = {}
    for b in blocks:
        groups.setdefault(b.receivers, []).append(b)
    edges: list[Edge] = []
    use: Counter[int] = Counter()
    egress: Counter[int] = Counter()
    ingress: Counter[int] = Counter()
    cross = 0
    longest = 0
    steps = 0
    for g, (receivers, members) in enumerate(sorted(groups.items())):
        pods = sorted({pod[r] for r in receivers})
        pods = pods[g % len(pods):] + pods[:g % len(pods)]
        order = []
        for p in pods:
            inside = [r for r in receivers if pod[r] == p]
            order += inside[g % len(inside):] + inside[:g % len(inside)]
        cursor = 0
        for n, b in enumerate(members):
            hops = [b.origin] + order
            for k, (a, c) in enumerate(zip(hops, hops[1:])):
                inter = pod[a] != pod[c]
                phase = "A" if k == 0 else ("A-relay" if inter else "B")
                # The group's first block opens one circuit per boundary hop; the blocks after it follow
                # on the same circuit (the trainer PoD's circuit serves whichever origin feeds the head).
                opens = inter and n == 0
                edges.append(Edge(b.id, a, c, phase, cursor + k, 0 if opens else -1, 1 if opens else 0))
                egress[a] += b.nbytes
                ingress[c] += b.nbytes
                cross += b.nbytes if a < t <= c else 0
            cursor += max(1, -(-b.nbytes // chunk_bytes))
        for a, c in zip([members[0].origin] + order, order):
            if pod[a] != pod[c]:
                use[pod[a]] += 1
                use[pod[c]] += 1
        longest = max(longest, len(order))
        steps = max(steps, cursor + len(order) - 1)
    for p, n in use.items():
        if n > links.budget(p):
            raise InfeasiblePlanError(f"strategy 'chain' needs {n} concurrent boundary circuit(s) at PoD {p}, whose "
                                      f"budget is {links.budget(p)}")
    trainer_s = 8.0 * max((egress[r] for r in range(t)), default=0) / links.nic_bps
    phase_a_s = max(trainer_s, 8.0 * cross / links.cross_bps if links.cross_bps else 0.0)
    gen_bytes = max([egress[r] for r in egress if r >= t] + list(ingress.values()) + [0])
    return Schedule(
        params=params, trainer=trainer, generator=generator, links=links, blocks=tuple(blocks),
        edges=tuple(sorted(edges, key=lambda e: (e.start_step, e.block, e.src, e.dst))),
        waves=(Wave(0, 0, steps, phase_a_s, dict(use)),) if use else (), chunk_bytes=chunk_bytes,
        strategy=strategy, predicted_phase_a_s=phase_a_s, predicted_phase_b_s=8.0 * gen_bytes / links.nic_bps,
        predicted_tail_s=longest * 8.0 * chunk_bytes / links.nic_bps, tail_hops=longest)


def _edge_s(nbytes: int, circuits: int, links: FabricLinks) -> float:
    rate = min(max(circuits, 1) * links.link_bps, links.nic_bps)
    return 8.0 * nbytes / rate


def _equalise(flat: list[tuple[int, int, int, str]], pod: list[int], blocks: list[Block], links: FabricLinks,
              use: Counter[int]) -> list[int]:
    """Give each inter-PoD edge one circuit, then add circuits to the bottleneck edge (App. E.1)."""
    circuits = [1] * len(flat)
    left = {p: links.budget(p) - n for p, n in use.items()}
    heap = [(-_edge_s(blocks[b].nbytes, 1, links), i) for i, (b, src, dst, _) in enumerate(flat) if pod[src] != pod[dst]]
    heapq.heapify(heap)
    while heap:
        _, i = heapq.heappop(heap)
        b, src, dst, _ = flat[i]
        ps, pd = pod[src], pod[dst]
        if circuits[i] * links.link_bps >= links.nic_bps or left[ps] < 1 or left[pd] < 1:
            break  # the bottleneck cannot get faster, so the wave cannot either
        circuits[i] += 1
        left[ps] -= 1
        left[pd] -= 1
        use[ps] += 1
        use[pd] += 1
        heapq.heappush(heap, (-_edge_s(blocks[b].nbytes, circuits[i], links), i))
    return circuits


def _wave_time(flat: list[tuple[int, int, int, str]], circuits: list[int], pod: list[int], blocks: list[Block],
               links: FabricLinks, n_trainers: int) -> float:
    """Slowest of: any edge, any endpoint NIC, and the shared cross-cluster link."""
    worst = 0.0
    out: Counter[int] = Counter()
    into: Counter[int] = Counter()
    cross = 0
    for (b, src, dst, _), c in zip(flat, circuits):
        n = blocks[b].nbytes
        worst = max(worst, _edge_s(n, c, links))
        out[src] += n
        into[dst] += n
        if src < n_trainers <= dst:
            cross += n
    nic = max(list(out.values()) + list(into.values()))
    worst = max(worst, 8.0 * nic / links.nic_bps)
    if links.cross_bps:
        worst = max(worst, 8.0 * cross / links.cross_bps)
    return worst


def _phase_b(blocks: list[Block], pod: list[int], arrival: dict[tuple[int, int], int], links: FabricLinks,
             chunk_bytes: int, n_trainers: int) -> tuple[list[Edge], Counter[int], float, int]:
    """Build one k-ary tree per (block, PoD) from its seed; return edges, egress, tail seconds, hops."""
    trees: dict[int, list[tuple[Block, list[int]]]] = {}  # pod -> (block, [root] + other members)
    for b in blocks:
        by_pod: dict[int, list[int]] = {}
        for r in b.receivers:
            by_pod.setdefault(pod[r], []).append(r)
        for p, members in by_pod.items():
            root = next(r for r in members if (b.id, r) in arrival)
            others = [r for r in members if r != root]
            if others:
                shift = b.id % len(others)
                trees.setdefault(p, []).append((b, [root] + others[shift:] + others[:shift]))
    edges: list[Edge] = []
    egress: Counter[int] = Counter()
    tail_s, tail_hops = 0.0, 0
    chunk_s = 8.0 * chunk_bytes / links.nic_bps
    for p, items in sorted(trees.items()):
        k = _best_fanout(items, links, chunk_s)
        for b, order in items:
            depth = {order[0]: 0}
            for i in range(1, len(order)):
                parent = order[(i - 1) // k]
                start = arrival[(b.id, parent)] + 1
                edges.append(Edge(b.id, parent, order[i], "B", start))
                arrival[(b.id, order[i])] = start
                depth[order[i]] = depth[parent] + 1
                egress[parent] += b.nbytes
            hops = max(depth.values())
            tail_hops = max(tail_hops, hops)
            tail_s = max(tail_s, hops * min(k, len(order) - 1) * chunk_s)
    return edges, egress, tail_s, tail_hops


def _best_fanout(items: list[tuple[Block, list[int]]], links: FabricLinks, chunk_s: float) -> int:
    """Fan-out minimising busiest-NIC time plus pipeline depth; within 2% the larger fan-out wins.

    Every hop adds a step of latency that the cost model does not see, so near-ties go to the
    shallower tree.
    """
    n_max = max(len(order) for _, order in items)
    candidates = sorted({1, 2, 3, 4, n_max - 1} | {2 ** i for i in range(3, max(3, (n_max - 1).bit_length()))})
    best_k, best_cost = 1, float("inf")
    for k in (c for c in candidates if 1 <= c <= max(1, n_max - 1)):
        egress: Counter[int] = Counter()
        depth = 0
        for b, order in items:
            n = len(order)
            for i in range(n):
                kids = max(0, min(k, n - 1 - i * k))
                if kids:
                    egress[order[i]] += kids * b.nbytes
            d, reach = 0, 1
            while reach < n:
                d += 1
                reach += k ** d
            depth = max(depth, d)
        cost = 8.0 * max(egress.values(), default=0) / links.nic_bps + depth * k * chunk_s
        if cost <= best_cost * 1.02:
            best_k, best_cost = k, min(cost, best_cost)
    return best_k
