"""The static fabrics as routable graphs, built from the cost model's wiring: FT, FT-OS, RO, TopoOpt, MixNet.

Design note
-----------
Each fabric reads its wiring from :func:`fabric.cost.build_design_graph`, so the cost model and the
simulator describe the same switches and links; only what the wiring leaves open is added here (the
circuits a patch panel or OCS holds). GPU ``g`` sits in server ``g // 8`` behind NIC ``g % 8``.

* **FT, FT-OS, RO** -- the Clos of the cost model. A flow enters at its NIC's leaf and ECMP carries
  it to the destination NIC's leaf. RO's leaves are rail switches, and a flow between different
  ranks first crosses NVLink to the sender's server-mate on the destination's rail (NCCL's PXN), so
  every cross-rail flow stays on one rail.
* **TopoOpt** -- every NIC has one fibre on a patch panel. The panel holds eight directed rings
  over the servers, one per NIC index, with strides chosen as TopoOpt's TotientPerms does
  (coprime to the server count, spread geometrically), so the server graph has degree 8 and a small
  diameter. Servers forward for each other (host forwarding), spending their own NIC links.
* **MixNet** -- NICs 0-5 of a server sit on its region's OCS; NICs 6-7 on the cost model's
  non-blocking Clos. OCS circuits join NICs of two servers of one region; they are allocated per
  communication stage from the stage's server-to-server demand with Algorithm 3 (the same greedy
  RFabric uses, :mod:`fabric.allocation`). A server pair with a circuit uses it; others use the Clos.

A NIC-EPS link failure (:class:`Failures`) relays the GPU's traffic over NVLink to the next healthy
NIC of its server (§5.4); a failed switch link reduces its bundle and ECMP routes around it.
"""

from __future__ import annotations

import hashlib
import math
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import dataclass, field
from typing import Iterable, Mapping

import numpy as np

from orchestrl.fabric.allocation import AllocationProblem, allocate_greedy
from orchestrl.fabric.cost import build_design_graph, max_clos_gpus
from orchestrl.fabric.errors import ConfigError
from orchestrl.fabric.topology import PortRef
from orchestrl.sim.network.config import DESIGN_OF, GPUS_PER_SERVER, SimConfig
from orchestrl.sim.network.ecmp import HOP_COST, Sink
from orchestrl.sim.network.state import NetState, SwitchGraph

__all__ = ["Failures", "Fabric", "ClosFabric", "TopoOptFabric", "MixNetFabric", "MixNetCircuit",
           "totient_strides", "mixnet_circuits"]


@dataclass(frozen=True)
class Failures:
    """What is broken: NIC-EPS links (by GPU), switch links (by their two switch names), OCS ports."""

    nics: frozenset[int] = frozenset()  # GPUs whose NIC-EPS link is down
    links: tuple[tuple[str, str], ...] = ()  # one physical switch-switch link each (Clos fabrics)
    ports: frozenset[PortRef] = frozenset()  # OCS ports (RFabric): circuits through them are dark

    def __post_init__(self) -> None:
        object.__setattr__(self, "nics", frozenset(int(g) for g in self.nics))
        object.__setattr__(self, "links", tuple(sorted(tuple(sorted(x)) for x in self.links)))
        object.__setattr__(self, "ports", frozenset(self.ports))

    @property
    def key(self) -> str:
        return f"nics={sorted(self.nics)};links={list(self.links)};ports={sorted(map(str, self.ports))}"


NO_FAILURES = Failures()


