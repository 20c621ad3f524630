"""Baseline weight-sync schedules, kept to measure the planner against (same executor, same checks).

* :func:`plan_chain` -- a pipelined chain broadcast, the way NCCL's ring broadcast moves data:
  every bucket goes from the trainer rank that owns it to the first generator, which forwards it
  chunk by chunk to the next, and so on through every generator (PoD by PoD, so it crosses each
  boundary once). Buckets follow each other back to back, so the chain streams continuously. Like
  a broadcast, it delivers *whole* tensors to every generator rank, which its engine's loader
  slices (vLLM's ``load_weights`` takes whole checkpoint tensors).
* :func:`plan_flat` -- veRL-style: trainer rank 0 gathers the whole model, then every generator
  rank fetches a full copy from it, all at once, so ``G`` copies cross the link between the
  clusters (RollMux §5.2, Figure 8 top). Nobody should pick it; it is kept for RollMux's figure.

Both are :class:`~collectives.schedule.Schedule` objects, so the executor, checksums and timeouts
that run the planned schedule run them too and a comparison measures only the communication
pattern. The third baseline, ``torch.distributed.broadcast`` of each bucket from its owner (as
checkpoint engines do), runs torch's own collective and lives in
:mod:`collectives.emulation.broadcast`.
"""

from __future__ import annotations

from typing import Sequence

from orchestrl.collectives.layout import FabricLinks, GeneratorLayout, GeneratorRank, ParamSpec, TrainerLayout
from orchestrl.collectives.plan import DEFAULT_CHUNK_BYTES, check_names
from orchestrl.collectives.schedule import Block, Edge, Schedule
from orchestrl.collectives.slicing import Piece, assign_origins, split_pieces

__all__ = ["plan_flat", "plan_chain", "owner_buckets"]


def owner_buckets(params: Sequence[ParamSpec], trainer: TrainerLayout, bucket_bytes: int = 0,
                  prefer: int = -1) -> list[tuple[int, tuple[Piece, ...]]]:
    """Return ``(owner trainer rank, pieces)`` buckets covering the whole model once.

    Pieces are the trainer's own slices (cut at its shard boundaries), each owned by one of its
    holders with equal bytes per holder, as in the planned schedule; ``bucket_bytes`` > 0 cuts an
    owner's pieces into buckets of at most that size (a piece is never split). Pieces that trainer
    ``prefer`` holds are all owned by it (the flat baseline's gathering rank).

    Examples
    --------
    >>> [(o, [(p.start, p.stop) for p in pcs]) for o, pcs in
    ...  owner_buckets([ParamSpec("w", (4, 2), "float32", tp_dim=0)], TrainerLayout(tp=2))]
    [(0, [(0, 2)]), (1, [(2, 4)])]
    """
    check_names(params, trainer)
    whole = GeneratorLayout((GeneratorRank(0),))  # one TP=1 engine: every generator needs everything
    infos = split_pieces(params, trainer, whole)
    mine = [(i, prefer) for i in infos if prefer in i.holders]
    assigned = mine + assign_origins([i for i in infos if prefer not in i.holders], [p.row_bytes for p in params])
    by_owner: dict[int, list[Piece]] = {}
    for info, owner in assigned:
        by_owner.setdefault(owner, []).append(info.piece)
    out: list[tuple[int, tuple[Piece, ...]]] = []
    for owner, pieces in sorted(by_owner.items()):
        run: list[Piece] = []
        size = 0
        for pc in sorted(pieces):
            if run and bucket_bytes and size + pc.nbytes > bucket_bytes:
                out.append((owner, tuple(run)))
                run, size = [], 0
            run.append(pc)
            size += pc.nbytes
        out.append((owner, tuple(run)))
    return out


