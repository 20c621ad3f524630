"""Proactive planner (OrchestrRL Algorithm 1 event 1, Eq. 1-4): choose a layout and re-home requests.

Design note
-----------
Eq. 1 chooses per-instance configurations ``Y`` and an assignment ``X`` minimising the largest
``T_k + C^mig_k + C^sw_k`` subject to KV balance (Eq. 2), the GPU budget (Eq. 3) and one instance
per request (Eq. 4). The three reductions of §4.1 make it small enough to solve exactly:

1. requests collapse into progress classes with histogram-based survival curves
   (:mod:`compute_sched.estimate`), so ``X`` becomes per-class counts;
2. configurations come from the restricted candidate set (intra-node TP, whole-node cross-node TP,
   EP and pre-selected AFD ratios for MoE), biased by the phase of the step (a large active batch
   drops cross-node TP; a small one drops AFD and TP=1);
3. identical instances share a type: a layout is at most two types, each with its instance count.

Every homogeneous layout is scored directly (its instances split the classes evenly). For mixes of
the best ``top_configs`` types at node-granular GPU splits, the per-class split between the two
types comes from a threshold search (the likely-longest classes to one type, the rest to the
other, O(P J T)) and, when there are at most ``mip_max_classes`` classes, also from a
mixed-integer program solved with HiGHS (``scipy.optimize.milp``): continuous class counts per type, one
binary per type and token-grid point saying whether the type's instances still run there (the
tail), and per-grid-point step times bounded below by tangent planes of the performance model.
Beyond that size the solver does not close the tail binaries within a fraction of a second, while the
threshold family contains the splits the planner actually picks (long requests to large TP).
The best few candidates are then materialised to concrete requests and instances (reusing
instances that keep their configuration and GPUs, so their requests stay) and evaluated exactly;
the plan is adopted only if it beats the current layout by ``margin_s`` (Alg. 1 line 5).

Homogeneous layouts (the candidates and the current layout) are scored over the planning horizon,
not to the end of the step: a layout is charged for the early phase it will run and credited with
the best later hand-over of the tail to another configuration (:mod:`compute_sched.lookahead`),
because the scheduler re-plans as the batch shrinks. Without this, a throughput layout is charged
for a tail it never runs and the planner jumps to the tail layout at t = 0.

Complexity: one homogeneous score is O(J T) for J classes and T grid points; each mix is a
threshold search of O(P J T) plus, for J <= ``mip_max_classes``, one MIP with 2T binaries and
2J + 2T continuous variables (time-limited); materialisation is O(R log K).
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from orchestrl.compute_sched.costs import CostModel
from orchestrl.compute_sched.engine import ClusterSnapshot
from orchestrl.compute_sched.estimate import (ClassTable, build_classes, instance_time_s, instance_times_s,
                                              lone_times_s)
from orchestrl.compute_sched.layout import Instance, InstanceConfig, Layout, candidate_configs
from orchestrl.compute_sched.lookahead import Continuation, best_continuation
from orchestrl.compute_sched.perf import PerfModel
from orchestrl.compute_sched.workload import StepWorkload

__all__ = ["PlannerConfig", "Plan", "plan_layout", "evaluate_layout"]


@dataclass(frozen=True)
class PlannerConfig:
    """Knobs of the proactive planner."""

    tail_mass: float = 0.25  # an instance runs while at least this many requests are expected to remain
    kv_delta: float = 0.15  # delta of Eq. 2 (relaxed x2 when infeasible)
    margin_s: float = 2.0  # epsilon of Alg. 1: required gain beyond the reconfiguration cost
    top_configs: int = 2  # homogeneous winners whose pairs are tried as mixes
    max_splits: int = 3  # node-granular GPU splits tried per pair
    mip_max_classes: int = 16  # mixes over more classes use the threshold search alone
    threshold_points: int = 8  # class boundaries the threshold search tries
    exact_candidates: int = 3  # candidates materialised and evaluated exactly
    phase_batch_per_gpu: float = 8.0  # pending requests per GPU at or above which the step is "early"
    mip_grid_points: int = 40  # token-grid points the MIP keeps (coarsened grid)
    mip_time_limit_s: float = 0.25
    mip_relative_gap: float = 0.01  # stop at a proven 1% of the optimum: the estimates behind the MIP are coarser
    cross_node_tp: bool = True
    afd_ratios: tuple[tuple[int, int], ...] = ((3, 1),)
    lookahead: bool = True  # score homogeneous layouts with the best later hand-over of the tail
    handover_after_s: float = 60.0  # earliest forecast hand-over (the scheduler's re-plan cooldown)
    reassign: bool = True  # also consider the current layout with its requests re-homed (no switch)
    monotone_tp: bool = True  # once a step has changed layout, dense TP layouts only move towards larger
    # instances (the batch only shrinks); the step's first change may go either way (veRL-TO's tuned layout
    # need not be the best early-phase one)


@dataclass(frozen=True)
class Plan:
    """What the planner decided and why."""

    layout: Layout
    placement: dict[str, int]  # request id -> instance of ``layout``
    predicted_s: float  # Obj_new: max over instances of T_k + C^mig_k + C^sw_k
    current_s: float  # Obj_cur: EstMakespan of the current layout and assignment (less its tail hand-over credit)
    cost_s: float  # largest C^sw + C^mig among the new instances
    reconfigure: bool  # Obj_new + margin < Obj_cur and the layout or the assignment differs
    phase: str  # "early" or "tail"
    candidates: int  # layouts scored
    mips: int  # mixed-integer programs solved
    solve_s: float  # wall-clock seconds of the whole decision
    per_instance_s: tuple[float, ...] = field(default=())
    continuation: str = ""  # forecast hand-over of the tail, e.g. "tp8 after ~5120 tokens" ("" if none)


def _place(types: Sequence[tuple[InstanceConfig, int]], current: Layout, gpn: int) -> Layout:
    """Put instances on GPUs, reusing current instances of the same configuration first."""
    total = current.total_gpus
    used: set[int] = set()
    out: list[Instance] = []
    todo: list[InstanceConfig] = []
    for cfg, n in types:
        same = [i for i in current.instances if i.config == cfg][:n]
        out += same
        used.update(g for i in same for g in i.gpu_ids)
        todo += [cfg] * (n - len(same))
    for cfg in sorted(todo, key=lambda c: -c.gpus):
        align = min(cfg.gpus, gpn)
        start = next((s for s in range(0, total - cfg.gpus + 1, align)
                      if not used.intersection(range(s, s + cfg.gpus))), None)
        if start is None:  # fragmented by reuse: lay everything out afresh
            return _place(types, Layout((), total), gpn)
        out.append(Instance(cfg, tuple(range(start, start + cfg.gpus))))
        used.update(range(start, start + cfg.gpus))
    return Layout(tuple(sorted(out, key=lambda i: i.gpu_ids[0])), total)


def _same_instances(layout: Layout, old: Layout) -> dict[int, int]:
    """Map each instance of ``layout`` that ``old`` also has (same configuration and GPUs) to its index there.

    O(K) by hashing; comparing every pair was O(K^2), a million comparisons per plan at 1,024 instances.
    """
    index = {inst: k for k, inst in enumerate(old.instances)}
    return {k: index[inst] for k, inst in enumerate(layout.instances) if inst in index}


def _expected_remaining(table: ClassTable) -> np.ndarray:
    return table.survival.sum(axis=1) * table.step_tokens


def _materialize(layout: Layout, type_counts: dict[InstanceConfig, np.ndarray], table: ClassTable,
                 snap: ClusterSnapshot) -> dict[str, int]:
    """Turn per-type class counts into a request -> instance placement (stayers first, then LPT)."""
    where = snap.instance_of()
    kept = _same_instances(layout, snap.layout)
    kept_by_old = {v: k for k, v in kept.items()}
    by_type: dict[InstanceConfig, list[int]] = {}
    for k, inst in enumerate(layout.instances):
        by_type.setdefault(inst.config, []).append(k)
    work_a = _expected_remaining(table)
    order = np.argsort(-work_a).tolist()
    work = work_a.tolist()  # Python scalars below: numpy scalar reads and writes cost 5x in this per-request loop
    load = [0.0] * len(layout.instances)
    placement: dict[str, int] = {}
    quotas = {cfg: np.rint(c).astype(int).tolist() for cfg, c in type_counts.items()}
    leftovers: list[tuple[int, str]] = []
    for j in order:
        for rid in table.classes[j].request_ids:
            k = kept_by_old.get(where.get(rid, -1))
            cfg = layout.instances[k].config if k is not None else None
            if cfg is not None and quotas[cfg][j] > 0:
                quotas[cfg][j] -= 1
                placement[rid] = k
                load[k] += work[j]
            else:
                leftovers.append((j, rid))
    heaps = {cfg: [(load[k], k) for k in ks] for cfg, ks in by_type.items()}
    for h in heaps.values():
        heapq.heapify(h)
    cfgs = list(by_type)
    for j, rid in leftovers:
        cfg = max(cfgs, key=lambda c: quotas[c][j])
        if quotas[cfg][j] <= 0:  # rounding left this class short: least-loaded type
            cfg = min(cfgs, key=lambda c: heaps[c][0][0])
        quotas[cfg][j] -= 1
        w, k = heapq.heappop(heaps[cfg])
        placement[rid] = k
        heapq.heappush(heaps[cfg], (w + work[j], k))
    return placement


def _rebalanced(layout: Layout, table: ClassTable, snap: ClusterSnapshot, slack: float = 0.1) -> dict[str, int]:
    """Re-home requests over the current instances, longest expected first, moving only what evens the load.

    Each request goes to the instance with the least expected work per GPU, unless its current
    instance would end within ``slack`` of that (a move costs a recompute or a transfer; a waiting
    request moves for free, so ties keep running requests and move waiting ones). O(R log R + R G log K)
    for G distinct GPU counts among the K instances.
    """
    cls, where = table.class_of(), snap.instance_of()
    work = _expected_remaining(table).tolist()
    running = {r.request_id for w in snap.workers for r in w.running}
    gpus = [float(i.config.gpus) for i in layout.instances]
    load = [0.0] * len(layout.instances)
    # the least (load + w) / gpus: per GPU count, the least-loaded instance (lowest index on ties) is
    # the heap's top; entries go stale as loads grow and are dropped when they surface
    heaps: dict[float, list[tuple[float, int]]] = {}
    for k, g in enumerate(gpus):
        heaps.setdefault(g, []).append((0.0, k))
    out: dict[str, int] = {}
    for rid in sorted(cls, key=lambda r: (-work[cls[r]], r not in running, r)):
        w = work[cls[rid]]
        best, best_v = -1, math.inf
        for g, h in heaps.items():
            while h[0][0] != load[h[0][1]]:
                heapq.heappop(h)
            v = (h[0][0] + w) / g
            if v < best_v or (v == best_v and h[0][1] < best):
                best, best_v = h[0][1], v
        cur = where.get(rid, best)
        keep = (load[cur] + w) / gpus[cur] <= (1.0 + slack) * (load[best] + w) / gpus[best]
        k = cur if keep else best
        out[rid] = k
        load[k] += w
        heapq.heappush(heaps[gpus[k]], (load[k], k))
    return out


def evaluate_layout(layout: Layout, placement: dict[str, int], table: ClassTable, snap: ClusterSnapshot,
                    perf: PerfModel, costs: CostModel, tail_mass: float) -> tuple[float, float, list[float]]:
    """Return (objective of Eq. 1, largest reconfiguration cost, per-instance totals) of a concrete plan."""
    cls = table.class_of()
    ctx = snap.running_context()  # only running requests hold KV
    where = snap.instance_of()
    old_cfg = {g: i.config for i in snap.layout.instances for g in i.gpu_ids}
    same = _same_instances(layout, snap.layout)
    n_inst, n_cls = len(layout.instances), len(table.classes)
    ks = np.fromiter(placement.values(), np.int64, len(placement))
    js = np.fromiter(map(cls.__getitem__, placement), np.int64, len(placement))
    counts = np.bincount(ks * n_cls + js, minlength=n_inst * n_cls).reshape(n_inst, n_cls).astype(np.float64)
    movers: list[list[int]] = [[] for _ in layout.instances]
    for rid, k in placement.items():
        c = ctx.get(rid)
        if c is not None and same.get(k) != where.get(rid):
            movers[k].append(c)
    run_s = np.zeros(len(layout.instances))
    by_cfg: dict[InstanceConfig, list[int]] = {}
    for k, inst in enumerate(layout.instances):
        by_cfg.setdefault(inst.config, []).append(k)
    for c, ks in by_cfg.items():  # one step-model call per configuration, not per instance
        run_s[ks] = instance_times_s(perf, c, table, counts[ks], tail_mass=tail_mass)
    totals, worst_cost = [], 0.0
    for k, inst in enumerate(layout.instances):
        sw = 0.0 if k in same else costs.switch(old_cfg.get(inst.gpu_ids[0]), inst.config).seconds
        mig = costs.migration(inst.config, movers[k]).seconds
        worst_cost = max(worst_cost, sw + mig)
        totals.append(sw + mig + float(run_s[k]))
    return max(totals, default=0.0), worst_cost, totals


def _solve_mix(perf: PerfModel, costs: CostModel, table: ClassTable, types: list[tuple[InstanceConfig, int]],
               snap: ClusterSnapshot, cfg: PlannerConfig) -> tuple[float, dict[InstanceConfig, np.ndarray]] | None:
    """Split classes between two instance types by MIP; return (objective, per-type class counts).

    Solved with HiGHS through ``scipy.optimize.milp`` (SciPy is a dependency already). With OR-Tools' SCIP,
    used before, the warm 2,048-GPU iteration of ``bench/sim_rl.py`` took 20.9 CPU-s against 15.6 s, with
    the same plans (2026-11-28); OR-Tools' own HiGHS wrapper ignores the relative gap and prints a banner
    to stdout whenever a time limit is set.
    """
    from scipy.optimize import Bounds, LinearConstraint, milp
    from scipy.sparse import coo_matrix

    n_cls = len(table.classes)
    step = max(1, int(np.ceil(len(table.grid_tokens) / cfg.mip_grid_points)))
    surv = table.survival[:, ::step]
    grid = table.grid_tokens[::step]
    dt = table.step_tokens * step
    counts, ctx0 = table.counts, table.contexts
    current = {i.config for i in snap.layout.instances}
    kv_total = float(counts @ ctx0)
    cap_total = sum(n * perf.kv_capacity_tokens(y) for y, n in types)
    mu = kv_total / cap_total
    n_t = len(types)
    lo_b: list[float] = []
    hi_b: list[float] = []
    integral: list[int] = []

    def var(lo: float, hi: float, integer: bool = False) -> int:
        lo_b.append(lo)
        hi_b.append(hi)
        integral.append(int(integer))
        return len(lo_b) - 1

    x = {(j, t): var(0.0, float(counts[j])) for j in range(n_cls) for t in range(n_t)}
    big_m = var(0.0, np.inf)
    rows: list[dict[int, float]] = []
    row_lo: list[float] = []
    row_hi: list[float] = []

    def add(coefs: dict[int, float], lo: float, hi: float) -> int:
        rows.append(coefs)
        row_lo.append(lo)
        row_hi.append(hi)
        return len(rows) - 1

    def plus(into: dict[int, float], k: int, v: float) -> None:
        into[k] = into.get(k, 0.0) + v

    for j in range(n_cls):
        add({x[j, t]: 1.0 for t in range(n_t)}, float(counts[j]), float(counts[j]))
    kv_rows = []
    for t, (y, n) in enumerate(types):
        per_inst = counts / n
        hints = [(float(per_inst @ surv[:, 0]), float(per_inst @ (surv[:, 0] * ctx0))), (1.0, float(ctx0.mean()))]
        planes = perf.decode_planes(y, hints)
        sw = 0.0 if y in current else costs.switch(None, y).seconds
        mig = 0.0 if y in current else costs.per_token_s(y)
        makespan: dict[int, float] = {big_m: -1.0}
        for g in range(len(grid)):
            upper = float(counts @ surv[:, g]) / n
            if upper < cfg.tail_mass:
                continue
            live = [j for j in range(n_cls) if surv[j, g] > 0]
            b = {x[j, t]: float(surv[j, g] / n) for j in live}  # requests of type t still running at grid point g
            c = {x[j, t]: float(surv[j, g] * (ctx0[j] + grid[g]) / n) for j in live}  # their context tokens
            z = var(0.0, 1.0, True)
            add({**b, z: -upper}, -np.inf, cfg.tail_mass)  # b - tail_mass <= upper * z
            u = var(0.0, np.inf)
            for pl in planes:  # u >= fixed * z + per_seq * b + per_ctx * c
                row = {u: -1.0, z: float(pl.fixed_s)}
                for k, v in b.items():
                    plus(row, k, pl.per_seq_s * v)
                for k, v in c.items():
                    plus(row, k, pl.per_ctx_s * v)
                add(row, -np.inf, 0.0)
            plus(makespan, u, dt)
        kv_rows.append(add({x[j, t]: float(ctx0[j] / (n * perf.kv_capacity_tokens(y))) for j in range(n_cls)},
                           mu - cfg.kv_delta, mu + cfg.kv_delta))
        for j in range(n_cls):
            plus(makespan, x[j, t], mig * float(ctx0[j] / n))
        add(makespan, -np.inf, -sw)  # big_m >= dt * sum(u) + sw + migration
        # A request is indivisible: an instance type holding any of class j runs at least j's lone time.
        lone = lone_times_s(perf, y, table, tail_mass=cfg.tail_mass)
        for j in range(n_cls):
            w = var(0.0, 1.0, True)
            add({x[j, t]: 1.0, w: -float(counts[j])}, -np.inf, 0.0)
            add({w: float(lone[j]), big_m: -1.0}, -np.inf, -sw)
    r_idx = [r for r, row in enumerate(rows) for _ in row]
    c_idx = [k for row in rows for k in row]
    vals = [v for row in rows for v in row.values()]
    a = coo_matrix((vals, (r_idx, c_idx)), shape=(len(rows), len(lo_b))).tocsr()
    objective = np.zeros(len(lo_b))
    objective[big_m] = 1.0
    options = {"disp": False, "time_limit": cfg.mip_time_limit_s, "mip_rel_gap": cfg.mip_relative_gap}
    lo, hi = np.array(row_lo), np.array(row_hi)
    delta = cfg.kv_delta
    while True:
        res = milp(objective, constraints=LinearConstraint(a, lo, hi), integrality=np.array(integral),
                   bounds=Bounds(np.array(lo_b), np.array(hi_b)), options=options)
        if res.x is not None:  # optimal, or the best found within the time limit
            break
        if delta >= 2.0:
            return None
        delta *= 2  # Eq. 2 too tight for these counts: relax the balance band
        lo[kv_rows], hi[kv_rows] = mu - delta, mu + delta
    split = {y: np.array([res.x[x[j, t]] for j in range(n_cls)]) for t, (y, _) in enumerate(types)}
    return float(res.x[big_m]), split


def _threshold_split(perf: PerfModel, costs: CostModel, table: ClassTable, types: list[tuple[InstanceConfig, int]],
                     snap: ClusterSnapshot, cfg: PlannerConfig) -> tuple[float, dict[InstanceConfig, np.ndarray]]:
    """Split classes between two types at a boundary of expected remaining length.

    Requests likely to run longest go to one type and the rest to the other (both directions are
    tried) at ``threshold_points`` boundaries; Eq. 2 is enforced (with the same relaxation as the
    MIP). O(P * J * T) for P boundaries, J classes and T grid points.
    """
    order = np.argsort(-_expected_remaining(table))
    counts, ctx0 = table.counts, table.contexts
    current = {i.config for i in snap.layout.instances}
    caps = [n * perf.kv_capacity_tokens(y) for y, n in types]
    mu = float(counts @ ctx0) / sum(caps)
    cuts = sorted({int(round(q)) for q in np.linspace(0, len(order), cfg.threshold_points + 1)})
    best: tuple[float, float, dict[InstanceConfig, np.ndarray]] | None = None
    for cut in cuts:
        for first in (0, 1):
            split = {y: np.zeros(len(counts)) for y, _ in types}
            head, tail = types[first][0], types[1 - first][0]
            split[head][order[:cut]] = counts[order[:cut]]
            split[tail][order[cut:]] = counts[order[cut:]]
            worst, viol = 0.0, 0.0
            for (y, n), cap in zip(types, caps):
                share = split[y]
                sw = 0.0 if y in current else costs.switch(None, y).seconds
                mig = 0.0 if y in current else costs.per_token_s(y) * float(share @ ctx0) / n
                lone = lone_times_s(perf, y, table, tail_mass=cfg.tail_mass)
                floor = float(lone[share > 0].max()) if (share > 0).any() else 0.0  # indivisible stragglers
                est = max(instance_time_s(perf, y, table, share / n, tail_mass=cfg.tail_mass), floor)
                worst = max(worst, sw + mig + est)
                viol = max(viol, abs(float(share @ ctx0) / cap - mu) - cfg.kv_delta)
            key = (max(0.0, viol), worst)
            if best is None or key < (best[0], best[1]):
                best = (key[0], worst, split)
    return best[1], best[2]


def _toward_latency(types: Sequence[tuple[InstanceConfig, int]], current: Layout) -> bool:
    """Whether a TP-only layout keeps at least as many GPUs in instances of every size as ``current`` does.

    Within a step the batch only shrinks, so a dense model's layouts should only move from
    throughput modes (many small-TP instances) towards latency modes (few large ones), never
    back (§4.1): for every instance size ``k``, the GPUs in instances of ``k`` or more GPUs must
    not decrease. Layouts with EP or AFD instances (where a larger instance is not a latency
    mode) always pass.

    >>> tp4, tp8 = InstanceConfig("tp", tp=4), InstanceConfig("tp", tp=8)
    >>> mixed = Layout((Instance(tp4, (0, 1, 2, 3)), Instance(tp4, (4, 5, 6, 7)),
    ...                 Instance(tp8, tuple(range(8, 16)))), 16)
    >>> _toward_latency([(tp8, 2)], mixed), _toward_latency([(tp4, 4)], mixed)
    (True, False)
    """
    if any(c.kind != "tp" for c, _ in types) or any(i.config.kind != "tp" for i in current.instances):
        return True
    new = [c.gpus for c, n in types for _ in range(n)]
    old = [i.config.gpus for i in current.instances]
    return all(sum(g for g in new if g >= k) >= sum(g for g in old if g >= k) for k in set(old))


def plan_layout(snap: ClusterSnapshot, perf: PerfModel, costs: CostModel, workload: StepWorkload | None,
                cfg: PlannerConfig | None = None, *, exact_remaining: dict[str, int] | None = None,
                first_change: bool = False) -> Plan:
    """Solve Eq. 1-4 for the pending requests of ``snap``; see the module note.

    Parameters
    ----------
    snap : ClusterSnapshot
        Current layout, assignment and request progress.
    workload : StepWorkload or None
        The step's remaining-workload histogram (None: every request may run to its cap).
    exact_remaining : dict, optional
        True remaining lengths (the clairvoyant planner-exact run only).
    first_change : bool
        No layout change has happened in this step yet: ``monotone_tp`` does not apply.
    """
    cfg = cfg or PlannerConfig()
    monotone = cfg.monotone_tp and not first_change
    t0 = time.perf_counter()
    pending = snap.pending
    total, gpn = snap.layout.total_gpus, perf.gpu.gpus_per_node
    if not pending:
        return Plan(snap.layout, {}, 0.0, 0.0, 0.0, False, "tail", 0, 0, time.perf_counter() - t0)
    table = build_classes(pending, workload, exact_remaining=exact_remaining)
    where = snap.instance_of()
    current_s, _, cur_totals = evaluate_layout(snap.layout, where, table, snap, perf, costs, cfg.tail_mass)
    phase = "early" if len(pending) / total >= cfg.phase_batch_per_gpu else "tail"
    fitting = [c for c in candidate_configs(total, gpn, moe=perf.model.is_moe, cross_node_tp=cfg.cross_node_tp,
                                            afd_ratios=cfg.afd_ratios) if perf.fits(c)]
    tail_configs = [c for c in fitting if c.kind != "afd" and not (c.kind == "tp" and c.tp == 1)] or fitting
    configs = [c for c in fitting if c.gpus <= gpn] if phase == "early" else tail_configs
    conts: dict[InstanceConfig, Continuation] = {}

    def credit(layout: Layout) -> float:
        """Seconds a homogeneous layout's later tail hand-over saves (0 for mixes or without lookahead)."""
        kinds = {i.config for i in layout.instances}
        return _config_credit(next(iter(kinds))) if cfg.lookahead and len(kinds) == 1 else 0.0

    def _config_credit(c: InstanceConfig) -> float:
        if c not in conts:
            conts[c] = best_continuation(perf, costs, table, c, tail_configs, total, tail_mass=cfg.tail_mass,
                                         min_head_s=cfg.handover_after_s)
        return conts[c].credit_s

    current_s -= credit(snap.layout)
    scored: list[tuple[float, list[tuple[InstanceConfig, int]], dict[InstanceConfig, np.ndarray]]] = []
    for c in configs:
        n = total // c.gpus
        # an even share of 1/n of a lone straggler vanishes below tail_mass; some instance runs all of it
        est = max(instance_time_s(perf, c, table, table.counts / n, tail_mass=cfg.tail_mass),
                  float(lone_times_s(perf, c, table, tail_mass=cfg.tail_mass).max()))
        est -= _config_credit(c) if cfg.lookahead else 0.0
        sw = 0.0 if all(i.config == c for i in snap.layout.instances) else costs.switch(None, c).seconds
        scored.append((est + sw, [(c, n)], {c: table.counts}))
    scored.sort(key=lambda s: s[0])
    best = [s[1][0][0] for s in scored[:cfg.top_configs]]
    mips = 0
    for a_i in range(len(best)):
        for b_i in range(a_i + 1, len(best)):
            a, b = sorted((best[a_i], best[b_i]), key=lambda c: c.gpus)
            unit = max(a.gpus, b.gpus, gpn)
            steps = total // unit
            splits = sorted({max(1, min(steps - 1, round(steps * f / (cfg.max_splits + 1))))
                             for f in range(1, cfg.max_splits + 1)}) if steps > 1 else []
            for s in splits:
                types = [(a, s * unit // a.gpus), (b, (total - s * unit) // b.gpus)]
                if monotone and not _toward_latency(types, snap.layout):
                    continue  # dropped below anyway: spare its split and MIP
                scored.append((*_threshold_split(perf, costs, table, types, snap, cfg), ))
                scored[-1] = (scored[-1][0], types, scored[-1][1])
                if len(table.classes) <= cfg.mip_max_classes:
                    solved = _solve_mix(perf, costs, table, types, snap, cfg)
                    mips += 1
                    if solved is not None:
                        scored.append((solved[0], types, solved[1]))
    if monotone:  # the mixes were screened above; the single configurations still picked ``best``
        scored = [c for c in scored if _toward_latency(c[1], snap.layout)]
    scored.sort(key=lambda s: s[0])
    best_plan: tuple[float, float, Layout, dict[str, int], list[float]] | None = None
    for _, types, split in scored[:cfg.exact_candidates]:
        layout = _place(types, snap.layout, gpn)
        placement = _materialize(layout, split, table, snap)
        obj, cost, totals = evaluate_layout(layout, placement, table, snap, perf, costs, cfg.tail_mass)
        obj -= credit(layout)
        if best_plan is None or obj < best_plan[0]:
            best_plan = (obj, cost, layout, placement, totals)
    # The current layout with its requests re-homed (Alg. 1 may change the assignment alone).
    moved = _rebalanced(snap.layout, table, snap) if cfg.reassign else dict(where)
    if moved != where:
        obj, cost, totals = evaluate_layout(snap.layout, moved, table, snap, perf, costs, cfg.tail_mass)
        obj -= credit(snap.layout)
        if best_plan is None or obj < best_plan[0]:
            best_plan = (obj, cost, snap.layout, moved, totals)
    if best_plan is None:  # every candidate would move back towards smaller instances: keep the layout
        best_plan = (current_s, 0.0, snap.layout, dict(where), cur_totals)
    obj, cost, layout, placement, totals = best_plan
    changed = layout != snap.layout or any(where.get(r) != k for r, k in placement.items())
    reconfigure = changed and obj + cfg.margin_s < current_s
    if not reconfigure:
        layout, placement, obj, cost, totals = snap.layout, dict(where), current_s, 0.0, cur_totals
    kinds = {i.config for i in layout.instances}
    cont = conts.get(next(iter(kinds))) if len(kinds) == 1 else None
    note = (f"{cont.tail.name} after ~{cont.switch_tokens:.0f} tokens"
            if cont is not None and cont.tail != cont.head and cont.credit_s > 0 else "")
    return Plan(layout, placement, obj, current_s, cost, reconfigure, phase, len(scored), mips,
                time.perf_counter() - t0, tuple(totals), note)
