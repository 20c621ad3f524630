"""Benchmark the RollMux co-execution group scheduler against same-run baselines and the exhaustive optimum.

Run from the repository root::

    python bench/groups.py           # a few minutes on 2 cores
    python bench/groups.py --quick   # fewer seeds and jobs
    python bench/groups.py --json    # also print one JSON document at the end
    python bench/groups.py --tune-margin   # only: how the realised check's 3% margin was chosen

Everything is measured in the same run; the paper's figures are printed beside ours as references
and never divided into a verdict. SLO attainment is *realised* (each job's realised slowdown
against its realised solo run); the worst-case ("planned") attainment that RollMux's admission
enforces is printed beside it, labelled, and is no evidence for RollMux.

1. Decision latency of Algorithm 1 at 5-2,000 concurrent jobs against the same search scoring every
   placement (no screens, no early stop; must give the same decisions), RollMux without the
   realised-slowdown check (``rollmux-paper``), Greedy and Random on the same cluster state, and the
   exhaustive optimum's solve time at 5 and 9 jobs. Paper (Table 5): 591 ms at 2,000; Opt 113 ms / > 1 min.
2. Cost over the offline optimum (same constraints, same run) on small dense instances of every
   Table 6 workload, with realised and planned SLO attainment; phases at their Table 6 times as in
   §7.5, then stochastic phases. Paper §7.5: 1.01-1.12x, 1.72-2.00x, 1.38-1.89x.
3. Cost saving of rollmux against Solo-D and co-located (veRL) on the mixed workload at the §7.4
   trace's concurrency (paper: 1.84x and 1.38x on its production trace), with bubbles and peak GPUs.
4. Realised SLO attainment on held-out seeds (1000-1019; no test uses them, the check's margin was
   chosen on 100-139): every policy's mean and worst seed, its cost against Solo-D, and every miss
   by cause. rollmux-paper is the scheduler before the realised-slowdown check. Then the same with
   jobs whose response lengths differ from the model the check samples.
5. What this project adds: PoD-aware placement on a fabric (cross-PoD traffic against first-fit),
   RollArt hardware affinity (cost with mixed rollout pools), long-tail migration (paper: 1.06-1.28x).
6. Warm start from host memory against a cold load from disk (torch; RollMux Fig. 4: up to 48x).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

from orchestrl.compute_sched.groups.baselines import GreedyPolicy, RandomPolicy, make_policy  # noqa: E402
from orchestrl.compute_sched.groups.cluster import Cluster  # noqa: E402
from orchestrl.compute_sched.groups.config import GroupConfig  # noqa: E402
from orchestrl.compute_sched.groups.inter import RollMuxScheduler  # noqa: E402
from orchestrl.compute_sched.groups.intra import GroupJob, round_robin  # noqa: E402
from orchestrl.compute_sched.groups.optimal import optimal_groups  # noqa: E402
from orchestrl.compute_sched.groups.replay import MISS_UNEVEN  # noqa: E402
from orchestrl.compute_sched.groups.scenario import ReplaySetup, run_replay  # noqa: E402
from orchestrl.compute_sched.groups.slo import DEFAULT_MARGIN, RealisedSloCheck  # noqa: E402
from orchestrl.compute_sched.groups.workload import ResponseModel, TraceStats, synthesize_jobs  # noqa: E402

# The paper's figures: references printed beside ours, never a denominator.
PAPER_LATENCY_MS = {5: 5.6, 100: 41.9, 500: 198.0, 1000: 318.0, 2000: 591.0}
PAPER_OPT_MS = {5: 113.0, 9: 60_000.0}
PAPER_COST_VS_OPT = {"rollmux": (1.01, 1.12), "random": (1.72, 2.00), "greedy": (1.38, 1.89)}
PAPER_SAVING = {"solo": 1.84, "colocated": 1.38}
#: Screened Algorithm 1 against the same search scoring every placement, at the largest size (same run).
TARGET_SPEEDUP_VS_EVERY_PLACEMENT = 5.0
TARGET_REALISED_ATTAINMENT = 0.95
VS_OPT_POLICIES = ("rollmux", "random", "greedy", "solo")  # Solo-D: not in §7.5; what never sharing costs
HELD_OUT_SEEDS = tuple(range(1000, 1020))  # no test uses these; slo.DEFAULT_MARGIN was chosen on TUNING_SEEDS
TUNING_SEEDS = range(100, 140)  # `--tune-margin` sweeps the check's margin here
#: Realised response-length models unlike the one the check samples (median 0.3 of the limit, sigma 0.7).
MISSPECIFIED = {"median 0.2": ResponseModel(median_fraction=0.2), "sigma 0.4": ResponseModel(sigma=0.4)}
HELD_OUT_POLICIES = ("rollmux", "rollmux-paper", "random", "greedy", "solo", "colocated", "gavel")
EXAMPLE_FABRIC = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                              "examples", "groups", "rollout-fabric-h20.yaml")
TRAIN_FABRIC = os.path.join(os.path.dirname(EXAMPLE_FABRIC), "..", "topology-2048gpu.yaml")
# §7.4's trace: 200 jobs over two weeks, mean 27.9 h -> concurrency 16.6; §7.5's: 300 jobs, 580 h, 14.4 h.
TESTBED_CONCURRENCY = 200 * 27.9 / (14 * 24)
SIM_CONCURRENCY = TraceStats().jobs * TraceStats().mean_duration_h / TraceStats().span_h


def _decision_key(d) -> tuple:
    return (d.strategy, d.group_id, d.roll_nodes, d.new_roll_type, d.new_roll_count, round(d.delta_usd_per_h, 6))


def latency(sizes: list[int], probes: int) -> dict:
    """Return per-size decision times of every policy on the same cluster state, filled by rollmux."""
    cfg = GroupConfig()
    jobs = synthesize_jobs("mixed", max(sizes) + probes, seed=11)
    cluster, sched = Cluster(cfg), RollMuxScheduler(cfg)
    policies = {"rollmux": sched, "rollmux-paper": RollMuxScheduler(cfg, None),
                "every placement": RollMuxScheduler(cfg, exhaustive=True), "greedy": GreedyPolicy(cfg),
                "random": RandomPolicy(cfg)}
    out, placed = {}, 0
    for n in sizes:
        for job in jobs[placed:n]:
            cluster.apply(job, sched.place(job, cluster))
        placed = n
        row: dict = {"groups": len(cluster.groups)}
        keys = {}
        for name, policy in policies.items():
            times, keys[name] = [], []
            for job in jobs[n:n + probes]:
                t0 = time.perf_counter()
                d = policy.place(job, cluster)
                times.append((time.perf_counter() - t0) * 1e3)
                keys[name].append(_decision_key(d))
            row[name] = {"median_ms": statistics.median(times), "max_ms": max(times)}
        row["same_decisions"] = keys["every placement"] == keys["rollmux"]
        out[n] = row
    return out


def optimum_latency() -> dict:
    """Return the optimum's solve time and rollmux's per-decision time on the same 5- and 9-job instances."""
    cfg, check = GroupConfig(), RealisedSloCheck()
    out = {}
    for n in PAPER_OPT_MS:
        opt, online = [], []
        for seed in range(3):
            jobs = synthesize_jobs("mixed", n, seed=seed)
            t0 = time.perf_counter()
            optimal_groups(jobs, cfg, check)
            opt.append((time.perf_counter() - t0) * 1e3)
            cluster, sched = Cluster(cfg), RollMuxScheduler(cfg, check)
            for job in jobs:
                t0 = time.perf_counter()
                d = sched.place(job, cluster)
                online.append((time.perf_counter() - t0) * 1e3)
                cluster.apply(job, d)
        out[n] = {"optimum_ms": statistics.median(opt), "rollmux_ms": statistics.median(online)}
    return out


def versus_optimum(seeds: int, jobs: int, phases: str = "deterministic") -> dict:
    """Return each policy's cost over the optimum (same run, same constraints) and realised/planned attainment."""
    policies = VS_OPT_POLICIES if phases == "deterministic" else ("rollmux", "rollmux-paper", *VS_OPT_POLICIES[1:])
    ratios: dict[str, list[float]] = {p: [] for p in policies}
    att: dict[str, list[float]] = {p: [] for p in ("optimal", *policies)}
    planned: dict[str, list[float]] = {p: [] for p in ("optimal", *policies)}
    slowdown: dict[str, list[float]] = {p: [] for p in ("optimal", *policies)}
    per_workload = {}
    for workload in ("balanced", "rollout-heavy", "train-heavy", "mixed"):
        wl_ratios: dict[str, list[float]] = {p: [] for p in policies}
        for seed in range(seeds):
            base = ReplaySetup(workload=workload, jobs=jobs, seed=seed, arrival_scale=0.05, phases=phases)
            opt = run_replay(dataclasses.replace(base, policy="optimal"))
            for policy in ("optimal", *policies):
                r = opt if policy == "optimal" else run_replay(dataclasses.replace(base, policy=policy))
                if policy != "optimal":
                    ratios[policy].append(r.cost_usd_total / opt.cost_usd_total)
                    wl_ratios[policy].append(r.cost_usd_total / opt.cost_usd_total)
                att[policy].append(r.slo_attainment)
                planned[policy].append(r.slo_attainment_planned)
                slowdown[policy].append(r.mean_slowdown)
        per_workload[workload] = {p: statistics.mean(v) for p, v in wl_ratios.items()}
    return {"cost_vs_opt": {p: {"mean": statistics.mean(v), "min": min(v), "max": max(v)} for p, v in ratios.items()},
            "per_workload": per_workload, "slo_attainment": {p: statistics.mean(v) for p, v in att.items()},
            "slo_attainment_planned": {p: statistics.mean(v) for p, v in planned.items()},
            "mean_slowdown": {p: statistics.mean(v) for p, v in slowdown.items()}, "phases": phases}


