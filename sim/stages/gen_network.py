"""The generation engine's network seam on RLSim's network simulator (NetworkSim, RFabricDriver).

Design note
-----------
:class:`FabricSeam` implements :class:`compute_sched.netseam.NetworkSeam`, so the simulated
generation engine and its scheduler run unchanged while every byte that leaves a server is timed
on the fabric:

* **Decode traffic** (EP all-to-all, AFD M2N, cross-node TP all-reduce). Every instance of a
  layout that sends across nodes contributes its pattern -- all instances at once, which is what a
  fabric shared by concurrently decoding instances sees -- with per-pair bytes of one layer at the
  nominal batch. The pattern is timed once on the fabric state in force; instance ``k`` gets the
  effective per-GPU rate ``B_k = link * T_ideal_k / T_k``, where ``T_ideal_k`` is its busiest
  NIC's cross-server bytes over the line rate (what a non-blocking fabric gives) and ``T_k`` when
  its last flow finished. On a non-blocking fabric at the GPU's NIC rate this reproduces the
  performance model's NIC term exactly; where uplinks are oversubscribed or circuits are missing,
  ``B_k`` shrinks by the slowdown the flows saw (path latency is left out: the step model has its
  own per-exchange latency). Rates are cached per (layout, fabric state).
* **Estimates** for the planner (a configuration without a placement): the harmonic mean of
  ``B_k`` over a homogeneous layout of that configuration on the generation GPUs; bulk transfers
  (reshard from peers, KV transfer) use a shift pattern, every instance sending to the next.
* **Deployment boundaries.** On RFabric with an :class:`~sim.network.reconfig.RFabricDriver`,
  :meth:`FabricSeam.deploy` announces the new layout's generation intent
  (:func:`compute_sched.intents.generation_intent`) with the demand of its decode pattern plus the
  reload and KV transfers the change causes, then marks the ``deployment-boundary`` the Gen gate
  waits for, with the pause the runtime takes (at least the engine switch-over, at least the
  switching the plan needs). The Gen template keeps PoDs isolated (Figure 8(c)); a deployment whose
  decode pattern or transfers cross PoDs asks for the train template's demanded core circuits
  instead (the intent's template override), since RFabric has no other path between PoDs.
  Decoding instances that cross nodes start once the circuits are up;
  the circuits in force after the change are the state decode rates are computed on, and
  transfers run on the driver's timeline (old circuits until the new ones have switched).
* **Transfers** are flows: each :class:`~compute_sched.netseam.Transfer` spreads its bytes over
  source/destination GPU pairs, pairs are summed per GPU pair and start time, and each transfer
  lands when its last pair has (never, ``inf``, where the circuits in force give no path: the engine
  then recomputes the KV or reads the weights from host memory). Flow sizes are rounded up to 64
  log-spaced classes between the batch's smallest and largest flow, so a batch of thousands of
  differently sized KV caches costs at most ~64 events; a flow lands late by at most
  ``(largest / smallest) ** (1 / 64)`` (11% for a 1000x spread). The engine times transfers this
  way at deployment boundaries; migrations while decoding are priced by the cost model at
  :meth:`FabricSeam.transfer_bytes_per_s`.

**Copies.** With ``copies=c`` the engine simulates a slice of ``len(gpus) / c`` GPUs that stands
for ``c`` identical copies side by side (``GenerationStage(slice_gpus=...)``). The fabric still sees
the whole cluster: every pattern, intent and transfer is replicated onto each copy's GPUs, an
instance runs at the harmonic mean of its copies' rates (their average step), and a transfer
lands when its slowest copy has.

Static fabrics ignore intents; MixNet and RFabric without a driver get the circuits NetworkSim
plans per pattern. ``probe`` mode (veRL-TO's TP sweep) never touches the driver: RFabric rates then
come from the plan the controller *would* make for the layout (same algorithm, private cache).
"""

from __future__ import annotations

