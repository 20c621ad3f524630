"""Network cost of RFabric and its baselines (OrchestrRL §7.2.3, prices from Table 4 / Appendix G).

Design note
-----------
Component counts are never typed in: every design is *built* as a wiring graph and the counts are
read off that graph by one counting rule (:func:`count_links`), so all designs are counted alike
and a change to a structure (more boundary fibres, a smaller switch radix) changes its cost.

The graph is an ``nx.MultiGraph`` whose nodes carry ``kind`` -- ``"nic"``, ``"eps"`` (electrical
packet switch), ``"ocs"`` or ``"patch"`` (patch panel) -- and whose every edge is one duplex
physical link. The counting rule, stated once:

* every link is one duplex fibre cable (Table 4 has no copper/DAC price, so none is assumed);
* a link end on a NIC or an EPS port holds one pluggable transceiver; an OCS or patch-panel port
  holds none, because both switch light transparently (that is the premise of OCS);
* an EPS, OCS or patch-panel port is counted when it is *cabled*: Table 4 prices ports, not
  chassis, so an idle port of a partly used device costs nothing here;
* one NIC per GPU in every design (§7.2: eight GPUs and eight NICs per server).

Baselines are folded Clos networks of ``switch_radix``-port switches with as few tiers as reach
the endpoints (1, 2 or 3); FT-OS puts its 3:1 oversubscription at the leaf. RFabric is counted
from a :class:`fabric.topology.Topology`. ``docs/cost-model.md`` compares the results with §7.2.3.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from types import MappingProxyType
from typing import Iterable, Mapping, Sequence

import networkx as nx

from orchestrl.fabric.errors import ConfigError
from orchestrl.fabric.topology import OCS_TECHNOLOGIES, FabricSpec, Topology, spec_from_mapping

__all__ = [
    "max_clos_gpus",
    "ComponentPrices",
    "PRICES_USD",
    "ComponentCounts",
    "CostRow",
    "PaperFigure",
    "DESIGNS",
    "PAPER_RELATIVE",
    "PAPER_FT_NETWORK_TO_GPU",
    "build_design_graph",
    "count_links",
    "count_components",
    "default_rfabric_spec",
    "network_cost",
    "cost_table",
    "format_cost_table",
]


@dataclass(frozen=True)
class ComponentPrices:
    """One row of OrchestrRL Table 4: list price in USD of each component at one link speed."""

    link_gbps: int
    transceiver_usd: float  # one pluggable optic; one per NIC or EPS link end
    nic_usd: float
    eps_port_usd: float  # one electrical switch port
    ocs_port_usd: float  # one OCS port; speed-independent because OCS switches light, not bits
    patch_panel_port_usd: float
    fibre_usd: float  # one duplex fibre cable per link


# OrchestrRL Appendix G, Table 4 ("indicative prices ... not vendor quotes"); the paper's
# sources per column: transceiver [17,18,11,12], NIC [25,22,23,24], EPS port [19,26,16,13],
# OCS port [15,47], patch panel port [63], fibre [14,20,21,28].
PRICES_USD: Mapping[int, ComponentPrices] = MappingProxyType({
    p.link_gbps: p
    for p in (
        ComponentPrices(100, 249.0, 736.0, 215.0, 350.0, 100.0, 25.0),
        ComponentPrices(200, 499.0, 1291.0, 876.0, 350.0, 100.0, 45.0),
        ComponentPrices(400, 799.0, 1710.0, 1392.0, 350.0, 100.0, 65.0),
        ComponentPrices(800, 1599.0, 2347.0, 1731.0, 350.0, 100.0, 92.0),
    )
})


@dataclass(frozen=True)
class ComponentCounts:
    """Priced components of one built network (independent of link speed), plus device counts."""

    nics: int
    transceivers: int
    eps_ports: int  # cabled electrical switch ports
    ocs_ports: int  # cabled OCS ports (Agg and Core for RFabric)
    patch_panel_ports: int
    fibres: int
    eps_switches: int = 0  # informational: Table 4 prices ports, not chassis
    ocs_devices: int = 0  # informational
    patch_panels: int = 0  # informational


@dataclass(frozen=True)
class CostRow:
    """The network cost of one design at one link speed, by component and relative to fat-tree."""

    design: str
    gpus: int
    link_gbps: int
    counts: ComponentCounts
    nic_usd: float
    transceiver_usd: float
    eps_port_usd: float
    ocs_port_usd: float
    patch_panel_port_usd: float
    fibre_usd: float
    relative_to_fat_tree: float  # network_usd / fat-tree's at the same GPUs, speed and radix
    relative_to_fat_tree_excl_nics: float  # same ratio with NICs left out of both (a sensitivity)

    @property
    def network_usd(self) -> float:
        return (self.nic_usd + self.transceiver_usd + self.eps_port_usd + self.ocs_port_usd
                + self.patch_panel_port_usd + self.fibre_usd)

    @property
    def network_excl_nics_usd(self) -> float:
        return self.network_usd - self.nic_usd


@dataclass(frozen=True)
class PaperFigure:
    """What §7.2.3 reports for one design's cost relative to FT; ``None`` where it gives no number."""

    low: float | None
    high: float | None
    text: str  # the paper's wording, so a reader can check the transcription

    def __str__(self) -> str:
        if self.low is None:
            return self.text
        return f"{self.low:.2f}" if self.high == self.low else f"{self.low:.2f}-{self.high:.2f}"