def held_out(seeds: tuple[int, ...], jobs: int) -> dict:
    """Return every policy's realised attainment (mean, worst seed), planned attainment, cost and misses."""
    rows: dict[str, dict[str, list]] = {p: {"att": [], "planned": [], "cost_vs_solo": [], "cost_vs_paper": [],
                                            "misses": []} for p in HELD_OUT_POLICIES}
    for seed in seeds:
        setup = ReplaySetup(workload="mixed", jobs=jobs, seed=seed)
        res = {p: run_replay(dataclasses.replace(setup, policy=p)) for p in HELD_OUT_POLICIES}
        for p, r in res.items():
            rows[p]["att"].append(r.slo_attainment)
            rows[p]["planned"].append(r.slo_attainment_planned)
            rows[p]["cost_vs_solo"].append(r.cost_usd_total / res["solo"].cost_usd_total)
            rows[p]["cost_vs_paper"].append(r.cost_usd_total / res["rollmux-paper"].cost_usd_total)
            rows[p]["misses"].extend((seed, m) for m in r.slo_misses)
    out = {}
    for p, v in rows.items():
        misses = [m for _, m in v["misses"]]
        uneven = [m for m in misses if m.cause == MISS_UNEVEN]
        out[p] = {"slo_attainment_mean": statistics.mean(v["att"]), "slo_attainment_worst": min(v["att"]),
                  "slo_attainment_planned_mean": statistics.mean(v["planned"]),
                  "cost_vs_solo": statistics.mean(v["cost_vs_solo"]),
                  "cost_vs_rollmux_paper": statistics.mean(v["cost_vs_paper"]),
                  "misses": len(misses), "misses_over_plan": len(misses) - len(uneven),
                  "misses_uneven": len(uneven),
                  "uneven_by_profile": {k: sum(m.profile.startswith(k) for m in uneven) for k in ("TH", "BL", "RH")},
                  "uneven_solo_shrink": statistics.mean(m.solo_shrink for m in uneven) if uneven else None,
                  "uneven_co_shrink": statistics.mean(m.co_shrink for m in uneven) if uneven else None,
                  "named": [f"seed {s}: {m.describe()}" for s, m in v["misses"]] if p.startswith("rollmux") else []}
    return {"seeds": [seeds[0], seeds[-1]], "jobs": jobs, "margin": DEFAULT_MARGIN, "policies": out}


