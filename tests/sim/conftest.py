"""Fixtures shared by the JigsawRL RLSim tests (test_jigsaw*.py)."""

from __future__ import annotations

import pytest

from orchestrl.sim.multiplex import runner
from orchestrl.sim.multiplex.workload import PipelineSpec


@pytest.fixture(scope="module")
def two_steps():
    """Two small Qwen3-4B GSM8K pipelines, two steps, on 4 H100 workers and on 2 (the halves' steps)."""
    specs = [PipelineSpec(n, "Qwen3-4B", "gsm8k", tp=1, prompts=8, seed=i + 1) for i, n in enumerate("AB")]
    return ([runner.simulate_steps(s, "H100", 4, 2) for s in specs],
            [runner.simulate_steps(s, "H100", 2, 2) for s in specs])