class Fabric(ABC):
    """A fabric of ``gpus`` GPUs: its wiring and how its states route flows.

    Subclasses build :meth:`state`; every state of one fabric shares the base bundles.
    """

    name: str
    nic_attached: bool  # NICs hang off a switch: their links are base bundles, not graph edges

    def __init__(self, name: str, gpus: int, config: SimConfig) -> None:
        if not isinstance(gpus, int) or gpus < GPUS_PER_SERVER or gpus % GPUS_PER_SERVER:
            raise ConfigError("fabric", "gpus", f"{gpus!r} is not a whole number of {GPUS_PER_SERVER}-GPU servers",
                              f"a positive multiple of {GPUS_PER_SERVER}")
        most = max_clos_gpus(config.switch_radix)
        if gpus > most:  # refuse before building: the wiring graphs grow with gpus (10^7 took minutes to refuse)
            raise ConfigError("fabric", "gpus", f"{gpus} GPUs exceed what a 3-tier Clos of {config.switch_radix}-port "
                              f"switches connects ({most}), the largest cluster the cost model compares",
                              f"at most {most}, or a larger switch_radix")
        self.name = name
        self.gpus = gpus
        self.gpus_per_server = GPUS_PER_SERVER
        self.servers = gpus // GPUS_PER_SERVER
        self.config = config
        self._states: dict[str, NetState] = {}
        self.signature = hashlib.sha256(f"{name}|{gpus}|{config!r}".encode()).hexdigest()[:16]

    def relay(self, failures: Failures) -> np.ndarray:
        """Return, per GPU, the GPU whose NIC carries its traffic (itself unless its NIC link failed).

        A GPU with a failed NIC-EPS link relays over NVLink to the next healthy NIC of its server, in
        rank order (§5.4 (iii)); a server with no healthy NIC cannot be reached.
        """
        out = np.arange(self.gpus)
        for g in sorted(failures.nics):
            server = g // self.gpus_per_server
            for k in range(1, self.gpus_per_server):
                cand = server * self.gpus_per_server + (g + k) % self.gpus_per_server
                if cand not in failures.nics:
                    out[g] = cand
                    break
            else:
                raise ConfigError("failures", "nics", f"every NIC of server {server} failed", "at most 7 per server")
        return out

    def state(self, failures: Failures = NO_FAILURES) -> NetState:
        """Return the fabric's state under ``failures`` (built once, then cached)."""
        if failures.links and not hasattr(self, "wiring"):
            raise ConfigError("failures", "links", f"{self.name} has no switch links to fail",
                              "links on ft, ft-os, ro or mixnet; for rfabric fail OCS ports (Failures.ports)")
        if failures.ports and self.name != "rfabric":
            raise ConfigError("failures", "ports", f"{self.name} has no OCS ports the simulator models",
                              "ports on rfabric; on other fabrics fail NICs or links")
        got = self._states.get(failures.key)
        if got is None:
            got = self._states[failures.key] = self._build_state(failures)
        return got

    @abstractmethod
    def _build_state(self, failures: Failures) -> NetState:
        """Return the fabric's state under ``failures`` (each fabric family builds its own)."""

    def describe(self) -> dict[str, object]:
        """Return the fabric's numbering (which switch each GPU's NIC reaches) for reports."""
        return {"fabric": self.name, "gpus": self.gpus, "servers": self.servers}


# ------------------------------------------------------------------------------------ Clos


def _label(node: object) -> str:
    return "/".join(map(str, node)) if isinstance(node, tuple) else str(node)


class _ClosWiring:
    """Switches of a cost-model Clos as integer nodes, with their parallel-link counts."""

    def __init__(self, graph, first_node: int) -> None:
        # role, then the numbers in the name: leaf 2 before leaf 10, so leaf order follows host order
        eps = sorted((n for n, d in graph.nodes(data=True) if d["kind"] == "eps"),
                     key=lambda n: (str(n[1]), n[2:]) if isinstance(n, tuple) else (str(n), ()))
        self.index = {n: first_node + i for i, n in enumerate(eps)}
        self.labels = [_label(n) for n in eps]
        self.roles = [graph.nodes[n].get("role", "") for n in eps]
        pairs: Counter[tuple[int, int]] = Counter()
        self.nic_leaf: dict[tuple[int, int], int] = {}
        for a, b in graph.edges():
            ka, kb = graph.nodes[a]["kind"], graph.nodes[b]["kind"]
            if ka == "eps" and kb == "eps":
                u, v = sorted((self.index[a], self.index[b]))
                pairs[(u, v)] += 1
            elif "nic" in (ka, kb) and "eps" in (ka, kb):
                nic, sw = (a, b) if ka == "nic" else (b, a)
                self.nic_leaf[(nic[1], nic[2])] = self.index[sw]
        keys = sorted(pairs)
        self.u = np.array([k[0] for k in keys], dtype=np.int64)
        self.v = np.array([k[1] for k in keys], dtype=np.int64)
        self.count = np.array([pairs[k] for k in keys], dtype=np.float64)
        self.first_node = first_node

    def edges(self, config: SimConfig, failed: Iterable[tuple[str, str]] = ()) -> tuple[np.ndarray, ...]:
        """Directed edges (tail, head, mult, cost, lat, labels) with failed links taken off."""
        count = self.count.copy()
        by_label = {(self.labels[u - self.first_node], self.labels[v - self.first_node]): i
                    for i, (u, v) in enumerate(zip(self.u, self.v))}
        for a, b in failed:
            i = by_label.get((a, b), by_label.get((b, a)))
            if i is None:
                raise ConfigError("failures", "links", f"no link between switches {a!r} and {b!r}",
                                  "two switch names of the fabric, e.g. " + ", ".join(map(str, list(by_label)[:2])))
            count[i] = max(count[i] - 1, 0)
        lat = config.hop_latency_s() + config.switch_latency_s
        tail = np.concatenate([self.u, self.v])
        head = np.concatenate([self.v, self.u])
        mult = np.concatenate([count, count])
        names = [f"{self.labels[t - self.first_node]}->{self.labels[h - self.first_node]}" for t, h in zip(tail, head)]
        return tail, head, mult, np.full(len(tail), HOP_COST), np.full(len(tail), lat), names