DESIGNS = ("fat-tree", "fat-tree-os3", "rail-optimized", "topoopt", "mixnet", "rfabric")

# OrchestrRL §7.2.3 (Figure 15 text), relative network cost at 200 and 400 Gbps.
PAPER_RELATIVE: Mapping[str, PaperFigure] = MappingProxyType({
    "fat-tree": PaperFigure(1.0, 1.0, "the high-cost baseline (1.00x)"),
    "fat-tree-os3": PaperFigure(0.54, 0.54, "reduces cost to 0.54x"),
    "rail-optimized": PaperFigure(None, None, "~FT"),  # "Rail-Optimized has similar cost"
    "topoopt": PaperFigure(0.21, 0.21, "further lowers it to 0.21x"),
    "mixnet": PaperFigure(None, None, "~RFabric, FT-OS"),  # RFabric is "comparable to MixNet and FT-OS"
    "rfabric": PaperFigure(0.51, 0.52, "costs 0.51-0.52x of FT"),
})

# OrchestrRL §7.2.3: FT network cost is ~37% of GPU cost at 200 Gbps and ~59% at 400 Gbps.
PAPER_FT_NETWORK_TO_GPU: Mapping[int, float] = MappingProxyType({200: 0.37, 400: 0.59})

# §7.2 MixNet baseline: "in each 8-GPU server, 6 GPUs connect to a local OCS, while 2 ... Fat-tree".
_MIXNET_OCS_NICS_PER_SERVER = 6
_GPUS_PER_SERVER = 8  # §7.2: H800 servers with eight GPUs and eight NICs
_RFABRIC_SERVERS_PER_POD = 32  # as examples/topology-2048gpu.yaml (§7.3 scale)
_OCS_TECH = "piezo"  # the example fabric's OCS; its radix only sets device counts, not cost
_PATCH_TECH = "robotic"  # TopoOpt [63] uses a robotic (Telescent) patch panel


def _check_choice(field: str, value: object, allowed: Iterable[object], source: str = "cost model") -> None:
    allowed = tuple(allowed)
    if value not in allowed:
        raise ConfigError(source, field, f"{value!r} is not supported", ", ".join(map(str, allowed)))


def _check_gpus(gpus: int) -> None:
    if not isinstance(gpus, int) or gpus < _GPUS_PER_SERVER or gpus % _GPUS_PER_SERVER:
        raise ConfigError("cost model", "gpus", f"{gpus!r} is not a whole number of {_GPUS_PER_SERVER}-GPU servers",
                          f"a positive multiple of {_GPUS_PER_SERVER}")


# -- builders ---------------------------------------------------------------------------------
def _nics(g: nx.MultiGraph, gpus: int, ranks: Sequence[int] | None = None) -> list[tuple[int, int]]:
    """Add one NIC node per GPU (server-major); return (server, rank) of those with a rank in ``ranks``."""
    out = []
    for gpu in range(gpus):
        server, rank = divmod(gpu, _GPUS_PER_SERVER)
        g.add_node(("nic", server, rank), kind="nic", role="nic", server=server, rank=rank)
        if ranks is None or rank in ranks:
            out.append((server, rank))
    return out


