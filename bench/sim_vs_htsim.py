"""Validate the flow-level simulator against htsim, a packet-level simulator, and compare their speed.

Run from the repository root with an htsim binary built outside the repository (Broadcom/csg-htsim,
BSD-2; ``cd sim && make && cd datacenter && make htsim_ndp``)::

    python bench/sim_vs_htsim.py --htsim /path/to/htsim_ndp            # full comparison (minutes)
    python bench/sim_vs_htsim.py --htsim /path/to/htsim_ndp --quick    # two small cases
    python bench/sim_vs_htsim.py --quick                               # no binary: says so, exits 0
    python bench/sim_vs_htsim.py --htsim PATH --cases ft:1024 --patterns permutation   # the speed case only

Both simulators get the same network: the cost model's FT or FT-OS wiring for N hosts
(:func:`fabric.cost.build_design_graph`), written out as an htsim ``.topo`` file -- leaves of 32
hosts with 32 uplinks (FT) or 48 with 16 (FT-OS, 3:1), spines joined to every leaf by equal bundles,
1 us per link, 0.8 us per switch, 200 Gb/s, 9000-byte packets. Host ``i`` of htsim is GPU ``i`` here,
with same-server traffic forced through the NICs (htsim hosts have one NIC each). Host counts are
those where the two wirings are identical (FT: 128, 256, 1024; FT-OS: 192, 384, 768; a 3:1 leaf of
a 64-port switch holds 48 hosts, so 128/256/1024 hosts would leave a partial leaf htsim cannot build).

htsim runs NDP with per-packet spraying over all paths (``-strat perm``), the packet-level behaviour
closest to fluid ECMP with fair sharing, at the best settings we found: queues of 200 packets
(1.8 MB per port; with 50, trimming under a 3:1 core costs FT-OS permutations another 3-5%) and an
initial window of 60 packets (above the ~33-packet bandwidth-delay product: NDP's default of 15
halves every flow's rate; 10, 30 and 120 were no better). EQDS, tried on FT-OS, was 3-6% further
from the fluid model than NDP.
For every case the table gives the makespan error of the fluid model against htsim, the median
per-flow completion-time error, and the wall time of both; the summary gives the mean |makespan error|
(target 10%) and, for the 1,024-host FT permutation, the speed ratio in wall and in CPU time (target
1,000x; ours includes building the fabric and routing from scratch).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from orchestrl.sim.network.build import build_fabric  # noqa: E402  (path set up above)
from orchestrl.sim.network.config import SimConfig  # noqa: E402
from orchestrl.sim.network.events import FlowSet, simulate  # noqa: E402
from orchestrl.sim.network.htsim import HTSIM_SETTINGS, run_htsim  # noqa: E402  (writes the case, runs, parses)

LINK_GBPS = 200
MTU = 9000
HTSIM_ARGS = [f"-{k}={v}" for k, v in HTSIM_SETTINGS.items()]  # for the JSON record
TARGET_MAKESPAN_ERR = 0.10
TARGET_SPEEDUP = 1000.0


def derangement(hosts: int, rng: np.random.Generator) -> np.ndarray:
    """A random permutation with no fixed point (a host never sends to itself), as htsim's generator swaps."""
    perm = rng.permutation(hosts)
    for i in np.flatnonzero(perm == np.arange(hosts)):
        j = (i + 1) % hosts
        perm[i], perm[j] = perm[j], perm[i]
    assert np.all(perm != np.arange(hosts)) and len(set(perm.tolist())) == hosts
    return perm