def misspecified(seeds: tuple[int, ...], jobs: int) -> dict:
    """Return realised attainment when the jobs' response lengths differ from the model the check samples."""
    from orchestrl.compute_sched.groups.replay import replay

    cfg, out = GroupConfig(), {}
    for label, real in MISSPECIFIED.items():
        att: dict[str, list[float]] = {"rollmux": [], "rollmux-paper": []}
        for seed in seeds:
            trace = synthesize_jobs("mixed", jobs, seed)
            for name, check in (("rollmux", RealisedSloCheck(ResponseModel(), seed=seed)), ("rollmux-paper", None)):
                att[name].append(replay(trace, RollMuxScheduler(cfg, check), cfg, responses=real, seed=seed)
                                 .slo_attainment)
        out[label] = {p: {"mean": statistics.mean(v), "worst": min(v)} for p, v in att.items()}
    return out


def tune_margin(seeds: range, jobs: int, margins=(0.0, 0.01, 0.02, 0.03, 0.04, 0.05)) -> dict:
    """Return rollmux's realised attainment and cost over Solo-D per margin on the tuning seeds (not held out)."""
    from orchestrl.compute_sched.groups.replay import replay

    cfg, out = GroupConfig(), {m: {"att": [], "cost_vs_solo": []} for m in margins}
    for seed in seeds:
        trace = synthesize_jobs("mixed", jobs, seed)
        solo = replay(trace, make_policy("solo", cfg), cfg, seed=seed).cost_usd_total
        for m in margins:
            r = replay(trace, RollMuxScheduler(cfg, RealisedSloCheck(margin=m, seed=seed)), cfg, seed=seed)
            out[m]["att"].append(r.slo_attainment)
            out[m]["cost_vs_solo"].append(r.cost_usd_total / solo)
    return {m: {"mean": statistics.mean(v["att"]), "worst": min(v["att"]),
                "cost_vs_solo": statistics.mean(v["cost_vs_solo"])} for m, v in out.items()}