def _clos(g: nx.MultiGraph, leaves_down: list[list[object]], radix: int, down_per_up: int, tag: str,
          tiers: int) -> None:
    """Wire a folded Clos of ``tiers`` tiers over leaves given by their attached endpoint nodes.

    Each leaf is an EPS with ``len(down)`` endpoint links and ``ceil(len(down) / down_per_up)``
    uplinks; the tiers above the leaf are non-blocking. Two tiers: spines reach every leaf, so at
    most ``radix`` leaves. Three tiers: pods of radix/2 leaves, at most ``radix`` pods.
    """
    for i, down in enumerate(leaves_down):
        g.add_node((tag, "leaf", i), kind="eps", role="leaf")
        for end in down:
            g.add_edge(end, (tag, "leaf", i))
    if tiers == 1:
        return
    ups = [math.ceil(len(d) / down_per_up) for d in leaves_down]
    half = radix // 2
    if tiers == 2 and len(leaves_down) <= radix:
        spines = math.ceil(sum(ups) / radix)
        k = 0
        for i, u in enumerate(ups):  # round-robin keeps every spine within its radix; full leaves reach all
            for _ in range(u):
                g.add_node((tag, "spine", k % spines), kind="eps", role="spine")
                g.add_edge((tag, "leaf", i), (tag, "spine", k % spines))
                k += 1
        return
    pods = math.ceil(len(leaves_down) / half)
    if pods > radix:
        raise ConfigError("cost model", "gpus",
                          f"needs {pods} Clos pods of {half} leaves; a 3-tier Clos of {radix}-port switches has at "
                          f"most {radix}", "fewer GPUs, or a larger switch_radix")
    for p in range(pods):
        members = range(p * half, min((p + 1) * half, len(leaves_down)))
        for j in range(max(ups[i] for i in members)):  # agg j of the pod: plane j
            agg = (tag, "agg", p, j)
            g.add_node(agg, kind="eps", role="agg", clos_pod=p)
            down = [i for i in members if ups[i] > j]
            for i in down:
                g.add_edge((tag, "leaf", i), agg)
            for c in range(len(down)):  # non-blocking: as many up as down, one per plane-j core
                g.add_node((tag, "core", j, c), kind="eps", role="core")
                g.add_edge(agg, (tag, "core", j, c))


