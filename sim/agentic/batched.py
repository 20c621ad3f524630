"""veRL's batch-level interaction at cluster scale (RollArt Fig. 5b): one barrier per turn over the batch."""

from __future__ import annotations

import asyncio

from orchestrl.sim.agentic.cluster import Cluster, _batch_tokens, _build, _train_s
from orchestrl.sim.agentic.clock import run_virtual

__all__ = ["run_batched"]


async def _run(c: Cluster, iterations: int) -> dict:
    rt, proxy = _build(c, 1, 0.0, False, 0)
    rt.group_size = c.batch_groups * c.group_size  # the barrier spans the whole batch
    proxy.start()
    loop = asyncio.get_running_loop()
    steps, tokens = [], []
    try:
        for v in range(iterations):
            t0 = loop.time()
            got = await rt.batched_group(f"b{v}", rt.tasks[0])
            proxy.suspend()
            await rt.weights.update(v + 1)
            proxy.resume(v + 1)
            await asyncio.sleep(_train_s(c, _batch_tokens(got)))
            steps.append(loop.time() - t0)
            tokens.append(_batch_tokens(got))
    finally:
        rt.weights.close()
        await proxy.stop()
    warm, wt = (steps[1:], tokens[1:]) if len(steps) > 1 else (steps, tokens)
    return {"system": "batched", "step_s": sum(warm) / len(warm), "throughput_tps": sum(wt) / sum(warm),
            "steps": steps}


def run_batched(c: Cluster, iterations: int = 3) -> dict:
    """Synchronous veRL with batch-level environment interaction; mean step time and throughput."""
    return run_virtual(_run(c, iterations))