def mixed_savings(jobs: int) -> dict:
    setup = ReplaySetup(workload="mixed", jobs=jobs, seed=1, arrival_scale=SIM_CONCURRENCY / TESTBED_CONCURRENCY)
    res = {p: run_replay(dataclasses.replace(setup, policy=p))
           for p in ("rollmux", "rollmux-paper", "solo", "colocated", "gavel", "random", "greedy")}
    rm = res["rollmux"]
    # Totals are the saving (jobs own fixed work, so a slowed job pays longer); the paper quotes
    # time-averaged $/h over its trace, reported too (the two differ when horizons differ).
    return {"saving_vs_solo": res["solo"].cost_usd_total / rm.cost_usd_total,
            "saving_vs_colocated": res["colocated"].cost_usd_total / rm.cost_usd_total,
            "saving_vs_solo_per_h": res["solo"].cost_usd_per_h / rm.cost_usd_per_h,
            "saving_vs_colocated_per_h": res["colocated"].cost_usd_per_h / rm.cost_usd_per_h,
            "policies": {p: {"cost_usd_per_h": r.cost_usd_per_h,
                             "cost_vs_rollmux": r.cost_usd_total / rm.cost_usd_total,
                             "slo_attainment": r.slo_attainment, "slo_attainment_planned": r.slo_attainment_planned,
                             "rollout_bubble": r.rollout_bubble,
                             "train_bubble": r.train_bubble, "peak_gpus_rollout": r.peak_gpus_rollout,
                             "peak_gpus_train": r.peak_gpus_train} for p, r in res.items()}}


def snapshot_saving(workload: str, concurrent: int, seeds: int = 4) -> float:
    """Return Solo-D's $/h over RollMux's with ``concurrent`` jobs placed at once and none leaving.

    This is RollMux's packing alone: no departures fragmenting groups, no slowed job paying longer.
    """
    cfg, ratios = GroupConfig(), []
    for seed in range(seeds):
        jobs = synthesize_jobs(workload, concurrent, seed)
        costs = []
        for policy in (make_policy("solo", cfg), RollMuxScheduler(cfg)):
            cluster = Cluster(cfg)
            for job in jobs:
                cluster.apply(job, policy.place(job, cluster))
            costs.append(cluster.cost_usd_per_h())
        ratios.append(costs[0] / costs[1])
    return statistics.mean(ratios)


def rollout_heavy_saving(jobs: int) -> float:
    """Return Solo-D's total cost over RollMux's on a rollout-heavy trace (§7.4's is "typically rollout-heavy")."""
    setup = ReplaySetup(workload="rollout-heavy", jobs=jobs, seed=1,
                        arrival_scale=SIM_CONCURRENCY / TESTBED_CONCURRENCY)
    res = {p: run_replay(dataclasses.replace(setup, policy=p)) for p in ("rollmux", "solo")}
    return res["solo"].cost_usd_total / res["rollmux"].cost_usd_total