def patterns(hosts: int, per_leaf: int, quick: bool, rng: np.random.Generator,
             a2a_max_hosts: int = 192, stride_max_hosts: int = 512) -> list[tuple[str, FlowSet]]:
    """The four workload families (plus short flows), sized so htsim finishes in seconds to minutes.

    htsim's cost grows with the packets it moves: the all-to-all (1 MB between all pairs of 64) and the
    leaf-stride ring (every flow crosses the core) run only up to ``a2a_max_hosts`` / ``stride_max_hosts``
    hosts, which keeps the whole comparison near 15 minutes of htsim CPU on one core.
    """
    big = 8e6 if quick else 32e6
    out = []
    perm = derangement(hosts, rng)
    src = np.arange(hosts)
    out.append(("permutation", FlowSet(src, perm, big, 0.0)))
    if quick:
        return out
    out.append(("permutation-256KB", FlowSet(src, perm, 256e3, 0.0)))
    if hosts <= a2a_max_hosts:  # htsim needs minutes per 10^4 flows of 1 MB here
        g = min(hosts, 64)
        grp = np.arange(hosts).reshape(-1, g)
        i, j = np.nonzero(~np.eye(g, dtype=bool))
        out.append((f"all-to-all/{g}", FlowSet(grp[:, i].ravel(), grp[:, j].ravel(), 1e6, 0.0)))
    receivers = rng.choice(hosts, 4, replace=False)
    inc_src, inc_dst = [], []
    for r in receivers:
        senders = rng.choice(np.setdiff1d(np.arange(hosts), receivers), 31, replace=False)
        inc_src += senders.tolist()
        inc_dst += [int(r)] * 31
    out.append(("incast 4x31:1", FlowSet(inc_src, inc_dst, 2e6, 0.0)))
    out.append(("ring", FlowSet(src, (src + 1) % hosts, big, 0.0)))
    if hosts <= stride_max_hosts:
        out.append(("ring stride leaf", FlowSet(src, (src + per_leaf) % hosts, big, 0.0)))
    return out


