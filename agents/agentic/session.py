"""Build a whole agentic run from a :class:`~agents.agentic.config.RunConfig` and run it (one event loop).

Used by ``orchestrl agentic run``, the benchmark and RLSim's RollArt experiments: workers per pool on
the simulated engine, the proxy, the reward client (in-process or HTTP), the weight updater, and the
rollout runtime's asynchronous loop.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any, Callable

from orchestrl.agents.agentic.config import RunConfig
from orchestrl.agents.agentic.proxy import LLMProxy
from orchestrl.agents.agentic.reward import HttpRewardClient, LocalRewardClient
from orchestrl.agents.agentic.runtime import RolloutRuntime
from orchestrl.agents.agentic.weights import LinkSpec, WeightUpdater
from orchestrl.agents.agentic.worker import sim_worker
from orchestrl.fabric.errors import ConfigError

__all__ = ["build", "run_config"]


def build(cfg: RunConfig, progress: Callable[[str], None] | None = None) -> tuple[RolloutRuntime, LLMProxy]:
    """Create the workers, proxy, reward client, weight updater and runtime of ``cfg`` (inside a running loop)."""
    workers = [sim_worker(f"{p.name}-{i}", p.name, p.gpu, cfg.model, p.tp, p.max_batch,
                          kv_reuse=cfg.resume == "kv_reuse")
               for p in cfg.pools for i in range(p.workers)]
    proxy = LLMProxy(workers, cfg.mapping)
    reward = (HttpRewardClient(cfg.reward_url, cfg.reward_function, timeout_s=cfg.reward_timeout_s,
                               retries=cfg.reward_retries) if cfg.reward_url else LocalRewardClient(cfg.reward_function))
    w = cfg.weights
    mover = None
    if w.get("move_bytes"):  # real bytes between processes: the collectives relay or Mooncake
        from orchestrl.agents.agentic.transfer import CollectivesRelay, MooncakeRelay
        n = int(w.get("model_bytes", 16.4e9))
        mover = (MooncakeRelay(n) if w.get("backend") == "mooncake" else
                 CollectivesRelay(n, generators=w.get("generators", 2), cross_bps=w.get("cross_cluster_bps", 200e9),
                                  intra_bps=w.get("intra_cluster_bps", 400e9)))
    fabric = _fabric_agent(cfg)
    fab = {"agent": fabric, "job": cfg.fabric["job"], "train_gpus": cfg.fabric["train_gpus"],
           "gen_gpus": cfg.fabric["gen_gpus"]} if fabric is not None else {}
    weights = WeightUpdater(LinkSpec(w.get("model_bytes", 16.4e9), w.get("cross_cluster_bps", 200e9),
                                     w.get("intra_cluster_bps", 400e9)),
                            asynchronous=w.get("asynchronous", True), backend=w.get("backend", "relay"), mover=mover,
                            **fab)
    rt = RolloutRuntime(proxy, reward, list(cfg.tasks), group_size=cfg.group_size, redundancy=cfg.redundancy,
                        bound=cfg.bound, seed=cfg.seed, max_replacements=cfg.max_replacements, weights=weights,
                        progress=progress)
    return rt, proxy


def _fabric_agent(cfg: RunConfig) -> Any:
    """The host agent that announces each cross-cluster copy to the control proxy, if the run file names one."""
    if cfg.fabric is None:
        return None
    name = cfg.fabric["token_env"]
    token = os.environ.get(name)
    if not token:
        raise ConfigError(cfg.source, "fabric.token_env", f"environment variable {name} is not set",
                          f"export {name}=<the token POST /v1/jobs returned for job {cfg.fabric['job']!r}>")
    from orchestrl.agents.host_agent import HostAgent
    return HostAgent(cfg.fabric["proxy_url"], token, job=cfg.fabric["job"])


async def run_config(cfg: RunConfig, progress: Callable[[str], None] | None = None) -> dict:
    """Run ``cfg`` to its last iteration; return the summary (ledger, failures, staleness, routing, ...)."""
    rt, proxy = build(cfg, progress)
    proxy.start()
    loop = asyncio.get_running_loop()
    t0 = loop.time()
    try:
        out = await rt.train(cfg.iterations, cfg.batch_groups, cfg.train_step_s)
    finally:
        rt.weights.close()
        await proxy.stop()
        await rt.reward_client.close()
        agent = rt.weights.agent
        if agent is not None:  # send what is queued, then stop its thread (off the loop: it may wait on the network)
            await asyncio.to_thread(agent.flush, 5.0)
            await asyncio.to_thread(agent.close)
    out["wall_s"] = loop.time() - t0
    out["weights_waited_s"] = list(rt.weights.waited_s)
    if agent is not None:
        st = agent.stats()
        out["fabric"] = {"intents_announced": rt.weights.intents, "intents_answered": st.sent_intents,
                         "events_sent": st.sent_events,
                         "decisions": [d.get("decision") for d in agent.decisions], "errors": st.errors,
                         "last_error": st.last_error}
    if rt.weights.mover is not None:
        out["weights_bytes_moved"] = rt.weights.mover.bytes_moved
    return out
