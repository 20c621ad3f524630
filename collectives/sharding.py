"""How one side (trainer or engine) lays a parameter's split dimension out over its TP ranks.

Design note
-----------
Both sides agree on a *canonical* tensor: the unsharded parameter as the engine's checkpoint
names it (for fused layers, the parts concatenated: ``[q; k; v]``, ``[gate; up]``; for
vocabularies, the true vocabulary without padding). Each side then says, for a TP degree ``t``
and a TP rank ``k``, which canonical rows of the split dimension its local shard holds and in
which order: a tuple of *runs* ``(lo, hi)`` laid end to end, followed by ``pad`` rows that hold no
canonical data. Every layout Megatron-core and vLLM use is one of four shapes of that map:

* **even** (default): rank ``k`` holds rows ``[k E/t, (k+1) E/t)`` -- column- and row-parallel
  linear layers.
* **fused** (``parts``): the canonical tensor is several parts concatenated and each part is split
  on its own, so rank ``k`` holds its slice of every part, part after part -- Megatron's SwiGLU
  ``linear_fc1`` (``[g_k; u_k]`` on rank ``k``), any Megatron parameter with
  ``partition_stride > 1``, vLLM's ``MergedColumnParallelLinear`` and ``QKVParallelLinear``. With
  ``heads``, a part is split by whole heads; a part with fewer heads than ranks is *replicated*:
  ``t / heads`` consecutive ranks hold the same head (vLLM's KV heads when TP exceeds them).
* **interleaved** (``groups``): the side stores the parts interleaved group by group
  (``q_g, k_g, v_g`` for each query group ``g``, Megatron-core's ``linear_qkv``) and splits that
  order evenly, which may cut a group when there are fewer groups than ranks (as Megatron does).
* **padded** (``pad_multiple``): the side pads the split dimension to a multiple of
  ``pad_multiple`` (times ``t`` with ``pad_per_tp``, Megatron's ``make_vocab_size_divisible_by``)
  and splits the padded length evenly (vLLM's ``VocabParallelEmbedding`` pads to 64); the last
  ranks hold fewer real rows and some padding, so real splits are uneven.

Everything the planner moves is derived from these runs, so a layout mismatch between the two
sides is resolved row by row instead of being sent as if the two layouts were the same.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Mapping

from orchestrl.fabric.errors import ConfigError

__all__ = ["Sharding", "Runs", "local_runs"]

#: A local shard's layout: canonical ``(lo, hi)`` row ranges in local order, then ``pad`` rows.
Runs = tuple[tuple[tuple[int, int], ...], int]


@dataclass(frozen=True)
class Sharding:
    """One side's layout of a parameter's split dimension (see the module note).

    Parameters
    ----------
    parts : tuple of int
        Sizes of the fused parts along the split dimension, in canonical order; empty means one part.
    heads : tuple of int
        Heads (indivisible units) per part; empty means every row is a unit.
    groups : int
        If > 0, the side interleaves the parts group by group and splits that order evenly.
    pad_multiple : int
        The side pads the split dimension to a multiple of this (1: no padding).
    pad_per_tp : bool
        The multiple is ``pad_multiple * tp`` (Megatron) rather than ``pad_multiple`` (vLLM).

    Examples
    --------
    >>> Sharding.fused(4, 4).runs(8, 2, 1)             # [g; u] -> rank 1 holds [g_1; u_1]
    (((2, 4), (6, 8)), 0)
    >>> Sharding.fused(8, 2, 2, heads=(4, 1, 1)).runs(12, 2, 0)   # q heads 0-1; the one KV head on both
    (((0, 4), (8, 12)), 0)
    >>> Sharding.interleaved(4, 2, 2, groups=2).runs(8, 2, 0)     # Megatron QKV: q_0 k_0 v_0
    (((0, 2), (4, 5), (6, 7)), 0)
    >>> Sharding.padded(4).runs(10, 2, 1)               # vocab 10 padded to 12: 4 real rows + 2 pad
    (((6, 10),), 2)
    """

    parts: tuple[int, ...] = ()
    heads: tuple[int, ...] = ()
    groups: int = 0
    pad_multiple: int = 1
    pad_per_tp: bool = False

    def __post_init__(self) -> None:
        object.__setattr__(self, "parts", tuple(int(p) for p in self.parts))
        object.__setattr__(self, "heads", tuple(int(h) for h in self.heads))
        src = "Sharding"
        if any(p < 1 for p in self.parts):
            raise ConfigError(src, "parts", f"has a size < 1: {self.parts}", "positive part sizes")
        if self.heads and len(self.heads) != len(self.parts):
            raise ConfigError(src, "heads", f"{len(self.heads)} entries for {len(self.parts)} parts",
                              "one head count per part, or empty")
        for p, h in zip(self.parts, self.heads):
            if h < 1 or p % h:
                raise ConfigError(src, "heads", f"{h} heads do not divide a part of {p} rows",
                                  "a head count that divides its part")
        if self.groups < 0 or (self.groups and (self.heads or len(self.parts) < 1)):
            raise ConfigError(src, "groups", f"{self.groups} with parts={self.parts} heads={self.heads}",
                              "groups >= 1 with parts and no heads (Megatron's interleaved QKV), or 0")
        for p in self.parts if self.groups else ():
            if p % self.groups:
                raise ConfigError(src, "groups", f"{self.groups} groups do not divide a part of {p} rows",
                                  "a group count that divides every part")
        if self.pad_multiple < 1:
            raise ConfigError(src, "pad_multiple", f"{self.pad_multiple} < 1", "a multiple >= 1")
        if self.pad_multiple > 1 and (self.parts or self.groups):
            raise ConfigError(src, "pad_multiple", "padding combined with fused parts",
                              "padding only on an unfused (vocabulary) dimension")

    # -- constructors ---------------------------------------------------------------------
    @classmethod
    def fused(cls, *parts: int, heads: tuple[int, ...] = ()) -> "Sharding":
        """Parts concatenated in the canonical tensor, each split on its own (optionally by heads)."""
        return cls(parts=tuple(parts), heads=tuple(heads))

    @classmethod
    def interleaved(cls, *parts: int, groups: int) -> "Sharding":
        """Parts stored group by group and split evenly in that order (Megatron-core ``linear_qkv``)."""
        return cls(parts=tuple(parts), groups=groups)

    @classmethod
    def padded(cls, multiple: int, per_tp: bool = False) -> "Sharding":
        """Split dimension padded to a multiple (times TP with ``per_tp``) and split evenly."""
        return cls(pad_multiple=multiple, pad_per_tp=per_tp)

    @property
    def is_even(self) -> bool:
        return self == _EVEN

    # -- the map ---------------------------------------------------------------------------
    def local_extent(self, extent: int, tp: int) -> int:
        """Rows of the split dimension in one rank's local shard (padding included)."""
        if self.pad_multiple > 1:
            return self.padded_extent(extent, tp) // tp
        return sum(hi - lo for lo, hi in self.runs(extent, tp, 0)[0])

    def padded_extent(self, extent: int, tp: int) -> int:
        """Length of the split dimension after this side's padding."""
        m = self.pad_multiple * (tp if self.pad_per_tp else 1)
        return -(-extent // m) * m

    def runs(self, extent: int, tp: int, rank: int) -> Runs:
        """Return the canonical rows rank ``rank`` of ``tp`` holds, in local order, and its pad rows.

        Raises
        ------
        ConfigError
            If the sizes do not split over ``tp`` ranks the way this layout needs.
        """
        return _runs(self, extent, tp, rank)

    def check(self, extent: int, tp: int, where: str) -> None:
        """Raise ConfigError (naming ``where``) unless this layout splits ``extent`` over ``tp``."""
        try:
            for k in range(tp):
                self.runs(extent, tp, k)
        except ConfigError as exc:
            raise ConfigError(where, exc.field, exc.problem, exc.allowed) from None

    # -- serialisation ---------------------------------------------------------------------
    def to_json(self) -> dict[str, object]:
        doc: dict[str, object] = {}
        if self.parts:
            doc["parts"] = list(self.parts)
        if self.heads:
            doc["heads"] = list(self.heads)
        if self.groups:
            doc["groups"] = self.groups
        if self.pad_multiple > 1:
            doc["pad_multiple"] = self.pad_multiple
            doc["pad_per_tp"] = self.pad_per_tp
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, object] | None) -> "Sharding":
        doc = doc or {}
        return cls(tuple(doc.get("parts", ())), tuple(doc.get("heads", ())), int(doc.get("groups", 0)),  # type: ignore[arg-type]
                   int(doc.get("pad_multiple", 1)), bool(doc.get("pad_per_tp", False)))  # type: ignore[arg-type]


