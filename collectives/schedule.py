"""The weight-sync schedule: what every rank sends and receives at each pipeline step.

Design note
-----------
A schedule is a list of *blocks* (a set of pieces with one origin rank) and *edges* (block ``b``
goes from ``src`` to ``dst``). A block is cut into chunks of ``chunk_bytes``; on an edge that
starts at step ``s``, chunk ``k`` moves at step ``s + k``. Every edge out of a non-origin rank
starts exactly one step after the edge into it, so a rank forwards chunk ``k`` while chunk
``k + 1`` arrives (pipelining) and holds at most two steps of chunks (double buffering): memory is
bounded by the chunk size, never by the model.

Steps order the work; they are not clock ticks. Each rank runs its own steps in order, posting all
of a step's sends and receives before waiting on any, so a rank only waits for the peers it talks
to. Within a step, ops are sorted per peer so that the lower rank of a pair posts its sends first
and the higher rank its receives first -- the order NCCL needs on one pair's stream.

Schedule ranks number trainer ranks ``0 .. T-1`` then generator ranks ``T .. T+G-1``.
"""

from __future__ import annotations

import gc
import hashlib
import json
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Mapping, NamedTuple

from orchestrl.collectives.layout import FabricLinks, GeneratorLayout, ParamSpec, TrainerLayout
from orchestrl.collectives.sharding import Runs
from orchestrl.collectives.slicing import Piece, generator_runs, trainer_runs

__all__ = ["PHASES", "Block", "Edge", "Wave", "Op", "Schedule"]

#: Edge phases: Phase A seeds a destination PoD across its boundary; "A-relay" copies a seeded
#: block to another generator PoD (one copy crosses a shared cross-cluster link); Phase B is the
#: intra-PoD tree; "chain" belongs to the chain-broadcast baseline, "gather" and "fetch" to the flat one.
PHASES = ("A", "A-relay", "B", "chain", "gather", "fetch")


@dataclass(frozen=True)
class Block:
    """Pieces that travel together: one origin, the same receivers."""

    id: int
    origin: int  # schedule rank that packs the block from its own tensors
    pieces: tuple[Piece, ...]
    nbytes: int
    receivers: tuple[int, ...]  # schedule ranks that end up holding the block


class Edge(NamedTuple):
    """Block ``block`` moves from ``src`` to ``dst``; chunk ``k`` at step ``start_step + k``.

    A named tuple rather than a frozen dataclass: a 256+256-rank schedule has ~80k edges, and every
    receiving rank rebuilds them from the published schedule (a tuple is ~10x cheaper to make).
    """

    block: int
    src: int
    dst: int
    phase: str
    start_step: int
    wave: int = -1  # Phase A / relay: the wave the edge runs in (-1: follows an earlier edge's circuit, chain)
    circuits: int = 0  # Phase A / relay: circuits allocated (App. E.1); 0 elsewhere


@dataclass(frozen=True)
class Wave:
    """One Phase A wave: inter-PoD edges that run concurrently within every PoD's budget."""

    index: int
    start_step: int
    steps: int
    predicted_s: float
    boundary_use: Mapping[int, int] = field(hash=False)  # PoD -> circuits in use during the wave


@dataclass(frozen=True)
class Op:
    """One send or receive of one chunk, as a rank executes it."""

    kind: str  # "send" | "recv"
    block: int
    chunk: int
    peer: int
    phase: str
    forward: bool = False  # a send of a chunk received at the previous step (not packed locally)


