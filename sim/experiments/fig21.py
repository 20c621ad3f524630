"""OrchestrRL Appendix H, Figure 21: one and two NIC-EPS or OCS-layer link failures, per RL stage.

The paper reports *stage* time (compute included) of Qwen2-57B-MoE, normalised to no failure:
NIC-EPS failures slow Train by 5.0% / 11.1%, Weight Sync by 6.6% / 13.5%, Gen by 1.2% / 3.8%; OCS-layer
failures Train by 1.1% / 2.1%, Weight Sync by 0.5% / 0.9%, Gen by 0.0% / 0.2%. This module measures
the network half: each stage's *communication* time on RFabric, normalised to no failure. Compute
and its overlap with communication come with the stage models of the next issue, so our numbers
are the slowdown of the stage's exposed communication, not of the stage.

Setup (Appendix C layouts on the cost model's 512-GPU RFabric: two PoDs of 32 servers, rail ToRs):
Train on PoD 0 with TP4 x EP16 x DP64 -- an EP all-to-all (fwd/bwd period) and a DP all-reduce
(gradient sync period), each planned by the controller for its own intent; Gen on PoD 1 in AFD
mode, six instances of 3x8 attention and 2x8 FFN GPUs exchanging M2N traffic; Weight Sync from the
256 train GPUs to the 256 gen GPUs (the shard-scatter of :mod:`fabric.traffic`).

* NIC-EPS failure: the NIC link of the GPU that receives the most network bytes in the stage (and,
  for two failures, of the next such GPU on another server) is down; its traffic crosses NVLink to
  the next NIC of its server (§5.4 (iii)); the controller re-plans for the relayed demand.
* OCS-layer failure: a port of a circuit carrying the stage's traffic fails; the circuit goes dark
  and the controller masks the port and re-allocates under the remaining budget (§5.4 (ii)). Both
  the time before the re-plan (ECMP around the dark circuit) and after it are reported.

Run ``python -m orchestrl.sim.experiments.fig21 [--quick] [--json]``.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Callable

import numpy as np

from orchestrl.fabric.controller import FabricController
from orchestrl.fabric.intent import Collective, Intent
from orchestrl.fabric.layout import ParallelLayout, parallel_groups
from orchestrl.fabric.traffic import aggregate_pair_arrays, intent_pair_arrays
from orchestrl.sim.experiments.common import Row, figure_document, format_rows
from orchestrl.sim.network.build import build_fabric
from orchestrl.sim.network.events import FlowSet, simulate
from orchestrl.sim.network.fabrics import Failures

__all__ = ["PAPER", "stage_intents", "run"]

#: Figure 21 (Appendix H text): normalised stage time with 1 and 2 failures.
PAPER = {
    ("nic-eps", 1, "train"): 1.050, ("nic-eps", 2, "train"): 1.111,
    ("nic-eps", 1, "weight-sync"): 1.066, ("nic-eps", 2, "weight-sync"): 1.135,
    ("nic-eps", 1, "gen"): 1.012, ("nic-eps", 2, "gen"): 1.038,
    ("ocs", 1, "train"): 1.011, ("ocs", 2, "train"): 1.021,
    ("ocs", 1, "weight-sync"): 1.005, ("ocs", 2, "weight-sync"): 1.009,
    ("ocs", 1, "gen"): 1.000, ("ocs", 2, "gen"): 1.002,
}
MODEL_BYTES = 57.41e9 * 2  # Qwen2-57B-A14B in bf16 (Table 3)


def stage_intents(gpus_per_pod: int = 256, scale: float = 1.0) -> dict[str, list[Intent]]:
    """Return the communication periods of each stage as intents (Train has two periods)."""
    train = list(range(gpus_per_pod))
    layout = ParallelLayout(tp=4, ep=16, dp=gpus_per_pod // 4)
    groups = parallel_groups(layout, train)
    fwd = Intent("train", "moe57b", "fwd-bwd", (Collective("all-to-all", groups=tuple(map(tuple, groups["ep"])),
                                                           bytes_per_rank=256e6 * scale),))
    grad = Intent("train-dp", "moe57b", "grad-sync", (Collective("all-reduce", groups=tuple(map(tuple, groups["dp"])),
                                                                 bytes_per_rank=1e9 * scale),))
    base = gpus_per_pod
    src, dst = [], []
    for k in range((gpus_per_pod // 40)):  # AFD instances: 24 attention + 16 FFN GPUs each (§7.3.2)
        first = base + 40 * k
        src += list(range(first, first + 24))
        dst += list(range(first + 24, first + 40))
    gen = Intent("gen", "moe57b", "afd", (Collective("m2n", src_gpus=tuple(src), dst_gpus=tuple(dst),
                                                     bytes_per_rank=64e6 * scale),))
    ws = Intent("weight-sync", "moe57b", "sync", (Collective("weight-sync", src_gpus=tuple(train),
                                                            dst_gpus=tuple(range(base, 2 * base)),
                                                            bytes_per_rank=MODEL_BYTES / 8 * scale),))
    return {"train": [fwd, grad], "gen": [gen], "weight-sync": [ws]}


def _period_time(fab, intent: Intent, failures: Failures, masked_ports=(), replan: bool = True,
                 base_plan=None) -> tuple[float, object]:
    """Time one period: plan with the controller (under masks, for relayed demand), run its flows."""
    topo = fab.topology
    src, dst, vol = intent_pair_arrays(intent, topo)
    relay = fab.relay(failures)
    ctl = FabricController(topo)
    if masked_ports:
        ctl.mask_ports([(p.device, p.port, "failed") for p in masked_ports])
    if replan or base_plan is None:
        demand = aggregate_pair_arrays(relay[src], relay[dst], vol, ctl.topology)
        plan = ctl.materialize(intent, demand).plan
    else:
        plan = base_plan
    res = simulate(FlowSet(src, dst, vol, 0.0), fab.with_circuits(plan, failures))
    return res.makespan_s, plan


def _busiest_receivers(periods, fab, count: int = 2) -> list[int]:
    """GPUs (on distinct servers) that receive the most bytes over their NIC in the stage: where a NIC
    failure hurts the stage most, and where Appendix H's "oversubscribing the remaining NICs" bites."""
    got = np.zeros(fab.gpus)
    for intent in periods:
        src, dst, vol = intent_pair_arrays(intent, fab.topology)
        net = src // 8 != dst // 8
        got += np.bincount(dst[net], weights=vol[net], minlength=fab.gpus)
    out: list[int] = []
    for g in np.argsort(-got, kind="stable").tolist():
        if all(g // 8 != h // 8 for h in out):
            out.append(int(g))
        if len(out) == count:
            break
    return out


def _victims(plan, stage: str, k: int):
    """Ports of ``k`` circuits that carry the stage's traffic (core circuits for weight sync)."""
    tier = "core" if stage == "weight-sync" else "agg"
    circuits = [c for c in plan.circuits if c.tier == tier and "/up:" not in c.a + c.b] or list(plan.circuits)
    return [c.xc.ports()[0] for c in circuits[:k]]


def run(quick: bool = False, progress: Callable[[str], None] | None = None) -> list[Row]:
    """Return one row per (failure kind, count, stage): paper's and our normalised time.

    ``progress``, if given, is called with the name of each stage as it starts.
    """
    fab = build_fabric("rfabric", 512)
    intents = stage_intents(scale=0.05 if quick else 1.0)
    rows = []
    for stage, periods in intents.items():
        if progress:
            progress(f"fig21 {stage}")
        base, plans = 0.0, []
        for intent in periods:
            t, plan = _period_time(fab, intent, Failures())
            base += t
            plans.append(plan)
        victims = _busiest_receivers(periods, fab)
        for k in (1, 2):
            nics = frozenset(victims[:k])
            t = sum(_period_time(fab, i, Failures(nics=nics))[0] for i in periods)
            rows.append(Row(f"nic-eps x{k} / {stage}", PAPER[("nic-eps", k, stage)], t / base,
                            {"baseline_s": base, "failed_gpus": sorted(nics)}))
            dark_t = replan_t = 0.0
            for intent, plan in zip(periods, plans):
                ports = _victims(plan, stage, k)
                dark = Failures(ports=frozenset(ports))
                dark_t += _period_time(fab, intent, dark, replan=False, base_plan=plan)[0]
                replan_t += _period_time(fab, intent, dark, masked_ports=ports)[0]
            rows.append(Row(f"ocs x{k} / {stage}", PAPER[("ocs", k, stage)], replan_t / base,
                            {"baseline_s": base, "before_replan": dark_t / base}))
    return rows


NOTES = ("paper: stage time (compute included); ours: the stage's communication time, normalised to no failure",
         "ocs rows: after the controller re-plans under the masked port; 'before_replan' in --json is ECMP around "
         "the dark circuit")


def main(argv=None, progress: Callable[[str], None] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="5%% of the bytes")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    rows = run(args.quick, progress)
    if args.json:
        print(json.dumps(figure_document("fig21", rows, NOTES)))
    else:
        print(format_rows("Figure 21: normalised time with NIC-EPS / OCS-layer link failures (RFabric, 512 GPUs)",
                          rows, "x no-failure", NOTES))
    return 0


if __name__ == "__main__":
    sys.exit(main())