def ours(name: str, hosts: int, flows: FlowSet) -> tuple[np.ndarray, float, float]:
    """Build the fabric and run the flows from scratch; return finish times, wall and CPU time."""
    t0, c0 = time.perf_counter(), time.process_time()
    fab = build_fabric(name, hosts, SimConfig(intra_server="network", mtu_bytes=MTU))
    res = simulate(flows, fab.state())
    return res.finish_s, time.perf_counter() - t0, time.process_time() - c0


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--htsim", metavar="PATH", help="htsim_ndp binary (built outside the repository)")
    ap.add_argument("--quick", action="store_true", help="two small cases")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--a2a-max-hosts", type=int, default=192, metavar="N",
                    help="run the all-to-all only up to N hosts (htsim: ~1 min at 128 hosts, ~6 min at 1,024)")
    ap.add_argument("--stride-max-hosts", type=int, default=512, metavar="N",
                    help="run the leaf-stride ring only up to N hosts (htsim: ~4 min at 1,024)")
    ap.add_argument("--patterns", metavar="P,...", help="only these patterns, e.g. permutation (the speed case)")
    ap.add_argument("--cases", metavar="F:N,...",
                    help="only these fabric:hosts topologies, e.g. ft:1024,ft-os:192 (each has its own seed, "
                         "so a subset reproduces the same flows as the full run)")
    args = ap.parse_args(argv)
    binary = args.htsim
    if not binary or not (os.path.isfile(binary) and os.access(binary, os.X_OK)):
        why = "no --htsim given" if not binary else f"{binary} is not an executable file"
        print(f"htsim comparison skipped: {why}. Build htsim outside the repository "
              "(github.com/Broadcom/csg-htsim: cd sim && make && cd datacenter && make htsim_ndp) and pass "
              "--htsim path/to/htsim_ndp.")
        if args.json:
            print(json.dumps({"skipped": why}))
        return 0
    topologies = [("ft", 128), ("ft-os", 192)] if args.quick else [("ft", 128), ("ft", 256), ("ft", 1024),
                                                                   ("ft-os", 192), ("ft-os", 384), ("ft-os", 768)]
    if args.cases:
        try:
            want = [(c.split(":")[0], int(c.split(":")[1])) for c in args.cases.split(",")]
        except (IndexError, ValueError):
            ap.error(f"--cases {args.cases!r}: expected fabric:hosts[,fabric:hosts...], e.g. ft:1024,ft-os:192")
        if any(f not in ("ft", "ft-os") for f, _ in want):
            ap.error("--cases: htsim builds only fat trees here (ft, ft-os)")
        topologies = want
    rows = []
    workdir = tempfile.mkdtemp(prefix="htsim-cmp-")
    try:
        print(f"{'fabric':<7}{'hosts':>6} {'pattern':<19}{'flows':>7}{'htsim ms':>10}{'fluid ms':>10}{'makespan err':>13}"
              f"{'med |FCT err|':>14}{'med FCT err':>12}{'htsim s':>9}{'ours s':>8}{'speedup':>9}", flush=True)
        for name, hosts in topologies:
            rng = np.random.default_rng([2026, hosts, ("ft", "ft-os").index(name)])
            fab = build_fabric(name, hosts, SimConfig(intra_server="network", mtu_bytes=MTU))
            per_leaf = int(np.bincount(fab.leaf_of_gpu).max())
            cases = patterns(hosts, per_leaf, args.quick, rng, args.a2a_max_hosts, args.stride_max_hosts)
            for label, flows in cases:
                if args.patterns and label not in args.patterns.split(","):
                    continue
                fluid, our_s, our_cpu = ours(name, hosts, flows)
                end_us = max(1000.0, float(np.nanmax(fluid)) * 1e6 * 4)
                run = run_htsim(binary, fab, flows, LINK_GBPS, workdir, end_us=end_us)
                ht, ht_s, ht_cpu = run.finish_s, run.wall_s, run.cpu_s
                done = np.isfinite(ht)
                mk_ht, mk_ours = float(np.nanmax(ht)), float(np.max(fluid))
                err = (fluid[done] - ht[done]) / ht[done]
                row = {"fabric": name, "hosts": hosts, "pattern": label, "flows": len(flows),
                       "htsim_finished": int(done.sum()), "htsim_makespan_s": mk_ht, "fluid_makespan_s": mk_ours,
                       "makespan_err": mk_ours / mk_ht - 1, "median_abs_fct_err": float(np.median(np.abs(err))),
                       "median_fct_err": float(np.median(err)), "htsim_wall_s": ht_s, "ours_wall_s": our_s,
                       "speedup": ht_s / our_s, "htsim_cpu_s": ht_cpu, "ours_cpu_s": our_cpu,
                       "speedup_cpu": ht_cpu / max(our_cpu, 1e-6)}
                rows.append(row)
                print(f"{name:<7}{hosts:>6} {label:<19}{len(flows):>7}{mk_ht * 1e3:>10.3f}{mk_ours * 1e3:>10.3f}"
                      f"{row['makespan_err']:>+13.1%}{row['median_abs_fct_err']:>14.1%}{row['median_fct_err']:>+12.1%}"
                      f"{ht_s:>9.2f}{our_s:>8.3f}{row['speedup']:>9.0f}"
                      + ("" if done.all() else f"  ({len(flows) - int(done.sum())} htsim flows unfinished)"), flush=True)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    if not rows:
        print("no case matched --cases / --patterns")
        return 2
    mean_abs = statistics.mean(abs(r["makespan_err"]) for r in rows)
    long = [r for r in rows if "256KB" not in r["pattern"]] or rows
    print(f"\nmean |makespan error| over {len(rows)} cases: {mean_abs:.1%} (target within {TARGET_MAKESPAN_ERR:.0%}; "
          f"ratio {mean_abs / TARGET_MAKESPAN_ERR:.2f}); without the short-flow case: "
          f"{statistics.mean(abs(r['makespan_err']) for r in long):.1%}")
    # the speed target is on the largest FT permutation (1,024 hosts in the full run): same flows, same wiring
    speed = max((r for r in rows if r["fabric"] == "ft" and r["pattern"] == "permutation"), key=lambda r: r["hosts"],
                default=rows[0])
    print(f"speed on the {speed['hosts']}-host {speed['fabric'].upper()} {speed['pattern']}: "
          f"htsim {speed['htsim_wall_s']:.1f} s, ours "
          f"{speed['ours_wall_s'] * 1e3:.0f} ms (fabric build + routing + event loop): {speed['speedup']:.0f}x faster "
          f"(target >= {TARGET_SPEEDUP:.0f}x; ratio {speed['speedup'] / TARGET_SPEEDUP:.2f}); CPU time: htsim "
          f"{speed['htsim_cpu_s']:.1f} s, ours {speed['ours_cpu_s'] * 1e3:.0f} ms, {speed['speedup_cpu']:.0f}x")
    print(f"htsim over all cases: {sum(r['htsim_wall_s'] for r in rows) / 60:.1f} min wall, "
          f"{sum(r['htsim_cpu_s'] for r in rows) / 60:.1f} min CPU; "
          f"load average at the end: {os.getloadavg()[0]:.2f}")
    if args.json:
        print(json.dumps({"machine": f"{platform.machine()} {os.cpu_count()} cores", "htsim_args": HTSIM_ARGS,
                          "rows": rows, "mean_abs_makespan_err": mean_abs, "speedup_ft_permutation": speed["speedup"],
                          "speed_case": {k: speed[k] for k in ("fabric", "hosts", "pattern")}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
