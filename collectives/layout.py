"""What the weight-sync planner is told: the model, both clusters' layouts and the fabric's limits.

These are the contracts between a trainer, a generation engine and :mod:`collectives.plan`; they are
plain frozen dataclasses with units in their names, and importing them pulls in no torch.

A parameter is sharded along at most one dimension (``tp_dim``), the way Megatron-style
column-parallel (``tp_dim=0``) and row-parallel (``tp_dim=1``) layers are; parameters with
``tp_dim=None`` (norms, biases of row-parallel layers) are replicated on every TP rank. Trainer
rank ``r`` holds, for the parameters of its pipeline stage, the ``tp_rank(r)``-th of ``tp`` equal
slices; a generator rank with TP degree ``t`` needs the ``tp_rank``-th of ``t`` equal slices of
*every* parameter (generation engines run without pipeline stages).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import Mapping, Sequence

from fabric.errors import ConfigError
from fabric.layout import ParallelLayout, parallel_groups

__all__ = [
    "DTYPE_BYTES",
    "ParamSpec",
    "TrainerLayout",
    "GeneratorRank",
    "GeneratorLayout",
    "FabricLinks",
]

#: Bytes per element of the dtypes a parameter may have (torch's names).
DTYPE_BYTES: dict[str, int] = {
    "float64": 8, "float32": 4, "bfloat16": 2, "float16": 2,
    "float8_e4m3fn": 1, "float8_e5m2": 1, "int64": 8, "int32": 4, "int8": 1, "uint8": 1,
}


@dataclass(frozen=True)
class ParamSpec:
    """One named parameter of the model, as the *unsharded* checkpoint holds it.

    Parameters
    ----------
    name : str
        The name both sides use (the generator's name: a trainer converts its own naming first).
    shape : tuple of int
        Full (unsharded) shape.
    dtype : str
        A key of :data:`DTYPE_BYTES`.
    tp_dim : int or None
        Dimension split across tensor-parallel ranks, or None for a replicated parameter.
    pp_stage : int
        Trainer pipeline stage that owns the parameter.

    Examples
    --------
    >>> p = ParamSpec("layers.0.mlp.up.weight", (8, 4), "bfloat16", tp_dim=0)
    >>> p.nbytes, p.split_extent, p.row_bytes
    (64, 8, 8)
    """

    name: str
    shape: tuple[int, ...]
    dtype: str = "bfloat16"
    tp_dim: int | None = None
    pp_stage: int = 0

    def __post_init__(self) -> None:
        src = f"ParamSpec {self.name!r}"
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        if not self.name:
            raise ConfigError("ParamSpec", "name", "is empty", "a non-empty parameter name")
        if any(s < 1 for s in self.shape):
            raise ConfigError(src, "shape", f"has a dimension < 1: {self.shape}", "positive dimensions")
        if self.dtype not in DTYPE_BYTES:
            raise ConfigError(src, "dtype", f"unknown dtype {self.dtype!r}", ", ".join(DTYPE_BYTES))
        if self.tp_dim is not None and not 0 <= self.tp_dim < len(self.shape):
            raise ConfigError(src, "tp_dim", f"{self.tp_dim} is not a dimension of shape {self.shape}",
                              f"None or 0..{len(self.shape) - 1}")
        if self.pp_stage < 0:
            raise ConfigError(src, "pp_stage", f"negative stage {self.pp_stage}", "a stage >= 0")

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return DTYPE_BYTES[self.dtype]

    @property
    def numel(self) -> int:
        """Elements of the full parameter."""
        return prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Bytes of the full parameter."""
        return self.numel * self.itemsize

    @property
    def split_dim(self) -> int:
        """Dimension that slices are taken along (``tp_dim``, or 0 for a replicated parameter)."""
        return self.tp_dim if self.tp_dim is not None else 0

    @property
    def split_extent(self) -> int:
        """Length of :attr:`split_dim` (1 for a scalar)."""
        return self.shape[self.split_dim] if self.shape else 1

    @property
    def row_bytes(self) -> int:
        """Bytes of one index along :attr:`split_dim` of the full parameter."""
        return self.nbytes // self.split_extent

    def region_shape(self, lo: int, hi: int) -> tuple[int, ...]:
        """Shape of the slice ``[lo, hi)`` along :attr:`split_dim`."""
        if not self.shape:
            return ()
        s = list(self.shape)
        s[self.split_dim] = hi - lo
        return tuple(s)

    def to_json(self) -> dict[str, object]:
        return {"name": self.name, "shape": list(self.shape), "dtype": self.dtype, "tp_dim": self.tp_dim,
                "pp_stage": self.pp_stage}

    @classmethod
    def from_json(cls, doc: Mapping[str, object]) -> "ParamSpec":
        return cls(str(doc["name"]), tuple(doc["shape"]), str(doc["dtype"]),  # type: ignore[arg-type]
                   doc.get("tp_dim"), int(doc.get("pp_stage", 0)))  # type: ignore[arg-type]


@dataclass(frozen=True)
class TrainerLayout:
    """The training job's parallel layout (Megatron rank order) and where its ranks sit.

    Parameters
    ----------
    tp, pp, dp : int
        Tensor, pipeline and data parallel sizes; the world is ``tp * pp * dp`` ranks.
    pods : tuple of int
        PoD of each trainer rank; empty means every rank is in PoD 0.
    gpus : tuple of int
        Fabric GPU index of each trainer rank (for :mod:`collectives.fabric_demand`); may be empty.
    order : str
        Megatron's rank order, fastest dimension first (see :class:`fabric.layout.ParallelLayout`).

    Examples
    --------
    >>> lay = TrainerLayout(tp=2, pp=2)
    >>> [lay.tp_rank(r) for r in range(4)], [lay.pp_rank(r) for r in range(4)]
    ([0, 1, 0, 1], [0, 0, 1, 1])
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    pods: tuple[int, ...] = ()
    gpus: tuple[int, ...] = ()
    order: str = "tp-cp-ep-dp-pp"
    _coords: tuple[tuple[int, int], ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        layout = ParallelLayout(tp=self.tp, pp=self.pp, dp=self.dp, order=self.order)
        n = layout.world_size
        object.__setattr__(self, "pods", tuple(int(p) for p in self.pods) or (0,) * n)
        object.__setattr__(self, "gpus", tuple(int(g) for g in self.gpus))
        if len(self.pods) != n:
            raise ConfigError("TrainerLayout", "pods", f"has {len(self.pods)} entries for {n} ranks",
                              f"one PoD per rank ({n}) or empty")
        if self.gpus and len(self.gpus) != n:
            raise ConfigError("TrainerLayout", "gpus", f"has {len(self.gpus)} entries for {n} ranks",
                              f"one GPU per rank ({n}) or empty")
        groups = parallel_groups(layout, list(range(n)))
        tp_rank = {r: i for grp in groups["tp"] for i, r in enumerate(grp)}
        pp_rank = {r: i for grp in groups["pp"] for i, r in enumerate(grp)}
        object.__setattr__(self, "_coords", tuple((tp_rank[r], pp_rank[r]) for r in range(n)))

    @property
    def world_size(self) -> int:
        """Number of trainer ranks."""
        return self.tp * self.pp * self.dp

    def tp_rank(self, rank: int) -> int:
        """Tensor-parallel rank of trainer ``rank``."""
        return self._coords[rank][0]

    def pp_rank(self, rank: int) -> int:
        """Pipeline stage of trainer ``rank``."""
        return self._coords[rank][1]

    def to_json(self) -> dict[str, object]:
        return {"tp": self.tp, "pp": self.pp, "dp": self.dp, "pods": list(self.pods), "gpus": list(self.gpus),
                "order": self.order}

    @classmethod
    def from_json(cls, doc: Mapping[str, object]) -> "TrainerLayout":
        return cls(int(doc["tp"]), int(doc["pp"]), int(doc["dp"]), tuple(doc["pods"]),  # type: ignore[arg-type]
                   tuple(doc.get("gpus", ())), str(doc.get("order", "tp-cp-ep-dp-pp")))  # type: ignore[arg-type]


@dataclass(frozen=True)
class GeneratorRank:
    """One generation GPU: its PoD and its place in its engine's tensor-parallel group."""

    pod: int
    tp_size: int = 1
    tp_rank: int = 0
    gpu: int = -1  # fabric GPU index, for fabric demand; -1 when unknown

    def __post_init__(self) -> None:
        if self.tp_size < 1 or not 0 <= self.tp_rank < self.tp_size:
            raise ConfigError("GeneratorRank", "tp_rank", f"{self.tp_rank} with tp_size {self.tp_size}",
                              "tp_size >= 1 and 0 <= tp_rank < tp_size")


@dataclass(frozen=True)
class GeneratorLayout:
    """All generation GPUs, in generator-rank order (engines may differ in TP degree).

    Examples
    --------
    >>> g = GeneratorLayout.uniform(pods=(1, 2), ranks_per_pod=2, tp=2)
    >>> [(r.pod, r.tp_rank) for r in g.ranks]
    [(1, 0), (1, 1), (2, 0), (2, 1)]
    """

    ranks: tuple[GeneratorRank, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranks", tuple(self.ranks))
        if not self.ranks:
            raise ConfigError("GeneratorLayout", "ranks", "is empty", "at least one generator rank")

    @classmethod
    def uniform(cls, pods: Sequence[int], ranks_per_pod: int, tp: int = 1,
                gpus: Sequence[int] = ()) -> "GeneratorLayout":
        """Return ``ranks_per_pod`` ranks in each PoD, grouped into TP-``tp`` engines."""
        if ranks_per_pod % tp:
            raise ConfigError("GeneratorLayout", "tp", f"{tp} does not divide ranks_per_pod={ranks_per_pod}",
                              f"a divisor of {ranks_per_pod}")
        slots = [(p, i) for p in pods for i in range(ranks_per_pod)]
        gl = list(gpus)
        if gl and len(gl) != len(slots):
            raise ConfigError("GeneratorLayout", "gpus", f"has {len(gl)} entries for {len(slots)} ranks",
                              f"one GPU per rank ({len(slots)}) or empty")
        return cls(tuple(GeneratorRank(p, tp, i % tp, gl[k] if gl else -1) for k, (p, i) in enumerate(slots)))

    @property
    def world_size(self) -> int:
        return len(self.ranks)

    @property
    def pods(self) -> tuple[int, ...]:
        """The distinct PoDs, sorted."""
        return tuple(sorted({r.pod for r in self.ranks}))

    def to_json(self) -> list[list[int]]:
        return [[r.pod, r.tp_size, r.tp_rank, r.gpu] for r in self.ranks]

    @classmethod
    def from_json(cls, doc: Sequence[Sequence[int]]) -> "GeneratorLayout":
        return cls(tuple(GeneratorRank(*map(int, row)) for row in doc))


@dataclass(frozen=True)
class FabricLinks:
    """The fabric limits the planner schedules against (OrchestrRL App. E, RollMux §5.2).

    Parameters
    ----------
    nic_bps : float
        Rate of one rank's NIC, each direction.
    link_bps : float, optional
        Line rate of one circuit (``B_link``); defaults to ``nic_bps``. An edge with ``c`` circuits
        runs at ``min(c * link_bps, nic_bps)``.
    budgets : mapping of int -> int
        Per-PoD boundary concurrency budget ``d_p``: circuits crossing that PoD's boundary at once
        (each inter-PoD edge counts one unit at both ends). PoDs not listed get ``default_budget``.
    default_budget : int
        Budget of unlisted PoDs.
    cross_bps : float or None
        Aggregate rate of a train -> generation cluster link that every trainer-to-generator edge
        shares (RollMux's geo-disaggregated cross-cluster Ethernet); None when the PoDs meet only
        through OCS-Core circuits.
    """

    nic_bps: float
    link_bps: float = 0.0
    budgets: Mapping[int, int] = field(default_factory=dict, hash=False)
    default_budget: int = 8
    cross_bps: float | None = None

    def __post_init__(self) -> None:
        if not self.nic_bps > 0:
            raise ConfigError("FabricLinks", "nic_bps", f"expected > 0, got {self.nic_bps!r}", "a rate in bit/s > 0")
        if not self.link_bps:
            object.__setattr__(self, "link_bps", float(self.nic_bps))
        if self.cross_bps is not None and not self.cross_bps > 0:
            raise ConfigError("FabricLinks", "cross_bps", f"expected > 0 or None, got {self.cross_bps!r}",
                              "a rate in bit/s > 0, or None")
        for pod, d in self.budgets.items():
            if int(d) < 0:
                raise ConfigError("FabricLinks", f"budgets[{pod}]", f"negative budget {d}", "0 or more circuits")
        if self.default_budget < 1:
            raise ConfigError("FabricLinks", "default_budget", f"budget {self.default_budget} < 1",
                              "at least one concurrent boundary circuit")

    def budget(self, pod: int) -> int:
        """Boundary budget ``d_p`` of ``pod``."""
        return int(self.budgets.get(pod, self.default_budget))

    def to_json(self) -> dict[str, object]:
        return {"nic_bps": self.nic_bps, "link_bps": self.link_bps,
                "budgets": {str(k): v for k, v in self.budgets.items()},
                "default_budget": self.default_budget, "cross_bps": self.cross_bps}

    @classmethod
    def from_json(cls, doc: Mapping[str, object]) -> "FabricLinks":
        budgets = {int(k): int(v) for k, v in dict(doc.get("budgets", {})).items()}  # type: ignore[arg-type]
        return cls(float(doc["nic_bps"]), float(doc.get("link_bps", 0.0)), budgets,  # type: ignore[arg-type]
                   int(doc.get("default_budget", 8)), doc.get("cross_bps"))  # type: ignore[arg-type]