def fabric_and_affinity(jobs: int) -> dict:
    base = ReplaySetup(workload="mixed", jobs=jobs, seed=2, arrival_scale=0.2, rollout_topology=EXAMPLE_FABRIC,
                       train_topology=TRAIN_FABRIC)
    aware = run_replay(base)
    blind = run_replay(dataclasses.replace(base, fabric_aware=False))
    plain = ReplaySetup(workload="rollout-heavy", jobs=jobs, seed=3, arrival_scale=0.5)
    homog = run_replay(dataclasses.replace(plain, affinity=False))
    # Same trace with affinity: half the multi-turn jobs prefill-heavy; compare with H20-only pools.
    mixed_pool = run_replay(dataclasses.replace(plain, affinity=True))
    h20_only = _h20_only_with_prefill(plain)
    return {"pods_aware": aware.mean_rollout_pods, "pods_first_fit": blind.mean_rollout_pods,
            "cross_pod_tb_aware": aware.cross_pod_tb, "cross_pod_tb_first_fit": blind.cross_pod_tb,
            "rejected_aware": aware.rejected, "rejected_first_fit": blind.rejected,
            "affinity_saving": h20_only.cost_usd_total / mixed_pool.cost_usd_total,
            "affinity_slo": mixed_pool.slo_attainment, "h20_only_cost_vs_decode_trace": h20_only.cost_usd_total
            / homog.cost_usd_total}


def _h20_only_with_prefill(setup: ReplaySetup):
    from orchestrl.compute_sched.groups.inter import RollMuxScheduler as Sched
    from orchestrl.compute_sched.groups.replay import replay

    cfg = GroupConfig()
    jobs = synthesize_jobs(setup.workload, setup.jobs, setup.seed, arrival_scale=setup.arrival_scale,
                           prefill_share=0.5)
    return replay(jobs, Sched(cfg, RealisedSloCheck(seed=setup.seed)), cfg, seed=setup.seed)


def migration_gain(pairs: int) -> dict:
    cfg_on, cfg_off = GroupConfig(), GroupConfig(long_tail_migration=False)
    rng = np.random.default_rng(5)
    gains = {}
    for name, (lo, hi) in {"short": (50, 100), "long": (200, 300)}.items():
        g = []
        for _ in range(pairs):
            jobs = [GroupJob(f"j{i}", (0,), float(rng.uniform(lo, hi)), float(rng.uniform(lo, hi))) for i in range(2)]
            draws = ResponseModel().draw(rng, 24, 2, cfg_on.tail_threshold)
            on = round_robin(jobs, 1, cfg_on, draws=draws).meta_iteration_s
            off = round_robin(jobs, 1, cfg_off, draws=draws).meta_iteration_s
            g.append(off / on)
        gains[name] = statistics.mean(g)
    return gains


def warm_vs_cold() -> dict | None:
    try:
        from orchestrl.agents.phase import measure_warm_vs_cold
    except ImportError:
        return None
    with tempfile.TemporaryDirectory() as tmp:
        return measure_warm_vs_cold(tmp, state_mb=256)


def _print_latency(lat: dict, opt_lat: dict) -> float:
    print("\n1. Decision latency, mixed workload, on the same cluster state (ms, median / max over the probes)")
    print(f"  {'jobs':>6} {'groups':>7} {'rollmux':>14} {'rollmux-paper':>14} {'every placement':>16} {'x':>6} "
          f"{'greedy':>14} {'x':>6} {'random':>8}  {'paper (ref.)':>12}")
    for n, v in lat.items():
        cell = lambda p: f"{v[p]['median_ms']:.2f} / {v[p]['max_ms']:.1f}"  # noqa: E731
        print(f"  {n:>6} {v['groups']:>7} {cell('rollmux'):>14} {cell('rollmux-paper'):>14} "
              f"{cell('every placement'):>16} "
              f"{v['every placement']['median_ms'] / v['rollmux']['median_ms']:>5.1f}x {cell('greedy'):>14} "
              f"{v['greedy']['median_ms'] / v['rollmux']['median_ms']:>5.1f}x {v['random']['median_ms']:>8.2f}  "
              f"{PAPER_LATENCY_MS.get(n, float('nan')):>12.1f}")
    top = lat[max(lat)]
    speedup = top["every placement"]["median_ms"] / top["rollmux"]["median_ms"]
    same = all(v["same_decisions"] for v in lat.values())
    print(f"  {max(lat):,} jobs: {speedup:.1f}x faster than scoring every placement, "
          f"{'identical' if same else 'DIFFERENT'} decisions (target >= {TARGET_SPEEDUP_VS_EVERY_PLACEMENT:.0f}x, "
          f"identical) {'PASS' if speedup >= TARGET_SPEEDUP_VS_EVERY_PLACEMENT and same else 'FAIL'}")
    print("  exhaustive optimum (same realised-slowdown constraint) vs rollmux per decision, same instances: "
          + ", ".join(
        f"{n} jobs {v['optimum_ms']:.1f} ms vs {v['rollmux_ms']:.2f} ms = {v['optimum_ms'] / v['rollmux_ms']:.0f}x "
        f"(paper Opt {PAPER_OPT_MS[n]:.0f} ms)" for n, v in opt_lat.items()))
    return speedup


