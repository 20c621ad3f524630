"""What the weight-sync planner is told: the model, both clusters' layouts and the fabric's limits.

These are the contracts between a trainer, a generation engine and :mod:`collectives.plan`; they are
plain frozen dataclasses with units in their names, and importing them pulls in no torch.

A :class:`ParamSpec` describes one parameter as the engine's checkpoint holds it (the *canonical*
tensor) and, through a :class:`~collectives.sharding.Sharding` per side, how the trainer and the
engine lay its split dimension (``tp_dim``) out over their tensor-parallel ranks: evenly
(column-parallel ``tp_dim=0``, row-parallel ``tp_dim=1``), fused (Megatron's SwiGLU ``linear_fc1``,
vLLM's ``gate_up_proj`` and ``qkv_proj`` with replicated KV heads), interleaved (Megatron's
``linear_qkv``) or padded (vocabularies). Parameters with ``tp_dim=None`` are replicated. Trainer
rank ``r`` holds, for the parameters of its pipeline stage, the rows its sharding gives its TP rank;
a generator rank needs the rows the engine's sharding gives its TP rank of *every* parameter
(generation engines run without pipeline stages). Expert (MoE) parameters are described one expert
at a time (``expert``, ``num_experts``) and live on the expert-parallel rank that owns the expert,
split over the expert tensor-parallel group.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import Mapping, Sequence

from orchestrl.fabric.errors import ConfigError
from orchestrl.fabric.layout import ParallelLayout, parallel_groups

from orchestrl.collectives.sharding import Sharding

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

_EVEN = Sharding()


@dataclass(frozen=True)
class ParamSpec:
    """One named parameter of the model, as the engine's *unsharded* checkpoint holds it.

    Parameters
    ----------
    name : str
        The engine's name (what receivers are keyed by).
    shape : tuple of int
        Full canonical shape (true vocabulary, fused parts concatenated).
    dtype : str
        A key of :data:`DTYPE_BYTES`: what is sent and what the engine holds.
    tp_dim : int or None
        Dimension split across tensor-parallel ranks, or None for a replicated parameter.
    pp_stage : int
        Trainer pipeline stage that owns the parameter.
    trainer, engine : Sharding
        How the trainer and the engine lay ``tp_dim`` out over their TP ranks (default: evenly).
    source : str
        The trainer's name for the parameter ("" = ``name``): what :meth:`WeightSync.send` looks up.
    source_dtype : str
        The trainer's dtype ("" = ``dtype``), e.g. ``"float32"`` for fp32 master weights; each
        trainer rank casts its own shard to ``dtype`` while sending.
    aliases : tuple of str
        Other engine names of the same tensor (tied weights): sent once, delivered under every name.
    expert, num_experts : int or None, int
        For an expert (MoE) parameter: its global expert index and the number of experts of its layer.

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
    trainer: Sharding = _EVEN
    engine: Sharding = _EVEN
    source: str = ""
    source_dtype: str = ""
    aliases: tuple[str, ...] = ()
    expert: int | None = None
    num_experts: int = 0

    def __post_init__(self) -> None:
        src = f"ParamSpec {self.name!r}"
        object.__setattr__(self, "shape", tuple(int(s) for s in self.shape))
        object.__setattr__(self, "aliases", tuple(self.aliases))
        if not self.name:
            raise ConfigError("ParamSpec", "name", "is empty", "a non-empty parameter name")
        if any(s < 1 for s in self.shape):
            raise ConfigError(src, "shape", f"has a dimension < 1: {self.shape}", "positive dimensions")
        for fname in ("dtype", "source_dtype"):
            value = getattr(self, fname)
            if value not in DTYPE_BYTES and not (fname == "source_dtype" and value == ""):
                raise ConfigError(src, fname, f"unknown dtype {value!r}", ", ".join(DTYPE_BYTES))
        if self.tp_dim is not None and not 0 <= self.tp_dim < len(self.shape):
            raise ConfigError(src, "tp_dim", f"{self.tp_dim} is not a dimension of shape {self.shape}",
                              f"None or 0..{len(self.shape) - 1}")
        if self.tp_dim is None and not (self.trainer.is_even and self.engine.is_even):
            raise ConfigError(src, "tp_dim", "is None but a sharding is given", "a split dimension, or no sharding")
        if self.pp_stage < 0:
            raise ConfigError(src, "pp_stage", f"negative stage {self.pp_stage}", "a stage >= 0")
        if self.expert is not None and not 0 <= self.expert < self.num_experts:
            raise ConfigError(src, "expert", f"{self.expert} with num_experts={self.num_experts}",
                              "0 <= expert < num_experts")
        if self.name in self.aliases:
            raise ConfigError(src, "aliases", "repeats the parameter's own name", "other names only")

    @property
    def itemsize(self) -> int:
        """Bytes per element."""
        return DTYPE_BYTES[self.dtype]

    @property
    def source_name(self) -> str:
        """The trainer's name for this parameter."""
        return self.source or self.name

    @property
    def trainer_dtype(self) -> str:
        """The dtype the trainer holds the parameter in."""
        return self.source_dtype or self.dtype

    @property
    def names(self) -> tuple[str, ...]:
        """Every engine name the parameter is delivered under."""
        return (self.name,) + self.aliases

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
        """Shape of ``hi - lo`` rows along :attr:`split_dim`."""
        if not self.shape:
            return ()
        s = list(self.shape)
        s[self.split_dim] = hi - lo
        return tuple(s)

    def to_json(self) -> dict[str, object]:
        doc: dict[str, object] = {"name": self.name, "shape": list(self.shape), "dtype": self.dtype,
                                  "tp_dim": self.tp_dim, "pp_stage": self.pp_stage}
        # Optional fields only when set, so plain models keep their old documents and digests.
        for key, value in (("trainer", self.trainer.to_json()), ("engine", self.engine.to_json()),
                           ("source", self.source), ("source_dtype", self.source_dtype),
                           ("aliases", list(self.aliases)), ("num_experts", self.num_experts)):
            if value:
                doc[key] = value
        if self.expert is not None:
            doc["expert"] = self.expert
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, object]) -> "ParamSpec":
        return cls(str(doc["name"]), tuple(doc["shape"]), str(doc["dtype"]),  # type: ignore[arg-type]
                   doc.get("tp_dim"), int(doc.get("pp_stage", 0)),  # type: ignore[arg-type]
                   Sharding.from_json(doc.get("trainer")), Sharding.from_json(doc.get("engine")),  # type: ignore[arg-type]
                   str(doc.get("source", "")), str(doc.get("source_dtype", "")),
                   tuple(doc.get("aliases", ())), doc.get("expert"), int(doc.get("num_experts", 0)))  # type: ignore[arg-type]


