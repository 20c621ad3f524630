"""Collectives -> rank-pair bytes -> ToR/PoD demand: closed forms, conservation, placement."""

from __future__ import annotations

import json
import math
import os
from collections import defaultdict

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrl.fabric.intent import GROUPED_PRIMITIVES, Collective, Intent, load_intent
from orchestrl.fabric.topology import load_topology, uplink_endpoint
from orchestrl.fabric.traffic import (aggregate_demand, aggregate_intent, demand_of_intent, pod_flows_by_primitive,
                            rank_pair_bytes, transfer_pair_bytes, weight_sync_transfers)

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "examples")


@pytest.fixture(scope="module")
def small():
    return load_topology(os.path.join(EXAMPLES, "topology-64gpu-h800.yaml"))


@pytest.fixture(scope="module")
def big():
    return load_topology(os.path.join(EXAMPLES, "topology-2048gpu.yaml"))


def _out(pairs):
    sent = defaultdict(float)
    for (a, _), v in pairs.items():
        sent[a] += v
    return sent


def _in(pairs):
    got = defaultdict(float)
    for (_, b), v in pairs.items():
        got[b] += v
    return got


# -- per-primitive models ---------------------------------------------------------------------


def test_ring_all_reduce_sends_two_n_minus_one_over_n_to_the_successor():
    pairs = rank_pair_bytes(Collective("all-reduce", groups=((5, 1, 9, 3),), bytes_per_rank=8.0))
    assert pairs == {(5, 1): 12.0, (1, 9): 12.0, (9, 3): 12.0, (3, 5): 12.0}  # ring in listed order
    assert sum(pairs.values()) == 2 * 3 * 8.0


def test_all_gather_and_reduce_scatter_move_half_an_all_reduce():
    for primitive in ("all-gather", "reduce-scatter"):
        pairs = rank_pair_bytes(Collective(primitive, groups=((0, 1, 2, 3),), bytes_per_rank=8.0))
        assert set(pairs.values()) == {6.0} and len(pairs) == 4


def test_all_to_all_is_pairwise_s_over_n():
    pairs = rank_pair_bytes(Collective("all-to-all", groups=((0, 1, 2, 3),), bytes_per_rank=8.0))
    assert pairs == {(a, b): 2.0 for a in range(4) for b in range(4) if a != b}


def test_p2p_runs_forward_and_backward_between_adjacent_stages():
    pairs = rank_pair_bytes(Collective("p2p", groups=((0, 16, 32),), bytes_per_rank=5.0))
    assert pairs == {(0, 16): 5.0, (16, 32): 5.0, (16, 0): 5.0, (32, 16): 5.0}


def test_m2n_spreads_each_attention_rank_over_the_ffn_ranks_and_back():
    pairs = rank_pair_bytes(Collective("m2n", src_gpus=(0, 1, 2), dst_gpus=(8, 9), bytes_per_rank=6.0))
    assert all(v == 3.0 for v in pairs.values()) and len(pairs) == 12
    assert _out(pairs)[0] == 6.0 and _in(pairs)[0] == 6.0
    assert _in(pairs)[8] == 9.0  # each FFN rank gets 3 ranks x S/2


def test_response_stream_is_round_robin_from_gen_to_train():
    pairs = rank_pair_bytes(Collective("response-stream", src_gpus=(40, 41, 42), dst_gpus=(0, 1), bytes_per_rank=2.0))
    assert pairs == {(40, 0): 2.0, (41, 1): 2.0, (42, 0): 2.0}


def test_single_member_groups_and_zero_bytes_make_no_pairs():
    assert rank_pair_bytes(Collective("all-reduce", groups=((3,), (4,)), bytes_per_rank=1e9)) == {}
    assert rank_pair_bytes(Collective("all-to-all", groups=((0, 1),), bytes_per_rank=0.0)) == {}


@settings(max_examples=80, deadline=None)
@given(primitive=st.sampled_from(GROUPED_PRIMITIVES),
       sizes=st.lists(st.integers(1, 9), min_size=1, max_size=5),
       size_bytes=st.floats(min_value=0.0, max_value=1e12, allow_nan=False))
def test_grouped_totals_match_closed_forms(primitive, sizes, size_bytes):
    groups, start = [], 0
    for n in sizes:
        groups.append(tuple(range(start, start + n)))
        start += n
    c = Collective(primitive, groups=tuple(groups), bytes_per_rank=size_bytes)
    per_group = {"all-reduce": 2, "all-gather": 1, "reduce-scatter": 1, "all-to-all": 1, "p2p": 2}[primitive]
    closed = sum(per_group * (n - 1) * size_bytes for n in sizes)
    assert math.isclose(sum(rank_pair_bytes(c).values()), closed, rel_tol=1e-9, abs_tol=1e-6)
    assert math.isclose(c.total_bytes, closed, rel_tol=1e-12, abs_tol=1e-6)


