"""The fabric's weight-sync demand comes from the planned schedule."""

from __future__ import annotations

import pytest

from orchestrl.collectives.emulation.model import synthetic_model
from orchestrl.collectives.fabric_demand import links_from_topology, schedule_demand, schedule_transfers, weight_sync_intent
from orchestrl.collectives.layout import GeneratorLayout, TrainerLayout
from orchestrl.collectives.plan import plan_weight_sync
from orchestrl.fabric.errors import ConfigError
from orchestrl.fabric.templates.stages import WEIGHT_SYNC
from orchestrl.fabric.topology import FabricSpec, Topology
from orchestrl.fabric.traffic import pod_flows_by_primitive


@pytest.fixture
def setup():
    # 3 PoDs x 2 servers x 4 GPUs: trainers on PoD 0, generators on PoDs 1 and 2.
    topo = Topology(FabricSpec(name="t", link_bps=1e11, gpus_per_server=4, pods=3, servers_per_pod=2,
                               boundary_ports_per_pod=4, core_devices=1))
    trainer = TrainerLayout(tp=4, gpus=(0, 1, 2, 3))
    gen = GeneratorLayout.uniform(pods=(1, 2), ranks_per_pod=4, tp=2, gpus=tuple(range(8, 12)) + tuple(range(16, 20)))
    sch = plan_weight_sync(synthetic_model(1 << 20, hidden=64), trainer, gen, links_from_topology(topo))
    return topo, sch


def test_transfers_are_the_schedule_edges(setup):
    topo, sch = setup
    transfers = schedule_transfers(sch)
    assert len(transfers) == len(sch.edges)
    assert sum(v for _, _, v in transfers) == sum(sch.blocks[e.block].nbytes for e in sch.edges)


def test_each_generator_pod_receives_one_model_copy_across_its_boundary(setup):
    topo, sch = setup
    demand = schedule_demand(sch, topo)
    assert demand.pod_demand == {(0, 1): pytest.approx(sch.model_bytes), (0, 2): pytest.approx(sch.model_bytes)}


def test_weight_sync_template_instantiates_from_the_schedule(setup):
    topo, sch = setup
    intent = weight_sync_intent(sch, job="rl-job")
    assert intent.stage == "weight-sync"
    flows = pod_flows_by_primitive(intent, topo)
    scope = WEIGHT_SYNC.instantiate(flows, {0, 1, 2})
    assert scope.core_pairs == {frozenset({"pod0", "pod1"}), frozenset({"pod0", "pod2"})}
    assert scope.roles == {0: "train", 1: "gen", 2: "gen"}


def test_missing_gpus_are_refused():
    sch = plan_weight_sync(synthetic_model(1 << 16, hidden=8), TrainerLayout(),
                           GeneratorLayout.uniform(pods=(1,), ranks_per_pod=1), links_from_topology(
                               Topology(FabricSpec(name="t", link_bps=1e9, pods=2, servers_per_pod=1,
                                                   boundary_ports_per_pod=2, core_devices=1))))
    with pytest.raises(ConfigError, match="gpus"):
        schedule_transfers(sch)
    assert schedule_transfers(sch, trainer_gpus=(0,), generator_gpus=(8,))[0][:2] == (0, 8)