@dataclass(frozen=True)
class Schedule:
    """A complete weight-sync plan; built by :func:`collectives.plan.plan_weight_sync`.

    ``predicted_s`` is the completion time the link rates predict: the slower of Phase A (sum of
    wave times) and Phase B (busiest generator NIC), plus the pipeline tail.
    """

    params: tuple[ParamSpec, ...]
    trainer: TrainerLayout
    generator: GeneratorLayout
    links: FabricLinks
    blocks: tuple[Block, ...]
    edges: tuple[Edge, ...]
    waves: tuple[Wave, ...]
    chunk_bytes: int
    strategy: str  # "direct" | "relay" | "chain" | "flat"
    predicted_phase_a_s: float
    predicted_phase_b_s: float
    predicted_tail_s: float
    tail_hops: int  # hops the last chunk takes after crossing into the generation side
    full_ranks: tuple[int, ...] = ()  # ranks that end with whole parameters (flat baseline only)

    # -- ranks ----------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.trainer.world_size + self.generator.world_size

    def trainer_rank(self, i: int) -> int:
        """Schedule rank of trainer rank ``i``."""
        return i

    def generator_rank(self, j: int) -> int:
        """Schedule rank of generator rank ``j``."""
        return self.trainer.world_size + j

    def is_trainer(self, rank: int) -> bool:
        return rank < self.trainer.world_size

    def pod_of(self, rank: int) -> int:
        if self.is_trainer(rank):
            return self.trainer.pods[rank]
        return self.generator.ranks[rank - self.trainer.world_size].pod

    def rank_name(self, rank: int) -> str:
        """A name for messages: ``"generator 3 (rank 11, pod 2)"``."""
        if not 0 <= rank < self.world_size:
            return f"rank {rank}"
        if self.is_trainer(rank):
            return f"trainer {rank} (rank {rank}, pod {self.pod_of(rank)})"
        return f"generator {rank - self.trainer.world_size} (rank {rank}, pod {self.pod_of(rank)})"

    # -- sizes ----------------------------------------------------------------------------
    @property
    def model_bytes(self) -> int:
        return sum(p.nbytes for p in self.params)

    @property
    def predicted_s(self) -> float:
        return max(self.predicted_phase_a_s, self.predicted_phase_b_s) + self.predicted_tail_s

    @property
    def total_steps(self) -> int:
        return max((e.start_step + self.chunks(e.block) for e in self.edges), default=0)

    def chunks(self, block: int) -> int:
        """Number of chunks block ``block`` is cut into (at least one)."""
        return max(1, -(-self.blocks[block].nbytes // self.chunk_bytes))

    def chunk_payload(self, block: int, chunk: int) -> int:
        """Payload bytes of one chunk."""
        return min(self.chunk_bytes, self.blocks[block].nbytes - chunk * self.chunk_bytes)

    # -- what ranks hold ---------------------------------------------------------------------
    def runs(self, rank: int, param: int) -> Runs | None:
        """Canonical rows of ``param`` that ``rank`` holds when the sync is done, in its local order.

        None when the rank holds nothing of it. See :mod:`collectives.sharding` for the format.
        """
        p = self.params[param]
        if rank in self._full:
            return (((0, p.split_extent),), 0)
        if self.is_trainer(rank):
            return trainer_runs(p, self.trainer, rank)
        return generator_runs(p, self.generator.ranks[rank - self.trainer.world_size])

    def initial_runs(self, rank: int, param: int) -> Runs | None:
        """Canonical rows of ``param`` that ``rank`` brings to the sync (trainers only)."""
        if not self.is_trainer(rank):
            return None
        return trainer_runs(self.params[param], self.trainer, rank)

    def local_shape(self, rank: int, param: int, initial: bool = False) -> tuple[int, ...] | None:
        """Shape of ``rank``'s local tensor of ``param`` (padding rows included), or None."""
        runs = self.initial_runs(rank, param) if initial else self.runs(rank, param)
        if runs is None:
            return None
        rows = sum(hi - lo for lo, hi in runs[0]) + runs[1]
        return self.params[param].region_shape(0, rows)

    @cached_property
    def _full(self) -> frozenset[int]:
        return frozenset(self.full_ranks)

    # -- per-rank programs --------------------------------------------------------------------
    def program(self, rank: int) -> list[tuple[int, list[Op]]]:
        """Return ``rank``'s ops grouped by step, steps ascending, ops in posting order.

        Notes
        -----
        O(E + E_r * K log(E_r * K)) for E edges, E_r of them at the rank, and K chunks per block.
        """
        with no_gc():
            return self._program(rank)

    def _program(self, rank: int) -> list[tuple[int, list[Op]]]:
        by_step: dict[int, list[Op]] = {}
        for e in self.edges:
            if rank not in (e.src, e.dst):
                continue
            for k in range(self.chunks(e.block)):
                if e.src == rank:
                    op = Op("send", e.block, k, e.dst, e.phase, forward=e.src != self.blocks[e.block].origin)
                else:
                    op = Op("recv", e.block, k, e.src, e.phase)
                by_step.setdefault(e.start_step + k, []).append(op)

        def key(op: Op) -> tuple[int, bool, int, int]:
            first = "send" if rank < op.peer else "recv"
            return (op.peer, op.kind != first, op.block, op.chunk)

        return [(s, sorted(ops, key=key)) for s, ops in sorted(by_step.items())]

    def validate(self) -> None:
        """Check the invariants the executor relies on; raise ValueError naming the first broken one.

        Every forwarded chunk arrives one step before it leaves; every receiver gets each of its
        blocks exactly once; no rank receives a block it does not end up holding.
        """
        arrive: dict[tuple[int, int], int] = {}
        for e in self.edges:
            if (e.block, e.dst) in arrive:
                raise ValueError(f"block {e.block} reaches {self.rank_name(e.dst)} twice")
            arrive[(e.block, e.dst)] = e.start_step
        for e in self.edges:
            b = self.blocks[e.block]
            if e.src != b.origin and arrive.get((e.block, e.src)) != e.start_step - 1:
                raise ValueError(f"edge {e}: {self.rank_name(e.src)} forwards block {e.block} but does not "
                                 f"receive it one step earlier")
            if e.dst not in b.receivers:
                raise ValueError(f"edge {e}: {self.rank_name(e.dst)} is not a receiver of block {e.block}")
        for b in self.blocks:
            missing = [r for r in b.receivers if (b.id, r) not in arrive and r != b.origin]
            if missing:
                raise ValueError(f"block {b.id} never reaches {self.rank_name(missing[0])}")

    # -- serialisation -----------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        """Return a JSON-serialisable form; :meth:`from_json` inverts it."""
        return {
            "params": [p.to_json() for p in self.params],
            "trainer": self.trainer.to_json(),
            "generator": self.generator.to_json(),
            "links": self.links.to_json(),
            "blocks": [[b.id, b.origin, [[p.param, p.start, p.stop, p.nbytes] for p in b.pieces], b.nbytes,
                        list(b.receivers)] for b in self.blocks],
            # columns, not one list per edge: flat integer lists are what json parses fastest
            "edges": {f: [getattr(e, f) for e in self.edges] for f in Edge._fields},
            "waves": [[w.index, w.start_step, w.steps, w.predicted_s, {str(k): v for k, v in w.boundary_use.items()}]
                      for w in self.waves],
            "chunk_bytes": self.chunk_bytes,
            "strategy": self.strategy,
            "predicted": [self.predicted_phase_a_s, self.predicted_phase_b_s, self.predicted_tail_s],
            "tail_hops": self.tail_hops,
            "full_ranks": list(self.full_ranks),
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> "Schedule":
        pa, pb, pt = doc["predicted"]
        return cls(
            params=tuple(ParamSpec.from_json(p) for p in doc["params"]),
            trainer=TrainerLayout.from_json(doc["trainer"]),
            generator=GeneratorLayout.from_json(doc["generator"]),
            links=FabricLinks.from_json(doc["links"]),
            blocks=tuple(Block(i, o, tuple(Piece(*pc) for pc in pcs), n, tuple(rs)) for i, o, pcs, n, rs in doc["blocks"]),
            edges=_edges(doc["edges"]),
            waves=tuple(Wave(i, s, n, t, {int(k): v for k, v in use.items()}) for i, s, n, t, use in doc["waves"]),
            chunk_bytes=int(doc["chunk_bytes"]), strategy=str(doc["strategy"]),
            predicted_phase_a_s=pa, predicted_phase_b_s=pb, predicted_tail_s=pt,
            tail_hops=int(doc["tail_hops"]), full_ranks=tuple(doc.get("full_ranks", ())),
        )

    @cached_property
    def digest(self) -> str:
        """16 hex digits identifying the schedule; ranks refuse to run with peers on another one."""
        return blob_digest(self.canonical_json())

    def canonical_json(self) -> bytes:
        """The schedule as canonical JSON bytes (sorted keys, no spaces): what is published and digested."""
        return json.dumps(self.to_json(), sort_keys=True, separators=(",", ":")).encode()

    @classmethod
    def from_canonical_json(cls, blob: bytes) -> "Schedule":
        """Parse :meth:`canonical_json` output; the digest is the blob's, so it is not serialised again."""
        with no_gc():
            sch = cls.from_json(json.loads(blob))
        sch.__dict__["digest"] = blob_digest(blob)
        return sch

    def summary(self) -> dict[str, Any]:
        """Return the headline numbers (for CLIs and benchmark JSON)."""
        cross = sum(self.blocks[e.block].nbytes for e in self.edges
                    if self.is_trainer(e.src) and not self.is_trainer(e.dst))
        return {"strategy": self.strategy, "blocks": len(self.blocks), "edges": len(self.edges),
                "waves": len(self.waves), "steps": self.total_steps, "chunk_bytes": self.chunk_bytes,
                "model_bytes": self.model_bytes, "train_to_gen_bytes": cross,
                "predicted_s": self.predicted_s, "predicted_phase_a_s": self.predicted_phase_a_s,
                "predicted_phase_b_s": self.predicted_phase_b_s, "predicted_tail_s": self.predicted_tail_s}


@contextmanager
def no_gc():
    """Pause Python's cyclic garbage collector while building many objects that form no cycles.

    A schedule at 256 + 256 ranks is ~80,000 edges and their tuples; creating them triggers full
    collections that scan every object of the process (a receiving rank's model and torch state
    included): parsing and building one rank's program took 0.15-0.27 s with the collector paused
    against 0.52-0.78 s before, on a 2-core host (docs/benchmarks.md). The pause is process-wide
    (other threads run without cyclic collection for that long); the collector resumes, if it was
    on, on exit.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


def blob_digest(blob: bytes) -> str:
    """16 hex digits of SHA-256 over canonical schedule JSON."""
    return hashlib.sha256(blob).hexdigest()[:16]


def _edges(doc) -> tuple[Edge, ...]:
    """Edges from their columns (or, from documents written before the columns, one list per edge)."""
    if isinstance(doc, Mapping):
        return tuple(map(Edge._make, zip(*(doc[f] for f in Edge._fields))))
    return tuple(Edge(*row) for row in doc)