def plan_chain(params: Sequence[ParamSpec], trainer: TrainerLayout, generator: GeneratorLayout,
               links: FabricLinks, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Schedule:
    """Return the pipelined chain broadcast: owner -> g0 -> g1 -> ... for every bucket, back to back.

    Notes
    -----
    O(P log P + B * G) for P pieces, B buckets and G generator ranks.

    Examples
    --------
    >>> gen = GeneratorLayout.uniform(pods=(1,), ranks_per_pod=2)
    >>> s = plan_chain([ParamSpec("w", (4, 4), "float32", tp_dim=0)], TrainerLayout(tp=2), gen,
    ...                FabricLinks(nic_bps=1e9))
    >>> [(e.src, e.dst, e.start_step) for e in s.edges]
    [(0, 2, 0), (2, 3, 1), (1, 2, 1), (2, 3, 2)]
    """
    params = tuple(params)
    t = trainer.world_size
    order = sorted(range(generator.world_size), key=lambda j: (generator.ranks[j].pod, j))
    chain = [t + j for j in order]
    blocks: list[Block] = []
    edges: list[Edge] = []
    step = 0
    for owner, pieces in owner_buckets(params, trainer):
        b = Block(len(blocks), owner, pieces, sum(p.nbytes for p in pieces), tuple(sorted(chain)))
        blocks.append(b)
        hops = [owner] + chain
        for k, (src, dst) in enumerate(zip(hops, hops[1:])):
            edges.append(Edge(b.id, src, dst, "chain", step + k))
        step += max(1, -(-b.nbytes // chunk_bytes))
    model = sum(p.nbytes for p in params)
    rate = min(links.nic_bps, links.cross_bps or links.nic_bps)
    return Schedule(params=params, trainer=trainer, generator=generator, links=links, blocks=tuple(blocks),
                    edges=tuple(edges), waves=(), chunk_bytes=chunk_bytes, strategy="chain",
                    predicted_phase_a_s=8.0 * model / rate, predicted_phase_b_s=0.0,
                    predicted_tail_s=len(chain) * 8.0 * chunk_bytes / links.nic_bps, tail_hops=len(chain),
                    full_ranks=tuple(chain))


def plan_flat(params: Sequence[ParamSpec], trainer: TrainerLayout, generator: GeneratorLayout,
              links: FabricLinks, *, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Schedule:
    """Return the gather-then-fetch schedule: trainer 0 gathers, every generator fetches the full model.

    Notes
    -----
    O(P log P + G) for P pieces and G generator ranks.

    Examples
    --------
    >>> gen = GeneratorLayout.uniform(pods=(1,), ranks_per_pod=2)
    >>> s = plan_flat([ParamSpec("w", (4, 4), "float32", tp_dim=0)], TrainerLayout(tp=2), gen,
    ...               FabricLinks(nic_bps=1e9))
    >>> [(e.phase, e.src, e.dst) for e in s.edges]
    [('gather', 1, 0), ('fetch', 0, 2), ('fetch', 0, 3)]
    """
    params = tuple(params)
    t = trainer.world_size
    blocks: list[Block] = []
    edges: list[Edge] = []
    for owner, pieces in owner_buckets(params, trainer, prefer=0):
        if owner == 0:
            continue  # trainer 0 already holds its own pieces
        b = Block(len(blocks), owner, pieces, sum(p.nbytes for p in pieces), (0,))
        blocks.append(b)
        edges.append(Edge(b.id, owner, 0, "gather", 0))
    gather_steps = max((-(-b.nbytes // chunk_bytes) for b in blocks), default=0)
    whole = tuple(Piece(i, 0, p.split_extent, p.nbytes) for i, p in enumerate(params))
    receivers = tuple(range(t, t + generator.world_size))
    full = Block(len(blocks), 0, whole, sum(p.nbytes for p in whole), receivers)
    blocks.append(full)
    edges.extend(Edge(full.id, 0, g, "fetch", gather_steps) for g in receivers)

    into_root = sum(b.nbytes for b in blocks[:-1])
    gather_s = 8.0 * into_root / links.nic_bps
    copies = full.nbytes * len(receivers)
    fetch_s = 8.0 * copies / links.nic_bps
    if links.cross_bps:
        fetch_s = max(fetch_s, 8.0 * copies / links.cross_bps)
    return Schedule(params=params, trainer=trainer, generator=generator, links=links, blocks=tuple(blocks),
                    edges=tuple(edges), waves=(), chunk_bytes=chunk_bytes, strategy="flat",
                    predicted_phase_a_s=gather_s + fetch_s, predicted_phase_b_s=0.0, predicted_tail_s=0.0,
                    tail_hops=0, full_ranks=(0,) + receivers)