@dataclass(frozen=True)
class TrainerLayout:
    """The training job's parallel layout (Megatron-core rank order) and where its ranks sit.

    Parameters
    ----------
    tp, pp, dp, cp : int
        Tensor, pipeline, data and context parallel sizes; the world is ``tp * cp * dp * pp`` ranks.
        Context-parallel ranks hold the same weights, like data-parallel ones.
    ep : int
        Expert-parallel size: expert parameters are split over ``ep`` ranks (Megatron re-partitions
        the same ranks for expert layers).
    expert_tp : int or None
        Tensor-parallel size inside expert layers (None: ``tp``, Megatron's default).
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
    >>> moe = TrainerLayout(tp=2, dp=2, ep=2, expert_tp=1)
    >>> [moe.ep_rank(r) for r in range(4)], [moe.expert_tp_rank(r) for r in range(4)]
    ([0, 1, 0, 1], [0, 0, 0, 0])
    """

    tp: int = 1
    pp: int = 1
    dp: int = 1
    pods: tuple[int, ...] = ()
    gpus: tuple[int, ...] = ()
    order: str = "tp-cp-ep-dp-pp"
    cp: int = 1
    ep: int = 1
    expert_tp: int | None = None
    _coords: tuple[tuple[int, int, int, int], ...] = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        layout = ParallelLayout(tp=self.tp, cp=self.cp, ep=self.ep, dp=self.dp, pp=self.pp, order=self.order,
                                expert_tp=self.expert_tp)
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

        def index(kind: str) -> dict[int, int]:
            return {r: i for grp in groups[kind] for i, r in enumerate(grp)}

        tp, pp, ep, etp = index("tp"), index("pp"), index("ep"), index("expert-tp")
        object.__setattr__(self, "_coords", tuple((tp[r], pp[r], ep[r], etp[r]) for r in range(n)))

    @property
    def world_size(self) -> int:
        """Number of trainer ranks."""
        return self.tp * self.cp * self.pp * self.dp

    @property
    def expert_tp_size(self) -> int:
        """Tensor-parallel size inside expert layers."""
        return self.tp if self.expert_tp is None else self.expert_tp

    def tp_rank(self, rank: int) -> int:
        """Tensor-parallel rank of trainer ``rank``."""
        return self._coords[rank][0]

    def pp_rank(self, rank: int) -> int:
        """Pipeline stage of trainer ``rank``."""
        return self._coords[rank][1]

    def ep_rank(self, rank: int) -> int:
        """Expert-parallel rank of trainer ``rank``."""
        return self._coords[rank][2]

    def expert_tp_rank(self, rank: int) -> int:
        """Tensor-parallel rank of trainer ``rank`` inside expert layers."""
        return self._coords[rank][3]

    def coords(self, rank: int) -> dict[str, int]:
        """Trainer ``rank``'s place as a framework states it (the ``coords`` of :meth:`WeightSync.send`).

        >>> TrainerLayout(tp=2, pp=2).coords(3)
        {'tp': 1, 'pp': 1, 'ep': 0, 'expert_tp': 1}
        """
        tp, pp, ep, etp = self._coords[rank]
        return {"tp": tp, "pp": pp, "ep": ep, "expert_tp": etp}

    def to_json(self) -> dict[str, object]:
        doc: dict[str, object] = {"tp": self.tp, "pp": self.pp, "dp": self.dp, "pods": list(self.pods),
                                  "gpus": list(self.gpus), "order": self.order}
        for key, value, default in (("cp", self.cp, 1), ("ep", self.ep, 1), ("expert_tp", self.expert_tp, None)):
            if value != default:
                doc[key] = value
        return doc

    @classmethod
    def from_json(cls, doc: Mapping[str, object]) -> "TrainerLayout":
        return cls(int(doc["tp"]), int(doc["pp"]), int(doc["dp"]), tuple(doc["pods"]),  # type: ignore[arg-type]
                   tuple(doc.get("gpus", ())), str(doc.get("order", "tp-cp-ep-dp-pp")),  # type: ignore[arg-type]
                   int(doc.get("cp", 1)), int(doc.get("ep", 1)), doc.get("expert_tp"))  # type: ignore[arg-type]