# -- weight sync --------------------------------------------------------------------------------


def test_weight_sync_gives_every_gen_gpu_the_model_with_one_copy_per_pod(small):
    c = Collective("weight-sync", src_gpus=tuple(range(32)), dst_gpus=tuple(range(32, 64)), bytes_per_rank=3.2e10)
    pairs = rank_pair_bytes(c, small)
    got = _in(pairs)
    assert all(math.isclose(got[g], 3.2e10) for g in range(32, 64))
    assert all(math.isclose(_out(pairs)[t], 1e9) for t in range(32))  # each train GPU sends its shard once
    assert math.isclose(sum(pairs.values()), c.total_bytes)
    agg = aggregate_demand(pairs, small)
    assert agg.pod_demand == pytest.approx({(0, 1): 3.2e10})  # exactly one copy crosses the boundary


def test_weight_sync_sends_one_copy_into_each_gen_pod(big):
    train, gen = tuple(range(0, 512)), tuple(range(1024, 2048))  # PoDs 0-1 -> PoDs 4-7
    intent = Intent("weight-sync", "j", "ws", (Collective("weight-sync", src_gpus=train, dst_gpus=gen,
                                                          bytes_per_rank=1.4e11),))
    agg = aggregate_intent(intent, big)
    into = defaultdict(float)
    for (_, q), v in agg.pod_demand.items():
        into[q] += v
    assert dict(into) == pytest.approx({4: 1.4e11, 5: 1.4e11, 6: 1.4e11, 7: 1.4e11})
    assert pod_flows_by_primitive(intent, big) == {"weight-sync": {(p, q) for p in (0, 1) for q in (4, 5, 6, 7)}}


def test_explicit_transfers_replace_the_stand_in_schedule(small):
    schedule = ((0, 32, 5.0), (0, 32, 1.0), (32, 40, 6.0))
    c = Collective("weight-sync", src_gpus=(0,), dst_gpus=(32, 40), bytes_per_rank=6.0, transfers=schedule)
    assert rank_pair_bytes(c) == transfer_pair_bytes(schedule) == {(0, 32): 6.0, (32, 40): 6.0}
    assert c.total_bytes == 12.0


def test_stand_in_needs_the_topology_and_is_exposed_as_transfers(small):
    c = Collective("weight-sync", src_gpus=(0, 1), dst_gpus=(32, 33), bytes_per_rank=4.0)
    with pytest.raises(ValueError, match="topology"):
        rank_pair_bytes(c)
    assert transfer_pair_bytes(weight_sync_transfers((0, 1), (32, 33), 4.0, small)) == rank_pair_bytes(c, small)


# -- aggregation --------------------------------------------------------------------------------


def test_intra_tor_and_intra_server_traffic_creates_no_ocs_demand(small):
    # 64-GPU testbed: one ToR per rail per PoD, so GPUs 0, 8, 16, 24 (rail 0, PoD 0) share a ToR,
    # and GPUs 0-7 share a server.
    agg = aggregate_demand({(0, 8): 3.0, (8, 24): 4.0, (0, 7): 5.0, (3, 4): 1.0}, small)
    assert agg.pod_demand == {}
    assert all(not d for d in agg.tor_demand.values())
    assert (agg.eps_bytes, agg.nvlink_bytes, agg.total_bytes) == (13.0, 6.0, 13.0)


def test_cross_tor_and_cross_pod_traffic_lands_on_the_right_endpoints(small):
    agg = aggregate_demand({(0, 9): 2.0, (1, 33): 7.0, (2, 41): 1.0}, small)
    assert agg.tor_demand[0] == {("pod0/tor0", "pod0/tor1"): 2.0, ("pod0/tor1", uplink_endpoint(0, 1)): 7.0,
                                 ("pod0/tor2", uplink_endpoint(0, 1)): 1.0}
    assert agg.tor_demand[1] == {(uplink_endpoint(1, 0), "pod1/tor1"): 8.0}  # GPUs 33 and 41: rail 1
    assert agg.pod_demand == {(0, 1): 8.0}
    assert (agg.intra_pod_ocs_bytes, agg.inter_pod_bytes) == (2.0, 8.0)
    json.dumps(agg.to_json())


def _check_conservation(agg, topology):
    for p in topology.pods:
        lifts = sum(v for (u, w), v in agg.tor_demand[p].items() if w.startswith(f"pod{p}/up:"))
        drops = sum(v for (u, w), v in agg.tor_demand[p].items() if u.startswith(f"pod{p}/up:"))
        assert math.isclose(lifts, sum(v for (a, _), v in agg.pod_demand.items() if a == p), rel_tol=1e-9, abs_tol=1e-6)
        assert math.isclose(drops, sum(v for (_, b), v in agg.pod_demand.items() if b == p), rel_tol=1e-9, abs_tol=1e-6)
        for peer in topology.pods:  # per peer PoD, lift bytes equal that PoD pair's demand
            lift_q = sum(v for (_, w), v in agg.tor_demand[p].items() if w == uplink_endpoint(p, peer))
            assert math.isclose(lift_q, agg.pod_demand.get((p, peer), 0.0), rel_tol=1e-9, abs_tol=1e-6)
        for u, w in agg.tor_demand[p]:
            assert u != w and u.startswith(f"pod{p}/") and w.startswith(f"pod{p}/")
    assert math.isclose(agg.eps_bytes + agg.intra_pod_ocs_bytes + agg.inter_pod_bytes, agg.total_bytes)


