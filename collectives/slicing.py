"""Who holds and who needs each slice of the model: runs, pieces, shard owners and blocks.

Design note
-----------
Each side's sharding (:mod:`collectives.sharding`) maps a rank to the canonical rows of a
parameter's split dimension it holds (trainer) or needs (generator), as *runs*. The unit the
planner moves is a *piece*: an interval of canonical rows between two consecutive boundaries of all
runs of both sides, so every piece lies inside one run of every rank that touches it. A piece is
held whole by every trainer rank whose runs cover it (the DP/CP replicas of its TP slice and
stage, or of its expert) and needed whole by every generator rank whose runs cover it, so sending
pieces delivers exactly the rows each generator rank needs, in whatever order its local layout
keeps them, and no trainer rank ever sends more than its own shard.

Each piece gets exactly one *origin* among its holders. Pieces with the same holders are cut into
as many equal byte ranges as there are holders (at row boundaries, splitting a piece where a cut
falls inside it) and each holder originates one range, so every trainer NIC sends an equal share
even when one tensor (an ``lm_head``) dominates the model (RollMux's shard-scatter: "each training
GPU transmits a unique shard"). Pieces with the same origin and the same set of needing generator
ranks form a *block*: the unit that gets one Phase A edge per destination PoD and one Phase B tree
per PoD.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from orchestrl.fabric.errors import ConfigError

from orchestrl.collectives.layout import GeneratorLayout, GeneratorRank, ParamSpec, TrainerLayout
from orchestrl.collectives.sharding import Runs

__all__ = ["Piece", "PieceInfo", "trainer_runs", "generator_runs", "split_pieces", "assign_origins",
           "group_blocks"]


@dataclass(frozen=True, order=True)
class Piece:
    """An interval ``[start, stop)`` of one parameter's canonical split dimension."""

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


def _whole(param: ParamSpec) -> Runs:
    return (((0, param.split_extent),), 0)


def _expert_owner(param: ParamSpec, ep: int, who: str) -> int:
    if param.num_experts % ep:
        raise ConfigError(f"ParamSpec {param.name!r}", "num_experts",
                          f"{param.num_experts} experts do not split over the {who}'s expert parallelism {ep}",
                          "an expert-parallel size that divides the number of experts")
    return param.expert // (param.num_experts // ep)  # type: ignore[operator]


def trainer_runs(param: ParamSpec, trainer: TrainerLayout, rank: int) -> Runs | None:
    """Return the canonical rows trainer ``rank`` holds of ``param`` (local order), or None.

    Examples
    --------
    >>> trainer_runs(ParamSpec("w", (8, 2), tp_dim=0), TrainerLayout(tp=4), 1)
    (((2, 4),), 0)
    """
    if trainer.pp_rank(rank) != param.pp_stage:
        return None
    if param.expert is not None:
        if trainer.ep_rank(rank) != _expert_owner(param, trainer.ep, "trainer"):
            return None
        tp, k = trainer.expert_tp_size, trainer.expert_tp_rank(rank)
    else:
        tp, k = trainer.tp, trainer.tp_rank(rank)
    if param.tp_dim is None:
        return _whole(param)
    return param.trainer.runs(param.split_extent, tp, k)


def generator_runs(param: ParamSpec, rank: GeneratorRank) -> Runs | None:
    """Return the canonical rows a generator rank needs of ``param`` (local order), or None."""
    if param.expert is not None:
        if rank.ep_rank != _expert_owner(param, rank.ep_size, "engine"):
            return None
        tp, k = rank.expert_tp_size, rank.expert_tp_rank
    else:
        tp, k = rank.tp_size, rank.tp_rank
    if param.tp_dim is None:
        return _whole(param)
    return param.engine.runs(param.split_extent, tp, k)


