"""The network seam of compute_sched: None is today's NIC model; a seam's rates reach every cross-node term."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrl.compute_sched.costs import CostModel
from orchestrl.compute_sched.engine import EngineCapabilities, GenerationRequest
from orchestrl.compute_sched.hardware import load_gpu, load_model
from orchestrl.compute_sched.layout import Instance, Layout, homogeneous, parse_config
from orchestrl.compute_sched.netseam import NetworkSeam, Transfer, crosses_nodes
from orchestrl.compute_sched.perf import PerfModel
from orchestrl.compute_sched.sim_engine import SimEngine

CONFIGS = [parse_config(c) for c in ("tp1", "tp8", "tp16", "ep8-tp1", "ep16-tp1", "ep16-tp8", "afd12:4-tp1",
                                       "afd24:16-tp8")]


class ConstantSeam:
    """A network that gives every cross-node pattern ``factor`` x the NIC and lands transfers after ``land_s``."""

    def __init__(self, gpu, factor: float = 1.0, land_s: float = 0.0) -> None:
        self.rate = gpu.nic_bytes_per_s * factor
        self.land_s = land_s
        self.asked: list[tuple] = []
        self.deployed: list[tuple[str, float, int]] = []

    def link_bytes_per_s(self, cfg, gpu_ids=None):
        self.asked.append((cfg.name, None if gpu_ids is None else tuple(gpu_ids)))
        return self.rate

    def transfer_bytes_per_s(self, cfg):
        return self.rate

    def deploy(self, layout, now_s, transfers=()):
        self.deployed.append((layout.describe(), now_s, len(transfers)))
        return now_s

    def transfer_times_s(self, transfers, now_s):
        return [t.start_s + self.land_s for t in transfers]


@pytest.fixture(scope="module")
def moe():
    return load_model("Qwen3-235B-A22B"), load_gpu("H800")


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(CONFIGS), st.integers(1, 1024), st.integers(0, 3_000_000))
def test_a_seam_at_the_nic_rate_reproduces_the_no_seam_step_times_exactly(cfg, batch, ctx):
    model, gpu = load_model("Qwen3-235B-A22B"), load_gpu("H800")
    plain = PerfModel(model, gpu)
    seamed = PerfModel(model, gpu, network=ConstantSeam(gpu)).at(tuple(range(cfg.gpus)))
    assert seamed.decode_step_s(cfg, batch, ctx) == plain.decode_step_s(cfg, batch, ctx)
    assert seamed.prefill_s(cfg, batch * 100, ctx / batch) == plain.prefill_s(cfg, batch * 100, ctx / batch)


def test_a_slower_network_slows_exactly_the_configurations_that_cross_nodes(moe):
    model, gpu = moe
    plain, slow = PerfModel(model, gpu), PerfModel(model, gpu, network=ConstantSeam(gpu, factor=0.25))
    for cfg in CONFIGS:
        a, b = plain.decode_step_s(cfg, 256, 256 * 4000), slow.decode_step_s(cfg, 256, 256 * 4000)
        if crosses_nodes(cfg, gpu.gpus_per_node):
            assert b > a, cfg.name
        else:
            assert b == a, cfg.name


def test_the_seam_is_asked_with_each_instances_own_gpus(moe):
    model, gpu = moe
    seam = ConstantSeam(gpu)
    layout = homogeneous(parse_config("ep16-tp1"), 32)
    engine = SimEngine(PerfModel(model, gpu, network=seam), layout, {"a": 50, "b": 60})
    engine.add_requests([GenerationRequest("a", 100, 200)], 0)
    engine.add_requests([GenerationRequest("b", 100, 200)], 1)
    engine.advance(30.0)
    assert seam.deployed == [("2x ep16-tp1", 0.0, 0)]  # the layout is announced once, at start
    placements = {g for _, g in seam.asked if g is not None}
    assert placements == {inst.gpu_ids for inst in layout.instances}
    assert engine.idle()


def test_cost_estimates_use_the_seam_rate(moe):
    model, gpu = moe
    fast = CostModel(PerfModel(model, gpu, network=ConstantSeam(gpu, factor=4.0)))
    plain = CostModel(PerfModel(model, gpu))
    tp8, tp16 = parse_config("tp8"), parse_config("tp16")
    # KV: one NIC without a seam; every KV-holding GPU of the destination at the seam's rate with one
    assert plain.transfer_s(100_000, tp8) - plain.transfer_setup_s == pytest.approx(
        100_000 * model.kv_bytes_per_token / gpu.nic_bytes_per_s)
    assert fast.transfer_s(100_000, tp8) - fast.transfer_setup_s == pytest.approx(
        100_000 * model.kv_bytes_per_token / (8 * 4 * gpu.nic_bytes_per_s))
    # a cross-node reshard fetches from peers at the seam's rate (here faster than host memory)
    assert plain.switch(None, tp16).path == "host" and fast.switch(None, tp16).path == "nic"


def test_reconfiguration_announces_its_transfers_and_falls_back_to_recompute_without_a_path(moe):
    model, gpu = moe
    afd, tp8 = parse_config("afd24:16-tp8"), parse_config("tp8")
    start, end = homogeneous(afd, 40), homogeneous(tp8, 40)
    lengths = {f"r{i}": 4000 for i in range(20)}

    def run(land_s):
        seam = ConstantSeam(gpu, land_s=land_s)
        eng = SimEngine(PerfModel(model, gpu, network=seam), start, lengths,
                        capabilities=EngineCapabilities.assume_kv_transfer())
        eng.add_requests([GenerationRequest(r, 8000, 8000) for r in lengths], 0)  # long prompts: transfer wins
        eng.advance(10.0)
        rep = eng.change_layout(end, {r: i % 5 for i, r in enumerate(lengths)})
        return seam, eng, rep

    seam, eng, rep = run(0.5)
    assert seam.deployed[-1][0] == "5x tp8" and seam.deployed[-1][2] > 20  # weights and KV announced
    assert rep.migration.methods == {"transfer": 20}
    assert rep.migration.seconds == pytest.approx(0.5 + CostModel(eng.perf).transfer_setup_s)
    assert eng.switch_log[-1]["reload_paths"]["peers"] == 5  # 0.5 s from peers beats host memory
    _, _, rep = run(math.inf)  # the fabric cannot deliver: the engine recomputes, the weights come from host
    assert rep.migration.methods == {"recompute": 20}


def test_the_protocol_is_runtime_checkable(moe):
    assert isinstance(ConstantSeam(moe[1]), NetworkSeam)
    t = Transfer((0, 1), (8,), 1e9)
    assert t.kind == "kv" and t.start_s == 0.0
    lay = Layout((Instance(parse_config("afd6:2-tp2"), tuple(range(8))),), 8)
    assert crosses_nodes(lay.instances[0].config, 8)