def max_clos_gpus(radix: int) -> int:
    """Return the most endpoints a non-blocking 3-tier Clos of ``radix``-port switches connects (k^3/4 for k even).

    >>> max_clos_gpus(64)
    65536
    """
    return radix * (radix // 2) * _leaf_down_ports(radix, 1)


def _leaf_down_ports(radix: int, down_per_up: int) -> int:
    """Most endpoints a leaf can take while keeping ``down / up <= down_per_up`` within its radix."""
    down = radix * down_per_up // (down_per_up + 1)  # 64 ports: 32 down at 1:1, 48 down at 3:1
    while down + math.ceil(down / down_per_up) > radix:
        down -= 1
    return down


def _clos_over(g: nx.MultiGraph, ends: list[tuple], radix: int, down_per_up: int, rail_aligned: bool,
               min_tiers: int) -> None:
    """Attach endpoints to leaves (in order, or by rank for rail alignment) and wire a Clos above them.

    Uses the fewest tiers that reach every endpoint, but at least ``min_tiers``.
    """
    if len(ends) <= radix and min_tiers == 1:  # one switch reaches everyone, no uplinks needed
        _clos(g, [ends], radix, down_per_up, "ft", 1)
        return
    per_leaf = _leaf_down_ports(radix, down_per_up)
    if rail_aligned:  # [1]: a rail leaf takes rank r of per_leaf consecutive servers
        groups: dict[tuple[int, int], list[tuple]] = {}
        for n in ends:
            groups.setdefault((n[1] // per_leaf, n[2]), []).append(n)
        leaves = [groups[k] for k in sorted(groups)]
    else:
        leaves = [ends[i:i + per_leaf] for i in range(0, len(ends), per_leaf)]
    _clos(g, leaves, radix, down_per_up, "ft", max(min_tiers, 2 if len(leaves) <= radix else 3))


def _fat_tree(gpus: int, radix: int, down_per_up: int, rail_aligned: bool, min_tiers: int) -> nx.MultiGraph:
    g = nx.MultiGraph()
    _clos_over(g, [("nic",) + sn for sn in _nics(g, gpus)], radix, down_per_up, rail_aligned, min_tiers)
    return g


def _topoopt(gpus: int) -> nx.MultiGraph:
    g = nx.MultiGraph()
    radix = OCS_TECHNOLOGIES[_PATCH_TECH].radix_ports
    for i, (server, rank) in enumerate(_nics(g, gpus)):
        panel = ("patch", i // radix)
        g.add_node(panel, kind="patch", role="patch")
        g.add_edge(("nic", server, rank), panel)
    return g


def _mixnet(gpus: int, radix: int, min_tiers: int) -> nx.MultiGraph:
    g = nx.MultiGraph()
    ocs_ranks = range(_MIXNET_OCS_NICS_PER_SERVER)
    optical = _nics(g, gpus, ocs_ranks)
    ocs_radix = OCS_TECHNOLOGIES[_OCS_TECH].radix_ports
    per_region = ocs_radix // _MIXNET_OCS_NICS_PER_SERVER  # servers whose optical NICs share one OCS
    for server, rank in optical:
        ocs = ("mixnet-ocs", server // per_region)
        g.add_node(ocs, kind="ocs", role="ocs", region=server // per_region)
        g.add_edge(("nic", server, rank), ocs)
    electrical = [("nic", s, r) for s in range(gpus // _GPUS_PER_SERVER)
                  for r in range(_MIXNET_OCS_NICS_PER_SERVER, _GPUS_PER_SERVER)]
    _clos_over(g, electrical, radix, 1, False, min_tiers)
    return g


def _rfabric_graph(topo: Topology) -> nx.MultiGraph:
    """Translate a topology's wiring into the cost graph: GPUs' NICs, ToRs (EPS) and OCS devices."""
    kinds = {"gpu": "nic", "tor": "eps", "ocs": "ocs"}
    src = topo.to_networkx()
    g = nx.MultiGraph()
    for node, data in src.nodes(data=True):
        role = {"gpu": "nic", "tor": "tor"}.get(data["kind"]) or f"ocs-{data.get('tier')}"
        g.add_node(node, kind=kinds[data["kind"]], role=role)
    for a, b, data in src.edges(data=True):
        for _ in range(data.get("count", 1) + data.get("masked_count", 0)):  # masked ports are still cabled
            g.add_edge(a, b)
    return g


def default_rfabric_spec(gpus: int, link_gbps: float = 200, *, switch_radix: int = 64,
                         servers_per_pod: int | None = None) -> FabricSpec:
    """Return an RFabric like ``examples/topology-2048gpu.yaml`` sized for ``gpus`` GPUs.

    PoDs of 32 eight-GPU servers (fewer if the cluster is smaller, or ``servers_per_pod``); one rail
    ToR per rank per rack, with racks as large as ``switch_radix / 2`` servers allow; ToR uplinks
    equal to down ports; each PoD's boundary fibres are half of its ToR uplinks; piezo OCS devices,
    as many as the ports need.

    Raises
    ------
    ConfigError
        If ``gpus`` is not a multiple of 8, or above 256 GPUs not a multiple of 256 (whole PoDs).

    Examples
    --------
    >>> spec = default_rfabric_spec(2048)
    >>> spec.pods, spec.tor_uplinks, spec.boundary_ports_per_pod, spec.agg_devices_per_pod, spec.core_devices
    (8, 32, 128, 1, 2)
    """
    _check_gpus(gpus)
    servers = gpus // _GPUS_PER_SERVER
    per_pod = servers_per_pod or min(servers, _RFABRIC_SERVERS_PER_POD)
    if servers % per_pod:
        raise ConfigError("cost model", "gpus", f"{gpus} GPUs do not fill whole PoDs of {per_pod} servers",
                          f"<= {per_pod * _GPUS_PER_SERVER} or a multiple of {per_pod * _GPUS_PER_SERVER}; "
                          "or pass rfabric_spec")
    per_tor = max(d for d in range(1, per_pod + 1) if per_pod % d == 0 and d <= max(1, switch_radix // 2))
    pods = servers // per_pod
    tors, uplinks = (per_pod // per_tor) * _GPUS_PER_SERVER, per_tor
    boundary = tors * uplinks // 2 if pods > 1 else 0
    radix = OCS_TECHNOLOGIES[_OCS_TECH].radix_ports
    return spec_from_mapping({
        "name": f"rfabric-{gpus}-default", "link_gbps": link_gbps, "server": {"gpus": _GPUS_PER_SERVER},
        "pods": {"count": pods, "servers": per_pod},
        "tor": {"servers_per_tor": per_tor, "rails_per_tor": 1, "uplinks": uplinks},
        "ocs_agg": {"technology": _OCS_TECH, "devices_per_pod": math.ceil((tors * uplinks + boundary) / radix),
                    "boundary_ports": boundary},
        "ocs_core": {"technology": _OCS_TECH, "devices": max(1, math.ceil(pods * boundary / radix))},
    }, source="default_rfabric_spec")


def build_design_graph(design: str, gpus: int, *, switch_radix: int = 64, min_clos_tiers: int = 1,
                       rfabric: Topology | None = None, oversubscription: int = 3) -> nx.MultiGraph:
    """Return the wiring of ``design`` for ``gpus`` GPUs as a cost graph (one edge per physical link).

    Parameters are those of :func:`count_components`. Complexity is linear in the number of links.
    Besides ``kind`` (what the counting rule prices), every node carries a ``role`` that the network
    simulator (:mod:`sim.network`) routes by: ``nic`` (with ``server`` and ``rank``; GPU index
    ``server * 8 + rank``), ``leaf``, ``spine``, ``agg`` (with ``clos_pod``), ``core``, ``patch``,
    ``ocs`` (MixNet's regional OCS, with ``region``), and for RFabric ``tor``, ``ocs-agg``, ``ocs-core``.
    ``oversubscription`` is FT-OS's leaf down:up ratio (the cost model's and the paper's: 3).
    """
    _check_choice("design", design, DESIGNS)
    _check_choice("min_clos_tiers", min_clos_tiers, (1, 2, 3))
    if not isinstance(switch_radix, int) or switch_radix < 4 or switch_radix % 2:
        raise ConfigError("cost model", "switch_radix", f"{switch_radix!r} cannot form a folded Clos",
                          "an even integer >= 4, e.g. 32 or 64")
    if design == "rfabric":
        topo = rfabric if rfabric is not None else Topology(default_rfabric_spec(gpus, switch_radix=switch_radix))
        if topo.gpu_count != gpus:
            raise ConfigError("cost model", "gpus", f"{gpus} differs from the RFabric topology's {topo.gpu_count} GPUs",
                              f"gpus={topo.gpu_count}, or a topology of {gpus} GPUs")
        return _rfabric_graph(topo)
    _check_gpus(gpus)
    if design == "topoopt":
        return _topoopt(gpus)
    if design == "mixnet":
        return _mixnet(gpus, switch_radix, min_clos_tiers)
    if design == "fat-tree-os3" and (not isinstance(oversubscription, int) or not 1 <= oversubscription < switch_radix):
        raise ConfigError("cost model", "oversubscription", f"{oversubscription!r}",
                          f"an integer ratio from 1 to {switch_radix - 1}")
    return _fat_tree(gpus, switch_radix, oversubscription if design == "fat-tree-os3" else 1,
                     design == "rail-optimized", min_clos_tiers)


def count_links(graph: nx.MultiGraph) -> ComponentCounts:
    """Return the components a cost graph needs, by the module's counting rule.

    Examples
    --------
    >>> g = nx.MultiGraph()
    >>> g.add_nodes_from([("a", {"kind": "nic"}), ("s", {"kind": "eps"}), ("o", {"kind": "ocs"})])
    >>> g.add_edges_from([("a", "s"), ("s", "o")])  # NIC-EPS: 2 optics; EPS-OCS: 1 optic
    [0, 0]
    >>> c = count_links(g)
    >>> c.nics, c.transceivers, c.eps_ports, c.ocs_ports, c.fibres
    (1, 3, 2, 1, 2)
    """
    kinds = nx.get_node_attributes(graph, "kind")
    ends = {"nic": 0, "eps": 0, "ocs": 0, "patch": 0}
    for a, b in graph.edges():
        ends[kinds[a]] += 1
        ends[kinds[b]] += 1
    nodes = {k: sum(1 for v in kinds.values() if v == k) for k in ends}
    return ComponentCounts(
        nics=nodes["nic"], transceivers=ends["nic"] + ends["eps"], eps_ports=ends["eps"],
        ocs_ports=ends["ocs"], patch_panel_ports=ends["patch"], fibres=graph.number_of_edges(),
        eps_switches=nodes["eps"], ocs_devices=nodes["ocs"], patch_panels=nodes["patch"],
    )


def count_components(design: str, gpus: int, *, switch_radix: int = 64, min_clos_tiers: int = 1,
                     rfabric: Topology | None = None) -> ComponentCounts:
    """Return the component counts of ``design`` for ``gpus`` GPUs, read off its built wiring.

    Parameters
    ----------
    design : str
        One of :data:`DESIGNS`.
    gpus : int
        Cluster size; a multiple of 8 (eight GPUs and NICs per server).
    switch_radix : int
        Ports of every electrical switch in the Clos baselines (and the default RFabric's ToRs).
    min_clos_tiers : int
        1 builds each Clos with the fewest tiers that reach its endpoints; 3 always builds three,
        as the k-ary fat-tree of Al-Fares et al. [29] that §7.2 cites for FT. Ignored by RFabric.
    rfabric : Topology, optional
        The RFabric to count; default :func:`default_rfabric_spec`.

    Raises
    ------
    ConfigError
        For an unknown design, a bad ``gpus`` or ``switch_radix``, or a topology of another size.

    Examples
    --------
    >>> c = count_components("fat-tree", 2048)
    >>> c.nics, c.eps_ports, c.transceivers, c.fibres, c.eps_switches
    (2048, 6144, 8192, 4096, 96)
    """
    return count_links(build_design_graph(design, gpus, switch_radix=switch_radix, min_clos_tiers=min_clos_tiers,
                                          rfabric=rfabric))


def _price(design: str, gpus: int, link_gbps: int, counts: ComponentCounts, ft: ComponentCounts) -> CostRow:
    p = PRICES_USD[link_gbps]

    def usd(c: ComponentCounts) -> tuple[float, ...]:
        return (c.nics * p.nic_usd, c.transceivers * p.transceiver_usd, c.eps_ports * p.eps_port_usd,
                c.ocs_ports * p.ocs_port_usd, c.patch_panel_ports * p.patch_panel_port_usd, c.fibres * p.fibre_usd)

    mine, base = usd(counts), usd(ft)
    return CostRow(design, gpus, link_gbps, counts, *mine, relative_to_fat_tree=sum(mine) / sum(base),
                   relative_to_fat_tree_excl_nics=sum(mine[1:]) / sum(base[1:]))


def _check_speed(link_gbps: object) -> None:
    _check_choice("link_gbps", link_gbps, PRICES_USD, "Table 4 prices")


def network_cost(design: str, gpus: int, link_gbps: int, *, switch_radix: int = 64, min_clos_tiers: int = 1,
                 rfabric_spec: FabricSpec | None = None) -> CostRow:
    """Return the network cost of one design at one Table 4 link speed, relative to fat-tree.

    ``rfabric_spec`` is used only for ``design="rfabric"``, and its own ``link_bps`` is not: counts
    do not depend on speed and prices come from ``link_gbps``.

    Examples
    --------
    >>> row = network_cost("fat-tree-os3", 2048, 200)
    >>> round(row.relative_to_fat_tree, 2) < 1.0
    True
    """
    _check_speed(link_gbps)
    topo = Topology(rfabric_spec) if rfabric_spec is not None and design == "rfabric" else None
    counts = count_components(design, gpus, switch_radix=switch_radix, min_clos_tiers=min_clos_tiers, rfabric=topo)
    ft = count_components("fat-tree", gpus, switch_radix=switch_radix, min_clos_tiers=min_clos_tiers)
    return _price(design, gpus, link_gbps, counts, ft)


def cost_table(gpus: int = 2048, link_gbps: Sequence[int] = (100, 200, 400, 800), *,
               rfabric_spec: FabricSpec | None = None, switch_radix: int = 64,
               min_clos_tiers: int = 1) -> list[CostRow]:
    """Return one :class:`CostRow` per link speed and design, speed-major, in :data:`DESIGNS` order.

    Each design is built and counted once; only the prices change with link speed.
    """
    for s in link_gbps:
        _check_speed(s)
    _check_gpus(gpus)
    most = max_clos_gpus(switch_radix)
    if gpus > most:  # refuse before building anything: the graphs grow with gpus (10**12 would never finish)
        raise ConfigError("cost model", "gpus", f"{gpus} GPUs exceed what a 3-tier Clos of {switch_radix}-port "
                          f"switches connects ({most})", f"at most {most} GPUs, or a larger switch_radix")
    topo = Topology(rfabric_spec) if rfabric_spec is not None else None
    counts = {d: count_components(d, gpus, switch_radix=switch_radix, min_clos_tiers=min_clos_tiers, rfabric=topo)
              for d in DESIGNS}
    return [_price(d, gpus, s, counts[d], counts["fat-tree"]) for s in link_gbps for d in DESIGNS]


def format_cost_table(rows: Sequence[CostRow], *, gpu_price_usd: float | None = None) -> str:
    """Return a readable table: counts per design, then cost per speed beside the paper's ratios.

    Closes with the GPU-cost cross-check of §7.2.3: the GPU price that the paper's FT
    network-to-GPU shares (37% at 200G, 59% at 400G) imply for *our* FT cost; the two agree only
    if our FT cost grows with link speed as the paper's does. With ``gpu_price_usd`` (an assumption
    the caller states) it also prints our FT network-to-GPU share.
    """
    out, m = [], 1e6
    first: dict[str, CostRow] = {}
    for r in rows:
        first.setdefault(r.design, r)
    if first:
        out.append(f"Component counts for {rows[0].gpus} GPUs (independent of link speed)")
        out.append(f"{'design':<15}{'NICs':>7}{'xcvrs':>8}{'EPS ports':>10}{'OCS ports':>10}{'patch':>7}"
                   f"{'fibres':>8}{'switches':>9}{'OCS devs':>9}")
        for d, r in first.items():
            c = r.counts
            out.append(f"{d:<15}{c.nics:>7}{c.transceivers:>8}{c.eps_ports:>10}{c.ocs_ports:>10}"
                       f"{c.patch_panel_ports:>7}{c.fibres:>8}{c.eps_switches:>9}{c.ocs_devices + c.patch_panels:>9}")
        out.append("")
    out.append(f"{'Gbps':>4} {'design':<15}{'total $M':>9}{'NIC':>8}{'xcvr':>8}{'EPS':>8}{'OCS':>8}{'patch':>8}"
               f"{'fibre':>8}{'x FT':>7}{'x FT exNIC':>11}  paper x FT")
    for r in rows:
        out.append(f"{r.link_gbps:>4} {r.design:<15}{r.network_usd / m:>9.3f}{r.nic_usd / m:>8.3f}"
                   f"{r.transceiver_usd / m:>8.3f}{r.eps_port_usd / m:>8.3f}{r.ocs_port_usd / m:>8.3f}"
                   f"{r.patch_panel_port_usd / m:>8.3f}{r.fibre_usd / m:>8.3f}{r.relative_to_fat_tree:>7.2f}"
                   f"{r.relative_to_fat_tree_excl_nics:>11.2f}  {PAPER_RELATIVE[r.design]}")
    ft = {r.link_gbps: r for r in rows if r.design == "fat-tree"}
    checked = [ft[s] for s in sorted(PAPER_FT_NETWORK_TO_GPU) if s in ft]
    if checked:
        out.append("\nGPU cross-check (paper: FT network ~37% of GPU cost at 200G, ~59% at 400G): the GPU price")
        out.append("those shares imply for our FT, with and without NICs in the network:")
        implied = [(r.network_usd / r.gpus / PAPER_FT_NETWORK_TO_GPU[r.link_gbps],
                    r.network_excl_nics_usd / r.gpus / PAPER_FT_NETWORK_TO_GPU[r.link_gbps]) for r in checked]
        for r, (incl, excl) in zip(checked, implied):
            out.append(f"  {r.link_gbps}G: incl. NICs ${r.network_usd / r.gpus:,.0f}/GPU -> ${incl:,.0f}; "
                       f"excl. NICs ${r.network_excl_nics_usd / r.gpus:,.0f}/GPU -> ${excl:,.0f}")
        if len(checked) == 2:  # 1.000 means our FT grows with link speed exactly as the paper's does
            out.append(f"  agreement of the two implied prices (400G/200G): incl. NICs "
                       f"{implied[1][0] / implied[0][0]:.3f}, excl. NICs {implied[1][1] / implied[0][1]:.3f}")
    for s, r in sorted(ft.items()) if gpu_price_usd is not None else ():
        out.append(f"  assumed GPU ${gpu_price_usd:,.0f}: FT network at {s}G = "
                   f"{r.network_usd / (gpu_price_usd * r.gpus):.0%} of GPU cost")
    return "\n".join(out)
