"""RollArt in RLSim: the systems' ordering on one cluster, and the figure's what-if rows."""

from __future__ import annotations

from dataclasses import replace

from orchestrl.sim.agentic.cluster import Cluster, Pool, run_system
from orchestrl.sim.experiments import rollart_fig10


def _steps(c: Cluster) -> dict[str, float]:
    return {s: run_system(c, s, iterations=3, bound=1)["step_s"] for s in ("verl+", "streamrl", "rollart")}


def test_rollart_steps_faster_than_both_baselines_and_streamrl_gains_more_when_training_is_longer():
    c = Cluster(pools=(Pool("h800", "H800", 8),), batch_groups=4, group_size=4, train_gpus=4)
    short = _steps(c)
    assert short["rollart"] < short["streamrl"] <= short["verl+"]
    long = _steps(replace(c, train_gpus=1))  # training ~4x longer: more of it for StreamRL to hide
    assert long["verl+"] / long["streamrl"] > short["verl+"] / short["streamrl"]
    assert long["verl+"] > short["verl+"]


def test_the_what_if_rows_divide_the_what_if_runs_not_the_figures_own():
    cases = rollart_fig10.cases(quick=True)
    assert sum(c.extra["train_share"] == "x4" for c in cases) == 3
    x4 = next(c for c in cases if c.extra["train_share"] == "x4")
    plain = next(c for c in cases if c.extra["train_share"] == "as run" and c.extra["gpus"] == 64)
    assert x4.cluster.train_gpus == max(1, plain.cluster.train_gpus // 4)
    step = {("verl+", "as run"): 100.0, ("streamrl", "as run"): 90.0, ("rollart", "as run"): 50.0,
            ("verl+", "x4"): 130.0, ("streamrl", "x4"): 100.0, ("rollart", "x4"): 65.0}
    results = [{"system": c.system, "bound": c.bound, "step_s": step.get((c.system, c.extra["train_share"]), 60.0),
                "throughput_tps": 1.0, **c.extra} for c in cases]
    rows = {r.label: r.ours for r in rollart_fig10.rows_of(results)}
    assert rows["step: veRL+ / StreamRL"] == 100.0 / 90.0
    assert rows["what-if, training x4: veRL+ / StreamRL step"] == 130.0 / 100.0
    assert rows["what-if, training x4: veRL+ / RollArt b1 step"] == 2.0
