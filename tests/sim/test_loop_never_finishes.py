"""A stage that never finishes stops the run with its name, instead of the next stage starting at infinity."""

from __future__ import annotations

import math

import pytest

from orchestrl.compute_sched.traces import heavy_tailed_trace
from orchestrl.sim.loop import StageNeverFinishes, Stages, run_iterations
from orchestrl.sim.stages.base import StageResult


class _Fixed:
    """A stage double with a fixed time (the loop is what is tested here)."""

    def __init__(self, name: str, time_s: float, breakdown: dict | None = None) -> None:
        self.name, self.time_s, self.breakdown = name, time_s, breakdown or {}
        self.starts: list[float] = []

    def run(self, *args) -> StageResult:
        self.starts.append(args[-1])
        return StageResult(self.name, self.time_s, self.breakdown)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_an_infinite_weight_sync_is_named_and_no_stage_starts_at_infinity(mode):
    # e.g. RFabric at 4,096 GPUs: the weight-sync plan leaves some Phase A flows without a path
    gen, train = _Fixed("gen", 10.0), _Fixed("train", 5.0)
    sync = _Fixed("weight-sync", math.inf, {"phase_a": math.inf, "phase_b": 2.0})
    stages = Stages(gen, train, sync, lambda trace, res: None)
    with pytest.raises(StageNeverFinishes, match=r"iteration 0: the weight-sync stage never finishes.*phase_a=inf"):
        run_iterations(stages, lambda k: heavy_tailed_trace(2, 4, 1024, seed=k), 3, mode)
    assert all(math.isfinite(t) for t in gen.starts + train.starts)
