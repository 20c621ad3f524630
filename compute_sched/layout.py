"""Parallel configurations of generation instances, cluster layouts, and the §4.1 candidate set.

A *logical instance* (OrchestrRL §4.1) is a GPU group running one model replica under one
configuration ``y``: tensor parallel (``tp``), expert parallel for MoE (``ep``: attention TP inside
DP groups, experts spread over all GPUs) or attention-FFN disaggregation (``afd``: attention GPUs
exchange hidden states with FFN GPUs every layer). A :class:`Layout` is the list of instances with
the GPUs each one occupies; GPUs are numbered ``0..G-1`` inside the generation cluster.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from orchestrl.fabric.errors import ConfigError

__all__ = ["InstanceConfig", "Instance", "Layout", "homogeneous", "aligned", "candidate_configs", "parse_config"]

KINDS = ("tp", "ep", "afd")


@dataclass(frozen=True, order=True)
class InstanceConfig:
    """Parallel configuration ``y`` of one instance; ``gpus`` is ``G(y)``.

    Examples
    --------
    >>> InstanceConfig("tp", tp=4).gpus
    4
    >>> InstanceConfig("afd", tp=2, attn_gpus=12, ffn_gpus=4).name
    'afd12:4-tp2'
    """

    kind: str = "tp"
    tp: int = 1  # tensor parallel degree of attention / dense layers
    ep: int = 1  # kind "ep": GPUs the experts are spread over (= GPUs of the instance)
    attn_gpus: int = 0  # kind "afd": attention side
    ffn_gpus: int = 0  # kind "afd": FFN (expert) side

    def __post_init__(self) -> None:
        src = "InstanceConfig"
        if self.kind not in KINDS:
            raise ConfigError(src, "kind", f"unknown kind {self.kind!r}", ", ".join(KINDS))
        if self.tp < 1 or self.ep < 1:
            raise ConfigError(src, "tp", f"tp={self.tp}, ep={self.ep}", "integers >= 1")
        if self.kind == "ep" and (self.ep < 2 or self.ep % self.tp):
            raise ConfigError(src, "ep", f"ep={self.ep} with tp={self.tp}", "ep >= 2 and a multiple of tp")
        if self.kind == "afd":
            if self.attn_gpus < 1 or self.ffn_gpus < 1 or self.attn_gpus % self.tp:
                raise ConfigError(src, "attn_gpus", f"attn_gpus={self.attn_gpus}, ffn_gpus={self.ffn_gpus}, "
                                                    f"tp={self.tp}", "both >= 1, attn_gpus a multiple of tp")
        elif self.attn_gpus or self.ffn_gpus:
            raise ConfigError(src, "attn_gpus", f"only kind 'afd' takes attn_gpus/ffn_gpus, not {self.kind!r}")

    @property
    def gpus(self) -> int:
        if self.kind == "tp":
            return self.tp
        if self.kind == "ep":
            return self.ep
        return self.attn_gpus + self.ffn_gpus

    @property
    def name(self) -> str:
        if self.kind == "tp":
            return f"tp{self.tp}"
        if self.kind == "ep":
            return f"ep{self.ep}-tp{self.tp}"
        return f"afd{self.attn_gpus}:{self.ffn_gpus}-tp{self.tp}"


def parse_config(text: str) -> InstanceConfig:
    """Return the configuration a name like ``tp4``, ``ep16-tp2`` or ``afd12:4-tp2`` stands for.

    >>> parse_config("ep16-tp2")
    InstanceConfig(kind='ep', tp=2, ep=16, attn_gpus=0, ffn_gpus=0)
    """
    def unreadable() -> ConfigError:  # built only when refused: parse_config runs in the planner's loops
        return ConfigError("<config>", "name", f"cannot read {text!r}", "tpK, epN-tpK or afdA:F-tpK")

    head, _, tail = text.strip().lower().partition("-")
    if tail and not (tail.startswith("tp") and tail[2:].isdigit()):  # "-tpx", "-foo": not a TP suffix
        raise unreadable()
    tp = int(tail[2:]) if tail else 1
    try:
        if head.startswith("tp") and not tail:
            return InstanceConfig("tp", tp=int(head[2:]))
        if head.startswith("ep"):
            return InstanceConfig("ep", tp=tp, ep=int(head[2:]))
        if head.startswith("afd"):
            a, _, f = head[3:].partition(":")
            return InstanceConfig("afd", tp=tp, attn_gpus=int(a), ffn_gpus=int(f))
    except ValueError:  # a number that is not one
        raise unreadable() from None
    raise unreadable()


@dataclass(frozen=True)
class Instance:
    """One instance of a layout: its configuration and the GPUs (cluster-local indices) it runs on."""

    config: InstanceConfig
    gpu_ids: tuple[int, ...]


@dataclass(frozen=True)
class Layout:
    """A generation cluster's deployment ``Y``: instances on disjoint GPU sets (Eq. 3 budget)."""

    instances: tuple[Instance, ...]
    total_gpus: int

    def __post_init__(self) -> None:
        seen: set[int] = set()
        for k, inst in enumerate(self.instances):
            if len(inst.gpu_ids) != inst.config.gpus:
                raise ConfigError("Layout", f"instances[{k}]", f"{inst.config.name} needs {inst.config.gpus} GPUs, "
                                                               f"got {len(inst.gpu_ids)}")
            for g in inst.gpu_ids:
                if g in seen or not 0 <= g < self.total_gpus:
                    raise ConfigError("Layout", f"instances[{k}].gpu_ids", f"GPU {g} reused or outside 0.."
                                                                           f"{self.total_gpus - 1}",
                                      "disjoint GPUs inside the cluster (Eq. 3)")
                seen.add(g)

    @property
    def used_gpus(self) -> int:
        return sum(i.config.gpus for i in self.instances)

    def describe(self) -> str:
        """Return e.g. ``"8x tp2"`` or ``"4x tp2 + 1x tp8"``."""
        counts: dict[str, int] = {}
        for inst in self.instances:
            counts[inst.config.name] = counts.get(inst.config.name, 0) + 1
        return " + ".join(f"{n}x {name}" for name, n in counts.items())


