"""RFabric as a routable graph: rail ToRs joined only by the circuits of a plan from the real controller.

Design note
-----------
The wiring is a :class:`fabric.topology.Topology` (the same object the cost model counts). Below the
ToRs nothing changes: a GPU's NIC sits on its rail ToR (``topology.tor_of_gpu``). Above them there
is no electrical path at all -- capacity between ToRs exists only as circuits of a
:class:`fabric.plan.CircuitPlan`:

* an OCS-Agg circuit between two ToRs of a PoD is a ToR-to-ToR link (fibre ToR-Agg-ToR);
* an OCS-Core circuit between boundary fibres of PoDs p and q carries traffic only where each
  fibre's Agg port is cross-connected down to a ToR (the lift/drop circuits): ToR x of p and ToR y
  of q are then joined by one optical path ToR-Agg-Core-Agg-ToR. Which ToRs end up joined is
  whatever the controller's placement made; the simulator does not re-pair them.

ToRs forward packets, so routes may take several circuits. A flow enters at its own NIC's ToR (the
controller plans demand from ``tor_of_gpu`` of both ends) and leaves at its destination NIC's
ToR; when that is further, it may instead land on another rail ToR of the destination rack and
finish over NVLink (one and a half hops' worth of cost, so a direct circuit always wins).
Circuits whose ports are in :attr:`Failures.ports` are dark.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from typing import Iterable

import numpy as np

from orchestrl.fabric.cost import default_rfabric_spec
from orchestrl.fabric.errors import ConfigError
from orchestrl.fabric.plan import Circuit, CircuitPlan, is_uplink_endpoint
from orchestrl.fabric.topology import Topology
from orchestrl.sim.network.config import GPUS_PER_SERVER, SimConfig
from orchestrl.sim.network.ecmp import HOP_COST, Sink
from orchestrl.sim.network.fabrics import NO_FAILURES, Fabric, Failures, _nic_entries
from orchestrl.sim.network.state import NetState, SwitchGraph

__all__ = ["RFabricFabric", "LANDING_EXTRA_COST", "circuit_links"]

#: Extra routing cost of landing on another rail's ToR and crossing NVLink (1.5 hops in HOP_COST units).
LANDING_EXTRA_COST = 3


def circuit_links(topology: Topology, circuits: Iterable[Circuit], dark: frozenset = frozenset()
                  ) -> tuple[Counter, Counter]:
    """Return ToR-to-ToR links a circuit set makes: (intra-PoD Agg links, inter-PoD Agg-Core-Agg paths).

    Each is a Counter of sorted ToR-id pairs. A Core circuit counts only when both of its boundary
    fibres are lifted to a ToR by an Agg circuit; a circuit touching a ``dark`` port counts not at all.

    Notes
    -----
    O(C) for C circuits.
    """
    agg: Counter = Counter()
    lift: dict = {}
    circuits = list(circuits)
    for c in circuits:
        if c.tier != "agg" or any(p in dark for p in c.xc.ports()):
            continue
        if is_uplink_endpoint(c.a) or is_uplink_endpoint(c.b):
            tor = c.b if is_uplink_endpoint(c.a) else c.a
            for p in c.xc.ports():
                if p in topology.fibre_by_agg:
                    lift[p] = tor
        else:
            agg[tuple(sorted((c.a, c.b)))] += 1
    core: Counter = Counter()
    for c in circuits:
        if c.tier != "core" or any(p in dark for p in c.xc.ports()):
            continue
        fa, fb = (topology.fibre_by_core.get(p) for p in c.xc.ports())
        if fa is None or fb is None or fa.agg in dark or fb.agg in dark:
            continue
        x, y = lift.get(fa.agg), lift.get(fb.agg)
        if x is not None and y is not None:
            core[tuple(sorted((x, y)))] += 1
    return agg, core


class RFabricFabric(Fabric):
    """RFabric of ``gpus`` GPUs (default: :func:`fabric.cost.default_rfabric_spec`, as the cost model)."""

    nic_attached = True

    def __init__(self, gpus: int, config: SimConfig, topology: Topology | None = None) -> None:
        super().__init__("rfabric", gpus, config)
        if topology is None:
            topology = Topology(default_rfabric_spec(gpus, config.link_bps / 1e9, switch_radix=config.switch_radix))
        if topology.gpu_count != gpus or topology.spec.gpus_per_server != GPUS_PER_SERVER:
            raise ConfigError(topology.spec.source, "pods", f"topology has {topology.gpu_count} GPUs in servers of "
                              f"{topology.spec.gpus_per_server}", f"{gpus} GPUs in servers of {GPUS_PER_SERVER}")
        if abs(topology.link_bps - config.link_bps) > 1e-6 * config.link_bps:
            raise ConfigError(topology.spec.source, "link_gbps", f"{topology.link_bps / 1e9:g} differs from the "
                              f"simulator's {config.link_bps / 1e9:g} Gb/s", "the same link speed in both")
        self.topology = topology
        self.tor_ids = tuple(topology.tors)
        self.tor_index = {t: i for i, t in enumerate(self.tor_ids)}
        self.tor_of_gpu = np.array([self.tor_index[topology.tor_of_gpu(g)] for g in range(gpus)])
        racks: dict[tuple[int, int], list[int]] = {}
        for t in topology.tors.values():
            racks.setdefault((t.pod, t.rack), []).append(self.tor_index[t.id])
        self.rack_tors = [racks[(topology.tors[t].pod, topology.tors[t].rack)] for t in self.tor_ids]
        self.tor_rail = [topology.tors[t].rails[0] for t in self.tor_ids]
        self.signature = hashlib.sha256((self.signature + repr(topology.spec)).encode()).hexdigest()[:16]

    def _build_state(self, failures: Failures) -> NetState:
        return _RFabricState(self, (), failures)

    def with_circuits(self, circuits: Iterable[Circuit] | CircuitPlan | None,
                      failures: Failures = NO_FAILURES) -> NetState:
        """Return the state in which the OCS devices hold ``circuits`` (a plan, a list, or None: nothing)."""
        if isinstance(circuits, CircuitPlan):
            circuits = circuits.circuits
        circuits = tuple(sorted(circuits or (), key=lambda c: (c.xc.device, c.xc.a_port, c.xc.b_port)))
        if failures.links:
            raise ConfigError("failures", "links", "rfabric has no switch links to fail",
                              "OCS ports (Failures.ports) or NICs (Failures.nics)")
        key = failures.key + "|" + hashlib.sha256(repr([(c.xc, c.a, c.b) for c in circuits]).encode()).hexdigest()
        got = self._states.get(key)
        if got is None:
            got = self._states[key] = _RFabricState(self, circuits, failures)
        return got

    def describe(self) -> dict[str, object]:
        s = self.topology.spec
        return {**super().describe(), "pods": s.pods, "servers_per_pod": s.servers_per_pod,
                "servers_per_tor": s.effective_servers_per_tor, "tors": len(self.tor_ids),
                "tor_of_gpu": [self.tor_ids[i] for i in self.tor_of_gpu]}


class _RFabricState(NetState):
    def __init__(self, fabric: RFabricFabric, circuits: tuple[Circuit, ...], failures: Failures) -> None:
        cfg = fabric.config
        agg, core = circuit_links(fabric.topology, circuits, failures.ports)
        tail, head, mult, lat, names = [], [], [], [], []
        ser = cfg.mtu_bytes * 8 / cfg.link_bps
        for links, segments, kind in ((agg, 2, "agg"), (core, 4, "core")):
            for (a, b), n in sorted(links.items()):
                for x, y in ((a, b), (b, a)):
                    tail.append(fabric.tor_index[x])
                    head.append(fabric.tor_index[y])
                    mult.append(float(n))
                    lat.append(segments * cfg.link_latency_s + ser + cfg.switch_latency_s)
                    names.append(f"{x}=>{y} ({kind} x{n})")
        m = len(tail)
        graph = SwitchGraph(len(fabric.tor_ids), np.array(tail, np.int64), np.array(head, np.int64),
                            np.array(mult, dtype=np.float64), np.full(m, HOP_COST), np.array(lat),
                            np.ones(m, bool), names)
        self._hop = cfg.hop_latency_s()
        self._failed_servers = {g // fabric.gpus_per_server for g in failures.nics}
        self.relay_map = fabric.relay(failures)
        self._fab = fabric
        self.failures, self.config = failures, cfg  # _sink needs both before NetState sets them
        sinks = [self._sink(t, -1) for t in range(len(fabric.tor_ids))]
        sinks += [self._sink(int(fabric.tor_of_gpu[s * fabric.gpus_per_server + r]), s)
                  for s in self._failed_servers for r in range(fabric.gpus_per_server)]
        self.circuits = circuits
        tag = failures.key + "|" + hashlib.sha256(repr([(c.xc, c.a, c.b) for c in circuits]).encode()).hexdigest()[:12]
        super().__init__(fabric, graph, sinks, np.arange(len(fabric.tor_ids)), failures, tag)

    def _sink(self, tor: int, server: int) -> Sink:
        """Exits toward ToR ``tor``: itself, or another rail ToR of its rack then NVLink (not onto a dead NIC)."""
        fab, cfg = self._fab, self.config
        nodes, extra, label, lat = [tor], [0], [-1], [self._hop]
        for y in fab.rack_tors[tor]:
            rail = fab.tor_rail[y]
            if y == tor or (server >= 0 and server * fab.gpus_per_server + rail in self.failures.nics):
                continue
            nodes.append(y), extra.append(LANDING_EXTRA_COST), label.append(rail)
            lat.append(self._hop + cfg.nvlink_latency_s)
        return Sink(tuple(nodes), tuple(extra), tuple(label), tuple(lat))

    def _endpoints(self, src, dst):
        fab = self._fab
        es, ed = self.relay_map[src], self.relay_map[dst]
        nodes = fab.tor_of_gpu[es]
        tors = fab.tor_of_gpu[ed]
        server = dst // fab.gpus_per_server
        failed = np.isin(server, np.fromiter(self._failed_servers, np.int64, len(self._failed_servers)))
        keys = tors * (fab.servers + 1) + np.where(failed, server + 1, 0)
        sinks = {}
        for k in np.unique(keys).tolist():
            t, s = divmod(k, fab.servers + 1)
            sinks[k] = self._sink(t, s - 1)
        return nodes, keys, sinks, (es, ed)

    def _own(self, src, dst, ctx, exit_dist, on_bundle):
        es, ed = ctx
        return _nic_entries(self, src, dst, es, ed, exit_dist)
