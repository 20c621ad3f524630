"""TEST FIXTURES, not product models: minimal real training and generation stages for loop tests.

The loop is tested against the stage contract (:class:`sim.stages.base.StageResult`) with the real
weight-sync stage and these two small stand-ins, so loop tests do not depend on the full training
and generation stage models:

* :class:`FixtureTrainingStage` -- compute at a fixed model FLOP utilisation (6 x active parameters
  x tokens) plus the data-parallel gradient all-reduce timed on the network simulator;
* :class:`FixtureGenerationStage` -- :func:`compute_sched.replay.replay` of the step on the
  simulated engine under the run's policy (no network).

Use them only in tests (``stages_factory=fixture_stages``); ``orchestrl sim run`` uses
:func:`sim.run.default_stages`.
"""

from __future__ import annotations

from orchestrl.compute_sched.perf import PerfModel
from orchestrl.compute_sched.replay import replay
from orchestrl.compute_sched.traces import Trace
from orchestrl.fabric.intent import Collective
from orchestrl.fabric.layout import ParallelLayout, parallel_groups
from orchestrl.sim.loop import Stages
from orchestrl.sim.network.netsim import NetworkSim
from orchestrl.sim.run import Simulation, weight_sync_stage
from orchestrl.sim.stages.base import StageResult

__all__ = ["FixtureTrainingStage", "FixtureGenerationStage", "fixture_stages"]


class FixtureTrainingStage:
    """TEST FIXTURE: compute at a fixed MFU plus the DP gradient all-reduce on the network simulator."""

    def __init__(self, model, layout: ParallelLayout, gpus, gpu, net: NetworkSim, mfu: float = 0.35) -> None:
        self.model, self.gpus, self.gpu, self.mfu = model, tuple(gpus), gpu, mfu
        # RFabric: the fixture times its all-reduce on circuits the controller plans for that pattern alone
        self.net = NetworkSim(net.fabric) if net.circuit_policy == "fixed" else net
        groups = tuple(tuple(g) for g in parallel_groups(layout, list(self.gpus))["dp-cp"])
        grad_bytes = 2.0 * model.params_total / (layout.tp * layout.pp)
        self.grad_sync = Collective("all-reduce", groups=groups, bytes_per_rank=grad_bytes)

    def run(self, batch: tuple[int, ...], now_s: float = 0.0) -> StageResult:
        tokens = float(sum(batch))
        compute = 6.0 * self.model.active_params * tokens / (len(self.gpus) * self.gpu.bf16_flops * self.mfu)
        sync = self.net.time_collective(self.grad_sync).time_s if len(self.grad_sync.groups[0]) > 1 else 0.0
        return StageResult("train", compute + sync, {"compute": compute, "dp-all-reduce": sync}, tokens=tokens,
                           samples=len(batch))


class FixtureGenerationStage:
    """TEST FIXTURE: the step replayed on compute_sched's simulated engine under the policy."""

    def __init__(self, model, gpus, gpu, policy: str = "orchestrl") -> None:
        self.perf, self.gpus, self.policy = PerfModel(model, gpu), tuple(gpus), policy

    def run(self, trace: Trace, now_s: float = 0.0) -> StageResult:
        r = replay(trace, self.perf, len(self.gpus), self.policy)
        out = sum(q.output_tokens for q in trace.requests)
        return StageResult("gen", r.makespan_s, {"decode": r.makespan_s}, tokens=float(out),
                           samples=len(trace.requests), detail={"layout": r.initial_layout})


def fixture_stages(sim: Simulation) -> Stages:
    """TEST FIXTURE stage factory: the two stand-ins above plus the real weight-sync stage."""
    cfg = sim.config
    train = FixtureTrainingStage(sim.model, cfg.train_layout(len(sim.train_gpus)), sim.train_gpus, sim.gpu, sim.net)
    gen = FixtureGenerationStage(sim.model, sim.gen_gpus, sim.gpu, cfg.generation.policy)
    return Stages(gen, train, weight_sync_stage(sim),
                  lambda trace, _: tuple(q.prompt_tokens + q.output_tokens for q in trace.requests))
