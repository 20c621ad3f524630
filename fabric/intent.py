"""Intent descriptors (OrchestrRL §5.3): what a job will communicate in its next period.

Design note
-----------
Before each stable communication period a job announces an *intent*: its stage, the collectives it
will run, who takes part in each (group membership, as global GPU indices) and how many bytes each
rank moves. The controller turns it into demand (:mod:`fabric.traffic`) and caches a topology
template under :meth:`Intent.signature`, which depends on the *shape* of the communication only,
so the cache keeps hitting when volumes change from iteration to iteration or a failed server is
replaced by another.

YAML format
-----------
One document per intent; unknown keys are refused and every error names the file and field::

    job: rl-job-1              # required: the job's name
    stage: train               # required: train | train-dp | gen | weight-sync
    period: fwd-bwd            # optional label of the recurring period (default: the stage)
    template: null             # optional: a topology template name that overrides the stage's
    layout:                    # optional: Megatron parallel layout, so collectives can say `over`
      tp: 4                    #   tp, cp, ep, dp, pp: sizes (default 1); world = tp*cp*dp*pp
      ep: 4
      dp: 4
      pp: 2
      expert_tp: 4             #   optional; default tp
      order: tp-cp-ep-dp-pp    #   optional; Megatron's rank order, fastest dimension first
      gpus: "0-31"             #   required: job rank r runs on the r-th GPU listed
    collectives:               # required, non-empty list
      - {primitive: all-to-all, over: ep, bytes_per_rank: 2.0e9}       # groups from the layout
      - {primitive: all-reduce, groups: [[0, 8], [1, 9]], bytes_per_rank: 1.0e9}  # explicit
      - {primitive: weight-sync, train_gpus: "0-31", gen_gpus: "32-63", model_bytes: 2.9e10}
      - {primitive: m2n, src_gpus: "32-47", dst_gpus: "48-55", bytes_per_rank: 1.0e8}
      - {primitive: response-stream, gen_gpus: "32-63", train_gpus: "0-31", bytes_per_rank: 4.0e6}

A GPU set is a list of GPU indices, or a string of comma-joined indices and ``a-b`` ranges
(``"0-15,32-47"``; ``a-b`` includes both ends). Grouped primitives (all-reduce, all-gather,
reduce-scatter, all-to-all, p2p) take either ``over`` (a group kind of
:data:`fabric.layout.GROUP_NAMES`) or ``groups``. Every GPU must exist in the topology.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections import Counter
from dataclasses import dataclass
from functools import cached_property
from typing import Any, Mapping

from orchestrl.fabric.config import Reader, load_document
from orchestrl.fabric.errors import ConfigError
from orchestrl.fabric.layout import GROUP_NAMES, ParallelLayout, parallel_groups
from orchestrl.fabric.topology import Topology

__all__ = [
    "MAX_GPUS",
    "MAX_NAME_CHARS",
    "MAX_BYTES_PER_RANK",
    "STAGES",
    "GROUPED_PRIMITIVES",
    "BIPARTITE_PRIMITIVES",
    "PRIMITIVES",
    "Collective",
    "Intent",
    "load_intent",
    "intent_from_mapping",
    "parse_gpu_set",
]

#: RL stages an intent can describe; each names the default topology template (§5.2).
STAGES = ("train", "train-dp", "gen", "weight-sync")

#: Primitives run inside groups of ranks (``Collective.groups``).
GROUPED_PRIMITIVES = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "p2p")

#: Primitives between two disjoint GPU sets (``Collective.src_gpus`` -> ``Collective.dst_gpus``).
BIPARTITE_PRIMITIVES = ("m2n", "weight-sync", "response-stream")

PRIMITIVES = GROUPED_PRIMITIVES + BIPARTITE_PRIMITIVES

_SIGNATURE_VERSION = 1  # bump when the signature's inputs change, so stale cache entries miss


@dataclass(frozen=True)
class Collective:
    """One collective of an intent: a primitive, who takes part, and bytes per rank.

    ``bytes_per_rank`` (``S``) means, per primitive (``n`` = group size):

    ========================  ======================================================================
    all-reduce                size of the buffer each rank reduces (NCCL ``count * sizeof``)
    all-gather                size of the *gathered* (full) buffer, i.e. ``n`` input shards;
                              NCCL-tests' convention, so all-reduce = reduce-scatter + all-gather
    reduce-scatter            size of the full input buffer each rank contributes (``n`` shards)
    all-to-all                size of each rank's send buffer; ``S / n`` goes to every member
    p2p                       bytes crossing each pipeline stage boundary in each direction
                              (activations forward, their gradients backward); groups in stage order
    m2n                       bytes each ``src`` (attention) rank sends, spread evenly over the
                              ``dst`` (FFN) ranks; the same amount comes back
    weight-sync               bytes of weights every ``dst`` (gen) GPU must receive, initially held
                              as equal shards by the ``src`` (train) GPUs; ``transfers`` may give
                              the exact schedule instead
    response-stream           bytes each ``src`` (gen) GPU streams to the ``dst`` (train) GPUs
    ========================  ======================================================================

    Parameters
    ----------
    primitive : str
        One of :data:`PRIMITIVES`.
    groups : tuple of tuple of int
        Grouped primitives only: the groups, each of distinct global GPU indices, in ring / stage
        order.
    bytes_per_rank : float
        ``S`` above, in bytes; >= 0.
    src_gpus, dst_gpus : tuple of int
        Bipartite primitives only: the two disjoint sides (m2n: attention -> FFN;
        weight-sync: train shard holders -> gen; response-stream: gen -> train).
    transfers : tuple of (src, dst, bytes)
        weight-sync only: an explicit schedule (e.g. from the collectives planner) that replaces the
        built-in shard-scatter stand-in of :mod:`fabric.traffic`.
    label : str
        Where the groups came from (``"ep"`` for ``over: ep``), for reports; not part of the
        signature.

    Raises
    ------
    ConfigError
        If a field is inconsistent with the primitive.

    Examples
    --------
    >>> c = Collective("all-reduce", groups=((0, 1, 2, 3),), bytes_per_rank=100.0)
    >>> c.total_bytes  # ring: 2 (n - 1) S
    600.0
    """

    primitive: str
    groups: tuple[tuple[int, ...], ...] = ()
    bytes_per_rank: float = 0.0
    src_gpus: tuple[int, ...] = ()
    dst_gpus: tuple[int, ...] = ()
    transfers: tuple[tuple[int, int, float], ...] = ()
    label: str = ""

    def __post_init__(self) -> None:
        src = "Collective"
        if self.primitive not in PRIMITIVES:
            raise ConfigError(src, "primitive", f"unknown primitive {self.primitive!r}", ", ".join(PRIMITIVES))
        # Normalise containers so equal collectives compare and hash equal however they were built.
        object.__setattr__(self, "groups", tuple(tuple(int(g) for g in grp) for grp in self.groups))
        object.__setattr__(self, "src_gpus", tuple(int(g) for g in self.src_gpus))
        object.__setattr__(self, "dst_gpus", tuple(int(g) for g in self.dst_gpus))
        object.__setattr__(self, "transfers", tuple((int(a), int(b), float(v)) for a, b, v in self.transfers))
        object.__setattr__(self, "bytes_per_rank", float(self.bytes_per_rank))
        if not self.bytes_per_rank >= 0.0 or self.bytes_per_rank == float("inf"):
            raise ConfigError(src, "bytes_per_rank", f"expected a finite number >= 0, got {self.bytes_per_rank!r}",
                              "a finite number of bytes >= 0")
        if self.primitive in GROUPED_PRIMITIVES:
            if not self.groups:
                raise ConfigError(src, "groups", f"{self.primitive} needs at least one group", "a non-empty tuple")
            if self.src_gpus or self.dst_gpus or self.transfers:
                raise ConfigError(src, "src_gpus", f"{self.primitive} is a grouped primitive",
                                  "groups only (src_gpus/dst_gpus/transfers are for "
                                  + ", ".join(BIPARTITE_PRIMITIVES) + ")")
            for i, grp in enumerate(self.groups):
                if not grp:
                    raise ConfigError(src, f"groups[{i}]", "is empty", "at least one GPU")
                if len(set(grp)) != len(grp):
                    raise ConfigError(src, f"groups[{i}]", f"repeats a GPU: {list(grp)}", "distinct GPUs")
        else:
            if self.groups:
                raise ConfigError(src, "groups", f"{self.primitive} is bipartite", "src_gpus and dst_gpus")
            for name in ("src_gpus", "dst_gpus"):
                side = getattr(self, name)
                if not side:
                    raise ConfigError(src, name, f"{self.primitive} needs a non-empty {name}", "one or more GPUs")
                if len(set(side)) != len(side):
                    raise ConfigError(src, name, "repeats a GPU", "distinct GPUs")
            overlap = set(self.src_gpus) & set(self.dst_gpus)
            if overlap:
                # A GPU on both sides would "send to itself": no network traffic, and the closed-form
                # totals below would overstate demand. Colocated weight updates are local copies.
                raise ConfigError(src, "dst_gpus", f"overlaps src_gpus on GPUs {sorted(overlap)[:8]}",
                                  "disjoint source and destination sets")
            if self.transfers and self.primitive != "weight-sync":
                raise ConfigError(src, "transfers",
                                  f"only weight-sync takes an explicit schedule, not {self.primitive}", "weight-sync")
            for i, (a, b, v) in enumerate(self.transfers):
                if v < 0 or v != v:
                    raise ConfigError(src, f"transfers[{i}]", f"negative or NaN bytes {v!r}", "bytes >= 0")

    @property
    def members(self) -> frozenset[int]:
        """Every GPU taking part."""
        out: set[int] = set(self.src_gpus) | set(self.dst_gpus)
        for grp in self.groups:
            out.update(grp)
        for a, b, _ in self.transfers:
            out.update((a, b))
        return frozenset(out)

    @property
    def total_bytes(self) -> float:
        """Bytes this collective moves between distinct GPUs (NVLink included), in closed form.

        Notes
        -----
        O(number of groups). Equals the sum of :func:`fabric.traffic.rank_pair_bytes`.
        """
        s = self.bytes_per_rank
        p = self.primitive
        if p in GROUPED_PRIMITIVES:
            per_n = {"all-reduce": 2.0, "all-gather": 1.0, "reduce-scatter": 1.0, "all-to-all": 1.0, "p2p": 2.0}[p]
            return sum(per_n * (len(g) - 1) * s for g in self.groups)
        if p == "m2n":
            return 2.0 * len(self.src_gpus) * s
        if p == "response-stream":
            return len(self.src_gpus) * s
        if self.transfers:
            return sum(v for a, b, v in self.transfers if a != b)
        return len(self.dst_gpus) * s  # weight-sync: every gen GPU receives S once

    def shape(self) -> tuple[Any, ...]:
        """Return what the template cache keys on: the primitive and its group sizes, not members."""
        if self.primitive in GROUPED_PRIMITIVES:
            sizes = sorted(Counter(len(g) for g in self.groups).items())
            return (self.primitive, tuple(sizes))
        return (self.primitive, len(self.src_gpus), len(self.dst_gpus))


@dataclass(frozen=True)
class Intent:
    """A job's announcement of its next communication period (OrchestrRL §5.3, Algorithm 2).

    Parameters
    ----------
    stage : str
        One of :data:`STAGES`; picks the default topology template.
    job : str
        The announcing job.
    period : str
        Label of the recurring period inside the stage (``"fwd-bwd"``, ``"grad-sync"``).
    collectives : tuple of Collective
        What runs in the period.
    template : str or None
        A template name that overrides the stage's default.

    Examples
    --------
    >>> i = Intent("train-dp", "job", "grad-sync", (Collective("all-reduce", ((0, 8),), 1e9),))
    >>> i.primitive_mix
    {'all-reduce': 1.0}
    >>> len(i.signature())
    16
    """

    stage: str
    job: str
    period: str
    collectives: tuple[Collective, ...]
    template: str | None = None

    def __post_init__(self) -> None:
        src = "Intent"
        if self.stage not in STAGES:
            raise ConfigError(src, "stage", f"unknown stage {self.stage!r}", ", ".join(STAGES))
        if not isinstance(self.job, str) or not self.job:
            raise ConfigError(src, "job", f"expected a non-empty string, got {self.job!r}", "the job's name")
        object.__setattr__(self, "collectives", tuple(self.collectives))
        if not self.collectives:
            raise ConfigError(src, "collectives", "is empty", "at least one Collective")
        for i, c in enumerate(self.collectives):
            if not isinstance(c, Collective):
                raise ConfigError(src, f"collectives[{i}]", f"expected a Collective, got {type(c).__name__}")
        if self.template is not None and (not isinstance(self.template, str) or not self.template):
            raise ConfigError(src, "template", f"expected a template name or None, got {self.template!r}")

    @property
    def primitive_mix(self) -> dict[str, float]:
        """Fraction of the intent's bytes carried by each primitive (sums to 1; all 0 if no bytes).

        Notes
        -----
        O(total number of groups), from the closed-form :attr:`Collective.total_bytes`.
        """
        totals: dict[str, float] = {}
        for c in self.collectives:
            totals[c.primitive] = totals.get(c.primitive, 0.0) + c.total_bytes
        grand = sum(totals.values())
        return {p: (v / grand if grand > 0 else 0.0) for p, v in sorted(totals.items())}

    @property
    def members(self) -> frozenset[int]:
        """Every GPU any collective of the intent touches."""
        out: set[int] = set()
        for c in self.collectives:
            out |= c.members
        return frozenset(out)

    def signature(self) -> str:
        """Return a stable 16-hex-digit key for the template cache.

        The key covers the stage, the template override, the sorted set of primitive kinds and each
        collective's *shape* (primitive plus the multiset of its group sizes, or the sizes of its
        two sides). It deliberately leaves out concrete GPU indices and byte volumes: volumes change
        every iteration and members change when a failed server is replaced (§5.4), yet the cached
        template and allocation procedure stay valid -- only the demand, recomputed from the current
        intent, changes. The job and period labels are left out too, so identical periods share
        an entry; key by ``(job, signature)`` where entries must not be shared.

        Notes
        -----
        O(G log G) for G groups in total, once per intent object (an intent is immutable, and a
        service that sees the same intent every RL iteration asks again each time).
        """
        return self._signature

    @cached_property
    def _signature(self) -> str:  # not a field: eq and hash ignore it
        payload = {
            "v": _SIGNATURE_VERSION,
            "stage": self.stage,
            "template": self.template,
            "primitives": sorted({c.primitive for c in self.collectives}),
            "shapes": sorted(json.dumps(c.shape()) for c in self.collectives),
        }
        blob = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


# -- loading ---------------------------------------------------------------------------------


MAX_BYTES_PER_RANK = 1e18  # one exabyte per rank and period: past any model (1e300 would only overflow the demand sums)
MAX_NAME_CHARS = 256  # a job or period name: it is logged, journalled and shown in every decision
MAX_GPUS = 1 << 22  # GPU indices a set may name without a topology to bound it (4 Mi: far past any cluster)


def parse_gpu_set(value: Any, source: str, path: str, topology: Topology | None = None) -> tuple[int, ...]:
    """Return the GPU indices a YAML GPU set names, in the order written.

    Parameters
    ----------
    value : list of int, int, or str
        ``[0, 1, 2]``, ``7``, or ``"0-3,8,10-11"`` (ranges include both ends).
    source, path : str
        File and field, for error messages.
    topology : Topology, optional
        When given, every GPU must exist in it.

    Raises
    ------
    ConfigError
        If the value is malformed, repeats a GPU or names a GPU outside the topology.

    Notes
    -----
    O(number of GPUs named).

    Examples
    --------
    >>> parse_gpu_set("0-3,8", "x.yaml", "gpus")
    (0, 1, 2, 3, 8)
    """
    allowed = 'a list of GPU indices, or a string like "0-31" or "0-7,16-23"'
    limit = topology.gpu_count if topology is not None else MAX_GPUS
    bound = f"fabric {topology.name!r} (0..{limit - 1})" if topology is not None else f"0..{MAX_GPUS - 1}"
    within = f"0..{limit - 1}"
    out: list[int] = []
    if isinstance(value, bool):
        raise ConfigError(source, path, f"expected GPU indices, got {value!r}", allowed)
    if isinstance(value, int):
        out = [value]
    elif isinstance(value, str):
        for part in value.split(","):
            part = part.strip()
            lo, sep, hi = part.partition("-")
            try:
                first = int(lo)
                last = int(hi) if sep else first
            except ValueError:
                raise ConfigError(source, path, f"cannot read {part!r} in {value!r}", allowed) from None
            if last < first:
                raise ConfigError(source, path, f"range {part!r} runs backwards", "a-b with a <= b")
            # bound the range before expanding it: "0-99999999999" must not allocate a list of 10^11 ints
            if first < 0 or last >= limit or len(out) + last - first + 1 > limit:
                raise ConfigError(source, path, f"range {part!r} names GPUs outside {bound}", f"GPU indices {within}")
            out.extend(range(first, last + 1))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            if isinstance(v, bool) or not isinstance(v, int):
                raise ConfigError(source, f"{path}[{i}]", f"expected a GPU index, got {v!r}", allowed)
            out.append(v)
    else:
        raise ConfigError(source, path, f"expected GPU indices, got {type(value).__name__}", allowed)
    if not out:
        raise ConfigError(source, path, "names no GPU", allowed)
    seen: set[int] = set()
    for g in out:
        if g in seen:
            raise ConfigError(source, path, f"GPU {g} appears twice", "each GPU once")
        seen.add(g)
        if g < 0 or (topology is not None and g >= topology.gpu_count):
            limit = f"0..{topology.gpu_count - 1}" if topology is not None else ">= 0"
            where = f" of fabric {topology.name!r}" if topology is not None else ""
            raise ConfigError(source, path, f"GPU {g} is outside the topology{where}", f"GPU indices {limit}")
    return tuple(out)


def load_intent(path: str | os.PathLike[str], topology: Topology) -> Intent:
    """Return the intent stored in a YAML/JSON file, checked against ``topology``.

    Raises
    ------
    ConfigError
        Naming the file and field, for any malformed, unknown or out-of-topology value.

    Notes
    -----
    O(W + G) for W layout ranks and G group members.
    """
    return _intent_from_reader(load_document(path), topology)


def intent_from_mapping(data: Mapping[str, Any], source: str, topology: Topology) -> Intent:
    """Return the intent described by an already-parsed mapping (see the module's YAML format).

    Examples
    --------
    >>> from orchestrl.fabric.topology import FabricSpec, Topology
    >>> topo = Topology(FabricSpec(name="t", link_bps=1e11, servers_per_pod=2))
    >>> i = intent_from_mapping({"job": "j", "stage": "train", "layout": {"tp": 8, "dp": 2, "gpus": "0-15"},
    ...     "collectives": [{"primitive": "all-reduce", "over": "dp", "bytes_per_rank": 1e6}]}, "<doc>", topo)
    >>> i.collectives[0].groups[:2]
    ((0, 8), (1, 9))
    """
    return _intent_from_reader(Reader(data, source), topology)


_COMMON_KEYS = {"primitive", "label"}
_FIELDS_BY_PRIMITIVE = {
    **{p: {"over", "groups", "bytes_per_rank"} for p in GROUPED_PRIMITIVES},
    "m2n": {"src_gpus", "dst_gpus", "bytes_per_rank"},
    "weight-sync": {"train_gpus", "gen_gpus", "model_bytes"},
    "response-stream": {"gen_gpus", "train_gpus", "bytes_per_rank"},
}


def _intent_from_reader(r: Reader, topology: Topology) -> Intent:
    r.reject_unknown({"job", "stage", "period", "template", "layout", "collectives"})
    job = r.str("job")
    if not job.strip() or len(job) > MAX_NAME_CHARS:
        raise r.error("job", "is empty" if not job.strip() else f"is {len(job)} characters long",
                      f"the job's name, 1..{MAX_NAME_CHARS} characters")
    stage = r.str("stage", choices=STAGES)
    period = r.str("period", default=stage)
    if not period.strip() or len(period) > MAX_NAME_CHARS:
        raise r.error("period", "is empty" if not period.strip() else f"is {len(period)} characters long",
                      f"a name of 1..{MAX_NAME_CHARS} characters")
    template = r.str("template") if r.raw("template", None) is not None else None
    groups_by_kind = _layout_groups(r, topology) if r.raw("layout", None) is not None else None
    items = r.sections("collectives")
    if not items:
        raise r.error("collectives", "is empty", "a list of one or more collectives")
    collectives = tuple(_collective(c, topology, groups_by_kind) for c in items)
    return Intent(stage=stage, job=job, period=period, collectives=collectives, template=template)


def _layout_groups(r: Reader, topology: Topology) -> dict[str, list[list[int]]]:
    lay = r.section("layout")
    lay.reject_unknown({"tp", "cp", "ep", "dp", "pp", "expert_tp", "order", "gpus"})
    kwargs: dict[str, Any] = {d: lay.int(d, default=1, minimum=1) for d in ("tp", "cp", "ep", "dp", "pp")}
    kwargs["order"] = lay.str("order", default="tp-cp-ep-dp-pp")
    kwargs["expert_tp"] = lay.int("expert_tp", minimum=1) if lay.raw("expert_tp", None) is not None else None
    try:
        layout = ParallelLayout(**kwargs)
    except ConfigError as exc:
        # Re-anchor the layout's own complaint at the file and field the user wrote.
        raise ConfigError(r.source, lay.field_path(exc.field), exc.problem, exc.allowed) from None
    gpus = parse_gpu_set(lay.raw("gpus"), r.source, lay.field_path("gpus"), topology)
    if len(gpus) != layout.world_size:
        raise lay.error("gpus", f"lists {len(gpus)} GPUs but the layout has tp*cp*dp*pp = {layout.world_size} ranks",
                        f"exactly {layout.world_size} GPUs")
    return parallel_groups(layout, gpus)


def _collective(c: Reader, topology: Topology, groups_by_kind: dict[str, list[list[int]]] | None) -> Collective:
    primitive = c.str("primitive", choices=PRIMITIVES)
    c.reject_unknown(_COMMON_KEYS | _FIELDS_BY_PRIMITIVE[primitive])
    label = c.str("label", default="")

    def gpus(key: str) -> tuple[int, ...]:
        return parse_gpu_set(c.raw(key), c.source, c.field_path(key), topology)

    if primitive in GROUPED_PRIMITIVES:
        size = _bytes(c, "bytes_per_rank")
        has_over = c.raw("over", None) is not None
        if has_over == (c.raw("groups", None) is not None):
            raise c.error("over", "give exactly one of 'over' and 'groups'",
                          "over: <group kind> (needs a layout) or groups: [[gpu, ...], ...]")
        if has_over:
            kind = c.str("over", choices=GROUP_NAMES)
            if groups_by_kind is None:
                raise c.error("over", f"'over: {kind}' needs the intent's 'layout' section",
                              "a top-level layout, or explicit groups")
            groups = tuple(tuple(g) for g in groups_by_kind[kind])
            label = label or kind
        else:
            listed = c.items("groups")
            if not listed:
                raise c.error("groups", "is empty", "one or more groups of GPUs")
            groups = tuple(parse_gpu_set(v, c.source, p, topology) for p, v in listed)
        return _build(c, "groups", Collective, primitive, groups=groups, bytes_per_rank=size, label=label)
    if primitive == "m2n":
        return _build(c, "dst_gpus", Collective, primitive, src_gpus=gpus("src_gpus"), dst_gpus=gpus("dst_gpus"),
                      bytes_per_rank=_bytes(c, "bytes_per_rank"), label=label)
    if primitive == "weight-sync":
        return _build(c, "gen_gpus", Collective, primitive, src_gpus=gpus("train_gpus"), dst_gpus=gpus("gen_gpus"),
                      bytes_per_rank=_bytes(c, "model_bytes"), label=label)
    return _build(c, "train_gpus", Collective, primitive, src_gpus=gpus("gen_gpus"), dst_gpus=gpus("train_gpus"),
                  bytes_per_rank=_bytes(c, "bytes_per_rank"), label=label)


def _bytes(c: Reader, key: str) -> float:
    """Read a byte count; also accept ``"1.0e9"``, which YAML 1.1 (PyYAML) loads as a string."""
    value = c.raw(key)
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            raise c.error(key, f"expected a number of bytes, got {value!r}", "a number >= 0, e.g. 2.0e9") from None
        return Reader({key: value}, c.source, c.path).float(key, minimum=0.0, maximum=MAX_BYTES_PER_RANK)
    return c.float(key, minimum=0.0, maximum=MAX_BYTES_PER_RANK)


def _build(c: Reader, blame: str, cls: type, primitive: str, **kwargs: Any) -> Collective:
    """Construct a collective, re-anchoring a consistency error at the YAML field that caused it."""
    try:
        return cls(primitive, **kwargs)
    except ConfigError as exc:
        raise ConfigError(c.source, c.field_path(blame), exc.problem, exc.allowed) from None