@dataclass(frozen=True)
class GeneratorRank:
    """One generation GPU: its PoD, its engine and its place in the engine's parallel groups.

    Parameters
    ----------
    pod : int
        PoD of the GPU.
    tp_size, tp_rank : int
        The engine's tensor-parallel degree and this rank's place in it.
    gpu : int
        Fabric GPU index, for fabric demand; -1 when unknown.
    ep_size, ep_rank : int
        Expert parallelism of the engine (vLLM's ``enable_expert_parallel``): which share of the
        experts this rank holds. 1 and 0 when experts are not split by expert.
    expert_tp_size, expert_tp_rank : int
        Tensor parallelism inside expert layers; 0 means ``tp_size`` / ``tp_rank`` without expert
        parallelism and 1 / 0 with it (vLLM's rule).
    engine : int
        Which model replica (engine) the rank belongs to; -1 lets :class:`GeneratorLayout` infer it
        (a new engine starts at each rank with ``tp_rank == ep_rank == 0``).
    """

    pod: int
    tp_size: int = 1
    tp_rank: int = 0
    gpu: int = -1
    ep_size: int = 1
    ep_rank: int = 0
    expert_tp_size: int = 0
    expert_tp_rank: int = 0
    engine: int = -1

    def __post_init__(self) -> None:
        if self.tp_size < 1 or not 0 <= self.tp_rank < self.tp_size:
            raise ConfigError("GeneratorRank", "tp_rank", f"{self.tp_rank} with tp_size {self.tp_size}",
                              "tp_size >= 1 and 0 <= tp_rank < tp_size")
        if self.ep_size < 1 or not 0 <= self.ep_rank < self.ep_size:
            raise ConfigError("GeneratorRank", "ep_rank", f"{self.ep_rank} with ep_size {self.ep_size}",
                              "ep_size >= 1 and 0 <= ep_rank < ep_size")
        if not self.expert_tp_size:
            object.__setattr__(self, "expert_tp_size", self.tp_size if self.ep_size == 1 else 1)
            object.__setattr__(self, "expert_tp_rank", self.tp_rank if self.ep_size == 1 else 0)
        if not 0 <= self.expert_tp_rank < self.expert_tp_size:
            raise ConfigError("GeneratorRank", "expert_tp_rank",
                              f"{self.expert_tp_rank} with expert_tp_size {self.expert_tp_size}",
                              "0 <= expert_tp_rank < expert_tp_size")

    def to_json(self) -> list[int]:
        row = [self.pod, self.tp_size, self.tp_rank, self.gpu]
        extra = [self.ep_size, self.ep_rank, self.expert_tp_size, self.expert_tp_rank, self.engine]
        plain = GeneratorRank(self.pod, self.tp_size, self.tp_rank, self.gpu)
        if extra != [plain.ep_size, plain.ep_rank, plain.expert_tp_size, plain.expert_tp_rank, plain.engine]:
            row += extra  # only when set, so plain layouts keep their old documents and digests
        return row


