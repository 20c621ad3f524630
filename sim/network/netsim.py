"""NetworkSim: one fabric, its current state, and cached timings of flow sets and collectives.

Design note
-----------
This is the object the RL-iteration simulator holds. It times a flow set or a collective on the
fabric *as it stands* and caches the answer by (pattern signature, fabric-state signature), so an
iteration that repeats last iteration's collectives on the same circuits re-solves nothing.

What "as it stands" means per fabric:

* static fabrics (FT, FT-OS, RO, TopoOpt) -- the wiring, minus failures;
* MixNet -- circuits re-allocated per stage: with ``circuits="per-pattern"`` (default) each timed
  pattern gets the circuits MixNet would set up for it, else those set with :meth:`set_mixnet_circuits`;
* RFabric -- with ``circuits="per-pattern"`` each pattern gets a plan from the real controller
  (Algorithm 2 on the pattern's demand, the train-dp template, so any PoD pair may get circuits);
  with ``circuits="fixed"`` the circuits in force are those of :meth:`set_circuits` or of an
  :class:`sim.network.reconfig.RFabricDriver` timeline (:meth:`time_flows` with ``timeline``).

For the generation engine's network seams :meth:`rates` and :meth:`transfer_time_s` give the
max-min rates of concurrent transfers and the time of one batch of them.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from orchestrl.fabric.controller import FabricController
from orchestrl.fabric.errors import ConfigError
from orchestrl.fabric.intent import Collective, Intent
from orchestrl.fabric.plan import Circuit, CircuitPlan
from orchestrl.fabric.topology import Topology
from orchestrl.fabric.traffic import aggregate_pair_arrays
from orchestrl.sim.network.build import build_fabric
from orchestrl.sim.network.collectives import CollectiveTiming, collective_flows, timing_of
from orchestrl.sim.network.config import SimConfig
from orchestrl.sim.network.events import FlowResult, FlowSet, simulate
from orchestrl.sim.network.fabrics import Fabric, Failures, MixNetCircuit, MixNetFabric, mixnet_circuits
from orchestrl.sim.network.rfabric import RFabricFabric
from orchestrl.sim.network.state import NetState

__all__ = ["NetworkSim", "CacheStats", "pattern_intent"]

CIRCUIT_POLICIES = ("per-pattern", "fixed")


@dataclass
class CacheStats:
    hits: int = 0
    misses: int = 0


def pattern_intent(members: Sequence[int], job: str = "sim") -> Intent:
    """Return the intent under which the controller plans circuits for an arbitrary flow pattern.

    The train-dp template makes every PoD pair of the pattern eligible on OCS-Core (a mesh) and
    lets OCS-Agg join ToRs and lift to the boundary; the demand itself is passed to the controller
    separately, so the intent's one collective only names the members (zero bytes).
    """
    group = tuple(sorted(set(int(g) for g in members)))
    return Intent("train-dp", job, "pattern", (Collective("all-reduce", groups=(group,), bytes_per_rank=0.0),),
                  template="train-dp")


class NetworkSim:
    """Time flow sets and collectives on one fabric, caching by (pattern, fabric state).

    Parameters
    ----------
    fabric : Fabric or str
        A built fabric, or a fabric name (then ``gpus`` is required).
    gpus : int, optional
    config : SimConfig, optional
    topology : Topology, optional
        RFabric only.
    circuits : {"per-pattern", "fixed"}
        How RFabric and MixNet get circuits (see the module note).
    method : str
        RFabric's allocation procedure for per-pattern plans (``greedy``, ``uniform``, ...).
    cache_size : int
        Timings kept (least recently used dropped first).

    Examples
    --------
    >>> sim = NetworkSim("ft", gpus=64)
    >>> t = sim.time_collective(Collective("all-reduce", groups=(tuple(range(0, 64, 8)),), bytes_per_rank=1e9))
    >>> round(t.busbw_bytes_per_s / 1e9, 1)  # one 200 Gb/s NIC per rank: 25 GB/s bus bandwidth
    25.0
    >>> sim.time_collective(Collective("all-reduce", groups=(tuple(range(0, 64, 8)),), bytes_per_rank=1e9)) is t
    True
    """

    def __init__(self, fabric: Fabric | str, gpus: int | None = None, config: SimConfig | None = None, *,
                 topology: Topology | None = None, circuits: str = "per-pattern", method: str = "greedy",
                 cache_size: int = 4096) -> None:
        if isinstance(fabric, str):
            if gpus is None:
                raise ConfigError("NetworkSim", "gpus", "is required with a fabric name", "a multiple of 8")
            fabric = build_fabric(fabric, gpus, config, topology=topology)
        if circuits not in CIRCUIT_POLICIES:
            raise ConfigError("NetworkSim", "circuits", f"unknown policy {circuits!r}", ", ".join(CIRCUIT_POLICIES))
        self.fabric = fabric
        self.config = fabric.config
        self.circuit_policy = circuits
        self.method = method
        self.failures = Failures()
        self._circuits: tuple[Circuit, ...] = ()
        self._mixnet: tuple[MixNetCircuit, ...] = ()
        self._cache: OrderedDict[tuple, object] = OrderedDict()
        self._cache_size = cache_size
        self.stats = CacheStats()
        self._controller = (FabricController(fabric.topology, method=method)
                            if isinstance(fabric, RFabricFabric) else None)
        self.last_plan: CircuitPlan | None = None

    # ------------------------------------------------------------------ state
    def set_failures(self, failures: Failures) -> None:
        """Break NIC-EPS links, switch links or OCS ports; later timings see the degraded fabric."""
        self.failures = failures
        if self._controller is not None and failures.ports:
            self._controller.mask_ports([(p.device, p.port, "failed") for p in sorted(failures.ports)])

    def set_circuits(self, plan: CircuitPlan | Sequence[Circuit] | None) -> None:
        """RFabric: hold these circuits (a plan from the controller) until changed."""
        self._circuits = tuple(plan.circuits if isinstance(plan, CircuitPlan) else (plan or ()))

    def set_mixnet_circuits(self, circuits: Sequence[MixNetCircuit]) -> None:
        """MixNet: hold these OCS circuits until changed."""
        self._mixnet = tuple(circuits)

    def state(self, flows: FlowSet | None = None) -> NetState:
        """Return the fabric state a pattern is timed on (planning its circuits if the policy says so)."""
        fab = self.fabric
        if isinstance(fab, RFabricFabric):
            if self.circuit_policy == "per-pattern" and flows is not None and len(flows):
                plan = self.plan_for(flows)
                return fab.with_circuits(plan.circuits if plan else (), self.failures)
            return fab.with_circuits(self._circuits, self.failures)
        if isinstance(fab, MixNetFabric):
            circuits = self._mixnet
            if self.circuit_policy == "per-pattern" and flows is not None and len(flows):
                pairs = {}
                for a, b, v in zip(flows.src.tolist(), flows.dst.tolist(), flows.size_bytes.tolist()):
                    pairs[(a, b)] = pairs.get((a, b), 0.0) + v
                circuits = mixnet_circuits(fab, pairs, self.failures)
            return fab.with_circuits(circuits, self.failures)
        return fab.state(self.failures)

    def plan_for(self, flows: FlowSet) -> CircuitPlan | None:
        """RFabric: the controller's plan for a flow pattern's demand (cached with the timings)."""
        key = ("plan", flows.signature, self.failures.key, self.method)
        if key in self._cache:
            return self._cache[key]
        relay = self.fabric.relay(self.failures)  # a GPU behind a failed NIC enters at its relay's ToR
        demand = aggregate_pair_arrays(relay[flows.src], relay[flows.dst], flows.size_bytes, self._controller.topology)
        res = self._controller.materialize(pattern_intent(np.concatenate([flows.src, flows.dst])), demand)
        plan = res.plan if res.accepted else None
        self.last_plan = plan
        self._put(key, plan)
        return plan

    # ------------------------------------------------------------------ timing
    def _put(self, key: tuple, value: object) -> None:
        self._cache[key] = value
        self._cache.move_to_end(key)
        while len(self._cache) > self._cache_size:
            self._cache.popitem(last=False)

    def _get(self, key: tuple):
        got = self._cache.get(key)
        if got is not None:
            self._cache.move_to_end(key)
            self.stats.hits += 1
        else:
            self.stats.misses += 1
        return got

    def time_flows(self, flows: FlowSet, timeline: Sequence[tuple[float, NetState]] | None = None, *,
                   progress: Callable[[float, int, int], None] | None = None) -> FlowResult:
        """Return when each flow finishes on the current state (or across ``timeline``), cached.

        Notes
        -----
        A cache hit is O(F) (hashing the pattern); a miss runs :func:`sim.network.events.simulate`.
        """
        if timeline is None:
            state = self.state(flows)
            key = ("flows", flows.signature, state.signature)
            got = self._get(key)
            if got is None:
                got = simulate(flows, state, progress=progress)
                self._put(key, got)
            return got
        key = ("flows", flows.signature) + tuple((t, s.signature) for t, s in timeline)
        got = self._get(key)
        if got is None:
            got = simulate(flows, timeline, progress=progress)
            self._put(key, got)
        return got

    def time_collective(self, collective: Collective, algorithm: str = "ring", *,
                        timeline: Sequence[tuple[float, NetState]] | None = None,
                        topology: Topology | None = None) -> CollectiveTiming:
        """Return the completion time and bus bandwidth of one collective (cached).

        ``topology`` is needed only by a weight-sync collective without explicit transfers.
        """
        topo = topology or getattr(self.fabric, "topology", None)
        flows = collective_flows(collective, topo, algorithm)
        state_sig = (tuple((t, s.signature) for t, s in timeline) if timeline is not None
                     else self.state(flows).signature)
        key = ("collective", flows.signature, collective.primitive, algorithm, state_sig)
        got = self._get(key)
        if got is None:
            res = self.time_flows(flows, timeline)
            latency = (timeline[0][1] if timeline else self.state(flows)).incidence(flows.src, flows.dst).latency_s
            got = timing_of(collective, res, latency, algorithm)
            self._put(key, got)
        return got

    def rates(self, src: Sequence[int], dst: Sequence[int]) -> np.ndarray:
        """Return the max-min fair rate (bits/s) of concurrent transfers ``src[i] -> dst[i]``.

        This is the seam for the generation engine: KV migration, parameter reload or an M2N
        exchange runs at these rates rather than at a hard-coded NIC rate.
        """
        flows = FlowSet(src, dst, np.ones(len(src)), np.zeros(len(src)))
        state = self.state(flows)
        key = ("rates", flows.signature, state.signature)
        got = self._get(key)
        if got is None:
            inc = state.incidence(flows.src, flows.dst)
            run = inc.routable
            got = inc.problem().solve(state.capacity_bps, run).rate_bps if run.any() else np.zeros(len(src))
            self._put(key, got)
        return got

    def transfer_time_s(self, src: Sequence[int], dst: Sequence[int], size_bytes: Sequence[float] | float) -> float:
        """Return when the last of a batch of concurrent transfers finishes (inf if one cannot)."""
        size = np.broadcast_to(np.asarray(size_bytes, dtype=np.float64), (len(src),))
        return self.time_flows(FlowSet(src, dst, size, np.zeros(len(src)))).makespan_s
