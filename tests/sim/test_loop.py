"""RL iterations: the synchronous and one-step asynchronous schedules, throughput, and per dollar.

The training and generation stages here are the TEST FIXTURES of ``tests/sim/stage_fixtures.py``;
the weight-sync stage, the fabric, the controller and the cost model are the real ones.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrl.fabric.cost import network_cost
from orchestrl.fabric.topology import load_topology
from orchestrl.sim.config import config_from_mapping
from orchestrl.sim.loop import throughput
from orchestrl.sim.pricing import GPU_USD_PER_HOUR, HOURS_PER_YEAR
from orchestrl.sim.run import balanced_split, build, simulate
from tests.sim.stage_fixtures import fixture_stages

REPO = Path(__file__).resolve().parents[2]
TOPO64 = str(REPO / "examples" / "topology-64gpu-h800.yaml")


def _cfg(kind: str = "ft", mode: str = "async", iterations: int = 3, train_gpus: int | None = 32, **extra):
    doc = {"name": "t", "model": "Qwen2.5-14B", "cluster": {"gpus": 64, "train_gpus": train_gpus},
           "fabric": {"kind": kind, **({"topology": TOPO64} if kind == "rfabric" else {})},
           "train": {"tp": 8, "pp": 2}, "workload": {"prompts_per_step": 16, "max_tokens": 8192},
           "generation": {"policy": "verl-to"},
           "loop": {"mode": mode, "iterations": iterations, "seed": 3}}
    for section, values in extra.items():
        doc.setdefault(section, {}).update(values)
    return config_from_mapping(doc, "test.yaml")


def _run(cfg):
    return simulate(cfg, stages_factory=fixture_stages)


@pytest.mark.parametrize("fabric", ["ft", "rfabric"])
def test_one_step_async_overlaps_gen_with_train_and_is_never_slower(fabric):
    sync, asyn = _run(_cfg(fabric, "sync")), _run(_cfg(fabric, "async"))
    assert asyn.throughput.samples_per_s >= sync.throughput.samples_per_s
    g, t = asyn.stage_means_s()["gen"], asyn.stage_means_s()["train"]
    # the steady period drops from gen + train + sync to max(gen, train) + sync: min(gen, train) saved
    saved = sync.throughput.window_s - asyn.throughput.window_s
    assert saved == pytest.approx(2 * min(g, t), rel=0.05)  # two steady iterations
    assert asyn.throughput.tokens_per_s > sync.throughput.tokens_per_s


def test_the_schedule_follows_the_rl_dependencies():
    asyn = _run(_cfg("ft", "async", iterations=4)).iterations
    for k, it in enumerate(asyn):
        assert it.train_start_s >= it.gen_end_s  # Train(k) trains on Gen(k)'s samples
        if k:
            prev = asyn[k - 1]
            assert it.gen_start_s == pytest.approx(prev.train_start_s)  # Gen(k) runs beside Train(k-1)
            assert it.train_start_s >= prev.sync_end_s  # the trainer is busy with the previous sync
            assert prev.sync_start_s >= max(prev.train_end_s, it.gen_end_s)  # generators load between steps
        if k >= 2:
            assert it.gen_start_s >= asyn[k - 2].sync_end_s  # Gen(k) uses the weights of Train(k-2)
    sync = _run(_cfg("ft", "sync", iterations=3)).iterations
    for prev, it in zip(sync, sync[1:]):
        assert it.gen_start_s == pytest.approx(prev.sync_end_s)
        assert it.train_start_s == pytest.approx(it.gen_end_s) and it.sync_start_s == pytest.approx(it.train_end_s)


def test_throughput_counts_the_trained_samples_and_tokens():
    res = _run(_cfg("ft", "sync", iterations=2))
    it = res.iterations[1]
    period = it.train_end_s - res.iterations[0].train_end_s
    assert res.throughput.window == "steady" and res.throughput.window_s == pytest.approx(period)
    assert res.throughput.samples_per_s == pytest.approx(16 * 8 / period)
    assert res.throughput.tokens_per_s == pytest.approx(it.work.tokens / period)
    one = _run(_cfg("ft", "sync", iterations=1))
    assert one.throughput.window == "run" and one.throughput.window_s == pytest.approx(one.makespan_s)


def test_per_dollar_uses_the_fabric_cost_and_the_gpu_price():
    wiring = {"ft": network_cost("fat-tree", 64, 200),
              "rfabric": network_cost("rfabric", 64, 200, rfabric_spec=load_topology(TOPO64).spec)}
    for fabric, row in wiring.items():
        res = _run(_cfg(fabric, iterations=2))
        assert res.cost.gpu_usd_per_hour == GPU_USD_PER_HOUR["H800"] == 5.28  # RollMux Table 1
        assert res.cost.network_usd == pytest.approx(row.network_usd)  # Table 4 prices of this fabric
        usd_h = 64 * 5.28 + row.network_usd / (3 * HOURS_PER_YEAR)
        assert res.samples_per_usd == pytest.approx(res.throughput.samples_per_s * 3600 / usd_h)
        assert res.tokens_per_usd == pytest.approx(res.throughput.tokens_per_s * 3600 / usd_h)
    # the same work at a cheaper price per hour buys proportionally more samples per dollar
    cheap = _run(_cfg("ft", iterations=2, cost={"gpu_usd_per_hour": 1.85}))
    dear = _run(_cfg("ft", iterations=2))
    assert cheap.throughput.samples_per_s == pytest.approx(dear.throughput.samples_per_s)
    assert cheap.samples_per_usd / dear.samples_per_usd == pytest.approx(dear.cost.usd_per_h / cheap.cost.usd_per_h)


def test_rfabric_weight_syncs_go_through_the_controller_and_slow_switches_cost_throughput():
    sim = build(_cfg("rfabric", iterations=3), stages_factory=fixture_stages)
    res = sim.run()
    commits = [d for d in sim.driver.decisions if d.stage == "weight-sync" and d.action in ("commit", "unchanged")]
    assert len(commits) == 3 and all(it.sync.intents == 1 for it in res.iterations)
    assert res.iterations[0].sync.reconfigurations == 1  # the first sync switches the OCS to its forest
    robotic = _run(_cfg("rfabric", iterations=3, fabric={"ocs": "robotic"}))  # Table 2: 120 s
    assert robotic.iterations[0].sync.time_s > 120.0
    assert robotic.throughput.samples_per_s < res.throughput.samples_per_s


def test_the_balanced_split_beats_lopsided_ones():
    heavy = {"prompts_per_step": 128}  # enough samples that training time matters
    cfg = _cfg("ft", train_gpus=None, iterations=2, workload=heavy)
    best, rows = balanced_split(cfg, fixture_stages, candidates=(16, 24, 32, 48))
    assert [r["train_gpus"] for r in rows] == [16, 32, 48]  # 24 does not tile TP8 x PP2: skipped
    runs = {n: _run(_cfg("ft", train_gpus=n, workload=heavy)).throughput.samples_per_s for n in (16, 32, 48)}
    assert runs[best] == max(runs.values())  # profiled on step 0, checked on 3 iterations with weight syncs
    res = simulate(cfg, stages_factory=fixture_stages)
    assert res.detail["train_gpus"] == best and len(res.detail["split_profile"]) == 3


def test_a_run_is_reproducible_from_its_seed():
    a, b = _run(_cfg("ft", iterations=2)), _run(_cfg("ft", iterations=2))
    assert a.to_json()["iterations"][1]["gen_end_s"] == b.to_json()["iterations"][1]["gen_end_s"]
    c = _run(_cfg("ft", iterations=2, loop={"seed": 4}))
    assert c.iterations[1].work != a.iterations[1].work


def test_throughput_needs_iterations():
    with pytest.raises(ValueError):
        throughput([])


def test_the_split_maximises_samples_per_period_when_the_step_grows_with_generation_gpus():
    """Steps sized per generation GPU: more generators make a longer step with more samples, so the
    shortest period is not the highest throughput; the split must pick what the full runs confirm."""
    scaled = {"prompts_per_step": None, "responses_per_gen_gpu": 16}  # the default; shortest period: 48
    cfg = _cfg("ft", train_gpus=None, iterations=2, workload=scaled)
    best, rows = balanced_split(cfg, fixture_stages, candidates=(16, 32, 48))
    assert len({r["samples"] for r in rows}) == 3  # the step really grows with the generation GPUs
    runs = {n: _run(_cfg("ft", train_gpus=n, workload=scaled)).throughput.samples_per_s for n in (16, 32, 48)}
    assert runs[best] == max(runs.values())
    assert best == max(rows, key=lambda r: r["samples_per_s"])["train_gpus"]


def test_the_loops_gc_policy_frees_frozen_cycles_periodically_and_unfreezes_on_any_exit():
    import gc
    import weakref

    from orchestrl.sim import loop

    class Node:
        pass

    was_frozen = gc.get_freeze_count()  # another test in this worker may have started a proxy (it freezes)
    gc.unfreeze()
    try:
        _check_gc_policy(loop, Node, gc, weakref)
    finally:
        if was_frozen:
            gc.freeze()


def _check_gc_policy(loop, Node, gc, weakref) -> None:
    with loop.long_lived_frozen() as settle:
        a = Node()
        a.self = a  # a garbage cycle once ``a`` is dropped: only the cyclic collector frees it
        gone = weakref.ref(a)
        gc.collect()  # make it old, as the run's long-lived objects are
        settle()
        assert gc.get_freeze_count() > 0
        with loop.long_lived_frozen() as inner:  # a nested run keeps the outer policy: its settle does nothing
            frozen = gc.get_freeze_count()
            inner()
            assert gc.get_freeze_count() == frozen
        del a
        for _ in range(loop._FULL_EVERY - 2):
            settle()
        assert gone() is not None  # frozen: young collections do not reach it
        settle()  # the periodic full collection
        assert gone() is None
    assert gc.get_freeze_count() == 0
    with pytest.raises(RuntimeError):
        with loop.long_lived_frozen() as settle:
            settle()
            raise RuntimeError("a stage failed")
    assert gc.get_freeze_count() == 0  # nothing stays frozen after a failed run
