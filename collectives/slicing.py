"""Who holds and who needs each slice of the model: pieces, regions, shard owners and blocks.

Design note
-----------
Trainer and generator TP degrees may differ, so the unit the planner moves is a *piece*: the
intersection of one trainer TP slice and one generator TP slice of a parameter, i.e. an interval of
its split dimension between two consecutive boundaries of the common refinement of both slicings.
Every piece is held whole by every trainer rank of its TP slice and pipeline stage (the DP
replicas) and needed whole by every generator rank whose slice covers it, so sending pieces
delivers exactly the slices each generator rank needs and no trainer rank ever holds more than its
own shard.

Each piece gets exactly one *origin* among its holders, chosen longest-piece-first onto the least
loaded holder, so the model is partitioned into per-trainer shards of near-equal bytes (RollMux's
shard-scatter: "each training GPU transmits a unique shard"). Pieces with the same origin and the
same set of needing generator ranks form a *block*: the unit that gets one Phase A edge per
destination PoD and one Phase B tree per PoD.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from fabric.errors import ConfigError

from collectives.layout import GeneratorLayout, GeneratorRank, ParamSpec, TrainerLayout

__all__ = ["Piece", "PieceInfo", "trainer_region", "generator_region", "split_pieces", "assign_origins",
           "group_blocks"]


@dataclass(frozen=True, order=True)
class Piece:
    """An interval ``[start, stop)`` of one parameter's split dimension."""

    param: int  # index into the schedule's parameter list
    start: int
    stop: int
    nbytes: int


@dataclass(frozen=True)
class PieceInfo:
    """A piece with the trainer ranks holding it and the generator ranks needing it."""

    piece: Piece
    holders: tuple[int, ...]  # trainer ranks
    needers: tuple[int, ...]  # generator indices (0-based, generator-rank order)


def trainer_region(param: ParamSpec, trainer: TrainerLayout, rank: int) -> tuple[int, int] | None:
    """Return the ``[lo, hi)`` of ``param``'s split dimension trainer ``rank`` holds, or None.

    Examples
    --------
    >>> trainer_region(ParamSpec("w", (8, 2), tp_dim=0), TrainerLayout(tp=4), 1)
    (2, 4)
    """
    if trainer.pp_rank(rank) != param.pp_stage:
        return None
    return _slice(param, trainer.tp, trainer.tp_rank(rank))


def generator_region(param: ParamSpec, rank: GeneratorRank) -> tuple[int, int]:
    """Return the ``[lo, hi)`` of ``param``'s split dimension a generator rank needs."""
    return _slice(param, rank.tp_size, rank.tp_rank)


def _slice(param: ParamSpec, tp: int, tp_rank: int) -> tuple[int, int]:
    ext = param.split_extent
    if param.tp_dim is None:
        return (0, ext)
    width = ext // tp
    return (tp_rank * width, (tp_rank + 1) * width)


def split_pieces(params: Sequence[ParamSpec], trainer: TrainerLayout,
                 generator: GeneratorLayout) -> list[PieceInfo]:
    """Return the common refinement of trainer and generator slicings, with holders and needers.

    Raises
    ------
    ConfigError
        If a TP degree does not divide a sharded dimension or a stage has no trainer rank.

    Notes
    -----
    O(N * (T + G)) for N parameters, T trainer and G generator ranks.

    Examples
    --------
    >>> gen = GeneratorLayout.uniform(pods=(1,), ranks_per_pod=1, tp=1)
    >>> [(i.piece.start, i.piece.stop, i.holders) for i in
    ...  split_pieces([ParamSpec("w", (4, 2), "float32", tp_dim=0)], TrainerLayout(tp=2), gen)]
    [(0, 2, (0,)), (2, 4, (1,))]
    """
    degrees = sorted({trainer.tp} | {r.tp_size for r in generator.ranks})
    out: list[PieceInfo] = []
    for i, p in enumerate(params):
        if p.pp_stage >= trainer.pp:
            raise ConfigError(f"ParamSpec {p.name!r}", "pp_stage", f"{p.pp_stage} but the trainer has "
                              f"{trainer.pp} pipeline stage(s)", f"0..{trainer.pp - 1}")
        cuts = {0, p.split_extent}
        if p.tp_dim is not None:
            for t in degrees:
                if p.split_extent % t:
                    raise ConfigError(f"ParamSpec {p.name!r}", "shape",
                                      f"dimension {p.tp_dim} of size {p.split_extent} is not divisible by TP {t}",
                                      f"a size divisible by every TP degree in use {degrees}")
                cuts.update(range(0, p.split_extent, p.split_extent // t))
        bounds = sorted(cuts)
        for lo, hi in zip(bounds, bounds[1:]):
            holders = tuple(r for r in range(trainer.world_size)
                            if (reg := trainer_region(p, trainer, r)) and reg[0] <= lo and hi <= reg[1])
            needers = tuple(g for g, rank in enumerate(generator.ranks)
                            if (reg := generator_region(p, rank))[0] <= lo and hi <= reg[1])
            out.append(PieceInfo(Piece(i, lo, hi, (hi - lo) * p.row_bytes), holders, needers))
    return out


def assign_origins(infos: Sequence[PieceInfo]) -> list[int]:
    """Return one origin trainer rank per piece, balancing bytes across holders (LPT greedy).

    Notes
    -----
    O(P log P + P * H) for P pieces with at most H holders each. Ties go to the lower rank, so the
    result is deterministic.

    Examples
    --------
    >>> a, b = Piece(0, 0, 1, 10), Piece(1, 0, 1, 6)
    >>> assign_origins([PieceInfo(a, (0, 1), (0,)), PieceInfo(b, (0, 1), (0,))])
    [0, 1]
    """
    load: dict[int, int] = {}
    origin = [-1] * len(infos)
    for idx in sorted(range(len(infos)), key=lambda k: (-infos[k].piece.nbytes, infos[k].piece)):
        holders = infos[idx].holders
        best = min(holders, key=lambda r: (load.get(r, 0), r))
        origin[idx] = best
        load[best] = load.get(best, 0) + infos[idx].piece.nbytes
    return origin


def group_blocks(infos: Sequence[PieceInfo], origins: Sequence[int],
                 max_block_bytes: int = 0) -> list[tuple[int, tuple[int, ...], tuple[Piece, ...]]]:
    """Return ``(origin, needers, pieces)`` per block, pieces in parameter order.

    ``max_block_bytes`` > 0 splits a block into consecutive runs of at most that many bytes (a
    piece is never split), so a big shard can be disseminated by several trees at once.

    Notes
    -----
    O(P log P) for P pieces.
    """
    groups: dict[tuple[int, tuple[int, ...]], list[Piece]] = {}
    for info, o in zip(infos, origins):
        if info.needers:
            groups.setdefault((o, info.needers), []).append(info.piece)
    out = []
    for (o, needers), pieces in sorted(groups.items()):
        run: list[Piece] = []
        size = 0
        for pc in sorted(pieces):
            if run and max_block_bytes and size + pc.nbytes > max_block_bytes:
                out.append((o, needers, tuple(run)))
                run, size = [], 0
            run.append(pc)
            size += pc.nbytes
        if run:
            out.append((o, needers, tuple(run)))
    return out