class ClosFabric(Fabric):
    """FT, FT-OS or RO: the cost model's folded Clos with NICs on leaves (RO: rail leaves and PXN)."""

    nic_attached = True

    def __init__(self, name: str, gpus: int, config: SimConfig) -> None:
        super().__init__(name, gpus, config)
        self.wiring = _ClosWiring(build_design_graph(DESIGN_OF[name], gpus, switch_radix=config.switch_radix,
                                                     oversubscription=config.oversubscription), 0)
        self.leaf_of_gpu = np.array([self.wiring.nic_leaf[divmod(g, GPUS_PER_SERVER)] for g in range(gpus)])
        self.pxn = name == "ro"

    def _build_state(self, failures: Failures) -> NetState:
        return _ClosState(self, failures)

    def describe(self) -> dict[str, object]:
        w = self.wiring
        return {**super().describe(), "switches": len(w.labels),
                "leaf_of_gpu": [w.labels[i] for i in self.leaf_of_gpu]}


class _ClosState(NetState):
    def __init__(self, fabric: ClosFabric, failures: Failures) -> None:
        w = fabric.wiring
        tail, head, mult, cost, lat, names = w.edges(fabric.config, failures.links)
        graph = SwitchGraph(len(w.labels), tail, head, mult, cost, lat, np.ones(len(tail), bool), names)
        leaves = np.unique(fabric.leaf_of_gpu)
        self._hop = fabric.config.hop_latency_s()
        super().__init__(fabric, graph, [self._sink(int(x)) for x in leaves], leaves, failures, failures.key)
        self.relay_map = fabric.relay(failures)

    def _sink(self, leaf: int) -> Sink:
        return Sink((leaf,), (0,), (-1,), (self._hop,))

    def _endpoints(self, src, dst):
        fab: ClosFabric = self.fabric
        gps = fab.gpus_per_server
        nic = (src // gps) * gps + dst % gps if fab.pxn else src
        es, ed = self.relay_map[nic], self.relay_map[dst]
        nodes, keys = fab.leaf_of_gpu[es], fab.leaf_of_gpu[ed]
        return nodes, keys, {int(k): self._sink(int(k)) for k in np.unique(keys)}, (es, ed)

    def _own(self, src, dst, ctx, exit_dist, on_bundle):
        es, ed = ctx
        return _nic_entries(self, src, dst, es, ed, exit_dist)


def _nic_entries(state: NetState, src, dst, es, ed, exit_dist):
    """Own bundles of NIC-attached fabrics: NIC up, landing NIC(s) down, NVLink at either end."""
    g, gps, cfg = state.fabric.gpus, state.fabric.gpus_per_server, state.config
    n = len(src)
    i = np.arange(n)
    rows, cols, vals = [i], [2 * g + es], [np.ones(n)]
    relay_out = es != src
    # a relayed flow (PXN, or around a failed NIC) crosses NVLink from src to es: src's NVLink-out and
    # the relay's NVLink-in both carry it
    rows += [i[relay_out], i[relay_out]]
    cols += [src[relay_out], g + es[relay_out]]
    vals += [np.ones(int(relay_out.sum()))] * 2
    own_col = exit_dist[:, -1]
    rows.append(i[own_col > 0])
    cols.append(3 * g + ed[own_col > 0])
    vals.append(own_col[own_col > 0])
    fwd = (own_col > 0) & (ed != dst)  # landed on another GPU's NIC: that GPU forwards it over NVLink
    rows.append(i[fwd])
    cols.append(ed[fwd])
    vals.append(own_col[fwd])
    server = dst // gps
    for r in range(gps):  # landing on another rail of the destination server (RFabric)
        f = exit_dist[:, r]
        m = f > 0
        if m.any():
            rows.append(i[m])
            cols.append(3 * g + server[m] * gps + r)
            vals.append(f[m])
            lander = server[m] * gps + r
            hop = lander != dst[m]
            rows.append(i[m][hop])
            cols.append(lander[hop])  # the landing GPU's NVLink-out towards dst
            vals.append(f[m][hop])
    nvl_in = 1.0 - np.where(ed == dst, own_col, 0.0)
    reached = exit_dist.sum(axis=1) > 0
    m = (nvl_in > 1e-12) & reached
    rows.append(i[m])
    cols.append(g + dst[m])
    vals.append(nvl_in[m])
    extra = (cfg.hop_latency_s() + cfg.switch_latency_s + cfg.nvlink_latency_s * relay_out
             + cfg.nvlink_latency_s * (ed != dst))
    return np.concatenate(rows), np.concatenate(cols), np.concatenate(vals), extra


# ------------------------------------------------------------------------------- server-node fabrics


class _ServerNodeState(NetState):
    """Fabrics whose NIC links are graph edges between server nodes (TopoOpt, MixNet)."""

    def __init__(self, fabric, graph: SwitchGraph, out_edge: np.ndarray, in_edge: np.ndarray,
                 src_node: np.ndarray, sink_node: np.ndarray, failures: Failures, tag: str) -> None:
        self._src_node, self._sink_node = src_node, sink_node
        sinks = [Sink((int(t),), (0,), (-1,), (0.0,)) for t in sink_node]
        super().__init__(fabric, graph, sinks, src_node, failures, tag)
        # Bundle of each GPU's NIC link (out of and into its server); -1 where the NIC has no link.
        self.out_bundle = np.where(out_edge >= 0, self.edge_bundle[np.maximum(out_edge, 0)], -1)
        self.in_bundle = np.where(in_edge >= 0, self.edge_bundle[np.maximum(in_edge, 0)], -1)

    def _endpoints(self, src, dst):
        gps = self.fabric.gpus_per_server
        s, t = src // gps, dst // gps
        keys = t
        sinks = {int(k): Sink((int(self._sink_node[k]),), (0,), (-1,), (0.0,)) for k in np.unique(keys)}
        return self._src_node[s], keys, sinks, None

    def _own(self, src, dst, ctx, exit_dist, on_bundle):
        g, cfg = self.fabric.gpus, self.config
        n = len(src)
        i = np.arange(n)
        ob, ib = self.out_bundle[src], self.in_bundle[dst]
        x_out = np.where(ob >= 0, on_bundle(i, np.maximum(ob, 0)), 0.0)
        x_in = np.where(ib >= 0, on_bundle(i, np.maximum(ib, 0)), 0.0)
        reached = exit_dist.sum(axis=1) > 0
        a, b = (1.0 - x_out) * reached, (1.0 - x_in) * reached
        ma, mb = a > 1e-12, b > 1e-12
        rows, cols, vals = [i[ma], i[mb]], [src[ma], g + dst[mb]], [a[ma], b[mb]]
        # what leaves through a server-mate's NIC enters that mate over NVLink, and what lands on a mate's
        # NIC leaves it over NVLink towards dst: charge the mates' ports too (NVLink out == in, per server)
        gps = self.fabric.gpus_per_server
        for r in range(gps):
            for ends, bundles, col0, m in ((src, self.out_bundle, g, ma), (dst, self.in_bundle, 0, mb)):
                mate = (ends // gps) * gps + r
                sel = m & (mate != ends) & (bundles[mate] >= 0)
                if not sel.any():
                    continue
                frac = on_bundle(i[sel], bundles[mate[sel]])
                keep = frac > 1e-12
                rows.append(i[sel][keep])
                cols.append(col0 + mate[sel][keep])
                vals.append(frac[keep])
        return np.concatenate(rows), np.concatenate(cols), np.concatenate(vals), cfg.nvlink_latency_s * (a + b)


def totient_strides(n_servers: int, degree: int) -> list[int]:
    """Return ring strides for a degree-``degree`` circulant over ``n_servers`` (TopoOpt's TotientPerms).

    Strides are coprime to ``n_servers`` (each stride is then one ring through every server) and
    spread geometrically between 1 and ``n_servers``, which keeps the diameter near
    ``log(n) / log(n^(1/d))``; when there are fewer coprime strides than ``degree``, rings repeat.

    Examples
    --------
    >>> totient_strides(256, 8)
    [1, 3, 5, 9, 17, 33, 65, 129]
    """
    if n_servers < 2:
        return []
    cands = [k for k in range(1, n_servers) if math.gcd(k, n_servers) == 1]
    out: list[int] = []
    for i in range(degree):
        target = n_servers ** (i / degree)
        free = [k for k in cands if k not in out] or cands
        out.append(min(free, key=lambda k: (abs(math.log(k) - math.log(target)), k)))
    return out


class TopoOptFabric(Fabric):
    """TopoOpt: NICs on patch panels holding eight directed rings; servers forward for each other."""

    nic_attached = False

    def __init__(self, gpus: int, config: SimConfig) -> None:
        super().__init__("topoopt", gpus, config)
        if self.servers < 2:
            raise ConfigError("fabric", "gpus", f"TopoOpt of {gpus} GPUs is one server: no patch-panel links to "
                              "simulate", f"at least {2 * GPUS_PER_SERVER} GPUs")
        graph = build_design_graph("topoopt", gpus, switch_radix=config.switch_radix)
        cabled = {n[1:] for n, d in graph.nodes(data=True) if d["kind"] == "nic" and graph.degree(n) == 1}
        if len(cabled) != gpus:  # every NIC must have its fibre on a panel, as the cost model counts
            raise ConfigError("fabric", "topoopt", f"{gpus - len(cabled)} NICs have no patch-panel port", "one each")
        self.strides = totient_strides(self.servers, GPUS_PER_SERVER)

    def _build_state(self, failures: Failures) -> NetState:
        n, gps, cfg = self.servers, self.gpus_per_server, self.config
        tail, head, names = [], [], []
        out_edge = np.full(self.gpus, -1, dtype=np.int64)
        in_edge = np.full(self.gpus, -1, dtype=np.int64)
        mult = []
        for r, k in enumerate(self.strides):
            for s in range(n):
                t = (s + k) % n
                out_edge[s * gps + r] = len(tail)
                in_edge[t * gps + r] = len(tail)
                dead = (s * gps + r) in failures.nics or (t * gps + r) in failures.nics
                tail.append(s)
                head.append(t)
                mult.append(0.0 if dead else 1.0)
                names.append(f"srv{s}:nic{r}->srv{t}")
        m = len(tail)
        graph = SwitchGraph(n, np.array(tail, np.int64), np.array(head, np.int64), np.array(mult),
                            np.full(m, HOP_COST), np.full(m, cfg.hop_latency_s() + cfg.switch_latency_s),
                            np.zeros(m, bool), names)
        nodes = np.arange(n)
        return _ServerNodeState(self, graph, out_edge, in_edge, nodes, nodes, failures, failures.key)

    def describe(self) -> dict[str, object]:
        return {**super().describe(), "ring_strides": self.strides}


# ------------------------------------------------------------------------------------ MixNet


@dataclass(frozen=True, order=True)
class MixNetCircuit:
    """One full-duplex MixNet OCS circuit between NIC ``a_nic`` of server ``a`` and ``b_nic`` of ``b``."""

    a: int
    a_nic: int
    b: int
    b_nic: int


OCS_NICS = 6  # §7.2: 6 of 8 NICs per server on the regional OCS, 2 on the fat-tree


class MixNetFabric(Fabric):
    """MixNet: NICs 0-5 on a regional OCS with per-stage circuits, NICs 6-7 on a non-blocking Clos."""

    nic_attached = False

    def __init__(self, gpus: int, config: SimConfig) -> None:
        super().__init__("mixnet", gpus, config)
        graph = build_design_graph("mixnet", gpus, switch_radix=config.switch_radix)
        self.wiring = _ClosWiring(graph, 2 * self.servers)
        region = {}
        for node, d in graph.nodes(data=True):
            if d.get("role") == "ocs":
                for nic in graph.neighbors(node):
                    region[nic[1]] = d["region"]
        self.region_of_server = np.array([region[s] for s in range(self.servers)])

    def _build_state(self, failures: Failures, circuits: tuple[MixNetCircuit, ...] = ()) -> NetState:
        n, gps, cfg, w = self.servers, self.gpus_per_server, self.config, self.wiring
        tail, head, mult, cost, lat, names = (list(x) for x in w.edges(cfg, failures.links))
        mergeable = [True] * len(tail)
        out_edge = np.full(self.gpus, -1, dtype=np.int64)
        in_edge = np.full(self.gpus, -1, dtype=np.int64)
        hop = cfg.hop_latency_s()

        def add(t: int, h: int, m: float, label: str, swl: float) -> int:
            tail.append(t), head.append(h), mult.append(m), cost.append(HOP_COST), lat.append(hop + swl)
            names.append(label), mergeable.append(False)
            return len(tail) - 1

        for s in range(n):
            for r in range(OCS_NICS, gps):
                g = s * gps + r
                dead = 0.0 if g in failures.nics else 1.0
                leaf = w.nic_leaf[(s, r)]
                out_edge[g] = add(s, leaf, dead, f"srv{s}:nic{r}->{w.labels[leaf - w.first_node]}",
                                  cfg.switch_latency_s)
                in_edge[g] = add(leaf, n + s, dead, f"{w.labels[leaf - w.first_node]}->srv{s}:nic{r}", 0.0)
        for c in circuits:
            ga, gb = c.a * gps + c.a_nic, c.b * gps + c.b_nic
            dead = 0.0 if ga in failures.nics or gb in failures.nics else 1.0
            out_edge[ga] = in_edge[gb] = add(c.a, n + c.b, dead, f"srv{c.a}:nic{c.a_nic}=>srv{c.b}:nic{c.b_nic}", 0.0)
            out_edge[gb] = in_edge[ga] = add(c.b, n + c.a, dead, f"srv{c.b}:nic{c.b_nic}=>srv{c.a}:nic{c.a_nic}", 0.0)
        graph = SwitchGraph(2 * n + len(w.labels), np.array(tail, np.int64), np.array(head, np.int64),
                            np.array(mult, dtype=np.float64), np.array(cost, np.int64), np.array(lat),
                            np.array(mergeable), names)
        tag = failures.key + "|" + hashlib.sha256(repr(circuits).encode()).hexdigest()[:12]
        return _ServerNodeState(self, graph, out_edge, in_edge, np.arange(n), n + np.arange(n), failures, tag)

    def with_circuits(self, circuits: Iterable[MixNetCircuit], failures: Failures = NO_FAILURES) -> NetState:
        """Return the state in which the regional OCSes hold ``circuits`` (cached by circuit set)."""
        circuits = tuple(sorted(circuits))
        key = failures.key + repr(circuits)
        got = self._states.get(key)
        if got is None:
            got = self._states[key] = self._build_state(failures, circuits)
        return got


def mixnet_circuits(fabric: MixNetFabric, pair_bytes: Mapping[tuple[int, int], float],
                    failures: Failures = NO_FAILURES) -> tuple[MixNetCircuit, ...]:
    """Return the OCS circuits MixNet would set up for a stage with this GPU-to-GPU demand.

    Demand is folded to server pairs of one region, and Algorithm 3 (:func:`fabric.allocation.allocate_greedy`)
    gives each server pair circuits under a budget of six OCS NICs per server (failed NICs excluded);
    circuit ``k`` of a server uses its lowest free OCS NIC.

    Notes
    -----
    O(P log P + K) for P server pairs and K circuits (the greedy's cost).
    """
    gps = fabric.gpus_per_server
    demand: dict[tuple[str, str], float] = {}
    for (a, b), v in pair_bytes.items():
        s, t = a // gps, b // gps
        if s != t and v > 0 and fabric.region_of_server[s] == fabric.region_of_server[t]:
            demand[(f"s{s}", f"s{t}")] = demand.get((f"s{s}", f"s{t}"), 0.0) + float(v)
    if not demand:
        return ()
    servers = {int(e[1:]) for pair in demand for e in pair}
    ports = {f"s{s}": sum(1 for r in range(OCS_NICS) if s * gps + r not in failures.nics) for s in servers}
    alloc = allocate_greedy(AllocationProblem(fabric.config.link_bps, ports, demand))
    nxt = {s: [r for r in range(OCS_NICS) if s * gps + r not in failures.nics] for s in servers}
    out = []
    for (a, b), count in sorted(alloc.circuits.items()):
        sa, sb = int(a[1:]), int(b[1:])
        for _ in range(count):
            out.append(MixNetCircuit(sa, nxt[sa].pop(0), sb, nxt[sb].pop(0)))
    return tuple(out)
