"""The makespan lower bound holds for every schedule, and the model properties it rests on hold."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrl.compute_sched.bounds import makespan_lower_bound, solo_decode_s
from orchestrl.compute_sched.calibration import perf_model
from orchestrl.compute_sched.clairvoyant import clairvoyant_schedule, mixed_layout, place_by_true_length
from orchestrl.compute_sched.layout import InstanceConfig
from orchestrl.compute_sched.replay import replay
from orchestrl.compute_sched.traces import heavy_tailed_trace
from orchestrl.fabric.errors import ConfigError

PM = perf_model("Qwen2.5-14B", "H800")
TPS = (1, 2, 4, 8)
CFGS = [InstanceConfig("tp", tp=t) for t in TPS]


def _requests(trace):
    return [(q.prompt_tokens, q.output_tokens, q.generated_tokens) for q in trace.requests]


@settings(max_examples=60, deadline=None)
@given(tp=st.sampled_from(TPS), b=st.integers(1, 512), db=st.integers(0, 64), c=st.integers(1, 4_000_000),
       dc=st.integers(0, 400_000), overlap=st.floats(0.0, 1.0), q=st.floats(1e-6, 1.5e-4), s=st.floats(5e-4, 1.2e-2))
def test_step_time_never_falls_as_batch_or_context_grows_and_is_convex_in_context(tp, b, db, c, dc, overlap, q, s):
    """What the lower bound assumes of the performance model, for any calibration the fit may choose."""
    pm = PM.with_calibration(replace(PM.cal, host_overlap=overlap, seq_overhead_s=q, step_overhead_s=s))
    cfg = InstanceConfig("tp", tp=tp)
    f = pm.decode_step_s
    assert f(cfg, b + db, c) >= f(cfg, b, c) - 1e-12
    assert f(cfg, b, c + dc) >= f(cfg, b, c) - 1e-12
    mid = f(cfg, b, c + dc / 2)
    assert mid <= (f(cfg, b, c) + f(cfg, b, c + dc)) / 2 + 1e-12  # convex in the context


@pytest.mark.parametrize("gpus,prompts,cap,seed", [(8, 64, 20480, 11), (16, 128, 15360, 12)])
def test_no_schedule_beats_the_lower_bound(gpus, prompts, cap, seed):
    trace = heavy_tailed_trace(prompts, 8, cap, seed=seed)
    lb = makespan_lower_bound(PM, gpus, _requests(trace), CFGS)
    assert lb.seconds == max(lb.longest_request_s, lb.throughput_s) > 0
    runs = [replay(trace, PM, gpus, p, forecast="oracle").makespan_s
            for p in ("static-tp:1", "static-tp:2", "static-tp:4", "static-tp:8", "orchestrl", "planner-exact")]
    clair = clairvoyant_schedule(trace, PM, gpus, tps=TPS, switch_fractions=(0.5,))
    assert min(runs + [clair.makespan_s]) >= lb.seconds
    assert clair.makespan_s <= min(runs[:4]) * 1.05  # true-length placement is at least about as good as a split


def test_the_longest_request_alone_is_fastest_on_the_largest_instance():
    assert solo_decode_s(PM, CFGS[3], 400, 12_000) < solo_decode_s(PM, CFGS[1], 400, 12_000)
    lb = makespan_lower_bound(PM, 8, [(400, 12_000, 0)], CFGS)
    assert lb.longest_request_config == "tp8" and lb.longest_request_s == pytest.approx(
        solo_decode_s(PM, CFGS[3], 400, 12_000))


def test_lower_bound_refuses_impossible_inputs():
    with pytest.raises(ConfigError, match="configs"):
        makespan_lower_bound(PM, 8, [(400, 1000, 0)], [InstanceConfig("tp", tp=16)])
    with pytest.raises(ConfigError, match="requests"):
        makespan_lower_bound(PM, 8, [], CFGS)


def test_true_length_placement_puts_the_longest_where_a_token_is_cheapest_and_evens_the_rest():
    lay = mixed_layout(InstanceConfig("tp", tp=2), InstanceConfig("tp", tp=8), 8, 16)
    lengths = {"long": 15_000, **{f"r{i}": 1_000 for i in range(40)}}
    placed = place_by_true_length(lay, lengths)
    assert lay.instances[placed["long"]].config.tp == 8
    per_gpu = [sum(lengths[r] for r, k in placed.items() if k == i) / inst.config.gpus
               for i, inst in enumerate(lay.instances)]
    assert max(per_gpu) - min(per_gpu) <= 1_000  # no instance more than one request's share ahead
