"""The generation stage: compute_sched's engine and scheduler with every cross-server byte timed on the fabric."""

from __future__ import annotations

import math

import pytest

from orchestrl.compute_sched.engine import GenerationRequest
from orchestrl.compute_sched.hardware import DTYPE_BYTES, load_gpu, load_model
from orchestrl.compute_sched.layout import homogeneous, parse_config
from orchestrl.compute_sched.netseam import Transfer
from orchestrl.compute_sched.sim_engine import SimEngine
from orchestrl.compute_sched.traces import heavy_tailed_trace
from orchestrl.fabric.errors import ConfigError
from orchestrl.sim.network import NetworkSim, RFabricDriver, SimConfig
from orchestrl.sim.stages.gen_network import FabricSeam
from orchestrl.sim.stages.generation import GenerationStage

H800 = load_gpu("H800")
MOE57 = load_model("Qwen2-57B-A14B")
MOE235 = load_model("Qwen3-235B-A22B")
# 96 GPUs = two FT-OS leaves of 48 NICs (6 servers, 16 uplinks each). EP16 instance k takes server k of
# leaf 0 and server k of leaf 1, so half of every GPU's all-to-all crosses the 3:1 uplinks.
ACROSS_LEAVES = [g for k in range(6) for g in [*range(8 * k, 8 * k + 8), *range(48 + 8 * k, 56 + 8 * k)]]
# Two RFabric PoDs of 32 servers; the generation cluster takes 30 of each (whole AFD instances per PoD).
POD_ALIGNED = [s * 8 + r for p in range(2) for s in range(32 * p, 32 * p + 30) for r in range(8)]


def _stage(fabric, gpus, model=MOE57, *, config=None, total=None, **kw):
    net = NetworkSim(fabric, gpus=total or max(gpus) + 1, config=config,
                     circuits="fixed" if fabric == "rfabric" else "per-pattern")
    driver = RFabricDriver(net.fabric) if fabric == "rfabric" else None
    return GenerationStage(model, list(gpus), H800, net, driver, **kw), net, driver


def _drive(perf, layout, trace, seconds=5.0):
    engine = SimEngine(perf, layout, {q.request_id: q.output_tokens for q in trace.requests})
    n = len(layout.instances)
    for k, q in enumerate(trace.requests):
        engine.add_requests([GenerationRequest(q.request_id, q.prompt_tokens, trace.max_tokens, q.group_id)], k % n)
    finish = {}
    while not engine.idle():
        finish.update((f.request_id, f.finish_time_s) for f in engine.advance(seconds))
    return finish


@pytest.mark.parametrize("instance", ["ep16-tp1", "afd12:4-tp1"])
def test_on_a_non_blocking_fabric_at_the_nic_rate_the_seam_changes_nothing(instance):
    stage, _, _ = _stage("ft", range(64), policy="static", instance=instance)
    layout = homogeneous(parse_config(instance), 64)
    trace = heavy_tailed_trace(24, 8, 4096, seed=2)
    plain = _drive(type(stage.perf0)(MOE57, H800), layout, trace)  # the stage's step model, without the seam
    seamed = _drive(stage.perf, layout, trace)
    assert seamed.keys() == plain.keys() and len(plain) == 192
    assert all(seamed[r] == pytest.approx(plain[r], rel=1e-12) for r in plain)


def test_ft_os_slows_an_all_to_all_heavy_instance_by_what_its_uplinks_predict():
    ep16 = parse_config("ep16-tp1")
    ft, _, _ = _stage("ft", ACROSS_LEAVES, policy="static", instance="ep16-tp1")
    os3, _, _ = _stage("ft-os", ACROSS_LEAVES, policy="static", instance="ep16-tp1")
    link = 200e9 / 8
    assert ft.seam.link_bytes_per_s(ep16) == pytest.approx(link, rel=1e-9)
    # every cross-server byte of a leaf shares 16 uplinks among 48 NICs: a third of the NIC rate
    assert os3.seam.link_bytes_per_s(ep16) == pytest.approx(link / 3, rel=1e-6)
    # the step grows by exactly the all-to-all term at a third of the rate: 2 exchanges per layer
    batch, eff = 256, ft.perf0.cal.link_efficiency
    a2a_bytes = batch / 16 * MOE57.experts_per_token * MOE57.d_model * DTYPE_BYTES * 15 / 16
    extra = MOE57.layers * 2 * a2a_bytes / (eff * link) * 2
    gids = tuple(range(16))
    slow = os3.perf.at(gids).decode_step_s(ep16, batch, batch * 3000)
    fast = ft.perf.at(gids).decode_step_s(ep16, batch, batch * 3000)
    assert slow - fast == pytest.approx(extra, rel=1e-6)
    trace = heavy_tailed_trace(24, 8, 4096, seed=1)
    assert os3.run(trace).time_s > ft.run(trace).time_s