def split_pieces(params: Sequence[ParamSpec], trainer: TrainerLayout,
                 generator: GeneratorLayout) -> list[PieceInfo]:
    """Return the common refinement of every rank's runs, with holders and needers.

    Raises
    ------
    ConfigError
        If a layout does not split a parameter (sizes not divisible), a stage has no trainer rank,
        a row is held by no trainer rank, or an engine does not hold the whole model (a missing
        TP rank would leave part of every tensor undelivered).

    Notes
    -----
    O(N * (R + I * K)) for N parameters, R ranks, I pieces per parameter and K distinct layouts
    (ranks with the same coordinates share their runs).

    Examples
    --------
    >>> gen = GeneratorLayout.uniform(pods=(1,), ranks_per_pod=1, tp=1)
    >>> [(i.piece.start, i.piece.stop, i.holders) for i in
    ...  split_pieces([ParamSpec("w", (4, 2), "float32", tp_dim=0)], TrainerLayout(tp=2), gen)]
    [(0, 2, (0,)), (2, 4, (1,))]
    """
    engine_of = {j: e for e, members in enumerate(generator.engines) for j in members}
    out: list[PieceInfo] = []
    for i, p in enumerate(params):
        if p.pp_stage >= trainer.pp:
            raise ConfigError(f"ParamSpec {p.name!r}", "pp_stage", f"{p.pp_stage} but the trainer has "
                              f"{trainer.pp} pipeline stage(s)", f"0..{trainer.pp - 1}")
        held: dict[Runs, list[int]] = {}
        needed: dict[Runs, list[int]] = {}
        try:
            for r in range(trainer.world_size):
                runs = trainer_runs(p, trainer, r)
                if runs is not None:
                    held.setdefault(runs, []).append(r)
            for g, rank in enumerate(generator.ranks):
                runs = generator_runs(p, rank)
                if runs is not None:
                    needed.setdefault(runs, []).append(g)
        except ConfigError as exc:
            raise ConfigError(f"ParamSpec {p.name!r}", exc.field, f"{exc.problem} (shape {p.shape}, "
                              f"tp_dim {p.tp_dim})", exc.allowed) from None
        cuts = {0, p.split_extent}
        for runs in list(held) + list(needed):
            for lo, hi in runs[0]:
                cuts.update((lo, hi))
        bounds = sorted(cuts)
        at = {b: k for k, b in enumerate(bounds)}
        holders: list[list[int]] = [[] for _ in bounds[1:]]
        needers: list[list[int]] = [[] for _ in bounds[1:]]
        for table, into in ((held, holders), (needed, needers)):
            for runs, ranks in table.items():
                for lo, hi in runs[0]:
                    for k in range(at[lo], at[hi]):
                        into[k].extend(ranks)
        for k, (lo, hi) in enumerate(zip(bounds, bounds[1:])):
            if not holders[k]:
                raise ConfigError(f"ParamSpec {p.name!r}", "trainer", f"rows [{lo}, {hi}) are held by no "
                                  "trainer rank", "a trainer sharding that covers every row")
            engines = {engine_of[g] for g in needers[k]}
            if len(engines) != len(generator.engines):
                e = min(set(range(len(generator.engines))) - engines)
                members = generator.engines[e]
                ranks = generator.ranks[members[0]]
                raise ConfigError("GeneratorLayout", "ranks",
                                  f"engine {e} (generator ranks {list(members)}, TP {ranks.tp_size}) has no rank "
                                  f"that needs rows [{lo}, {hi}) of {p.name!r}, so they would go nowhere; "
                                  f"its TP ranks are {sorted(generator.ranks[j].tp_rank for j in members)}",
                                  "every engine complete: one GeneratorRank per TP rank 0..tp_size-1 "
                                  "(and per expert-parallel rank)")
            out.append(PieceInfo(Piece(i, lo, hi, (hi - lo) * p.row_bytes), tuple(sorted(holders[k])),
                                 tuple(sorted(needers[k]))))
    return out


def assign_origins(infos: Sequence[PieceInfo],
                   row_bytes: Sequence[int] | None = None) -> list[tuple[PieceInfo, int]]:
    """Return ``(piece, origin)`` pairs that give every holder of a holder set an equal byte share.

    Pieces with the same holders are laid end to end and cut into ``len(holders)`` equal byte
    ranges at row boundaries (``row_bytes[param]``; pieces are only cut where a range boundary
    falls inside them); the ``k``-th holder originates the ``k``-th range. Without ``row_bytes``
    pieces are never cut and go longest-first to the least loaded holder.

    Notes
    -----
    O(P log P) for P pieces; at most ``H - 1`` extra pieces per holder set of size ``H``.

    Examples
    --------
    >>> a, b = Piece(0, 0, 10, 10), Piece(1, 0, 6, 6)
    >>> [(i.piece, o) for i, o in assign_origins([PieceInfo(a, (0, 1), (0,)), PieceInfo(b, (0, 1), (0,))], [1, 1])]
    [(Piece(param=0, start=0, stop=8, nbytes=8), 0), (Piece(param=0, start=8, stop=10, nbytes=2), 1), \
(Piece(param=1, start=0, stop=6, nbytes=6), 1)]
    """
    if row_bytes is None:
        load: dict[int, int] = {}
        origin = [-1] * len(infos)
        for idx in sorted(range(len(infos)), key=lambda k: (-infos[k].piece.nbytes, infos[k].piece)):
            best = min(infos[idx].holders, key=lambda r: (load.get(r, 0), r))
            origin[idx] = best
            load[best] = load.get(best, 0) + infos[idx].piece.nbytes
        return list(zip(infos, origin))
    sets: dict[tuple[int, ...], list[PieceInfo]] = {}
    for info in infos:
        sets.setdefault(info.holders, []).append(info)
    out: list[tuple[PieceInfo, int]] = []
    for holders, members in sets.items():
        total = sum(i.piece.nbytes for i in members)
        n = len(holders)
        done = 0  # bytes already assigned in this holder set
        for info in members:
            pc = info.piece
            rb = row_bytes[pc.param]
            start = pc.start
            while start < pc.stop:
                k = min(n - 1, done * n // total) if total else 0
                boundary = (k + 1) * total / n  # where holder k's share ends
                rows_left = pc.stop - start
                take = rows_left if k == n - 1 else min(rows_left, max(1, round((boundary - done) / rb)))
                part = Piece(pc.param, start, start + take, take * rb)
                out.append((PieceInfo(part, info.holders, info.needers), holders[k]))
                done += part.nbytes
                start += take
    return out


def group_blocks(assigned: Sequence[tuple[PieceInfo, int]],
                 max_block_bytes: int = 0) -> list[tuple[int, tuple[int, ...], tuple[Piece, ...]]]:
    """Return ``(origin, needers, pieces)`` per block, pieces in parameter order.

    ``max_block_bytes`` > 0 splits a block into consecutive runs of at most that many bytes (a
    piece is never split), so a big shard can be disseminated by several trees at once.

    Notes
    -----
    O(P log P) for P pieces.
    """
    groups: dict[tuple[int, tuple[int, ...]], list[Piece]] = {}
    for info, o in assigned:
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