import contextlib
import itertools
import math
import time
from dataclasses import dataclass, replace
from typing import Iterator, Sequence

import numpy as np

from orchestrl.compute_sched.hardware import DTYPE_BYTES
from orchestrl.compute_sched.intents import generation_intent
from orchestrl.compute_sched.layout import Instance, InstanceConfig, Layout, homogeneous
from orchestrl.compute_sched.netseam import Transfer, crosses_nodes
from orchestrl.compute_sched.perf import PerfModel
from orchestrl.fabric.controller import FabricState, materialize
from orchestrl.fabric.errors import ConfigError
from orchestrl.fabric.intent import Collective, intent_from_mapping
from orchestrl.fabric.safe_window import CollectiveEvent
from orchestrl.fabric.templates import TemplateCache
from orchestrl.fabric.traffic import aggregate_pair_arrays, collective_pair_arrays, intent_pair_arrays
from orchestrl.sim.network.config import GPUS_PER_SERVER
from orchestrl.sim.network.events import FlowSet
from orchestrl.sim.network.netsim import NetworkSim
from orchestrl.sim.network.reconfig import RFabricDriver
from orchestrl.sim.network.rfabric import RFabricFabric

__all__ = ["FabricSeam", "Deployment", "TransferBatch"]

_SIZE_CLASSES = 64  # a batch's flow sizes are rounded up to this many log-spaced classes (bounded events)
_IDEAL_S = 1.0  # decode patterns are scaled so the shortest ideal time is this long (any scale gives the same rates)


@dataclass(frozen=True)
class Deployment:
    """One layout taking over, as the fabric saw it (stage clock)."""

    t_s: float
    layout: str
    ready_s: float  # when its cross-node decode traffic could start
    action: str  # driver decision: commit, defer, unchanged, refused, reject; "static" off RFabric
    switching_s: float  # OCS switching of a committed change
    transfers: int  # reload and KV transfers announced with it


@dataclass(frozen=True)
class TransferBatch:
    """One batch of concurrent transfers timed as flows (stage clock)."""

    t_s: float
    kind: str  # "kv", "weights" or "mixed"
    transfers: int
    size_bytes: float
    flows: int
    makespan_s: float  # from the first transfer's start to the last landing
    wall_s: float  # host seconds the flow simulation took