@settings(max_examples=60, deadline=None)
@given(pairs=st.dictionaries(st.tuples(st.integers(0, 63), st.integers(0, 63)),
                             st.floats(min_value=0.0, max_value=1e10, allow_nan=False), max_size=40))
def test_aggregation_conserves_bytes_and_matches_a_pair_by_pair_reference(pairs, small):
    agg = aggregate_demand(pairs, small)
    _check_conservation(agg, small)
    # Reference: classify each pair with the topology's own lookups.
    eps = nvl = 0.0
    tor = defaultdict(float)
    for (a, b), v in pairs.items():
        if a == b or v == 0:
            continue
        if small.server_of_gpu(a) == small.server_of_gpu(b):
            nvl += v
        elif small.tor_of_gpu(a) == small.tor_of_gpu(b):
            eps += v
        elif small.pod_of_gpu(a) == small.pod_of_gpu(b):
            tor[(small.tor_of_gpu(a), small.tor_of_gpu(b))] += v
    assert math.isclose(agg.nvlink_bytes, nvl, rel_tol=1e-9, abs_tol=1e-3)
    assert math.isclose(agg.eps_bytes, nvl + eps, rel_tol=1e-9, abs_tol=1e-3)
    intra = {k: v for p in small.pods for k, v in agg.tor_demand[p].items() if "/up:" not in k[0] + k[1]}
    assert intra == pytest.approx(dict(tor))


def test_every_example_intent_conserves_bytes(small, big):
    for name in sorted(os.listdir(os.path.join(EXAMPLES, "intents"))):
        topo = big if name.startswith("large-") else small
        intent = load_intent(os.path.join(EXAMPLES, "intents", name), topo)
        agg = aggregate_intent(intent, topo)
        _check_conservation(agg, topo)
        assert math.isclose(agg.total_bytes, sum(c.total_bytes for c in intent.collectives), rel_tol=1e-9)


def test_example_demand_lands_where_the_templates_expect(small, big):
    def agg(name, topo=small):
        return aggregate_intent(load_intent(os.path.join(EXAMPLES, "intents", name), topo), topo)

    fwd = agg("train-fwd-bwd.yaml")  # EP crosses ToRs inside PoD 0 only
    assert fwd.pod_demand == {} and fwd.tor_demand[0] and not fwd.tor_demand[1]
    assert set(agg("train-dp-cross-pod.yaml").pod_demand) == {(0, 1), (1, 0)}
    assert set(agg("weight-sync.yaml").pod_demand) == {(0, 1)}
    assert set(agg("gen.yaml").pod_demand) == {(1, 0)}  # only the response stream leaves the gen PoD
    large = agg("large-train-dp.yaml", big)
    assert set(large.pod_demand) == {(0, 1), (1, 2), (2, 3), (3, 0)}  # DP rings run along rails
    assert large.intra_pod_ocs_bytes == 0.0


def test_demand_of_intent_sums_collectives_and_matches_aggregate_intent(small):
    intent = load_intent(os.path.join(EXAMPLES, "intents", "gen.yaml"), small)
    pairs = demand_of_intent(intent)
    assert math.isclose(sum(pairs.values()), sum(c.total_bytes for c in intent.collectives))
    a, b = aggregate_demand(pairs, small), aggregate_intent(intent, small)
    assert a.pod_demand == pytest.approx(b.pod_demand)
    assert all(a.tor_demand[p] == pytest.approx(b.tor_demand[p]) for p in small.pods)


def test_all_to_all_over_64_gpu_groups_at_2048_gpus(big):
    groups = tuple(tuple(range(k, k + 64)) for k in range(0, 2048, 64))
    intent = Intent("train", "j", "moe", (Collective("all-to-all", groups=groups, bytes_per_rank=6.4e9),))
    agg = aggregate_intent(intent, big)
    assert math.isclose(agg.total_bytes, 32 * 63 * 6.4e9)
    assert agg.pod_demand == {}  # 64 consecutive GPUs = 8 servers of one PoD
    assert all(len(agg.tor_demand[p]) == 8 * 7 for p in big.pods)  # every rail ToR pair of the PoD


def test_gpus_outside_the_topology_are_refused(small):
    with pytest.raises(IndexError, match="outside"):
        aggregate_demand({(0, 64): 1.0}, small)