@dataclass(frozen=True)
class GeneratorLayout:
    """All generation GPUs, in generator-rank order (engines may differ in TP degree).

    ``engines`` groups generator ranks into model replicas: every engine must hold the whole
    model between its ranks, which :func:`collectives.plan.plan_weight_sync` checks.

    Examples
    --------
    >>> g = GeneratorLayout.uniform(pods=(1, 2), ranks_per_pod=2, tp=2)
    >>> [(r.pod, r.tp_rank) for r in g.ranks], g.engines
    ([(1, 0), (1, 1), (2, 0), (2, 1)], ((0, 1), (2, 3)))
    """

    ranks: tuple[GeneratorRank, ...]
    engines: tuple[tuple[int, ...], ...] = field(default=(), init=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ranks", tuple(self.ranks))
        if not self.ranks:
            raise ConfigError("GeneratorLayout", "ranks", "is empty", "at least one generator rank")
        groups: dict[tuple[str, int], list[int]] = {}
        inferred = 0
        for j, r in enumerate(self.ranks):
            prev = self.ranks[j - 1] if j else None
            if r.engine >= 0:
                key = ("given", r.engine)
            else:
                if prev is None or prev.engine >= 0 or (r.tp_rank, r.ep_rank) == (0, 0) \
                        or (prev.tp_size, prev.ep_size) != (r.tp_size, r.ep_size):
                    inferred += 1
                key = ("inferred", inferred)
            groups.setdefault(key, []).append(j)
        object.__setattr__(self, "engines", tuple(tuple(v) for v in groups.values()))

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
        return [r.to_json() for r in self.ranks]

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