def homogeneous(config: InstanceConfig, total_gpus: int, first_gpu: int = 0, count: int | None = None) -> Layout:
    """Return a layout of ``count`` (default: as many as fit) identical instances on consecutive GPUs.

    >>> homogeneous(InstanceConfig("tp", tp=2), 16).describe()
    '8x tp2'
    """
    n = (total_gpus - first_gpu) // config.gpus if count is None else count
    if n < 1 or first_gpu + n * config.gpus > total_gpus:
        raise ConfigError("Layout", "total_gpus", f"{total_gpus} GPUs cannot host {n} x {config.name}",
                          f"at least {config.gpus} GPUs per instance")
    insts = tuple(Instance(config, tuple(range(first_gpu + k * config.gpus, first_gpu + (k + 1) * config.gpus)))
                  for k in range(n))
    return Layout(insts, total_gpus)


def aligned(config: InstanceConfig, domains: Sequence[int]) -> Layout:
    """Return as many ``config`` instances as fit with none spanning two domains (e.g. PoDs).

    ``domains[g]`` names the domain of local GPU ``g`` (GPUs of one domain consecutive). Instances go
    left to right; one that would cross into the next domain starts at that domain instead, so GPUs
    at a domain's end stay idle. An instance larger than every domain cannot avoid spanning: then
    the layout is :func:`homogeneous`'s.

    >>> afd = parse_config("afd24:16-tp8")
    >>> homogeneous(afd, 512).describe(), aligned(afd, [g // 256 for g in range(512)]).describe()
    ('12x afd24:16-tp8', '12x afd24:16-tp8')
    >>> [i.gpu_ids[0] for i in aligned(afd, [g // 256 for g in range(512)]).instances][5:8]
    [200, 256, 296]
    """
    n, size = len(domains), config.gpus
    runs: dict[int, int] = {}
    start: dict[int, int] = {}  # each domain's first GPU
    for k, d in enumerate(domains):
        if d in runs and domains[k - 1] != d:
            raise ConfigError("Layout", "domains", f"GPU {k} returns to domain {d} after another",
                              "number GPUs so that each domain's are consecutive")
        start.setdefault(d, k)
        runs[d] = runs.get(d, 0) + 1
    if size > max(runs.values(), default=0):
        return homogeneous(config, n)
    insts, g = [], 0
    while g + size <= n:
        if domains[g + size - 1] != domains[g]:
            g = start[domains[g]] + runs[domains[g]]  # the next domain's first GPU
            continue
        insts.append(Instance(config, tuple(range(g, g + size))))
        g += size
    return Layout(tuple(insts), n)


def candidate_configs(total_gpus: int, gpus_per_node: int, *, moe: bool, cross_node_tp: bool = True,
                      afd_ratios: tuple[tuple[int, int], ...] = ((3, 1),)) -> list[InstanceConfig]:
    """Return the restricted candidate set of §4.1 for a cluster of ``total_gpus``.

    Intra-node TP degrees (powers of two up to a node), cross-node TP only in whole nodes (two
    nodes), and for MoE models expert parallelism over one or two nodes and the pre-selected AFD
    attention:FFN ratios (over one or two nodes).

    Notes
    -----
    O(log gpus_per_node + |afd_ratios|).

    >>> [c.name for c in candidate_configs(16, 8, moe=False)]
    ['tp1', 'tp2', 'tp4', 'tp8', 'tp16']
    """
    out: list[InstanceConfig] = []
    tp = 1
    while tp <= gpus_per_node and tp <= total_gpus:
        out.append(InstanceConfig("tp", tp=tp))
        tp *= 2
    if cross_node_tp and 2 * gpus_per_node <= total_gpus:
        out.append(InstanceConfig("tp", tp=2 * gpus_per_node))
    if moe:
        for nodes in (1, 2):
            g = nodes * gpus_per_node
            if g > total_gpus:
                continue
            out.append(InstanceConfig("ep", tp=1, ep=g))
            for a, f in afd_ratios:
                if g % (a + f) == 0:
                    out.append(InstanceConfig("afd", tp=1, attn_gpus=g * a // (a + f), ffn_gpus=g * f // (a + f)))
    return out
