"""Benchmark the Appendix D circuit allocators: speed at cluster scale, and quality.

Run from the repository root::

    python bench/allocator.py            # full run (about a minute on 2 cores)
    python bench/allocator.py --quick    # a few seconds; fewer repetitions and seeds
    python bench/allocator.py --json     # also print one JSON document at the end

Three measurements, all taken in the same run:

1. Time of one full greedy allocation (OCS-Core over PoDs plus every PoD's OCS-Agg problem)
   against cluster size, with the ratio of the 2,048-GPU p99 to the 10 ms control-loop target.
2. Greedy and uniform worst pair time over the CP-SAT optimum on random sparse demand.  The
   instances give every endpoint at least as many ports as demanded pairs, so all three methods
   serve every pair and the worst times compare like for like (greedy is provably optimal
   there; the row checks it).  A port-starved set reports served pairs and bytes instead,
   because the optimum's worst time is then taken over a different set of pairs.
3. Uniform worst pair time over greedy on skewed demand (hot pairs, as in Figure 23).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import random
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from fabric.allocator_exact import exact_min_max_time_s  # noqa: E402
from fabric.allocator import (  # noqa: E402  (path set up above)
    AllocationProblem,
    allocate_greedy,
    allocate_optimal,
    allocate_uniform,
)

LINK_BPS = 200e9  # 200 Gb/s circuits (bits per second; demands are bytes)
GPUS_PER_SERVER = 8
TORS_PER_POD = 8  # one rail ToR per GPU rail
SERVERS_PER_POD = 32  # so 256 GPUs per PoD
TOR_UPLINKS = 32  # OCS-Agg ports per ToR in a full PoD
POD_BOUNDARY_PORTS = 64  # OCS-Core ports per PoD
UPLINK_ENDPOINTS = 8  # boundary ports grouped into this many Agg-side endpoints
SIZES_GPUS = (64, 128, 256, 512, 1024, 2048, 4096, 8192)
TARGET_S_AT_2048 = 10e-3
TARGET_GREEDY_OVER_OPT = 1.10
TARGET_UNIFORM_OVER_GREEDY = 1.5


# ------------------------------------------------------------------ 1. speed at cluster scale


def cluster_problems(gpus: int, rng: random.Random):
    """Return (core problem or None, per-PoD agg problems) for a synthetic cluster."""
    servers = gpus // GPUS_PER_SERVER
    pods = max(1, servers // SERVERS_PER_POD)
    per_pod = min(SERVERS_PER_POD, servers)
    tor_ports = TOR_UPLINKS * per_pod // SERVERS_PER_POD  # smaller PoDs have fewer uplinks
    pod_names = [f"pod{i}" for i in range(pods)]
    core_demand = {}
    for u in pod_names:
        for v in pod_names:
            if u != v and rng.random() < 0.8:
                core_demand[(u, v)] = rng.lognormvariate(math.log(4e9), 1.0)
    core = None
    if pods > 1:
        core = AllocationProblem(LINK_BPS, {p: POD_BOUNDARY_PORTS for p in pod_names}, core_demand)
    aggs = []
    for p in pod_names:
        tors = [f"{p}.tor{r}" for r in range(TORS_PER_POD)]
        ports = {t: tor_ports for t in tors}
        demand = {}
        for u in tors:
            for v in tors:
                if u != v and rng.random() < 0.5:
                    demand[(u, v)] = rng.lognormvariate(math.log(1e9), 1.0)
        if pods > 1:
            ups = [f"{p}.up{k}" for k in range(UPLINK_ENDPOINTS)]
            ports.update({x: POD_BOUNDARY_PORTS // UPLINK_ENDPOINTS for x in ups})
            lift = sum(b for (u, _), b in core_demand.items() if u == p)
            drop = sum(b for (_, v), b in core_demand.items() if v == p)
            for t in tors:  # each ToR lifts/drops its share through a few uplink groups
                for x in rng.sample(ups, 3):
                    demand[(t, x)] = lift / (TORS_PER_POD * 3) * rng.uniform(0.5, 1.5)
                    demand[(x, t)] = drop / (TORS_PER_POD * 3) * rng.uniform(0.5, 1.5)
        aggs.append(AllocationProblem(LINK_BPS, ports, demand))
    return core, aggs


def bench_scale(quick: bool) -> list[dict]:
    rows = []
    for gpus in SIZES_GPUS:
        core, aggs = cluster_problems(gpus, random.Random(gpus))
        problems = ([core] if core else []) + aggs
        reps = (20 if gpus <= 2048 else 5) if quick else (300 if gpus <= 2048 else 60)
        times, uniform_times = [], []
        for _ in range(reps):
            t0 = time.perf_counter()
            allocs = [allocate_greedy(p) for p in problems]
            times.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            for p in problems:
                allocate_uniform(p)
            uniform_times.append(time.perf_counter() - t0)
        for p, a in zip(problems, allocs):  # a slow but wrong allocator must not look good
            assert all(a.ports_used().get(v, 0) <= d for v, d in p.ports.items())
        times.sort()
        rows.append({
            "gpus": gpus,
            "pods": len(aggs),
            "pairs": sum(len(a.pair_time_s) for a in allocs),
            "circuits": sum(sum(a.circuits.values()) for a in allocs),
            "reps": reps,
            "median_ms": 1e3 * statistics.median(times),
            "p99_ms": 1e3 * times[min(len(times) - 1, math.ceil(0.99 * len(times)) - 1)],
            "uniform_median_ms": 1e3 * statistics.median(uniform_times),
        })
    return rows


# ------------------------------------------------------------------ 2. quality vs the optimum


def sparse_problem(seed: int, starved: bool = False) -> AllocationProblem:
    """Random sparse demand (8-16 endpoints, 20-40 % of ordered pairs, lognormal bytes).

    By default every endpoint gets at least as many ports as demanded pairs (all servable);
    ``starved`` gives 2-6 ports instead, so some pairs must go without a circuit.
    """
    rng = random.Random(seed)
    names = [f"e{i:02d}" for i in range(rng.randint(8, 16))]
    density = rng.uniform(0.2, 0.4)
    demand = {}
    for u in names:
        for v in names:
            if u != v and rng.random() < density:
                demand[(u, v)] = rng.lognormvariate(math.log(1e9), 1.5)
    pairs_at = {n: 0 for n in names}
    for key in {tuple(sorted(k)) for k in demand}:
        pairs_at[key[0]] += 1
        pairs_at[key[1]] += 1
    if starved:
        ports = {n: rng.randint(2, 6) for n in names}
    else:
        ports = {n: max(rng.randint(4, 16), pairs_at[n]) for n in names}
    return AllocationProblem(LINK_BPS, ports, demand)


def _bytes_on_circuits(p: AllocationProblem, alloc) -> float:
    """Share of demanded bytes whose pair got at least one circuit (the rest stays on EPS)."""
    served = {frozenset(k) for k in alloc.circuits}
    total = sum(p.demand.values())
    return sum(b for k, b in p.demand.items() if frozenset(k) in served) / total


def bench_quality(quick: bool) -> dict:
    seeds = range(5) if quick else range(20)
    g_ratio, u_ratio, gaps, solve_s = [], [], [], []
    allocate_optimal(sparse_problem(0))  # pay the OR-Tools import outside the timed solves
    for seed in seeds:
        p = sparse_problem(seed)
        t0 = time.perf_counter()
        opt = allocate_optimal(p, time_limit_s=60)
        solve_s.append(time.perf_counter() - t0)
        g, u = allocate_greedy(p), allocate_uniform(p)
        assert not (opt.unserved or g.unserved or u.unserved)
        exact = exact_min_max_time_s(p)
        gaps.append(abs(opt.max_pair_time_s - exact) / exact)
        g_ratio.append(g.max_pair_time_s / opt.max_pair_time_s)
        u_ratio.append(u.max_pair_time_s / opt.max_pair_time_s)
    # Port-starved: the optimum maximises the *number* of served pairs first, so its worst
    # time is over a different (often lighter) pair set; compare served pairs and bytes.
    starved = {"greedy": [], "uniform": [], "greedy_bytes": [], "uniform_bytes": [],
               "optimal_bytes": []}
    for seed in seeds:
        p = sparse_problem(seed, starved=True)
        t0 = time.perf_counter()
        opt = allocate_optimal(p, time_limit_s=60)
        solve_s.append(time.perf_counter() - t0)
        most = len(opt.pair_time_s) - len(opt.unserved)
        for name, alloc in (("greedy", allocate_greedy(p)), ("uniform", allocate_uniform(p))):
            starved[name].append((len(alloc.pair_time_s) - len(alloc.unserved)) / most)
            starved[f"{name}_bytes"].append(_bytes_on_circuits(p, alloc))
        starved["optimal_bytes"].append(_bytes_on_circuits(p, opt))
    return {
        "instances": len(g_ratio),
        "greedy_over_opt_mean": statistics.fmean(g_ratio),
        "greedy_over_opt_max": max(g_ratio),
        "uniform_over_opt_mean": statistics.fmean(u_ratio),
        "uniform_over_opt_max": max(u_ratio),
        "cpsat_vs_exact_max_rel_gap": max(gaps),
        "cpsat_solve_s_max": max(solve_s),
        "starved_served_pairs_over_max": {
            m: {"mean": statistics.fmean(starved[m]), "min": min(starved[m])}
            for m in ("greedy", "uniform")
        },
        "starved_bytes_on_circuits_mean": {
            m: statistics.fmean(starved[f"{m}_bytes"]) for m in ("greedy", "uniform", "optimal")
        },
    }


# ------------------------------------------------------------------ 3. skewed demand


def skewed_problems() -> dict[str, tuple[AllocationProblem, bool]]:
    """Skewed demands in the spirit of Figure 23 (8 ToRs, 16 ports each).

    Returns name -> (problem, counts toward the >= 1.5x target).  The hot-*endpoint* case is
    reported for information only: when one endpoint's port budget is the bottleneck, no
    allocation can help (the optimum equals uniform), which is worth seeing but not a target.
    """
    tors = [f"tor{i}" for i in range(8)]
    ports = {t: 16 for t in tors}
    gb = 1e9
    # EP all-to-all with skewed routing: four disjoint ToR pairs exchange 8x the usual tokens.
    a2a = {(u, v): 1 * gb for u in tors for v in tors if u != v}
    for i in range(0, len(tors), 2):
        a2a[(tors[i], tors[i + 1])] = a2a[(tors[i + 1], tors[i])] = 8 * gb
    # DP ring allreduce (each rank sends to the next) over a light all-to-all background.
    ring = {(u, v): 0.05 * gb for u in tors for v in tors if u != v}
    for i, t in enumerate(tors):
        ring[(t, tors[(i + 1) % len(tors)])] = 25 * gb
    # Pipeline stages: each adjacent stage pair carries activations, others only control.
    pipe = {(u, v): 0.02 * gb for u in tors for v in tors if u != v}
    for i in range(0, len(tors) - 1):
        pipe[(tors[i], tors[i + 1])] = pipe[(tors[i + 1], tors[i])] = 8 * gb
    # All-to-all where two ToRs host hot experts: everyone sends them 6x the usual tokens.
    hot = {"tor2", "tor5"}
    hot_ep = {(u, v): (6 if v in hot else 1) * gb for u in tors for v in tors if u != v}
    return {
        "a2a_ep_hot_pairs": (AllocationProblem(LINK_BPS, ports, a2a), True),
        "allreduce_ring_dp": (AllocationProblem(LINK_BPS, ports, ring), True),
        "pipeline_neighbours": (AllocationProblem(LINK_BPS, ports, pipe), True),
        "a2a_hot_endpoints": (AllocationProblem(LINK_BPS, ports, hot_ep), False),
    }


def bench_skew() -> list[dict]:
    rows = []
    for name, (p, in_target) in skewed_problems().items():
        g, u, o = allocate_greedy(p), allocate_uniform(p), allocate_optimal(p, time_limit_s=60)
        rows.append({
            "scenario": name,
            "in_target": in_target,
            "greedy_s": g.max_pair_time_s,
            "uniform_s": u.max_pair_time_s,
            "optimal_s": o.max_pair_time_s,
            "uniform_over_greedy": u.max_pair_time_s / g.max_pair_time_s,
            "greedy_over_opt": g.max_pair_time_s / o.max_pair_time_s,
        })
    return rows


# ------------------------------------------------------------------ report


def _verdict(ok: bool) -> str:
    return "PASS" if ok else "FAIL"


def main(argv: list[str] | None = None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", action="store_true", help="also print a JSON document")
    ap.add_argument("--quick", action="store_true", help="fewer repetitions and seeds")
    args = ap.parse_args(argv)

    started = time.perf_counter()
    scale, quality, skew = bench_scale(args.quick), bench_quality(args.quick), bench_skew()
    at_2048 = next(r for r in scale if r["gpus"] == 2048)
    targets = [
        ("greedy full allocation p99 at 2,048 GPUs < 10 ms", at_2048["p99_ms"] / 10.0,
         at_2048["p99_ms"] * 1e-3 < TARGET_S_AT_2048, "x of 10 ms"),
        ("greedy / optimal mean worst pair time <= 1.10 (sparse)",
         quality["greedy_over_opt_mean"],
         quality["greedy_over_opt_mean"] <= TARGET_GREEDY_OVER_OPT, "x"),
        ("uniform / greedy worst pair time >= 1.5 (every hot-pair scenario)",
         min(r["uniform_over_greedy"] for r in skew if r["in_target"]),
         all(r["uniform_over_greedy"] >= TARGET_UNIFORM_OVER_GREEDY
             for r in skew if r["in_target"]), "x (min)"),
    ]

    print(f"# allocator benchmark  {time.strftime('%Y-%m-%d')}  "
          f"({platform.processor() or platform.machine()}, "
          f"{os.cpu_count()} cpus, python {platform.python_version()}"
          f"{', quick' if args.quick else ''})")
    print("\n## 1. greedy full allocation time (core + all PoD agg problems)")
    print(f"{'GPUs':>6} {'PoDs':>5} {'pairs':>6} {'circuits':>8} {'reps':>5} "
          f"{'median ms':>10} {'p99 ms':>8} {'uniform ms':>11}")
    for r in scale:
        print(f"{r['gpus']:>6} {r['pods']:>5} {r['pairs']:>6} {r['circuits']:>8} {r['reps']:>5} "
              f"{r['median_ms']:>10.3f} {r['p99_ms']:>8.3f} {r['uniform_median_ms']:>11.3f}")
    print(f"\n## 2a. worst pair time / CP-SAT optimum, {quality['instances']} random sparse "
          "instances, every pair servable")
    print(f"{'method':>8} {'mean':>7} {'max':>7}")
    print(f"{'greedy':>8} {quality['greedy_over_opt_mean']:>7.3f} "
          f"{quality['greedy_over_opt_max']:>7.3f}")
    print(f"{'uniform':>8} {quality['uniform_over_opt_mean']:>7.3f} "
          f"{quality['uniform_over_opt_max']:>7.3f}")
    print(f"CP-SAT vs exact binary search: max relative gap "
          f"{quality['cpsat_vs_exact_max_rel_gap']:.1e}; "
          f"slowest CP-SAT solve {quality['cpsat_solve_s_max']:.2f} s")
    print(f"\n## 2b. port-starved (2-6 ports), {quality['instances']} instances (info only)")
    print(f"{'method':>8} {'served/max mean':>16} {'served/max min':>15} {'bytes on circuits':>18}")
    served, on = quality["starved_served_pairs_over_max"], quality["starved_bytes_on_circuits_mean"]
    for m in ("greedy", "uniform"):
        print(f"{m:>8} {served[m]['mean']:>16.3f} {served[m]['min']:>15.3f} {on[m]:>18.3f}")
    print(f"{'optimal':>8} {1.0:>16.3f} {1.0:>15.3f} {on['optimal']:>18.3f}")
    print("\n## 3. skewed demand (8 ToRs x 16 ports, 200 Gb/s)")
    print(f"{'scenario':<22} {'greedy s':>9} {'uniform s':>10} {'optimal s':>10} "
          f"{'uni/greedy':>10} {'greedy/opt':>10}")
    for r in skew:
        print(f"{r['scenario']:<22} {r['greedy_s']:>9.4f} {r['uniform_s']:>10.4f} "
              f"{r['optimal_s']:>10.4f} {r['uniform_over_greedy']:>10.3f} "
              f"{r['greedy_over_opt']:>10.3f}{'' if r['in_target'] else '  (info only)'}")
    print("\n## targets")
    for name, value, ok, unit in targets:
        print(f"{_verdict(ok)}  {name}: {value:.3f}{unit}")
    elapsed = time.perf_counter() - started
    print(f"\n(total {elapsed:.1f} s)")

    doc = {
        "date": time.strftime("%Y-%m-%d"),
        "machine": {"processor": platform.processor() or platform.machine(),
                    "cpus": os.cpu_count(), "python": platform.python_version()},
        "quick": args.quick,
        "scale": scale,
        "quality": quality,
        "skew": skew,
        "targets": [{"name": n, "value": v, "pass": ok} for n, v, ok, _ in targets],
        "elapsed_s": elapsed,
    }
    if args.json:
        print(json.dumps(doc, indent=2))
    return doc


if __name__ == "__main__":
    main()