_EVEN = Sharding()


def local_runs(sharding: Sharding, extent: int, tp: int, rank: int) -> Runs:
    """Functional alias of :meth:`Sharding.runs` (cached)."""
    return _runs(sharding, extent, tp, rank)


@lru_cache(maxsize=65536)
def _runs(s: Sharding, extent: int, tp: int, rank: int) -> Runs:
    if not 0 <= rank < tp:
        raise ConfigError("Sharding", "tp_rank", f"{rank} with TP {tp}", f"0..{tp - 1}")
    if s.pad_multiple > 1:
        padded = s.padded_extent(extent, tp)
        if padded % tp:
            raise ConfigError("Sharding", "pad_multiple", f"padded length {padded} is not divisible by TP {tp}",
                              "a multiple that TP divides")
        width = padded // tp
        lo, hi = rank * width, (rank + 1) * width
        real = (lo, min(hi, extent)) if lo < extent else None
        return ((real,) if real else (), width - (real[1] - real[0] if real else 0))
    parts = s.parts or (extent,)
    if sum(parts) != extent:
        raise ConfigError("Sharding", "parts", f"sum to {sum(parts)} but the split dimension has {extent} rows",
                          "part sizes that add up to the split dimension")
    offsets = [sum(parts[:i]) for i in range(len(parts))]
    if s.groups:
        return (_interleaved(parts, offsets, s.groups, extent, tp, rank), 0)
    out: list[tuple[int, int]] = []
    for i, (size, off) in enumerate(zip(parts, offsets)):
        units = s.heads[i] if s.heads else size
        rows = size // units
        if units >= tp:
            if units % tp and not s.parts:
                raise ConfigError("Sharding", "shape", f"the split dimension of {extent} rows is not divisible by "
                                  f"TP {tp}", "a size divisible by every TP degree in use")
            if units % tp:
                raise ConfigError("Sharding", "heads" if s.heads else "parts",
                                  f"a part of {units} {'heads' if s.heads else 'rows'} does not split over TP {tp}",
                                  "a TP degree that divides it")
            per = units // tp
            out.append((off + rank * per * rows, off + (rank + 1) * per * rows))
        else:
            if tp % units:
                raise ConfigError("Sharding", "heads", f"{units} heads cannot be replicated evenly over TP {tp}",
                                  "a TP degree that is a multiple of the head count")
            u = rank // (tp // units)
            out.append((off + u * rows, off + (u + 1) * rows))
    return (_merge(out), 0)


def _interleaved(parts: tuple[int, ...], offsets: list[int], groups: int, extent: int, tp: int,
                 rank: int) -> tuple[tuple[int, int], ...]:
    if extent % tp:
        raise ConfigError("Sharding", "groups", f"{extent} interleaved rows do not split over TP {tp}",
                          "a TP degree that divides the fused dimension")
    width = extent // tp
    lo, hi = rank * width, (rank + 1) * width
    out: list[tuple[int, int]] = []
    pos = 0  # position in the side's (interleaved) order
    for g in range(groups):
        for size, off in zip(parts, offsets):
            n = size // groups
            a, b = max(lo, pos), min(hi, pos + n)
            if a < b:
                start = off + g * n + (a - pos)
                out.append((start, start + (b - a)))
            pos += n
            if pos >= hi:
                return _merge(out)
    return _merge(out)


def _merge(runs: list[tuple[int, int]]) -> tuple[tuple[int, int], ...]:
    """Join runs that continue each other (local order is kept)."""
    out: list[tuple[int, int]] = []
    for lo, hi in runs:
        if out and out[-1][1] == lo:
            out[-1] = (out[-1][0], hi)
        else:
            out.append((lo, hi))
    return tuple(out)
