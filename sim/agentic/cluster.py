"""RollArt at cluster scale in RLSim: the runtime's own objects on the virtual clock, and the systems compared.

A :class:`Cluster` is generation pools (GPU type, workers, TP) for one model, the task mix of RollArt
§7.1 (prefill-heavy multi-turn FrozenLake and decode-heavy single-turn GEM-math-like), a training
pool (H800s; step time from model FLOPs at an MFU) and the cross-cluster link. :func:`run_system`
runs one system for a few iterations with the same workers, environments, proxy and buffer the
real runtime uses, and returns its mean step time and throughput (prompt and response tokens of the
trained batch per second, §7.1's metric):

* ``rollart``: trajectory-level rollout, asynchronous training under the per-trajectory ``bound``,
  groups kept in flight beyond the batch, asynchronous cross-cluster weight update, redundancy;
* ``verl+``: veRL with RollArt's asynchronous reward and environment interaction and reward as a
  service: trajectory-level rollout, but synchronous -- rollout, then weight sync (synchronous copy),
  then training, every step;
* ``streamrl``: one step off-policy: the next batch's rollout overlaps training on the last one.
"""

from __future__ import annotations

import asyncio
import math
from dataclasses import dataclass, field, replace
from typing import Sequence

from orchestrl.agents.agentic.envs import LatencySpec
from orchestrl.agents.agentic.proxy import LLMProxy
from orchestrl.agents.agentic.reward import LocalRewardClient
from orchestrl.agents.agentic.runtime import RolloutRuntime, TaskSpec
from orchestrl.agents.agentic.weights import LinkSpec, WeightUpdater
from orchestrl.agents.agentic.worker import sim_worker
from orchestrl.compute_sched.agentic.routing import HwMapping
from orchestrl.compute_sched.hardware import load_gpu, load_model
from orchestrl.sim.agentic.clock import run_virtual

__all__ = ["Pool", "Cluster", "TASKS", "run_system", "SYSTEMS", "TP"]

SYSTEMS = ("rollart", "verl+", "streamrl")
TP = {"Qwen3-8B": 1, "Qwen3-14B": 2, "Qwen3-32B": 4}  # RollArt §7.1's rollout TP degrees

#: RollArt §2.1, Table 1: FrozenLake many turns (prefill-heavy), GEM-math few and long (decode-heavy).
TASKS = {
    "frozenlake": TaskSpec("frozenlake", "FrozenLake8x8-v1", "frozenlake", max_turns=30, reply_median_tokens=120,
                           reply_sigma=0.5, prompt_tokens=600,
                           latency=LatencySpec(reset_median_s=1.0, step_median_s=0.2, sigma=1.0)),
    "gem-math": TaskSpec("gem-math", "orchestrl/MathSingleTurn-v0", "gem-math", max_turns=1, reply_median_tokens=3000,
                         reply_sigma=0.6, max_reply_tokens=16384, prompt_tokens=300,
                         latency=LatencySpec(reset_median_s=0.5, step_median_s=0.5, sigma=1.0)),
}


@dataclass(frozen=True)
class Pool:
    name: str
    gpu: str
    gpus: int


@dataclass(frozen=True)
class Cluster:
    model: str = "Qwen3-8B"
    pools: tuple[Pool, ...] = (Pool("h800", "H800", 64),)
    mapping: dict = field(default_factory=dict)  # tag -> pools in priority order (default: every pool)
    tasks: tuple[str, ...] = ("frozenlake", "gem-math")
    train_gpus: int = 32
    train_mfu: float = 0.35
    batch_groups: int = 16  # GRPO groups per training batch (§7.1: 512 = 64 x 8; scaled down by default)
    group_size: int = 8
    cross_cluster_gbps: float = 200.0
    intra_cluster_gbps: float = 400.0
    latency_scale: float = 1.0  # multiplies every task's environment latency
    max_batch: int = 128


def _tasks(c: Cluster) -> list[TaskSpec]:
    out = []
    for name in c.tasks:
        t = TASKS[name]
        if c.latency_scale != 1.0:
            lat = t.latency
            t = replace(t, latency=replace(lat, reset_median_s=lat.reset_median_s * c.latency_scale,
                                           step_median_s=lat.step_median_s * c.latency_scale))
        out.append(t)
    return out