class FabricSeam:
    """A :class:`~compute_sched.netseam.NetworkSeam` on a :class:`~sim.network.netsim.NetworkSim`.

    Parameters
    ----------
    net : NetworkSim
        The fabric (its failures apply).
    gpus : sequence of int
        Fabric GPU of each cluster-local generation GPU.
    perf : PerfModel
        The network-free performance model (sizes of decode exchanges and intents).
    driver : RFabricDriver, optional
        RFabric's control loop; deployments then go through the controller and the Gen gate.
    job : str
        Job name of the intents and gate events.
    nominal_batch : int, optional
        Sequences per instance the decode pattern is sized at (default: the engine's batch limit).
    boundary_pause_s : float
        Shortest pause the runtime takes at a deployment boundary (the engine switch-over).
    copies : int
        The engine's cluster is the first ``len(gpus) / copies`` GPUs; the rest run identical copies.

    Examples
    --------
    >>> from orchestrl.compute_sched.hardware import load_gpu, load_model
    >>> from orchestrl.compute_sched.layout import parse_config
    >>> perf = PerfModel(load_model("Qwen2-57B-A14B"), load_gpu("H800"))
    >>> seam = FabricSeam(NetworkSim("ft", gpus=64), range(64), perf)
    >>> round(seam.link_bytes_per_s(parse_config("ep16-tp1")) / 1e9, 3)  # non-blocking: the 200 Gb/s NIC
    25.0
    """

    def __init__(self, net: NetworkSim, gpus: Sequence[int], perf: PerfModel, driver: RFabricDriver | None = None,
                 *, job: str = "gen", nominal_batch: int | None = None, boundary_pause_s: float = 1.5,
                 copies: int = 1) -> None:
        self.net, self.driver, self.job = net, driver, job
        self.gpus = np.asarray(list(gpus), dtype=np.int64)
        if copies < 1 or len(self.gpus) % copies:
            raise ConfigError("FabricSeam", "copies", f"{copies} copies of {len(self.gpus)} GPUs",
                              f"a divisor of {len(self.gpus)}")
        self.copies, self.local = copies, len(self.gpus) // copies
        self._copy_gpus = self.gpus.reshape(copies, self.local)  # fabric GPU of (copy, engine GPU)
        self.perf = perf.with_network(None)
        self.nominal_batch = nominal_batch or perf.cal.max_num_seqs
        self.boundary_pause_s = boundary_pause_s
        self.link_bytes_s = net.config.link_bps / 8.0
        self.rfabric = isinstance(net.fabric, RFabricFabric)
        if driver is not None and driver.fabric is not net.fabric:
            raise ConfigError("FabricSeam", "driver", "drives another fabric than the NetworkSim times",
                              "RFabricDriver(net.fabric)")
        self.origin_s = 0.0
        self.probe = False
        self._state = None  # NetState in force for decode (None: the NetworkSim's own choice per pattern)
        self._current: dict[tuple[int, ...], float] = {}
        self._cache: dict[tuple, object] = {}
        self._templates = TemplateCache()
        self._pod: np.ndarray | None = None  # PoD of every fabric GPU (RFabric)
        self.deployments: list[Deployment] = []
        self.batches: list[TransferBatch] = []

    # ------------------------------------------------------------------ run control
    def start(self, origin_s: float) -> None:
        """Begin a run whose engine clock 0 is ``origin_s`` on the stage clock; clear the run's logs."""
        self.origin_s = origin_s
        self.deployments, self.batches = [], []
        self._current = {}

    @contextlib.contextmanager
    def probing(self) -> Iterator[None]:
        """Run what-if engines (a TP sweep) without touching the driver or the logs."""
        saved = (self.probe, self._state, self._current, self.deployments, self.batches)
        self.probe, self.deployments, self.batches = True, [], []
        try:
            yield
        finally:
            self.probe, self._state, self._current, self.deployments, self.batches = saved

    # ------------------------------------------------------------------ NetworkSeam
    def link_bytes_per_s(self, cfg: InstanceConfig, gpu_ids: Sequence[int] | None = None) -> float:
        if gpu_ids is not None:
            got = self._current.get(gpu_ids if isinstance(gpu_ids, tuple) else tuple(gpu_ids))
            if got is not None:
                return got
        return self._estimate(cfg, "decode")

    def transfer_bytes_per_s(self, cfg: InstanceConfig | None) -> float:
        gpn = self.perf.gpu.gpus_per_node
        return self._estimate(cfg or InstanceConfig("tp", tp=gpn), "shift")

    def deploy(self, layout: Layout, now_s: float, transfers: Sequence[Transfer] = ()) -> float:
        t_abs = self.origin_s + now_s
        action, switching, ready_abs = "static", 0.0, t_abs
        if self.rfabric and self.driver is not None and not self.probe:
            action, switching, ready_abs = self._announce(layout, t_abs, transfers)
            self._state = self.net.fabric.with_circuits(self.driver.circuits_at(ready_abs), self.driver.failures)
        elif self.rfabric and self.driver is not None:
            self._state = self._would_plan(layout)
        self._current = self._rates(layout, self._state)
        self.deployments.append(Deployment(t_abs, layout.describe(), ready_abs, action, switching, len(transfers)))
        return ready_abs - self.origin_s

    def transfer_times_s(self, transfers: Sequence[Transfer], now_s: float) -> list[float]:
        if not transfers:
            return []
        t0 = time.perf_counter()
        src, dst, size, start, owner = self._expand(transfers)
        # one flow per (src, dst, start): pairs of different transfers share it; sizes up to the grid
        keys = np.stack([src, dst, start.view(np.int64)], axis=1)
        uniq, flow_of = np.unique(keys, axis=0, return_inverse=True)
        flow_of = flow_of.ravel()
        total = _size_classes(np.bincount(flow_of, size, minlength=len(uniq)))
        flows = FlowSet(uniq[:, 0], uniq[:, 1], total, uniq[:, 2].copy().view(np.float64))
        res = self.net.time_flows(flows, timeline=self._timeline(now_s))
        done = np.zeros(len(transfers))
        np.maximum.at(done, owner, res.finish_s[flow_of])
        lone = np.ones(len(transfers), dtype=bool)  # transfers with no pair off their own GPUs land at once
        lone[owner] = False
        done[lone] = np.array([t.start_s for t in transfers])[lone]
        kinds = {t.kind for t in transfers}
        self.batches.append(TransferBatch(self.origin_s + now_s, kinds.pop() if len(kinds) == 1 else "mixed",
                                          len(transfers), float(sum(t.size_bytes for t in transfers)), len(flows),
                                          float(done[np.isfinite(done)].max(initial=0.0))
                                          - min(t.start_s for t in transfers), time.perf_counter() - t0))
        return done.tolist()

    # ------------------------------------------------------------------ RFabric
    def _intent(self, layout: Layout, moves: tuple[np.ndarray, np.ndarray] | None = None):
        """The generation intent of ``layout`` (plus the transfer pairs ``moves``, fabric GPUs)."""
        topo = self.net.fabric.topology
        doc = generation_intent(self._whole(layout), self.perf, job=self.job, global_gpus=self.gpus.tolist(),
                                batch_per_instance=self.nominal_batch,
                                context_tokens=self.nominal_batch * 4096.0, period_s=30.0)
        if not doc["collectives"]:  # nothing crosses a GPU: an empty all-reduce keeps the document valid
            doc["collectives"] = [{"primitive": "all-reduce", "groups": [[int(self.gpus[0])]], "bytes_per_rank": 0.0}]
        intent = intent_from_mapping(doc, f"<gen intent {layout.describe()}>", topo)
        if self._pod is None:
            self._pod = np.array([topo.pod_of_gpu(g) for g in range(topo.gpu_count)], dtype=np.int64)
        src, dst, _ = intent_pair_arrays(intent, topo)
        if moves is not None:
            src, dst = np.r_[src, moves[0]], np.r_[dst, moves[1]]
        cross = self._pod[src] != self._pod[dst]
        if not cross.any():
            return intent
        # RFabric has no path between PoDs but core circuits: name every PoD pair the period crosses
        pairs = np.unique(np.stack([src[cross], dst[cross]], axis=1), axis=0)
        _, first = np.unique(self._pod[pairs[:, 0]] * (1 << 20) + self._pod[pairs[:, 1]], return_index=True)
        marks = tuple(Collective("m2n", src_gpus=(int(a),), dst_gpus=(int(b),), bytes_per_rank=0.0)
                      for a, b in pairs[first])
        return replace(intent, collectives=intent.collectives + marks, template="train")

    def _announce(self, layout: Layout, t_abs: float, transfers: Sequence[Transfer]) -> tuple[str, float, float]:
        drv, topo = self.driver, self.net.fabric.topology
        s2, d2, v2, _, _ = self._expand(transfers)
        intent = self._intent(layout, (s2, d2))
        src, dst, vol = intent_pair_arrays(intent, topo)
        src, dst, vol = np.r_[src, s2], np.r_[dst, d2], np.r_[vol, v2]
        d = drv.announce(intent, t_abs, aggregate_pair_arrays(src, dst, vol, topo))
        switching = d.change.switching_s if d.change is not None else 0.0
        if d.action == "defer":
            gate = drv.gate(self.job, "gen")
            hint = max(self.boundary_pause_s, switching + gate.config.guard_s(switching) + 1e-6)
            got = drv.observe(self.job, CollectiveEvent("deployment-boundary", t_abs, window_hint_s=hint))
            d = got[-1] if got else d
        ready = d.change.end_s if d.action == "commit" and d.change is not None else t_abs
        resume = max(ready, t_abs + self.boundary_pause_s)  # decoding resumes: the boundary's window closes
        comm = f"{self.job}/decode"
        drv.observe(self.job, CollectiveEvent("start", resume, "gen", "all-to-all", comm))
        drv.observe(self.job, CollectiveEvent("end", resume, "gen", "all-to-all", comm))
        return d.action, switching if d.action == "commit" else 0.0, ready

    def _would_plan(self, layout: Layout):
        """RFabric state the controller would give ``layout`` (pure: no driver, private template cache)."""
        key = ("plan", self._layout_key(layout), self.driver.failures.key)
        if key not in self._cache:
            topo = self.driver.controller.topology
            res = materialize(self._intent(layout), FabricState(topo, None), self._templates,
                              method=self.driver.method)
            self._cache[key] = self.net.fabric.with_circuits(res.plan.circuits if res.accepted else (),
                                                             self.driver.failures)
        return self._cache[key]

    def _timeline(self, now_s: float):
        if self.rfabric and self.driver is not None and not self.probe:
            t_abs = self.origin_s + now_s
            return [(max(0.0, t - t_abs), s) for t, s in self.driver.timeline(t_abs)]
        return None if self._state is None else [(0.0, self._state)]

    # ------------------------------------------------------------------ rates
    def _whole(self, layout: Layout) -> Layout:
        """The layout over every generation GPU: the engine's slice and its copies."""
        return _replicate(layout, self.copies)

    def _layout_key(self, layout: Layout) -> tuple:
        gpn = self.perf.gpu.gpus_per_node
        return tuple((i.config, i.gpu_ids) for i in layout.instances if crosses_nodes(i.config, gpn))

    def _estimate(self, cfg: InstanceConfig, pattern: str) -> float:
        """Harmonic mean of the per-instance rates of a homogeneous layout of ``cfg`` (cached)."""
        state = self._state
        key = ("estimate", cfg, pattern, None if state is None else state.signature, self.net.failures.key)
        got = self._cache.get(key)
        if got is None:
            total = self.local
            if cfg.gpus > total:
                got = self.link_bytes_s
            else:
                layout = homogeneous(cfg, total)
                if self.rfabric and self.driver is not None and pattern == "decode":
                    state = self._would_plan(layout)
                rates = [r for r in self._rates(layout, state, pattern).values() if r > 0]
                # harmonic mean over the instances the circuits join; none joined: next to nothing
                got = float(len(rates) / sum(1.0 / r for r in rates)) if rates else 1e-6 * self.link_bytes_s
            self._cache[key] = got
        return got

    def _rates(self, layout: Layout, state, pattern: str = "decode") -> dict[tuple[int, ...], float]:
        """Per-instance effective rate of ``layout``'s pattern on ``state`` (see the module note).

        With copies, each copy of an instance gets its own rate and the instance their harmonic mean
        (the copies' average step time).
        """
        key = ("rates", pattern, self._layout_key(layout) if pattern == "decode" else tuple(layout.instances),
               None if state is None else state.signature, self.net.failures.key)
        got = self._cache.get(key)
        if got is not None:
            return got
        insts = [i for i in layout.instances if pattern == "shift" or crosses_nodes(i.config, self.perf.gpu.gpus_per_node)]
        pairs = self._decode_pairs(insts) if pattern == "decode" else self._shift_pairs(insts)
        out: dict[tuple[int, ...], float] = {i.gpu_ids: self.link_bytes_s for i in insts}
        if pairs is None:
            self._cache[key] = out
            return out
        src, dst, size, owner = pairs  # owner: instance * copies + copy
        n = len(insts) * self.copies
        cross = (src // GPUS_PER_SERVER) != (dst // GPUS_PER_SERVER)
        busiest = np.zeros(n)
        for end in (src, dst):  # the busiest NIC of the instance, sending or receiving
            gpu_load = np.bincount(end[cross], size[cross], minlength=int(end.max()) + 1)
            np.maximum.at(busiest, owner[cross], gpu_load[end[cross]])
        ideal = busiest / self.link_bytes_s
        scale = _IDEAL_S / ideal[ideal > 0].min() if np.any(ideal > 0) else 1.0
        flows = FlowSet(src, dst, size * scale, 0.0)
        res = self.net.time_flows(flows, timeline=None if state is None else [(0.0, state)])
        on = state if state is not None else self.net.state(flows)
        took = np.zeros(n)  # last bit sent; the path latency is the step model's alpha term
        np.maximum.at(took, owner, res.finish_s - on.incidence(flows.src, flows.dst).latency_s)
        with np.errstate(divide="ignore", invalid="ignore"):
            rate = np.where(ideal > 0, self.link_bytes_s * ideal * scale / took, self.link_bytes_s)
        for k, inst in enumerate(insts):
            mine = rate[k * self.copies:(k + 1) * self.copies]
            if pattern == "decode" and not np.all(mine > 0):
                raise ConfigError("generation", "fabric", f"instance {inst.config.name} on GPUs "
                                  f"{int(self.gpus[inst.gpu_ids[0]])}.. has no path on {self.net.fabric.name} in "
                                  "the circuits in force", "place Gen instances inside PoDs, or announce the "
                                  "deployment through the RFabric driver")
            mine = mine[mine > 0]  # an estimate leaves out copies the circuits in force do not join
            out[inst.gpu_ids] = float(len(mine) / np.sum(1.0 / mine)) if len(mine) else 0.0
        self._cache[key] = out
        return out

    def _decode_pairs(self, insts):
        """Per-layer exchange of every instance (and copy) at the nominal batch: (src, dst, bytes, owner)."""
        parts = []
        for k, inst in enumerate(insts):
            for j, g in enumerate(self._copy_gpus[:, list(inst.gpu_ids)]):  # every copy sends the same pattern
                s, d, v = self._pattern(inst.config, g)
                parts.append((s, d, v, np.full(len(s), k * self.copies + j)))
        return _concat(parts)

    def _pattern(self, cfg: InstanceConfig, g: np.ndarray):
        """One instance's exchange on fabric GPUs ``g``: EP all-to-all, AFD M2N both ways, or a TP ring."""
        m = self.perf.model
        act = float(self.nominal_batch) * m.d_model * DTYPE_BYTES
        if cfg.kind == "ep":
            s, d = np.meshgrid(g, g, indexing="ij")
            keep = s != d
            return s[keep], d[keep], np.full(int(keep.sum()), act / cfg.ep * max(1, m.experts_per_token) / cfg.ep)
        if cfg.kind == "afd":
            a, f = g[:cfg.attn_gpus], g[cfg.attn_gpus:]
            fan = min(m.experts_per_token, cfg.ffn_gpus) if m.is_moe else 1
            sa, sf = np.meshgrid(a, f, indexing="ij")
            s, d = np.r_[sa.ravel(), sf.ravel()], np.r_[sf.ravel(), sa.ravel()]
            return s, d, np.full(len(s), act * fan / (len(a) * len(f)))
        return collective_pair_arrays(Collective("all-reduce", groups=(tuple(g.tolist()),), bytes_per_rank=act))

    def _shift_pairs(self, insts):
        """Every instance's GPUs send to the next instance's GPUs, position by position."""
        if len(insts) < 2:
            return None
        parts = []
        for k, inst in enumerate(insts):
            nxt = insts[(k + 1) % len(insts)]
            for j, row in enumerate(self._copy_gpus):
                s, d = row[list(inst.gpu_ids)], row[list(nxt.gpu_ids)]
                n = min(len(s), len(d))
                parts.append((s[:n], d[:n], np.ones(n), np.full(n, k * self.copies + j)))
        return _concat(parts)

    # ------------------------------------------------------------------ transfers
    def _expand(self, transfers: Sequence[Transfer]):
        """Transfers -> (src, dst, bytes, start, transfer) per GPU pair in fabric GPUs, self-pairs dropped.

        Per transfer, in order: copy ``j`` of the fabric, then stream ``k < max(len(src), len(dst))`` from
        ``src_gpus[k % len(src)]`` to ``dst_gpus[k % len(dst)]``, each carrying ``bytes / max(...)``.
        Built as whole arrays (a layout change moves thousands of requests between thousands of
        distinct instance pairs: a loop per transfer took 0.4 s).
        """
        live = [k for k, t in enumerate(transfers) if t.src_gpus and t.dst_gpus and t.size_bytes > 0]
        if not live:
            e = np.zeros(0)
            return e.astype(np.int64), e.astype(np.int64), e, e, e.astype(np.int64)
        ts = [transfers[k] for k in live]
        ns = np.fromiter((len(t.src_gpus) for t in ts), np.int64, len(ts))
        nd = np.fromiter((len(t.dst_gpus) for t in ts), np.int64, len(ts))
        src_flat = np.fromiter(itertools.chain.from_iterable(t.src_gpus for t in ts), np.int64, int(ns.sum()))
        dst_flat = np.fromiter(itertools.chain.from_iterable(t.dst_gpus for t in ts), np.int64, int(nd.sum()))
        n = np.maximum(ns, nd)
        copies = self._copy_gpus.shape[0]
        block = copies * n  # entries per transfer: every copy of the fabric moves the same
        tid = np.repeat(np.arange(len(ts)), block)
        pos = np.arange(int(block.sum())) - np.repeat(np.cumsum(block) - block, block)
        j, k = pos // n[tid], pos % n[tid]
        s = self._copy_gpus[j, src_flat[(np.cumsum(ns) - ns)[tid] + k % ns[tid]]]
        d = self._copy_gpus[j, dst_flat[(np.cumsum(nd) - nd)[tid] + k % nd[tid]]]
        keep = s != d
        tid = tid[keep]
        per_stream = np.fromiter((t.size_bytes for t in ts), np.float64, len(ts)) / n
        start = np.fromiter((float(t.start_s) for t in ts), np.float64, len(ts))
        return s[keep], d[keep], per_stream[tid], start[tid], np.asarray(live, dtype=np.int64)[tid]


def _replicate(layout: Layout, copies: int) -> Layout:
    """Return ``copies`` copies of ``layout`` side by side (copy ``j`` on GPUs ``j * total ..``)."""
    if copies == 1:
        return layout
    n = layout.total_gpus
    return Layout(tuple(Instance(i.config, tuple(j * n + g for g in i.gpu_ids)) for j in range(copies)
                        for i in layout.instances), n * copies)


def _size_classes(size: np.ndarray) -> np.ndarray:
    """Round sizes up to one of ``_SIZE_CLASSES`` log-spaced values between their minimum and maximum.

    >>> _size_classes(np.array([1.0, 3.0, 1000.0])).round(2).tolist()
    [1.0, 3.28, 1000.0]
    """
    if len(size) == 0 or size.max() <= size.min() * (1 + 1e-12):
        return size
    lo, hi = float(size.min()), float(size.max())
    step = math.log(hi / lo) / _SIZE_CLASSES
    k = np.ceil(np.log(size / lo) / step - 1e-9)
    return np.minimum(lo * np.exp(k * step), hi)


def _concat(parts):
    if not parts:
        return None
    src, dst, size, owner = (np.concatenate([p[i] for p in parts]) for i in range(4))
    return src.astype(np.int64), dst.astype(np.int64), size.astype(np.float64), owner.astype(np.int64)