@pytest.mark.parametrize("gpus", [range(96), ACROSS_LEAVES], ids=["in-order", "across-leaves"])
@pytest.mark.parametrize("policy,instance,extra", [("static", "ep16-tp1", {}), ("static", "afd12:4-tp1", {}),
                                                   ("two-phase", "afd12:4-tp1", {"switch_to": "tp8"})])
def test_a_slower_fabric_never_makes_generation_faster(gpus, policy, instance, extra):
    trace = heavy_tailed_trace(24, 8, 4096, seed=3)
    times = {}
    for name, fabric, config in (("ft", "ft", None), ("ft-os", "ft-os", None),
                                 ("ft-100g", "ft", SimConfig(link_bps=100e9))):
        stage, _, _ = _stage(fabric, gpus, config=config, policy=policy, instance=instance, **extra)
        times[name] = stage.run(trace).time_s
    assert times["ft"] <= times["ft-os"] and times["ft"] <= times["ft-100g"], times


@pytest.fixture(scope="module")
def section_732():
    """§7.3.2 at one eighth of the scale: 12 AFD instances (3x8 attention + 2x8 FFN GPUs) -> 60 TP8."""
    trace = heavy_tailed_trace(len(POD_ALIGNED) * 4 // 8, 8, 8192, seed=3)
    out = {}
    for fabric in ("rfabric", "ft-os"):
        stage, net, driver = _stage(fabric, POD_ALIGNED, MOE235, total=512, policy="two-phase",
                                    instance="afd24:16-tp8", switch_to="tp8", switch_at=0.5, max_num_seqs=1536)
        out[fabric] = (stage.run(trace), driver)
    return out


def test_section_7_3_2_afd_to_tp8_reports_per_phase_times_on_rfabric_and_ft_os(section_732):
    for fabric, (res, _) in section_732.items():
        b = res.breakdown_s
        assert b["decode/12x afd24:16-tp8"] > 0 and b["decode/60x tp8"] > 0, fabric
        assert b["switch_s"] > b["reload_s"] > 0 and b["kv_migration_s"] > 0, fabric
        assert res.detail["reconfigurations"][0]["methods"].get("transfer", 0) > 0  # KV moved over the fabric
        phases = b["decode/12x afd24:16-tp8"] + b["switch_s"] + b["kv_migration_s"] + b["decode/60x tp8"]
        assert phases == pytest.approx(res.time_s, rel=1e-9)
        assert res.samples == 1920 and res.tokens > 0
    rf, os3 = section_732["rfabric"][0].breakdown_s, section_732["ft-os"][0].breakdown_s
    # the M2N exchange crosses FT-OS's 3:1 uplinks; RFabric's PoD fabric carries it at the NIC rate
    assert rf["decode/12x afd24:16-tp8"] < os3["decode/12x afd24:16-tp8"]
    assert rf["kv_network_s"] < os3["kv_network_s"]
    assert rf["switch_s"] == os3["switch_s"]  # weights come from host memory on both


def test_rfabric_changes_the_gen_plan_only_at_deployment_boundaries(section_732):
    res, driver = section_732["rfabric"]
    deployments = res.detail["deployments"]
    assert res.intents == len(deployments) == 2 and res.reconfigurations >= 1
    boundaries = {d["t_s"] for d in deployments}
    gen = [d for d in driver.decisions if d.stage == "gen"]
    assert any(d.action == "commit" for d in gen)
    assert all(d.at_s in boundaries for d in gen if d.action == "commit")
    first = next(d for d in gen if d.action == "commit")
    assert res.breakdown_s["fabric_wait_s"] == pytest.approx(first.change.switching_s)  # AFD waits for circuits


def test_gen_pods_are_isolated_so_a_kv_transfer_between_them_never_lands():
    stage, _, driver = _stage("rfabric", POD_ALIGNED, MOE235, total=512, policy="static", instance="afd24:16-tp8")
    seam = stage.seam
    seam.start(0.0)
    seam.deploy(homogeneous(parse_config("afd24:16-tp8"), len(POD_ALIGNED)), 0.0)
    inside, across = Transfer((0, 1), (8, 9), 1e9), Transfer((0, 1), (240, 241), 1e9)  # local 240 = PoD 1
    t_in, t_across = seam.transfer_times_s([inside, across], 0.0)
    assert math.isfinite(t_in) and t_across == math.inf


def test_on_rfabric_afd_instances_stay_inside_pods_and_generate_as_fast_as_on_ft():
    # 512 GPUs = two PoDs; 12 instances of 40 GPUs packed end to end would put GPUs 240-279 in
    # both, and that instance's attention-FFN traffic would queue for OCS-Core circuits.
    trace = heavy_tailed_trace(64, 8, 4096, seed=1)
    times = {}
    for fabric in ("ft", "rfabric"):
        stage, net, _ = _stage(fabric, range(512), MOE57, total=512, policy="static", instance="afd24:16-tp8")
        res = stage.run(trace)
        times[fabric] = res.time_s
        assert res.detail["initial_layout"] == "12x afd24:16-tp8"
    pods = [{net.fabric.topology.pod_of_gpu(g) for g in inst.gpu_ids}
            for inst in stage._layout(parse_config("afd24:16-tp8")).instances]
    assert all(len(p) == 1 for p in pods)
    assert times["rfabric"] <= times["ft"] * 1.005  # packed across the boundary: 3.9% slower


def test_auto_placement_keeps_whichever_of_aligned_and_packed_generates_faster():
    # 480 GPUs over two PoDs (256 + 224): packed holds 12 AFD instances of 40 GPUs, one straddling
    # the boundary; inside PoDs only 6 + 5 fit. Neither is right at every scale, so auto runs both.
    trace = heavy_tailed_trace(48, 8, 4096, seed=3)
    times, layouts = {}, {}
    for placement in ("aligned", "packed", "auto"):
        stage, net, _ = _stage("rfabric", range(480), MOE57, total=512, policy="static", instance="afd24:16-tp8",
                               placement=placement)
        res = stage.run(trace)
        times[placement], layouts[placement] = res.time_s, res.detail["initial_layout"]
    assert layouts["aligned"] == "11x afd24:16-tp8" and layouts["packed"] == "12x afd24:16-tp8"
    assert times["aligned"] != pytest.approx(times["packed"], rel=1e-3)  # the choice matters here
    best = min(("aligned", "packed"), key=times.get)
    assert layouts["auto"] == layouts[best] and times["auto"] == pytest.approx(times[best], rel=1e-9)
    assert res.detail["placement"]["chosen"] == {"afd24:16-tp8": best}
    assert set(res.detail["placement"]["probe_s"]["afd24:16-tp8"]) == {"aligned", "packed"}
    with pytest.raises(ConfigError, match="placement"):
        _stage("rfabric", range(480), MOE57, total=512, policy="static", instance="afd24:16-tp8", placement="pods")


def test_a_second_run_reuses_every_fabric_timing():
    stage, net, _ = _stage("ft-os", ACROSS_LEAVES, policy="static", instance="ep16-tp1")
    stage.run(heavy_tailed_trace(24, 8, 4096, seed=1))
    misses = net.stats.misses
    stage.run(heavy_tailed_trace(24, 8, 4096, seed=2))
    assert net.stats.misses == misses


def test_orchestrl_plans_with_a_forecast_never_read_from_the_trace():
    stage, _, _ = _stage("ft-os", range(32), policy="orchestrl", instance="ep16-tp1")
    first = stage.run(heavy_tailed_trace(16, 8, 4096, seed=1))
    second = stage.run(heavy_tailed_trace(16, 8, 4096, seed=2))
    assert first.detail["forecast"].startswith("prior") and second.detail["forecast"] == "the previous run's lengths"
    assert first.samples == second.samples == 128
    assert first.detail["initial_layout"] == "2x ep16-tp1"


@pytest.mark.parametrize("kw,field", [({"policy": "fastest"}, "policy"), ({"instance": "tp1"}, "instance"),
                                      ({"policy": "static"}, "instance"),
                                      ({"policy": "two-phase", "instance": "tp8"}, "switch_to")])
def test_bad_settings_are_refused_naming_the_field(kw, field):
    with pytest.raises(ConfigError) as err:
        _stage("ft", range(64), MOE235, **kw)
    assert err.value.field == field


@pytest.mark.parametrize("gpus", [range(12), [0, 0, *range(2, 8)], range(60, 68)])
def test_generation_gpus_must_be_whole_servers_of_the_fabric(gpus):
    net = NetworkSim("ft", gpus=64)
    with pytest.raises(ConfigError) as err:
        GenerationStage(MOE57, gpus, H800, net, policy="static", instance="tp8")
    assert err.value.field == "gpus"