def _print_versus_optimum(vs: dict, vs_sto: dict, small: int, seeds: int) -> None:
    print(f"\n2. Cost over the offline optimum (same run, same SLO constraints), {small}-job dense instances, "
          f"4 workloads x {seeds} seeds")
    for doc, title in ((vs, "phases at their Table 6 times (§7.5); rollmux-paper is identical here"),
                       (vs_sto, "stochastic phases (heavy-tailed responses, long-tail migration)")):
        print(f"  {title}")
        print(f"  {'policy':>13} {'mean':>6} {'min':>6} {'max':>6} {'paper (ref.)':>12} {'SLO realised':>13} "
              f"{'(planned)':>10} {'slowdown':>9}")
        for p in ("optimal", *doc["cost_vs_opt"]):
            v = doc["cost_vs_opt"].get(p)
            costs = f"{v['mean']:>6.2f} {v['min']:>6.2f} {v['max']:>6.2f}" if v else f"{'1':>6} {'':>6} {'':>6}"
            paper = "%5.2f-%-6.2f" % PAPER_COST_VS_OPT[p] if p in PAPER_COST_VS_OPT else f"{'-':^12}"
            print(f"  {p:>13} {costs} {paper} {100 * doc['slo_attainment'][p]:>12.0f}% "
                  f"{100 * doc['slo_attainment_planned'][p]:>9.0f}% {doc['mean_slowdown'][p]:>8.2f}x")
    print("  per workload, Table 6 times (mean): " + "; ".join(
        f"{w}: " + ", ".join(f"{p} {r:.2f}" for p, r in d.items()) for w, d in vs["per_workload"].items()))


