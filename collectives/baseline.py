"""The flat, veRL-style weight sync, kept only as a baseline to measure against.

Trainer rank 0 first gathers the whole model from the other trainer ranks; then every generator
rank fetches a full copy from it, all at once, across whatever lies between them -- so with ``G``
generator ranks ``G`` copies cross the inter-cluster link (RollMux §5.2, Figure 8 top). It is
expressed as a :class:`~collectives.schedule.Schedule` so the same executor, checksums and
timeouts run it, and the comparison measures only the communication pattern.
"""

from __future__ import annotations

from typing import Sequence

from collectives.layout import FabricLinks, GeneratorLayout, ParamSpec, TrainerLayout
from collectives.plan import DEFAULT_CHUNK_BYTES
from collectives.schedule import Block, Edge, Schedule
from collectives.slicing import Piece, assign_origins, split_pieces, trainer_region

__all__ = ["plan_flat"]


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
    infos = split_pieces(params, trainer, generator)
    origins = assign_origins(infos)
    gather: dict[int, list[Piece]] = {}
    for info, origin in zip(infos, origins):
        mine = trainer_region(params[info.piece.param], trainer, 0)
        if mine and mine[0] <= info.piece.start and info.piece.stop <= mine[1]:
            continue  # trainer 0 already holds it
        gather.setdefault(origin, []).append(info.piece)
    blocks: list[Block] = []
    edges: list[Edge] = []
    for origin, pieces in sorted(gather.items()):
        b = Block(len(blocks), origin, tuple(sorted(pieces)), sum(p.nbytes for p in pieces), (0,))
        blocks.append(b)
        edges.append(Edge(b.id, origin, 0, "gather", 0))
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
