"""EP token dispatch (sim/train/dispatch.py): the copies per token each dispatcher puts on the NICs and
NVLink, checked against simulations of the routers the published points used, and how the MFU
calibration takes each source's dispatcher into account."""

from __future__ import annotations

import re

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from orchestrl.fabric.errors import ConfigError
from orchestrl.sim.train.dispatch import distinct_holders, token_copies
from orchestrl.sim.train.mfu import FREE_PARAMS, SETUP, SETUPS, IdealNetwork, calibrate, load_points, POINTS_FILE

# (experts, topk, holders): Qwen3-235B over EP32 GPUs and over 4 nodes, DeepSeek-V3 over 8 nodes,
# Kimi K2 over EP32, GPT-OSS-120B over 8 nodes, Qwen3-30B on one 8-GPU node
SHAPES = [(128, 8, 32), (128, 8, 4), (256, 8, 8), (384, 8, 32), (128, 4, 8), (128, 8, 8)]


def _holders_hit(experts_of_token: np.ndarray, experts: int, holders: int) -> np.ndarray:
    held_by = experts_of_token // (experts // holders)
    return np.array([len(set(row)) for row in held_by.tolist()])


@pytest.mark.parametrize("experts,topk,holders", SHAPES)
def test_random_routing_hits_as_many_holders_as_a_monte_carlo_of_the_force_balanced_router(experts, topk, holders):
    # Megatron's moe_router_force_load_balancing: Gaussian logits, then top-k
    rng = np.random.default_rng(20261124)
    tokens = 20_000
    logits = rng.standard_normal((tokens, experts))
    chosen = np.argpartition(-logits, topk - 1, axis=1)[:, :topk]
    hits = _holders_hit(chosen, experts, holders)
    stderr = hits.std(ddof=1) / np.sqrt(tokens)
    assert distinct_holders(experts, topk, holders, "random") == pytest.approx(hits.mean(), abs=4 * stderr + 1e-9)


@pytest.mark.parametrize("experts,topk,holders", SHAPES)
def test_sequential_routing_is_exactly_automodels_fake_balanced_gate(experts, topk, holders):
    # FakeBalancedGate: indices = arange(tokens * topk).view(-1, topk) % experts; tokens span whole periods
    tokens = 7 * experts
    chosen = np.arange(tokens * topk).reshape(-1, topk) % experts
    assert distinct_holders(experts, topk, holders, "sequential") == pytest.approx(
        _holders_hit(chosen, experts, holders).mean(), rel=1e-12)


def test_automodels_gate_sends_each_deepseek_token_to_one_node_and_random_routing_to_five():
    # DeepSeek-V3 on EP64 = 8 nodes of 32 experts: the benchmark's consecutive experts never leave a node,
    # a force-balanced router reaches 8 (1 - C(224, 8) / C(256, 8)) = 5.29 of them
    assert distinct_holders(256, 8, 8, "sequential") == 1.0
    assert distinct_holders(256, 8, 8, "random") == pytest.approx(5.295, abs=1e-3)
    seq, rnd = (token_copies(256, 8, 64, 8, "deepep", r) for r in ("sequential", "random"))
    assert seq.nic == pytest.approx(7 / 8) and rnd.nic == pytest.approx(5.295 * 7 / 8, abs=1e-3)
    assert token_copies(256, 8, 64, 8).nic == pytest.approx(7.0)  # all-to-all: topk copies, 7/8 off the node


@settings(max_examples=200, deadline=None)
@given(st.sampled_from([(32, 4), (64, 6), (128, 8), (256, 8), (384, 8), (160, 6)]), st.sampled_from([1, 2, 4, 8]),
       st.integers(0, 4), st.sampled_from(["random", "sequential"]))
def test_deepep_never_puts_more_on_the_nics_than_the_all_to_all(shape, per_server, log_nodes, routing):
    experts, topk = shape
    ep = per_server * 2 ** log_nodes
    if experts % ep:
        return
    plain, dedup = token_copies(experts, topk, ep, per_server), token_copies(experts, topk, ep, per_server, "deepep",
                                                                               routing)
    assert dedup.nic <= plain.nic + 1e-12
    assert 0.0 <= dedup.nvlink <= topk  # at most every expert on another GPU of some reached node
    if ep == per_server:  # one node: nothing leaves it
        assert plain.nic == dedup.nic == 0.0


def test_the_all_to_all_copies_time_exactly_as_the_plain_all_to_all():
    net = IdealNetwork()
    for experts, topk, ep, per_server in ((128, 8, 32, 8), (128, 8, 16, 2), (32, 4, 8, 8)):
        size = 4096 * topk * 4096 * 2.0
        want = net.alltoall_s(size, ep, per_server)
        got = net.dispatch_s(size / topk, token_copies(experts, topk, ep, per_server), ep, per_server)
        assert got == pytest.approx(want, rel=1e-12)


def test_bad_dispatch_input_names_the_field(tmp_path):
    with pytest.raises(ConfigError, match="dispatcher"):
        token_copies(128, 8, 32, 8, "nccl")
    with pytest.raises(ConfigError, match="holders"):
        distinct_holders(128, 8, 3)
    with pytest.raises(ConfigError, match="per_server"):
        token_copies(128, 8, 32, 3)
    text = POINTS_FILE.read_text()
    bad = tmp_path / "p.yaml"
    bad.write_text(text.replace("dispatch: {type: deepep,", "dispatch: {type: flex,", 1))
    with pytest.raises(ConfigError, match=r"points\[3\]\.dispatch\.type"):
        load_points(bad)
    # a dispatcher is a claim about the source's setup: without saying where it is from, the file is refused
    bad.write_text(re.sub(r'(dispatch: \{type: deepep, routing: sequential), source: "[^"]*"\}', r"\1}", text, count=1))
    with pytest.raises(ConfigError, match=r"points\[3\]\.dispatch\.source"):
        load_points(bad)


def test_the_points_record_the_dispatchers_their_sources_used():
    points = {p.id: p for p in load_points()[0]}
    automodel = [p for p in points.values() if p.framework == "NeMo AutoModel"]
    assert automodel and all(p.dispatcher == "deepep" and p.routing == "sequential" for p in automodel)
    assert points["megatron-bridge-gpt-oss-120b-26.02"].dispatcher == "alltoall"
    assert points["automodel-kimi-k2-256gpu"].recompute and not points["automodel-gpt-oss-120b-64gpu"].recompute


def test_the_default_calibration_models_a_setup_fact_only_where_leave_one_out_says_so():
    # a fact of the sources' setup enters the default only if it lowers the mean leave-one-out error
    # without raising the worst one (the held-out points play no part in the choice)
    base = calibrate(None, FREE_PARAMS, SETUP).summary()
    for setup in SETUPS:
        if tuple(setup) == tuple(SETUP):
            continue
        s = calibrate(None, FREE_PARAMS, setup).summary()
        assert (s["leave_one_out_mean_abs"] > base["leave_one_out_mean_abs"]
                or s["leave_one_out_max_abs"] > base["leave_one_out_max_abs"]), setup
