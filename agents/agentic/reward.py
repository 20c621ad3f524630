"""Reward as a service (RollArt §4.3): stateless reward functions behind HTTP, and the clients that call them.

* :data:`REWARD_FUNCTIONS`: name -> ``f(trajectory document) -> float``; pure, so any replica answers.
* :func:`reward_app`: a FastAPI app (the project's HTTP stack) with ``POST /reward/{name}``, a
  concurrency limit (requests beyond it wait, then get 503 after ``queue_timeout_s``), a per-call
  timeout (504), ``/healthz``; run it with uvicorn (``python -m orchestrl.agents.agentic.reward``).
* :class:`HttpRewardClient`: httpx with a timeout per attempt and ``retries`` with backoff; a service
  that is down or slow ends in :class:`RewardFailed` within ``timeout_s * (retries + 1)`` plus backoff,
  never a hang. :class:`LocalRewardClient` runs the same functions in-process (tests, one machine).

The runtime calls the client as a task when a trajectory completes, so reward computation overlaps
the rollouts still running.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any, Callable, Mapping

from pydantic import BaseModel, Field

from orchestrl.fabric.errors import OrchestrlError

__all__ = ["REWARD_FUNCTIONS", "RewardFailed", "LocalRewardClient", "HttpRewardClient", "reward_app"]


class RewardRequest(BaseModel):
    """What the service reads of a trajectory: its id, the environment's return and its turns' tokens."""

    trajectory_id: str = ""
    env_reward: float = 0.0
    turns: list[tuple[int, int]] = Field(default_factory=list)


class RewardFailed(OrchestrlError):
    """The reward could not be computed (service down, slow, or an error), after every retry."""


def _env_return(doc: Mapping[str, Any]) -> float:
    """The environment's own return (FrozenLake's goal, the math task's correctness)."""
    return float(doc.get("env_reward", 0.0))


def _length_penalised(doc: Mapping[str, Any]) -> float:
    """Return minus a small penalty per 1,000 output tokens (a common shaping)."""
    out = sum(int(o) for _, o in doc.get("turns", ()))
    return float(doc.get("env_reward", 0.0)) - 0.01 * out / 1000.0


REWARD_FUNCTIONS: dict[str, Callable[[Mapping[str, Any]], float]] = {
    "env_return": _env_return, "length_penalised": _length_penalised}


class LocalRewardClient:
    """The reward functions in-process, with the same interface (and an optional delay, for tests)."""

    def __init__(self, function: str = "env_return", delay_s: float = 0.0) -> None:
        if function not in REWARD_FUNCTIONS:
            raise OrchestrlError(f"unknown reward function {function!r}; known: {', '.join(REWARD_FUNCTIONS)}")
        self.fn, self.delay_s = REWARD_FUNCTIONS[function], delay_s

    async def reward(self, doc: Mapping[str, Any]) -> float:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return self.fn(doc)

    async def close(self) -> None:
        return None


class HttpRewardClient:
    """Call the reward service with a timeout per attempt and bounded retries (exponential backoff)."""

    def __init__(self, url: str, function: str = "env_return", *, timeout_s: float = 5.0, retries: int = 2,
                 backoff_s: float = 0.2) -> None:
        import httpx

        self.url = url.rstrip("/") + f"/reward/{function}"
        self.timeout_s, self.retries, self.backoff_s = timeout_s, retries, backoff_s
        self._client = httpx.AsyncClient(timeout=timeout_s)
        self.failures = 0

    async def reward(self, doc: Mapping[str, Any]) -> float:
        import httpx

        last = ""
        for attempt in range(self.retries + 1):
            try:
                r = await asyncio.wait_for(self._client.post(self.url, json=dict(doc)), self.timeout_s)
                if r.status_code == 200:
                    return float(r.json()["reward"])
                last = f"HTTP {r.status_code}: {r.text[:200]}"
            except (httpx.HTTPError, asyncio.TimeoutError, ValueError, KeyError) as exc:
                last = f"{type(exc).__name__}: {exc}"
            self.failures += 1
            if attempt < self.retries:
                await asyncio.sleep(self.backoff_s * (2 ** attempt))
        raise RewardFailed(f"{self.url}: {self.retries + 1} attempts failed; last: {last}")

    async def close(self) -> None:
        await self._client.aclose()


def reward_app(max_concurrency: int = 64, call_timeout_s: float = 10.0, queue_timeout_s: float = 5.0,
               delay_s: float = 0.0):
    """The reward service as a FastAPI app (see the module note); ``delay_s`` simulates a slow model judge."""
    from fastapi import FastAPI, HTTPException

    app = FastAPI(title="orchestrl reward service", version="1")
    sem = asyncio.Semaphore(max_concurrency)
    stats = {"served": 0, "rejected": 0, "timeouts": 0}

    @app.get("/healthz")
    async def healthz() -> dict:
        return {"ok": True, **stats}

    @app.post("/reward/{name}")
    async def reward(name: str, body: RewardRequest) -> dict:
        fn = REWARD_FUNCTIONS.get(name)
        if fn is None:
            raise HTTPException(404, f"unknown reward function {name!r}; known: {', '.join(REWARD_FUNCTIONS)}")
        try:
            await asyncio.wait_for(sem.acquire(), queue_timeout_s)
        except asyncio.TimeoutError:
            stats["rejected"] += 1
            raise HTTPException(503, f"over the concurrency limit of {max_concurrency} for {queue_timeout_s} s")
        try:
            t0 = time.perf_counter()
            if delay_s:
                await asyncio.sleep(delay_s)
            value = await asyncio.wait_for(asyncio.to_thread(fn, body.model_dump()), call_timeout_s)
            stats["served"] += 1
            return {"reward": value, "seconds": time.perf_counter() - t0}
        except asyncio.TimeoutError:
            stats["timeouts"] += 1
            raise HTTPException(504, f"reward function {name!r} took over {call_timeout_s} s")
        finally:
            sem.release()

    return app


def main(argv=None) -> int:
    import argparse

    import uvicorn

    ap = argparse.ArgumentParser(description="Serve the stateless reward functions over HTTP.")
    ap.add_argument("--listen", default="127.0.0.1:8088", metavar="HOST:PORT")
    ap.add_argument("--max-concurrency", type=int, default=64)
    ap.add_argument("--delay-s", type=float, default=0.0, help="added latency per call (to test a slow judge)")
    args = ap.parse_args(argv)
    host, _, port = args.listen.rpartition(":")
    uvicorn.run(reward_app(args.max_concurrency, delay_s=args.delay_s), host=host or "127.0.0.1", port=int(port),
                log_level="warning")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
