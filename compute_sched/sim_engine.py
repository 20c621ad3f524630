"""Discrete-event simulated generation cluster implementing :class:`compute_sched.engine.Engine`.

Design note
-----------
Each instance runs vLLM-style continuous batching: requests are admitted FIFO while their KV fits
(with a small watermark) and the batch is under ``max_num_seqs``; every iteration decodes one token
per running request; a request whose KV no longer fits is preempted (newest first) and later
recomputed. Step times come from :class:`compute_sched.perf.PerfModel`.

Simulating token by token would cost O(tokens x batch), so an instance jumps over runs of
iterations in which nothing changes (no request finishes, no KV overflow, no migrated request
becomes ready, the caller's horizon is not passed): over ``k`` such iterations the batch is fixed
and the context grows by ``B`` per iteration, so their time is ``k`` steps at the mid-point context
(exact for the affine memory-bound step). Instances are independent between scheduler actions, so
each one advances alone to the caller's horizon. Output lengths are known only to the simulator
(``lengths``), never shown in a snapshot.

With a network seam on the performance model (``perf.network``, :mod:`compute_sched.netseam`) each
instance's steps use the rates of its own placement; a layout change is announced to the network
(:meth:`~compute_sched.netseam.NetworkSeam.deploy`, with the transfers it causes), instances whose
decode traffic crosses nodes start once the fabric is ready, weights come from the old instance's
GPUs as flows or from host memory, whichever lands first, and KV transfers are timed as one batch
of concurrent flows. Without a seam every cost is the cost model's, as before.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Sequence

from orchestrl.compute_sched.balancer import WorkerLoad
from orchestrl.compute_sched.costs import CostModel
from orchestrl.compute_sched.engine import (ClusterSnapshot, EngineCapabilities, FinishedRequest, GenerationRequest, Migration,
                                  MigrationReport, SwitchReport, WorkerState)
from orchestrl.compute_sched.layout import Layout
from orchestrl.compute_sched.multiplex.substage import StepRecord
from orchestrl.compute_sched.netseam import Transfer, crosses_nodes, kv_gpus
from orchestrl.compute_sched.perf import PerfModel
from orchestrl.compute_sched.workload import RequestState
from orchestrl.fabric.errors import ConfigError

__all__ = ["SimEngine"]


_new_state = RequestState.__new__


@dataclass
class _Seq:
    rid: str
    prompt: int
    generated: int
    target: int  # hidden output length
    max_tokens: int
    group: str
    ready_at: float = 0.0
    kv_ready: bool = False  # True: KV already resident (new requests and recomputes still need a prefill)
    _state: RequestState | None = field(default=None, repr=False, compare=False)  # last snapshot's, reused
    # while ``generated`` stands still (a waiting request): snapshots are taken every tick

    @property
    def ctx(self) -> int:
        return self.prompt + self.generated

    def state(self) -> RequestState:
        st = self._state
        if st is None or st.generated_tokens != self.generated:
            # a frozen dataclass's __init__ sets each field through object.__setattr__; filling the instance
            # dict directly gives an equal object (same fields, equality and hash) in two thirds of the time,
            # and every running request gets a new state on every tick
            st = _new_state(RequestState)
            st.__dict__.update(request_id=self.rid, prompt_tokens=self.prompt, generated_tokens=self.generated,
                               max_tokens=self.max_tokens, group_id=self.group)
            self._state = st
        return st


class _Instance:
    def __init__(self, index: int, inst, perf: PerfModel, max_num_seqs: int) -> None:
        self.index, self.inst, self.cfg = index, inst, inst.config
        self.perf = perf.at(inst.gpu_ids)  # the rates of its placement (the model itself without a network seam)
        self.cap = perf.kv_capacity_tokens(inst.config)
        if self.cap <= 0:
            raise ConfigError("SimEngine", "layout", f"{perf.model.name} does not fit one {inst.config.name} "
                                                     f"instance of {perf.gpu.name}", "a configuration with more GPUs")
        self.running: list[_Seq] = []
        self.waiting: deque[_Seq] = deque()
        self.clock = 0.0
        self.available_at = 0.0
        self.max_num_seqs = max_num_seqs
        self.window_tokens = 0
        self.window_start = 0.0
        self.rate_tps = 0.0
        self.kv_used = 0  # context tokens of the running requests, kept up to date by every change of ``running``

    def used(self) -> int:
        return self.kv_used


class SimEngine:
    """Simulated generation cluster; see the module note.

    Parameters
    ----------
    perf : PerfModel
        Step times and KV capacity.
    layout : Layout
        Initial deployment.
    lengths : Mapping[str, int]
        Hidden output length of every request that will be added.
    costs : CostModel, optional
        Switching and migration costs, and the batched prefill of admitted requests, priced as a
        recompute (default: ``CostModel(perf, capabilities=capabilities)``).
    capabilities : EngineCapabilities, optional
        How migrations may move state (default: ``costs.capabilities``, else recompute only -- what
        the vLLM adapter can do; pass :meth:`EngineCapabilities.assume_kv_transfer` for a what-if).
    max_num_seqs : int, optional
        Batch limit per instance (vLLM ``max_num_seqs``; default: ``perf.cal.max_num_seqs``).
    """

    def __init__(self, perf: PerfModel, layout: Layout, lengths: Mapping[str, int], *, costs: CostModel | None = None,
                 max_num_seqs: int | None = None, kv_watermark: float = 0.02,
                 capabilities: EngineCapabilities | None = None) -> None:
        if costs is not None and capabilities is not None and costs.capabilities != capabilities:
            raise ConfigError("SimEngine", "capabilities", f"{capabilities.label!r} disagrees with the cost model's "
                                                           f"{costs.capabilities.label!r}", "one of the two, or equal")
        self.capabilities = capabilities or (costs.capabilities if costs is not None else EngineCapabilities())
        self.perf, self.costs = perf, costs or CostModel(perf, capabilities=self.capabilities)
        self.lengths = dict(lengths)
        self.max_num_seqs = max_num_seqs if max_num_seqs is not None else perf.cal.max_num_seqs
        self.watermark = kv_watermark
        self.layout = layout
        self._now = 0.0
        self._finished = 0
        self._insts = [_Instance(k, inst, perf, self.max_num_seqs) for k, inst in enumerate(layout.instances)]
        self.preemptions = 0
        self.network = perf.network
        self.switch_log: list[dict[str, object]] = []  # per layout change on a network: switch, reload paths
        # Forward steps as JigsawRL's sub-stage tracker reads them (multiplex.substage.StepRecord): set to a
        # list to record; None (the default) records nothing and costs nothing.
        self.step_log: list | None = None
        if self.network is not None:
            self._fabric_ready(self._insts, self.network.deploy(layout, self._now))

    # -- protocol -----------------------------------------------------------------------------
    def now_s(self) -> float:
        return self._now

    def idle(self) -> bool:
        return all(not i.running and not i.waiting for i in self._insts)

    def next_event_s(self) -> float:
        """A lower bound on the seconds until a pending request can finish (inf when idle).

        The earliest finish of a running request is at least its remaining tokens at today's step time
        (steps only grow with context); an instance with only waiting requests has a prefill first, so
        it answers 0 and the caller advances by its own quantum. Event loops that drive the engine in
        real or simulated time (the agentic runtime's workers) sleep this long instead of polling.
        """
        best = math.inf
        for i in self._insts:
            if i.running:
                k = min(s.target - s.generated for s in i.running)
                best = min(best, max(0, k) * i.perf.decode_step_s(i.cfg, len(i.running), i.used()))
            elif i.waiting:
                best = min(best, max(0.0, i.available_at - self._now))
        return best

    def worker_loads(self) -> list[WorkerLoad]:
        """Eq. 5's inputs per instance without building request states (see :func:`balancer.would_migrate`)."""
        # ``kv_used`` is the running requests' context, kept current by every change (no per-request sum)
        return [WorkerLoad(i.cfg, len(i.running), len(i.waiting), i.kv_used, float(max(0, i.cap - i.kv_used)),
                           i.rate_tps, i.available_at <= self._now, i.max_num_seqs)
                for i in self._insts]

    def pending_count(self) -> int:
        """Requests running or waiting, without building a snapshot."""
        return sum(len(i.running) + len(i.waiting) for i in self._insts)

    def snapshot(self) -> ClusterSnapshot:
        st = _Seq.state  # map over the method: a snapshot reads every pending request, every tick
        workers = tuple(WorkerState(i.index, i.cfg, tuple(map(st, i.running)), tuple(map(st, i.waiting)), i.used(),
                                    i.cap, i.rate_tps, i.available_at <= self._now, i.max_num_seqs)
                        for i in self._insts)
        return ClusterSnapshot(self._now, self.layout, workers, self._finished)

    def add_requests(self, requests: Sequence[GenerationRequest], instance: int | None = None) -> None:
        for q in requests:
            if q.request_id not in self.lengths:
                raise ConfigError("SimEngine", "lengths", f"no hidden output length for request {q.request_id!r}",
                                  "a length for every request the simulator runs")
            target = min(self.lengths[q.request_id], q.max_tokens)
            k = instance if instance is not None else min(self._insts, key=lambda i: len(i.running) + len(i.waiting)).index
            self._insts[k].waiting.append(_Seq(q.request_id, q.prompt_tokens, q.generated_tokens, target, q.max_tokens,
                                               q.group_id, self._now, kv_ready=False))

    def abort(self, request_ids: Iterable[str]) -> list[str]:
        wanted, out = set(request_ids), []
        for i in self._insts:
            for s in [s for s in i.running if s.rid in wanted]:
                i.running.remove(s)
                i.kv_used -= s.ctx
                out.append(s.rid)
            kept = deque(s for s in i.waiting if s.rid not in wanted)
            out += [s.rid for s in i.waiting if s.rid in wanted]
            i.waiting = kept
        return out

    def _take(self, rid: str, src: int) -> _Seq | None:
        inst = self._insts[src]
        for s in inst.running:
            if s.rid == rid:
                inst.running.remove(s)
                inst.kv_used -= s.ctx
                return s
        for s in inst.waiting:
            if s.rid == rid:
                inst.waiting.remove(s)
                return s
        return None

    def _fabric_ready(self, insts: Sequence[_Instance], ready_s: float) -> None:
        """Instances whose decode traffic crosses nodes wait until the fabric is ready for their layout."""
        gpn = self.perf.gpu.gpus_per_node
        for i in insts:
            if crosses_nodes(i.cfg, gpn):
                i.available_at = max(i.available_at, ready_s)

    def _land(self, movers: dict[int, list[tuple[_Seq, str, tuple[int, ...]]]], start: dict[int, float],
              boundary: bool = False) -> MigrationReport:
        """Queue moved requests on their destinations, paying the cheaper of transfer and recompute.

        ``movers`` maps a destination to (request, method, GPUs holding its KV now). With a network
        seam, the KV transfers of a deployment ``boundary`` are timed together as flows on the
        fabric; migrations while decoding (balancer, re-homing) are priced by the cost model at the
        fabric's rate -- they are small, overlap decoding, and come by the hundred.
        """
        methods: dict[str, int] = {}
        worst = 0.0
        moved = []
        batch: list[tuple[int, _Seq, tuple[int, ...]]] = []  # KV transfers the network times together
        for dst, all_items in movers.items():
            inst = self._insts[dst]
            for s, _, _ in all_items:  # never prefilled or preempted: no KV to move, just queue it
                if not s.kv_ready:
                    s.ready_at = start[dst]
                    inst.waiting.append(s)
                    methods["requeue"] = methods.get("requeue", 0) + 1
                    moved.append(s.rid)
            items = [(s, m) for s, m, _ in all_items if s.kv_ready]
            auto = [s for s, m in items if m == "auto"]
            chosen = self.costs.migration(inst.cfg, [s.ctx for s in auto]).method if auto else "none"
            for s, m in items:
                how = chosen if m == "auto" else m
                if how == "none" or (how == "transfer" and not self.capabilities.kv_transfer):
                    how = "recompute"  # an engine without a KV path recomputes whatever was asked
                s.kv_ready = how == "transfer"
                methods[how] = methods.get(how, 0) + 1
                moved.append(s.rid)
            tr = [s for s, m in items if s.kv_ready]
            if tr and self.network is not None and boundary:
                batch += [(dst, s, src) for s, _, src in all_items if s.kv_ready]
                tr = []  # timed below, with every other destination's transfers
            cost = self.costs.transfer_s(sum(s.ctx for s in tr), inst.cfg) if tr else 0.0
            rc = [s.ctx for s, m in items if not s.kv_ready]
            worst = max(worst, cost, self.costs.recompute_s(inst.cfg, rc) if rc else 0.0)
            for s, _ in items:
                s.ready_at = start[dst] + (cost if s.kv_ready else 0.0)
                inst.waiting.appendleft(s) if s.kv_ready else inst.waiting.append(s)
        if batch:
            worst = max(worst, self._time_kv(batch, start, methods))
        return MigrationReport(tuple(moved), (), worst, methods)

    def _time_kv(self, batch: list[tuple[int, _Seq, tuple[int, ...]]], start: dict[int, float],
                 methods: dict[str, int]) -> float:
        """Time a batch of KV transfers on the network; set each request's ready time; return the longest.

        A transfer the network cannot deliver (no path in the fabric state in force) is recomputed.
        """
        kv = float(self.perf.model.kv_bytes_per_token)
        moves = [Transfer(src, kv_gpus(self._insts[d].inst), s.ctx * kv, "kv", start[d] - self._now)
                 for d, s, src in batch]
        done = self.network.transfer_times_s(moves, self._now)
        worst = 0.0
        for (d, s, _), t in zip(batch, done):
            if not math.isfinite(t):
                s.kv_ready, s.ready_at = False, start[d]
                methods["transfer"] -= 1
                methods["recompute"] = methods.get("recompute", 0) + 1
                if not methods["transfer"]:
                    del methods["transfer"]
                continue
            s.ready_at = self._now + t + self.costs.transfer_setup_s
            worst = max(worst, s.ready_at - start[d])
        return worst

    def migrate(self, moves: Sequence[Migration]) -> MigrationReport:
        movers: dict[int, list[tuple[_Seq, str]]] = {}
        refused = []
        for mv in moves:
            if not (0 <= mv.src < len(self._insts) and 0 <= mv.dst < len(self._insts)) or mv.src == mv.dst:
                refused.append((mv.request_id, f"bad instances {mv.src}->{mv.dst}"))
                continue
            s = self._take(mv.request_id, mv.src)
            if s is None:
                refused.append((mv.request_id, f"not pending on instance {mv.src}"))
                continue
            movers.setdefault(mv.dst, []).append((s, mv.method, kv_gpus(self._insts[mv.src].inst)))
        start = {d: max(self._now, self._insts[d].available_at) for d in movers}
        rep = self._land(movers, start)
        return MigrationReport(rep.moved, tuple(refused), rep.seconds, rep.methods)

    def change_layout(self, layout: Layout, placement: Mapping[str, int]) -> SwitchReport:
        old = {(inst.config, inst.gpu_ids): k for k, inst in enumerate(self.layout.instances)}
        by_gpu = {g: inst.config for inst in self.layout.instances for g in inst.gpu_ids}
        new_insts, kept_from, switch_s = [], {}, 0.0
        for k, inst in enumerate(layout.instances):
            ni = _Instance(k, inst, self.perf, self.max_num_seqs)
            ni.clock = self._now
            prev = old.get((inst.config, inst.gpu_ids))
            if prev is not None:
                kept_from[k] = prev
                ni.available_at = max(self._now, self._insts[prev].available_at)
                ni.rate_tps = self._insts[prev].rate_tps
            else:
                was = by_gpu.get(inst.gpu_ids[0])
                sw = self.costs.switch(was, inst.config, same_gpus=was is not None)
                ni.available_at = self._now + sw.seconds
                switch_s = max(switch_s, sw.seconds)
            new_insts.append(ni)
        prev_of = {v: k for k, v in kept_from.items()}
        movers: dict[int, list[tuple[_Seq, str, tuple[int, ...]]]] = {}
        for oi in self._insts:
            running = {id(s) for s in oi.running}
            for s in [*oi.running, *oi.waiting]:
                dst = placement.get(s.rid)
                if dst is None or not 0 <= dst < len(new_insts):
                    raise ConfigError("change_layout", "placement", f"request {s.rid!r} has no valid instance",
                                      f"an instance 0..{len(new_insts) - 1} for every pending request")
                if prev_of.get(oi.index) == dst:
                    if id(s) in running:
                        new_insts[dst].running.append(s)
                        new_insts[dst].kv_used += s.ctx
                    else:
                        new_insts[dst].waiting.append(s)
                else:
                    movers.setdefault(dst, []).append((s, "auto", kv_gpus(oi.inst)))
        if self.network is not None:
            switch_s = self._switch_on_network(new_insts, kept_from, movers)
        self._insts, self.layout = new_insts, layout
        rep = self._land(movers, {d: new_insts[d].available_at for d in movers}, boundary=True)
        return SwitchReport(switch_s, rep, len(kept_from))

    def _switch_on_network(self, new_insts: list[_Instance], kept_from: dict[int, int],
                           movers: dict[int, list[tuple[_Seq, str, tuple[int, ...]]]]) -> float:
        """Announce the new layout to the network and time its weight reloads; return the largest ``C^sw``.

        A switching instance's GPUs fetch the bytes they miss from the GPUs of the old instances they
        overlap (each a full replica) as concurrent flows, or read them from host memory, whichever
        lands first; the fixed switch-over is paid either way. Instances on idle GPUs read from host.
        """
        old_by_gpu = {g: inst for inst in self.layout.instances for g in inst.gpu_ids}
        kv = float(self.perf.model.kv_bytes_per_token)
        fetches: dict[int, list[Transfer]] = {}
        host_s: dict[int, float] = {}
        for ni in new_insts:
            if ni.index in kept_from:
                continue
            was = old_by_gpu.get(ni.inst.gpu_ids[0])
            sw = self.costs.switch(was.config if was else None, ni.cfg, same_gpus=was is not None)
            host_s[ni.index] = sw.bytes_moved / self.perf.gpu.pcie_bytes_per_s
            peers = sorted({g for g in ni.inst.gpu_ids if g in old_by_gpu for g in old_by_gpu[g].gpu_ids})
            if sw.bytes_moved > 0 and peers:
                fetches[ni.index] = [Transfer(tuple(p for p in peers if p != d), (d,), sw.bytes_moved, "weights")
                                     for d in ni.inst.gpu_ids]
        weights = [t for ts in fetches.values() for t in ts]
        moving = [Transfer(src, kv_gpus(new_insts[d].inst), s.ctx * kv) for d, items in movers.items()
                  for s, _, src in items if s.kv_ready]
        ready = self.network.deploy(Layout(tuple(i.inst for i in new_insts), self.layout.total_gpus), self._now,
                                    weights + moving)
        done = iter(self.network.transfer_times_s(weights, self._now) if weights else ())
        over_net = {k: max(next(done) for _ in ts) for k, ts in fetches.items()}
        switch_s, paths = 0.0, {"host": 0, "peers": 0, "none": 0}
        for k, h in host_s.items():
            reload = min(h, over_net.get(k, h))
            paths["none" if reload == 0 else "peers" if reload < h else "host"] += 1
            seconds = self.costs.switch_fixed_s + reload
            new_insts[k].available_at = self._now + seconds
            switch_s = max(switch_s, seconds)
        self._fabric_ready(new_insts, ready)
        self.switch_log.append({"t_s": self._now, "switch_s": switch_s, "fabric_ready_s": ready - self._now,
                                "reload_paths": paths, "weights_bytes": sum(t.size_bytes for t in weights)})
        return switch_s

    def advance(self, seconds: float) -> list[FinishedRequest]:
        horizon = self._now + max(0.0, seconds)
        done: list[FinishedRequest] = []
        for inst in self._insts:
            inst.window_tokens, inst.window_start = 0, self._now
            self._run(inst, horizon, done)
            span = horizon - inst.window_start
            if span > 0 and (inst.window_tokens or not inst.running):
                inst.rate_tps = inst.window_tokens / span
        self._now = horizon
        done.sort(key=lambda f: f.finish_time_s)
        self._finished += len(done)
        return done

    # -- one instance -------------------------------------------------------------------------
    def _admit(self, inst: _Instance) -> list[int]:
        """Admit ready waiting requests FIFO while KV and batch allow; return the contexts to prefill.

        Requests still in flight to this instance (``ready_at`` in the future) are skipped, not
        waited for; the first ready request that does not fit stops admission (FIFO). The admitted
        requests without resident KV prefill in one batch, each attending only to itself
        (:meth:`~compute_sched.costs.CostModel.recompute_s` prices that batch).
        """
        limit = inst.cap * (1.0 - self.watermark)
        used, prefill = inst.used(), []
        later: list[_Seq] = []
        while inst.waiting and len(inst.running) < inst.max_num_seqs:
            s = inst.waiting[0]
            if s.ready_at > inst.clock:
                later.append(inst.waiting.popleft())
                continue
            if used + s.ctx + 1 > limit:
                break
            inst.waiting.popleft()
            inst.running.append(s)
            used += s.ctx
            if not s.kv_ready:
                prefill.append(s.ctx)
            s.kv_ready = True
        inst.waiting.extendleft(reversed(later))
        inst.kv_used = used
        return prefill

    def _run(self, inst: _Instance, horizon: float, done: list[FinishedRequest]) -> None:
        perf = inst.perf
        while inst.clock < horizon:
            if inst.clock < inst.available_at:
                inst.clock = min(horizon, inst.available_at)
                continue
            prefill = self._admit(inst)
            if sum(prefill):
                dt = self.costs.recompute_s(inst.cfg, prefill)
                if self.step_log is not None:
                    self.step_log.append(StepRecord(inst.index, inst.clock, dt, int(sum(prefill))))
                inst.clock += dt
                continue
            if not inst.running:
                nxt = min((s.ready_at for s in inst.waiting if s.ready_at > inst.clock), default=horizon)
                inst.clock = min(horizon, nxt)
                if not inst.waiting or nxt >= horizon:
                    inst.clock = horizon
                continue
            b = len(inst.running)
            used = inst.used()
            room = inst.cap - used
            if room < b:  # KV overflow: preempt the newest request, recompute it later
                s = inst.running.pop()
                inst.kv_used -= s.ctx
                s.kv_ready = False
                inst.waiting.appendleft(s)
                self.preemptions += 1
                continue
            left = min([s.target - s.generated for s in inst.running])  # a list is faster to min() than a generator
            k = min(left, room // b)
            step0 = perf.decode_step_s(inst.cfg, b, used)
            k = min(k, max(1, math.ceil((horizon - inst.clock) / step0)))
            pending_ready = [s.ready_at for s in inst.waiting if s.ready_at > inst.clock]
            if pending_ready:
                k = min(k, max(1, math.ceil((min(pending_ready) - inst.clock) / step0)))
            if inst.waiting and not pending_ready:  # admissions wait for room: re-check every few iterations
                k = min(k, 256)
            k = max(1, k)
            dt = k * perf.decode_step_s(inst.cfg, b, used + b * (k - 1) / 2.0)
            if self.step_log is not None:
                self.step_log.append(StepRecord(inst.index, inst.clock, dt, b, k))
            inst.clock += dt
            inst.window_tokens += b * k
            inst.kv_used += b * k
            if k < left:  # no request reaches its length in these steps (most runs end at the horizon)
                for s in inst.running:
                    s.generated += k
                continue
            still = []
            for s in inst.running:
                s.generated += k
                if s.generated >= s.target:
                    done.append(FinishedRequest(s.rid, s.generated, inst.clock, inst.index, s.group))
                    inst.kv_used -= s.ctx
                else:
                    still.append(s)
            inst.running = still