def _build(c: Cluster, bound: int, redundancy: float, asynchronous_weights: bool, seed: int):
    tp = TP.get(c.model, 1)
    workers = [sim_worker(f"{p.name}-{i}", p.name, p.gpu, c.model, tp, c.max_batch)
               for p in c.pools for i in range(p.gpus // tp)]
    default = tuple(p.name for p in c.pools)
    mapping = HwMapping({k: tuple(x for x in v if x in default) or default for k, v in c.mapping.items()}, default)
    proxy = LLMProxy(workers, mapping)
    m = load_model(c.model)
    weights = WeightUpdater(LinkSpec(m.weight_bytes, c.cross_cluster_gbps * 1e9, c.intra_cluster_gbps * 1e9),
                            asynchronous=asynchronous_weights)
    rt = RolloutRuntime(proxy, LocalRewardClient(delay_s=0.5), _tasks(c), group_size=c.group_size,
                        redundancy=redundancy, bound=bound, seed=seed, max_replacements=16, weights=weights)
    return rt, proxy


def _train_s(c: Cluster, tokens: float) -> float:
    m, g = load_model(c.model), load_gpu("H800")
    return 6.0 * m.active_params * tokens / (c.train_gpus * g.bf16_flops * c.train_mfu) + 5.0  # + optimizer step


def _batch_tokens(trajs) -> float:
    return float(sum(t.turns[-1][0] + t.turns[-1][1] for t in trajs if t.turns))


async def _run(c: Cluster, system: str, iterations: int, bound: int, redundancy: float, async_weights: bool,
               seed: int) -> dict:
    rt, proxy = _build(c, bound, redundancy, async_weights and system == "rollart", seed)
    proxy.start()
    loop = asyncio.get_running_loop()
    want = c.batch_groups
    steps, tokens = [], []
    gid = 0

    async def batch() -> list:
        nonlocal gid
        groups = []
        for _ in range(want):
            gid += 1
            groups.append(rt.group(f"g{gid}", put=False))
        return [t for g in await asyncio.gather(*groups) for t in g]

    try:
        if system == "rollart":
            def train_s(got: list) -> float:
                tokens.append(_batch_tokens(got))
                return _train_s(c, tokens[-1])
            await rt.train(iterations, want, train_s, groups_in_flight=math.ceil(want * (1 + bound)))
            steps = list(rt.metrics.step_s)
        elif system == "verl+":
            for v in range(iterations):
                t0 = loop.time()
                got = await batch()
                proxy.suspend()
                await rt.weights.update(v + 1)
                proxy.resume(v + 1)
                await asyncio.sleep(_train_s(c, _batch_tokens(got)))
                steps.append(loop.time() - t0)
                tokens.append(_batch_tokens(got))
        elif system == "streamrl":
            prev = None
            for v in range(iterations):
                t0 = loop.time()
                roll = loop.create_task(batch())
                if prev is not None:
                    await asyncio.sleep(_train_s(c, _batch_tokens(prev)))
                got = await roll
                proxy.suspend()
                await rt.weights.update(v + 1)
                proxy.resume(v + 1)
                prev = got
                steps.append(loop.time() - t0)
                tokens.append(_batch_tokens(got))
        else:
            raise ValueError(f"unknown system {system!r}; use one of {SYSTEMS}")
    finally:
        rt.weights.close()
        await proxy.stop()
    warm = steps[1:] if len(steps) > 1 else steps
    warm_tok = tokens[1:] if len(tokens) > 1 else tokens
    return {"system": system, "step_s": sum(warm) / len(warm), "throughput_tps": sum(warm_tok) / sum(warm),
            "steps": steps, "rollout_gpus": sum(p.gpus for p in c.pools), "routing_p99_ms": proxy.routing_p99_ms(),
            "weights_waited_s": list(rt.weights.waited_s)}


def run_system(c: Cluster, system: str, iterations: int = 4, bound: int = 1, redundancy: float = 0.0,
               async_weights: bool = True, seed: int = 0) -> dict:
    """Run ``system`` on cluster ``c`` for ``iterations`` steps in simulated time; return step time and throughput."""
    return run_virtual(_run(c, system, iterations, bound, redundancy, async_weights, seed))
