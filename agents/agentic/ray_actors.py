"""The agentic runtime across machines on Ray (the ``ray`` extra): the same objects, as actors.

As ROLL does, environment managers run on CPU nodes and generation workers on GPU nodes:

* :class:`ProxyActor` (an async actor, placed on a GPU node with ``num_gpus``) holds the generation
  workers and the :class:`~agents.agentic.proxy.LLMProxy`; its ``generate`` is the proxy's;
* :class:`EnvActor` (an async actor per CPU node) runs :class:`~agents.agentic.runtime.EnvManager`
  trajectories unchanged, its LLM calls going to the proxy actor through :class:`RemoteProxy`;
* :func:`run_on_ray` spreads trajectories over the env actors and gathers the finished ones.

On one machine the same code runs in-process (:mod:`agents.agentic.runtime`); nothing here is
needed there.
"""

from __future__ import annotations

import asyncio
from typing import Any, Sequence

__all__ = ["RemoteProxy", "make_actors", "run_on_ray"]


class RemoteProxy:
    """What an :class:`EnvManager` needs of a proxy (``generate``, ``version``), over a Ray actor handle."""

    def __init__(self, handle: Any) -> None:
        self.handle = handle
        self.version = 0

    async def generate(self, trajectory_id: str, tag: str, prompt_tokens: int, max_tokens: int, text: str = "",
                       prompt_token_ids: tuple[int, ...] = ()):
        return await self.handle.generate.remote(trajectory_id, tag, prompt_tokens, max_tokens, text, prompt_token_ids)


def make_actors():
    """Define the actor classes (Ray is imported only here, so the runtime never needs it)."""
    import ray

    @ray.remote
    class ProxyActor:
        def __init__(self, pools: Sequence[tuple[str, str, int]], model: str, mapping: dict, default: tuple) -> None:
            self.args = (pools, model, mapping, default)
            self.proxy = None

        async def _ensure(self) -> None:
            if self.proxy is None:
                from orchestrl.agents.agentic.proxy import LLMProxy
                from orchestrl.agents.agentic.worker import sim_worker
                from orchestrl.compute_sched.agentic.routing import HwMapping
                pools, model, mapping, default = self.args
                ws = [sim_worker(f"{name}-{i}", name, gpu, model) for name, gpu, n in pools for i in range(n)]
                self.proxy = LLMProxy(ws, HwMapping({k: tuple(v) for k, v in mapping.items()}, tuple(default)))
                self.proxy.start()

        async def generate(self, trajectory_id: str, tag: str, prompt_tokens: int, max_tokens: int, text: str = "",
                           prompt_token_ids: tuple[int, ...] = ()):
            await self._ensure()
            return await self.proxy.generate(trajectory_id, tag, prompt_tokens, max_tokens, text, prompt_token_ids)

        async def routing_p99_ms(self) -> float:
            await self._ensure()
            return self.proxy.routing_p99_ms()

    @ray.remote
    class EnvActor:
        def __init__(self, proxy_handle: Any, seed: int) -> None:
            from orchestrl.agents.agentic.runtime import Policy
            self.proxy = RemoteProxy(proxy_handle)
            self.policy = Policy(seed)
            self.seed = seed

        async def run(self, task: Any, trajectory_ids: Sequence[str]) -> list[dict]:
            from orchestrl.agents.agentic.buffer import Trajectory
            from orchestrl.agents.agentic.runtime import EnvManager

            async def one(i: int, tid: str) -> dict:
                t = Trajectory(tid, "ray", task.tag, 0, 0.0)
                try:
                    await EnvManager(task, self.proxy, self.policy, self.seed * 100_003 + i).run(t)
                    return {"trajectory_id": tid, "turns": len(t.turns), "env_reward": t.env_reward, "ok": True}
                except Exception as exc:  # noqa: BLE001 - counted and named for the caller, never dropped
                    return {"trajectory_id": tid, "ok": False, "error": f"{type(exc).__name__}: {exc}"}
            return list(await asyncio.gather(*(one(i, tid) for i, tid in enumerate(trajectory_ids))))

    return ProxyActor, EnvActor


def run_on_ray(task: Any, trajectories: int, *, env_actors: int = 2, pools=(("h800", "H800", 2),),
               model: str = "Qwen3-8B", mapping: dict | None = None) -> list[dict]:
    """Run ``trajectories`` of ``task`` on ``env_actors`` env actors and one proxy actor; return each outcome."""
    import ray

    ProxyActor, EnvActor = make_actors()
    proxy = ProxyActor.remote(list(pools), model, mapping or {}, tuple(p[0] for p in pools))
    actors = [EnvActor.remote(proxy, seed) for seed in range(env_actors)]
    ids = [f"ray-{i}" for i in range(trajectories)]
    parts = [ids[a::env_actors] for a in range(env_actors)]
    return [r for part in ray.get([a.run.remote(task, p) for a, p in zip(actors, parts)]) for r in part]
