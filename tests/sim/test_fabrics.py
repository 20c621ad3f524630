"""Analytic checks of the six fabrics: line rate plus latency, oversubscription bounds, circuits x B."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrl.fabric.errors import ConfigError
from orchestrl.sim.network.build import build_fabric
from orchestrl.sim.network.config import FABRICS, SimConfig
from orchestrl.sim.network.events import FlowSet, simulate
from orchestrl.sim.network.fabrics import Failures, mixnet_circuits, totient_strides
from orchestrl.sim.network.netsim import NetworkSim

B = 200e9
CFG = SimConfig()
HOP = CFG.hop_latency_s()
SW = CFG.switch_latency_s


def _rates(state, src, dst):
    inc = state.incidence(np.asarray(src), np.asarray(dst))
    return inc.problem().solve(state.capacity_bps, inc.routable).rate_bps


def test_permutation_on_fat_tree_finishes_at_bytes_over_line_rate_plus_path_latency():
    gpus = 256  # 8 leaves of 32 NICs under 4 spines: same-leaf and cross-leaf paths both occur
    rng = np.random.default_rng(5)
    dst = rng.permutation(gpus)
    src = np.arange(gpus)
    keep = src // 8 != dst // 8
    size = 12.5e6
    fab = build_fabric("ft", gpus)
    res = simulate(FlowSet(src[keep], dst[keep], size, 0.0), fab.state())
    same_leaf = fab.leaf_of_gpu[src[keep]] == fab.leaf_of_gpu[dst[keep]]
    latency = np.where(same_leaf, 2 * HOP + SW, 4 * HOP + 3 * SW)
    assert np.allclose(res.finish_s, size * 8 / B + latency, rtol=1e-9)
    assert res.events == 1


def test_oversubscribed_all_to_all_across_leaves_is_bounded_by_the_3_to_1_uplinks():
    gpus, s = 384, 96e6  # 8 leaves x 48 NICs, 16 uplinks each
    grp = np.arange(gpus)
    i, j = np.nonzero(~np.eye(gpus, dtype=bool))
    flows = FlowSet(grp[i], grp[j], s / gpus, 0.0)
    res = simulate(flows, build_fabric("ft-os", gpus).state())
    cross_bytes_per_leaf = 48 * (gpus - 48) / gpus * s
    bound = cross_bytes_per_leaf * 8 / (16 * B)
    nic_bound = (gpus - 8) / gpus * s * 8 / B
    assert bound > 2.5 * nic_bound
    assert bound <= res.makespan_s <= bound * 1.001 + 1e-5
    ft = simulate(flows, build_fabric("ft", gpus).state())
    assert ft.makespan_s == pytest.approx(nic_bound, rel=0.01)


@pytest.mark.parametrize("circuits", [1, 3, 5])
def test_an_rfabric_tor_pair_with_c_circuits_gets_c_times_line_rate(circuits):
    sim = NetworkSim("rfabric", gpus=128)  # one PoD: 8 rail ToRs of 16 servers
    src = np.arange(16) * 8  # rail 0 of every server
    dst = (np.arange(16) * 8 + 8) % 128 + 1  # rail 1 of the next server
    flows = FlowSet(src, dst, 1e9, 0.0)
    plan = sim.plan_for(flows)
    pair = [c for c in plan.circuits if {c.a, c.b} == {"pod0/tor0", "pod0/tor1"}]
    assert len(pair) >= 5  # the controller gave the demanded pair its circuits
    state = sim.fabric.with_circuits(pair[:circuits])
    assert _rates(state, src, dst).sum() == pytest.approx(circuits * B, rel=1e-9)
    full = sim.fabric.with_circuits(plan)
    assert _rates(full, src, dst).sum() == pytest.approx(min(len(pair), 16) * B, rel=1e-9)


def test_rfabric_without_a_circuit_lands_on_the_senders_rail_and_crosses_nvlink():
    fab = build_fabric("rfabric", 64)
    st = fab.with_circuits(())
    inc = st.incidence(np.array([0]), np.array([9]))  # rail 0 of server 0 -> rail 1 of server 1
    row = inc.own[0].toarray().ravel()
    g = fab.gpus
    assert row[2 * g + 0] == 1 and row[3 * g + 8] == 1 and row[g + 9] == 1  # NIC up, NIC 8 down, NVLink into 9
    assert inc.routable.all()
    assert _rates(st, [0], [9])[0] == pytest.approx(B)


def test_rail_optimised_sends_cross_rail_traffic_over_nvlink_to_the_destination_rail():
    fab = build_fabric("ro", 512)
    st = fab.state()
    inc = st.incidence(np.array([0]), np.array([8 * 40 + 3]))  # rank 0 -> rank 3, another rail group
    row = inc.own[0].toarray().ravel()
    g = fab.gpus
    assert row[0] == 1  # NVLink out of GPU 0 to its server-mate on rail 3
    assert row[2 * g + 3] == 1  # that mate's NIC carries the flow
    assert fab.leaf_of_gpu[3] != fab.leaf_of_gpu[0]  # a rail leaf, not GPU 0's


def test_same_server_traffic_uses_nvlink_at_its_per_direction_rate():
    st = build_fabric("ft", 64).state()
    rate = _rates(st, [0], [1])[0]
    assert rate == pytest.approx(CFG.nvlink_bps)  # 400 GB/s both ways = 200 GB/s = 1.6 Tb/s each way


def test_a_failed_nic_relays_over_nvlink_to_the_next_nic_and_shares_it():
    fab = build_fabric("ft", 256)
    st = fab.state(Failures(nics=frozenset({16})))
    r = _rates(st, [16, 17], [200, 201])
    assert r == pytest.approx([B / 2, B / 2])  # both leave through NIC 17
    assert _rates(fab.state(), [16, 17], [200, 201]) == pytest.approx([B, B])


def test_a_failed_switch_link_is_routed_around_and_costs_its_capacity():
    gpus = 1024  # 32 leaves x 32 uplinks, two links to each of 16 spines
    fab = build_fabric("ft", gpus)
    src = np.arange(32)  # all of leaf 0 sends to leaf 1
    dst = src + 32
    healthy = _rates(fab.state(), src, dst).sum()
    leaf, spine = fab.wiring.labels[fab.leaf_of_gpu[0]], "ft/spine/0"
    broken = _rates(fab.state(Failures(links=((leaf, spine),))), src, dst).sum()
    assert healthy == pytest.approx(32 * B)
    # per-hop ECMP weighs next hops by their links: each of the 31 surviving uplinks carries 1/31
    assert broken == pytest.approx(31 * B, rel=1e-9)
    with pytest.raises(ConfigError, match="no link between"):
        fab.state(Failures(links=(("ft/leaf/0", "nowhere"),)))


def test_topoopt_rings_are_coprime_strides_and_servers_forward():
    assert totient_strides(16, 8) == [1, 3, 5, 7, 9, 11, 13, 15]  # every odd stride: all coprime to 16
    assert sorted(totient_strides(4, 8)) == [1, 1, 1, 3, 3, 3, 3, 3]  # rings repeat when strides run out
    fab = build_fabric("topoopt", 128)
    st = fab.state()
    inc = st.incidence(np.array([0]), np.array([8 * 2]))  # server 0 -> server 2: no direct ring
    assert inc.routable.all() and inc.prof.shape[0] == 1
    assert inc.prof[inc.cls[0]].sum() > 1.0  # more than one link crossed on average: host forwarding


def test_mixnet_uses_its_circuits_and_the_fat_tree_for_the_rest():
    fab = build_fabric("mixnet", 128)
    pairs = {(0, 8): 1e9, (8, 0): 1e9}  # servers 0 and 1 exchange data
    circuits = mixnet_circuits(fab, pairs)
    assert len(circuits) == 6  # every OCS NIC of both servers on their one demanded pair
    st = fab.with_circuits(circuits)
    assert _rates(st, [0], [8])[0] == pytest.approx(6 * B)  # one GPU spreads over six circuits via NVLink
    assert _rates(st, [0], [16])[0] == pytest.approx(2 * B)  # no circuit: the two fat-tree NICs


@pytest.mark.parametrize("name", FABRICS)
def test_every_fabric_routes_an_all_to_all_and_rates_are_feasible(name):
    st = NetworkSim(name, gpus=64).state(FlowSet(np.arange(64), (np.arange(64) + 8) % 64, 1.0, 0.0))
    grp = np.arange(64)
    i, j = np.nonzero(~np.eye(64, dtype=bool))
    inc = st.incidence(grp[i], grp[j])
    assert inc.routable.all()
    rate = inc.problem().solve(st.capacity_bps).rate_bps
    load = inc.own.T @ rate + inc.prof.T @ np.bincount(inc.cls[inc.cls >= 0], weights=rate[inc.cls >= 0],
                                                      minlength=inc.prof.shape[0])
    assert np.all(load <= st.capacity_bps * (1 + 1e-9) + 1)


def test_bad_sizes_are_refused_with_the_field():
    with pytest.raises(ConfigError, match="gpus"):
        build_fabric("ft", 12)
    with pytest.raises(ConfigError, match="unknown fabric"):
        build_fabric("torus", 64)


def test_failures_a_fabric_does_not_have_are_refused():
    with pytest.raises(ConfigError, match="no switch links"):
        build_fabric("topoopt", 64).state(Failures(links=(("a", "b"),)))
    with pytest.raises(ConfigError, match="no switch links"):
        build_fabric("rfabric", 64).with_circuits((), Failures(links=(("a", "b"),)))
    from orchestrl.fabric.topology import PortRef
    with pytest.raises(ConfigError, match="OCS ports"):
        build_fabric("ft", 64).state(Failures(ports=frozenset({PortRef("x", 1)})))