def _print_held_out(ho: dict) -> bool:
    lo, hi = ho["seeds"]
    print(f"\n4. Realised SLO attainment on held-out seeds {lo}-{hi} (no test uses them; margin {ho['margin']:.0%} "
          f"chosen on seeds 100-139), mixed workload, {ho['jobs']} jobs, stochastic phases")
    print(f"  {'policy':>13} {'realised mean':>13} {'worst seed':>10} {'(planned)':>10} {'x Solo-D':>9} "
          f"{'x rollmux-paper':>15} {'misses':>6} {'over plan':>9} {'uneven':>6}")
    for p, v in ho["policies"].items():
        print(f"  {p:>13} {100 * v['slo_attainment_mean']:>12.1f}% {100 * v['slo_attainment_worst']:>9.0f}% "
              f"{100 * v['slo_attainment_planned_mean']:>9.0f}% {v['cost_vs_solo']:>9.3f} "
              f"{v['cost_vs_rollmux_paper']:>15.3f} {v['misses']:>6} {v['misses_over_plan']:>9} "
              f"{v['misses_uneven']:>6}")
    paper = ho["policies"]["rollmux-paper"]
    if paper["misses_uneven"]:
        by = paper["uneven_by_profile"]
        print(f"  {paper['misses_uneven']} of rollmux-paper's {paper['misses']} misses passed the worst-case check: "
              f"train-heavy {by['TH']}, balanced {by['BL']}, rollout-heavy {by['RH']}; their "
              f"solo iteration shrank to {paper['uneven_solo_shrink']:.0%} of its worst case on average, their "
              f"co-execution only to {paper['uneven_co_shrink']:.0%} (rollouts end with the longest response, "
              f"training follows the mean)")
    for line in ho["policies"]["rollmux"]["named"]:
        print(f"  rollmux miss, {line}")
    for label, v in ho["misspecified"].items():
        print(f"  jobs realise responses with {label} while the check samples median 0.3, sigma 0.7: rollmux "
              f"{100 * v['rollmux']['mean']:.1f}% mean ({100 * v['rollmux']['worst']:.0f}% worst seed), rollmux-paper "
              f"{100 * v['rollmux-paper']['mean']:.1f}% ({100 * v['rollmux-paper']['worst']:.0f}%)")
    rm = ho["policies"]["rollmux"]
    ok = rm["slo_attainment_mean"] >= TARGET_REALISED_ATTAINMENT
    print(f"  rollmux realised attainment {100 * rm['slo_attainment_mean']:.1f}% mean, "
          f"{100 * rm['slo_attainment_worst']:.0f}% worst seed (target mean >= {TARGET_REALISED_ATTAINMENT:.0%}) "
          f"{'PASS' if ok else 'FAIL'}; it costs {rm['cost_vs_rollmux_paper']:.3f}x of rollmux-paper")
    return ok


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="also print a JSON document")
    ap.add_argument("--quick", action="store_true", help="fewer seeds and jobs")
    ap.add_argument("--tune-margin", action="store_true",
                    help="only sweep the realised check's margin on seeds 100-139 (how DEFAULT_MARGIN was chosen)")
    args = ap.parse_args(argv)
    if args.tune_margin:
        sweep = tune_margin(TUNING_SEEDS, 100)
        print(f"realised-slowdown check margin on tuning seeds {TUNING_SEEDS.start}-{TUNING_SEEDS.stop - 1}, "
              f"mixed, 100 jobs: pick the smallest with no miss")
        for m, v in sweep.items():
            print(f"  margin {m:.0%}: realised {100 * v['mean']:.1f}% mean, {100 * v['worst']:.0f}% worst seed, "
                  f"cost {v['cost_vs_solo']:.3f}x Solo-D")
        if args.json:
            print(json.dumps({str(m): v for m, v in sweep.items()}, indent=2))
        return {"tune_margin": sweep}
    if args.quick:
        seeds, small, trace, probes, sizes, ho_seeds, ho_jobs = 2, 7, 150, 10, [5, 100, 500], 3, 60
    else:
        seeds, small, trace, probes, sizes, ho_seeds, ho_jobs = 5, 8, 300, 30, list(PAPER_LATENCY_MS), 20, 100
    t_start = time.time()
    print(f"# bench/groups.py  {platform.machine()} {os.cpu_count()} cores, python {platform.python_version()}")
    lat = latency(sizes, probes)
    opt_lat = optimum_latency()
    speedup = _print_latency(lat, opt_lat)

    vs = versus_optimum(seeds, small)
    vs_sto = versus_optimum(seeds, small, phases="stochastic")
    _print_versus_optimum(vs, vs_sto, small, seeds)

    sav = mixed_savings(trace)
    print(f"\n3. Mixed workload, {trace} jobs at the §7.4 trace's concurrency (SLO: realised, planned in brackets)")
    print(f"  {'policy':>13} {'$/h':>8} {'x rollmux':>9} {'SLO':>5} {'(plan)':>6} {'roll bubble':>11} "
          f"{'train bubble':>12} {'peak H20':>8} {'peak H800':>9}")
    for p, v in sav["policies"].items():
        rb = "-" if v["rollout_bubble"] is None else f"{100 * v['rollout_bubble']:.0f}%"
        print(f"  {p:>13} {v['cost_usd_per_h']:>8.0f} {v['cost_vs_rollmux']:>9.2f} {100 * v['slo_attainment']:>4.0f}% "
              f"{100 * v['slo_attainment_planned']:>5.0f}% {rb:>11} {100 * v['train_bubble']:>11.0f}% "
              f"{v['peak_gpus_rollout']:>8} {v['peak_gpus_train']:>9}")
    print(f"  saving vs Solo-D {sav['saving_vs_solo']:.2f}x (paper {PAPER_SAVING['solo']}x, its trace), "
          f"vs co-located {sav['saving_vs_colocated']:.2f}x (paper {PAPER_SAVING['colocated']}x); "
          f"time-averaged $/h: {sav['saving_vs_solo_per_h']:.2f}x, {sav['saving_vs_colocated_per_h']:.2f}x")
    n_conc = round(TESTBED_CONCURRENCY)
    snap = {w: snapshot_saving(w, n_conc) for w in ("mixed", "rollout-heavy")}
    rh = rollout_heavy_saving(trace)
    print(f"  rollout-heavy trace: {rh:.2f}x vs Solo-D; packing alone ({n_conc} jobs placed at once, none leaving, "
          f"no slowdown paid): mixed {snap['mixed']:.2f}x, rollout-heavy {snap['rollout-heavy']:.2f}x vs Solo-D $/h")

    ho = held_out(HELD_OUT_SEEDS[:ho_seeds], ho_jobs)
    ho["misspecified"] = misspecified(HELD_OUT_SEEDS[:ho_seeds], ho_jobs)
    held_out_ok = _print_held_out(ho)

    fab = fabric_and_affinity(trace)
    mig = migration_gain(20 if args.quick else 60)
    print("\n5. Beyond the paper")
    print(f"  PoD-aware placement ({os.path.basename(EXAMPLE_FABRIC)} rollout, topology-2048gpu.yaml training): "
          f"{fab['pods_aware']:.3f} rollout PoDs per job, {fab['cross_pod_tb_aware']:.1f} TB cross-PoD vs first-fit "
          f"{fab['pods_first_fit']:.3f} PoDs, {fab['cross_pod_tb_first_fit']:.1f} TB")
    print(f"  hardware affinity (half of multi-turn jobs prefill-heavy): H20+H800 rollout pools cost "
          f"{1 / fab['affinity_saving']:.2f}x of H20-only ({fab['affinity_saving']:.2f}x saving), "
          f"realised SLO {100 * fab['affinity_slo']:.0f}%")
    print(f"  long-tail migration, two balanced jobs sharing a rollout node: {mig['short']:.2f}x (50-100 s phases), "
          f"{mig['long']:.2f}x (200-300 s) throughput vs no migration, same draws (paper 1.06-1.28x)")
    warm = warm_vs_cold()
    if warm:
        print(f"\n6. Warm start from host memory vs cold load from disk, {warm['state_mb']} MB of torch tensors: "
              f"{warm['warm_s'] * 1e3:.1f} ms vs {warm['cold_s'] * 1e3:.1f} ms = {warm['ratio']:.1f}x")
    else:
        print("\n6. Warm start: torch not installed, skipped")
    top = max(lat)
    doc = {"latency_ms": {str(n): v["rollmux"]["median_ms"] for n, v in lat.items()},
           "latency": {str(n): v for n, v in lat.items()}, "latency_largest_jobs": top,
           "latency_speedup_vs_every_placement": speedup, "optimal_latency_ms": {str(n): v for n, v in opt_lat.items()},
           "cost_vs_opt": vs["cost_vs_opt"], "cost_vs_opt_per_workload": vs["per_workload"],
           "slo_attainment": vs["slo_attainment"], "slo_attainment_planned": vs["slo_attainment_planned"],
           "mean_slowdown_vs_opt": vs["mean_slowdown"], "cost_vs_opt_stochastic": vs_sto["cost_vs_opt"],
           "slo_attainment_stochastic": vs_sto["slo_attainment"],
           "slo_attainment_planned_stochastic": vs_sto["slo_attainment_planned"],
           "saving_vs_solo": sav["saving_vs_solo"],
           "saving_vs_colocated": sav["saving_vs_colocated"], "saving_vs_solo_per_h": sav["saving_vs_solo_per_h"],
           "saving_vs_colocated_per_h": sav["saving_vs_colocated_per_h"], "saving_vs_solo_rollout_heavy": rh,
           "snapshot_saving_vs_solo": snap, "mixed_trace": sav["policies"], "held_out": ho,
           "held_out_pass": held_out_ok, "fabric_affinity": fab, "migration_gain": mig, "warm_start": warm,
           "elapsed_s": time.time() - t_start, "machine": f"{platform.machine()} {os.cpu_count()} cores"}
    print(f"\n(elapsed {doc['elapsed_s']:.0f} s)")
    if args.json:
        print(json.dumps(doc, indent=2))
    return doc


if __name__ == "__main__":
    main()
