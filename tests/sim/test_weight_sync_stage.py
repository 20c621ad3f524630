"""The weight-sync stage: the planner's schedule as flows, through the real controller on RFabric."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrl.compute_sched.hardware import load_model
from orchestrl.fabric.errors import ConfigError
from orchestrl.fabric.fabric_spec import spec_from_mapping
from orchestrl.fabric.layout import ParallelLayout
from orchestrl.fabric.topology import Topology, load_topology
from orchestrl.sim.model_params import model_params, params_bytes
from orchestrl.sim.network.config import FABRICS
from orchestrl.sim.network.netsim import NetworkSim
from orchestrl.sim.network.reconfig import RFabricDriver
from orchestrl.sim.stages.weight_sync import WeightSyncStage, clear_plan_cache, plan_schedule

REPO = Path(__file__).resolve().parents[2]
TOPO64 = load_topology(REPO / "examples" / "topology-64gpu-h800.yaml")
M14 = load_model("Qwen2.5-14B")
B = 200e9


def _net(fabric: str, gpus: int = 64, topology: Topology | None = None) -> NetworkSim:
    if fabric == "rfabric":
        return NetworkSim("rfabric", gpus=gpus, topology=topology or (TOPO64 if gpus == 64 else None), circuits="fixed")
    return NetworkSim(fabric, gpus=gpus)


def _stage(net: NetworkSim, method: str = "planned", replay: str = "auto", train: int = 32, tp: int = 8,
           driver: RFabricDriver | None = None, model=M14) -> WeightSyncStage:
    g = net.fabric.gpus
    return WeightSyncStage(model, ParallelLayout(tp=tp, dp=train // tp), range(train), 8, range(train, g), net,
                           driver, method=method, replay=replay)


def test_the_parameter_list_holds_the_table_3_model():
    for name in ("Qwen2.5-14B", "Qwen2.5-72B", "Qwen2-57B-A14B", "Qwen3-235B-A22B"):
        m = load_model(name)
        assert params_bytes(model_params(m)) == pytest.approx(2 * m.params_total, rel=0.01)
    staged = model_params(load_model("Qwen2.5-72B"), pp=2)
    assert {p.pp_stage for p in staged} == {0, 1} and staged[0].pp_stage == 0 and staged[-1].pp_stage == 1


@pytest.mark.parametrize("fabric", FABRICS)
def test_the_planned_sync_is_never_slower_than_flat(fabric):
    net = _net(fabric)
    planned, flat = _stage(net).run(0.0), _stage(_net(fabric), "flat").run(0.0)
    assert 0 < planned.time_s <= flat.time_s
    # flat sends one full copy per generator out of trainer 0: at least 32 x 29.5 GB / its NICs' rate
    assert flat.time_s >= 32 * flat.detail["model_bytes"] * 8 / (8 * B)


def _boundary(ports: int) -> Topology:
    """The 64-GPU testbed as two PoDs whose Agg layers reach OCS-Core through ``ports`` fibres each."""
    return Topology(spec_from_mapping({"name": f"boundary-{ports}", "link_gbps": 200, "server": {"gpus": 8},
                                       "pods": {"count": 2, "servers": 4}, "tor": {"servers_per_tor": 4, "uplinks": 4},
                                       "ocs_agg": {"technology": "mems-3d", "boundary_ports": ports},
                                       "ocs_core": {"technology": "mems-3d", "devices": 1}}))


def test_on_a_narrow_cross_pod_fabric_the_planner_wins_by_the_copies_it_saves():
    narrow, wide = _boundary(8), _boundary(16)
    planned = _stage(_net("rfabric", topology=narrow)).run(0.0)
    flat = _stage(_net("rfabric", topology=narrow), "flat").run(0.0)
    assert planned.detail["decision"] == "commit" and flat.detail["decision"] == "commit"
    # every byte of the model crosses the 8 boundary circuits at least once: no schedule beats that
    model_bits = planned.detail["model_bytes"] * 8
    assert model_bits / (8 * B) <= planned.time_s < flat.time_s / 10
    # the planner's waves respect the boundary budget: a wider boundary syncs faster
    assert _stage(_net("rfabric", topology=wide)).run(0.0).time_s < planned.time_s


def test_a_boundary_with_fewer_fibres_than_tors_still_syncs_through_a_lifted_tor():
    # 4 fibres per PoD, 8 rail ToRs per PoD: only 4 source ToRs can be lifted to OCS-Core; the others
    # reach one of them over an OCS-Agg circuit (their sync used to have no path and never finish)
    starved = _boundary(4)
    assert len(starved.tors_by_pod[0]) == 8
    r = _stage(_net("rfabric", topology=starved)).run(0.0)
    assert r.detail["decision"] == "commit"
    model_bits = r.detail["model_bytes"] * 8
    assert model_bits / (4 * B) <= r.time_s < float("inf")
    assert _stage(_net("rfabric", topology=_boundary(8))).run(0.0).time_s < r.time_s


@pytest.mark.parametrize("fabric", ["ft", "ft-os", "topoopt", "mixnet", "rfabric"])
def test_the_pipeline_replay_agrees_with_the_edge_by_edge_replay(fabric):
    edges = _stage(_net(fabric, 128), replay="edges", train=64).run(0.0)
    pipe = _stage(_net(fabric, 128), replay="pipeline", train=64).run(0.0)
    assert edges.detail["replay"] == "edges" and pipe.detail["replay"] == "pipeline"
    assert pipe.time_s == pytest.approx(edges.time_s, rel=0.05)


def test_the_oversubscribed_fat_tree_is_slower_when_trees_cross_leaves():
    ft = _stage(_net("ft", 256), train=128).run(0.0)
    os3 = _stage(_net("ft-os", 256), train=128).run(0.0)
    assert ft.time_s == pytest.approx(ft.detail["predicted_s"], rel=0.05)  # non-blocking: the planner's estimate
    assert os3.time_s > 1.5 * ft.time_s  # 16 uplinks for 48 NICs per leaf


def test_flat_replays_gather_then_fetch():
    st = _stage(_net("ft"), "flat")
    r = st.run(0.0)
    s = st.schedule
    fetch_bits = sum(e.phase == "fetch" for e in s.edges) * r.detail["model_bytes"] * 8
    assert r.breakdown_s["fetch"] == pytest.approx(fetch_bits / B, rel=0.01)  # all copies out of one NIC
    assert r.breakdown_s["gather"] > 0 and r.time_s == pytest.approx(r.breakdown_s["gather"] + r.breakdown_s["fetch"])


def test_plans_are_made_once_per_layout_and_timings_once_per_fabric_state():
    clear_plan_cache()
    net = _net("ft")
    first = _stage(net).run(0.0)
    assert first.detail["plan_s"] > 0 and not first.detail["timing_cached"]
    again = _stage(net)  # a new stage, same model and layouts: the process-wide plan cache answers
    r1, r2 = again.run(0.0), again.run(5.0)
    assert r1.detail["plan_s"] == 0 and r2.detail["timing_cached"] and r2.time_s == first.time_s
    other = _stage(net, tp=4)  # another trainer layout is another plan
    assert other.run(0.0).detail["plan_s"] > 0
    s1, _, hit1 = plan_schedule(model_params(M14), again.trainer, again.generator, again.links)
    assert hit1 and s1 is again.schedule


def test_rfabric_commits_the_weight_sync_plan_through_the_gate_and_pays_the_switching():
    net = _net("rfabric")
    drv = RFabricDriver(net.fabric)  # the testbed file's 3D-MEMS OCS: 10 ms (Table 2)
    st = _stage(net, driver=drv)
    r = st.run(10.0)
    assert r.detail["decision"] == "commit" and r.reconfigurations == 1 and r.intents == 1
    ws = [d for d in drv.decisions if d.stage == "weight-sync"]
    assert [d.action for d in ws] == ["defer", "commit"]  # waits for weight-sync-begin, then commits
    assert "weight" in drv.active.template and any(c.tier == "core" for c in drv.active.circuits)
    assert r.breakdown_s["reconfiguration"] == pytest.approx(0.010 + 0.001)  # switch + the gate's guard
    slow = WeightSyncStage(M14, ParallelLayout(tp=8, dp=4), range(32), 8, range(32, 64), _net("rfabric"),
                           RFabricDriver(net.fabric, switch_delay_s=120.0))  # a robotic patch panel's delay
    rs = slow.run(0.0)
    assert rs.breakdown_s["reconfiguration"] == pytest.approx(132.0)  # 120 s + the 10% guard
    assert rs.time_s - 132.0 == pytest.approx(r.time_s - 0.011, rel=1e-6)  # the transfer itself is the same
    # the next sync finds its own circuits still in force: nothing to switch
    again = st.run(20.0)
    assert again.detail["decision"] == "unchanged" and again.breakdown_s["reconfiguration"] == 0.0
    assert again.time_s == pytest.approx(r.time_s - 0.011, rel=1e-6)


def test_bad_inputs_are_refused_with_the_field():
    net = _net("ft")
    with pytest.raises(ConfigError, match="method"):
        _stage(net, method="broadcast")
    with pytest.raises(ConfigError, match="gen_gpus"):
        WeightSyncStage(M14, ParallelLayout(tp=8, dp=4), range(32), 8, range(24, 56), net)
    with pytest.raises(ConfigError, match="gen_tp"):
        WeightSyncStage(M14, ParallelLayout(tp=8, dp=4), range(32), 3, range(32, 64), net)


def test_a_pipeline_replay_is_reused_whatever_states_came_before_the_broadcast(monkeypatch):
    # The pipeline replay times the broadcast on the state it starts on (every circuit up), so two
    # syncs that end on the same state take the same time even when the states before it differ (on
    # RFabric they are whatever the generation stage left): the second is a cache hit, not a replay.
    from types import SimpleNamespace

    from orchestrl.sim.network.fabrics import Failures

    net = _net("ft")
    stage = _stage(net, replay="pipeline")
    up, other = net.fabric.state(), net.fabric.state(Failures(nics=frozenset({40})))
    assert up.signature != other.signature
    sched = stage.schedule
    assert stage._replay(sched, [(0.0, other), (0.01, up)], 0.02).time_s == stage._replay(sched, [(0.0, up)], 0.02).time_s
    timelines = iter([[(0.0, other), (0.01, up)], [(0.0, up), (0.01, up)]])
    decision = SimpleNamespace(action="commit", reason="test", change=None)
    monkeypatch.setattr(stage, "rfabric", True)
    monkeypatch.setattr(stage, "driver", SimpleNamespace(observe=lambda *a, **k: []))
    monkeypatch.setattr(stage, "_through_controller", lambda s, now: (decision, 0.02, next(timelines)))
    first, second = stage.run(0.0), stage.run(10.0)
    assert not first.detail["timing_cached"] and second.detail["timing_cached"]
    assert second.time_s == first.time_s
