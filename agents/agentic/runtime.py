"""The agentic rollout runtime (RollArt §5.3): environment managers, redundant groups, the asynchronous loop.

Design note
-----------
Everything is an ``asyncio`` task on one event loop, so the same objects run in real time on one
machine and in simulated time under RLSim (:mod:`sim.agentic.clock` swaps the loop's clock):

* :class:`EnvManager` owns one environment instance and runs one trajectory: ``reset``, then
  observation -> LLM (through the proxy) -> action -> ``step`` until done. Every ``reset`` and
  ``step`` has a timeout; a raise, a hang or a malformed observation ends the trajectory as
  ``env_failure`` (named and counted) and the group launches a replacement on a fresh instance.
* :meth:`RolloutRuntime.group` launches ``group_size + redundancy`` managers and keeps the first
  ``group_size`` that finish (rewarded); the rest are cancelled and counted ``redundant``. A failed
  one is replaced at once (up to ``max_replacements``), so the margin survives the first failures.
* Reward: when a trajectory completes its reward is requested as a task (``reward_client``), so it
  overlaps the rollouts still running; then it enters the :class:`~agents.agentic.buffer.SampleBuffer`.
* :meth:`RolloutRuntime.train` is the asynchronous workflow: ``get_batch`` -> ``suspend`` ->
  ``model_update`` (the weight store's fetch) -> new version: trajectories started more than
  ``bound`` versions ago are aborted (``stale``) -> ``resume`` (unfinished turns resubmit with their
  context: recompute; on engines that keep KV they were frozen in place and continue) -> ``train_step``. Producers keep enough groups in flight to fill the next batch.
* :meth:`RolloutRuntime.batched_group` is veRL's batch-level interaction for comparison: a barrier
  per turn (every environment resets, then each turn all generate, then all step), through the same
  :class:`EnvManager` phases (``begin`` / ``ask`` / ``act``) as a trajectory-level run.

The simulated engine needs each reply's length: a :class:`Policy` stand-in draws it (and a legal
action text) per task; on GPUs the vLLM engine produces both. docs/agentic.md says which is which.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable

from orchestrl.agents.agentic.buffer import Ledger, SampleBuffer, Trajectory
from orchestrl.agents.agentic.envs import EnvFault, FaultyEnv, LatencySpec, make_env
from orchestrl.agents.agentic.proxy import GenerationFailed, LLMProxy
from orchestrl.agents.agentic.reward import RewardFailed
from orchestrl.compute_sched.admission import AsyncBound

__all__ = ["TaskSpec", "Policy", "EnvManager", "RolloutRuntime", "Metrics"]


@dataclass(frozen=True)
class TaskSpec:
    """One task of a run: its environment, routing tag, reply lengths and injected faults."""

    name: str
    env_id: str
    tag: str
    weight: float = 1.0  # share of groups
    max_turns: int = 20
    reply_median_tokens: float = 64.0  # lognormal reply length of the policy stand-in
    reply_sigma: float = 0.6
    max_reply_tokens: int = 4096
    prompt_tokens: int = 200  # system prompt and instructions before the first observation
    latency: LatencySpec = field(default_factory=LatencySpec)
    reset_timeout_s: float = 30.0
    step_timeout_s: float = 30.0


class Policy:
    """The stand-in for the LLM's text when the engine is simulated: a reply length and a legal action."""

    def __init__(self, seed: int = 0) -> None:
        self.rng = random.Random(seed)

    def act(self, task: TaskSpec, env: Any) -> tuple[int, str]:
        n = int(min(task.max_reply_tokens, max(1, task.reply_median_tokens * math.exp(self.rng.gauss(0, task.reply_sigma)))))
        names = getattr(getattr(env, "env", env), "names", None)
        if names:
            return n, f"thinking... <action>{self.rng.choice(names)}</action>"
        return n, f"the answer is {self.rng.randint(0, 10 ** 6)}"


def _tokens(text: Any) -> int:
    return max(1, len(str(text)) // 4)  # ~4 characters a token for English text and ASCII boards


@dataclass
class Metrics:
    """What a user watches: counts, staleness, idle time, reward latency, and the routing overhead."""

    env_failures: Counter = field(default_factory=Counter)  # by kind: raise, timeout, malformed
    replacements: int = 0
    redundant_aborted: int = 0
    stale_aborted: int = 0
    reward_latency_s: list = field(default_factory=list)
    staleness: Counter = field(default_factory=Counter)  # versions behind at training time -> trajectories
    step_s: list = field(default_factory=list)
    trained: int = 0


class EnvManager:
    """One environment instance, one trajectory at a time (see the module note)."""

    def __init__(self, task: TaskSpec, proxy: LLMProxy, policy: Policy, seed: int, tokenizer: Any = None) -> None:
        self.task, self.proxy, self.policy, self.seed = task, proxy, policy, seed
        # With a tokenizer (``encode(text) -> ids``, ``decode(ids) -> text``, e.g. transformers' AutoTokenizer)
        # the engine gets the conversation's token ids and the environment acts on the engine's own reply,
        # as on vLLM; without one (the simulated engine) the stand-in policy supplies length and action.
        self.tokenizer = tokenizer
        self.env = FaultyEnv(make_env(task.env_id), task.latency, random.Random(seed * 7919 + 1))
        self.context = 0  # tokens of the conversation so far (what the engine prefills)
        self.convo = ""  # its text (what a tokenizer encodes)

    async def begin(self) -> None:
        """``reset`` the environment (with its timeout); raise :class:`EnvFault` (named) if it fails."""
        t = self.task
        try:
            obs, _ = await asyncio.wait_for(self.env.reset(seed=self.seed), t.reset_timeout_s)
        except asyncio.TimeoutError:
            raise EnvFault(f"{t.env_id}: reset timed out after {t.reset_timeout_s} s") from None
        if obs is None:
            raise EnvFault(f"{t.env_id}: reset returned a malformed observation")
        self.context = t.prompt_tokens + _tokens(obs)
        self.convo = str(obs)

    async def ask(self, traj: Trajectory) -> tuple[Any, str]:
        """One LLM turn through the proxy; returns the completion and the action text the environment gets."""
        t = self.task
        n, text = self.policy.act(t, self.env)
        ids: tuple[int, ...] = ()
        if self.tokenizer is not None:
            ids = tuple(self.tokenizer.encode(self.convo))
            self.context = len(ids)
        comp = await self.proxy.generate(traj.trajectory_id, t.tag, self.context, n, text, prompt_token_ids=ids)
        if self.tokenizer is not None:
            text = comp.text  # the engine's reply is the action
        traj.turns.append((self.context, comp.output_tokens))
        traj.versions.add(self.proxy.version)
        return comp, text

    async def act(self, traj: Trajectory, comp: Any, text: str) -> bool:
        """``step`` the environment with ``text`` (with its timeout); True when the episode ended."""
        t = self.task
        try:
            obs, r, term, trunc, _ = await asyncio.wait_for(self.env.step(text), t.step_timeout_s)
        except asyncio.TimeoutError:
            raise EnvFault(f"{t.env_id}: step timed out after {t.step_timeout_s} s") from None
        if obs is None:
            raise EnvFault(f"{t.env_id}: step returned a malformed observation")
        traj.env_reward += float(r)
        self.context += comp.output_tokens + _tokens(obs)
        self.convo += f"{text}\n{obs}"
        return bool(term or trunc)

    async def run(self, traj: Trajectory) -> Trajectory:
        """Run ``traj`` to its end; raise :class:`EnvFault` (named) or ``GenerationFailed``."""
        await self.begin()
        for _ in range(self.task.max_turns):
            comp, text = await self.ask(traj)
            if await self.act(traj, comp, text):
                break
        return traj


class RolloutRuntime:
    """Groups of trajectories with redundancy, rewards as tasks, the bounded asynchronous loop."""

    def __init__(self, proxy: LLMProxy, reward_client: Any, tasks: list[TaskSpec], *, group_size: int,
                 redundancy: float = 0.0, bound: int = 1, seed: int = 0, max_replacements: int = 8,
                 weights: Any = None, progress: Callable[[str], None] | None = None, tokenizer: Any = None) -> None:
        self.proxy, self.reward_client, self.tasks = proxy, reward_client, tasks
        self.group_size, self.redundancy = group_size, redundancy
        self.ledger = Ledger()
        self.buffer = SampleBuffer(bound, self.ledger)
        self.bound = AsyncBound(bound)
        self.metrics = Metrics()
        self.rng = random.Random(seed)
        self.policy = Policy(seed)
        self.max_replacements = max_replacements
        self.weights = weights
        self.tokenizer = tokenizer  # for engines that take token ids (vLLM); see EnvManager
        self.progress = progress
        self._seq = 0
        self._running: dict[str, asyncio.Task] = {}
        self.concurrent_peak = 0

    def _new(self, group: str, task: TaskSpec) -> Trajectory:
        self._seq += 1
        loop = asyncio.get_running_loop()
        t = Trajectory(f"{group}.{self._seq}", group, task.tag, self.proxy.version, loop.time())
        self.ledger.start(t)
        self.bound.start(t.trajectory_id, t.version_started)
        return t

    async def _one(self, traj: Trajectory, task: TaskSpec) -> Trajectory:
        """Run one trajectory and its reward; end it in the ledger unless it succeeded (the group decides)."""
        try:
            await EnvManager(task, self.proxy, self.policy, self.rng.randrange(1 << 30), self.tokenizer).run(traj)
        except (EnvFault, GenerationFailed) as exc:
            self._failed(traj, exc)
            raise
        except asyncio.CancelledError:
            if traj.status == "running":
                self._end(traj, "aborted", traj.reason or "redundant")
            raise
        try:
            await self._reward(traj)
        except asyncio.CancelledError:
            self._end(traj, "aborted", traj.reason or "redundant")
            raise
        return traj

    async def _reward(self, traj: Trajectory) -> None:
        """Mark ``traj`` finished and request its reward; a failed reward ends it as ``reward_failed`` and raises."""
        loop = asyncio.get_running_loop()
        traj.finished_s = loop.time()
        traj.status = "finished"
        t0 = loop.time()
        try:
            traj.reward = await self.reward_client.reward({"trajectory_id": traj.trajectory_id,
                                                           "env_reward": traj.env_reward, "turns": traj.turns})
        except RewardFailed:
            self._end(traj, "aborted", "reward_failed")
            raise
        traj.reward_latency_s = loop.time() - t0
        self.metrics.reward_latency_s.append(traj.reward_latency_s)

    def _failed(self, traj: Trajectory, exc: BaseException) -> None:
        """End ``traj`` for a generation failure, or an environment failure (counted by kind; an exception
        that is neither, e.g. from the environment's own code, counts as an environment that raised)."""
        if isinstance(exc, GenerationFailed):
            self._end(traj, "aborted", "generation_failed")
            return
        msg = str(exc) if isinstance(exc, EnvFault) else ""
        kind = "timeout" if "timed out" in msg else "malformed" if "malformed" in msg else "raise"
        self.metrics.env_failures[kind] += 1
        self._end(traj, "aborted", "env_failure")

    def _end(self, traj: Trajectory, status: str, reason: str) -> None:
        self.bound.finish(traj.trajectory_id)
        self._running.pop(traj.trajectory_id, None)
        if traj.status in ("running", "finished"):
            self.ledger.end(traj, status, reason)
            if reason == "redundant":
                self.metrics.redundant_aborted += 1
            elif reason == "stale":
                self.metrics.stale_aborted += 1

    def _launch(self, group: str, task: TaskSpec) -> asyncio.Task:
        traj = self._new(group, task)
        job = asyncio.get_running_loop().create_task(self._one(traj, task), name=traj.trajectory_id)
        job.traj = traj  # type: ignore[attr-defined]
        self._running[traj.trajectory_id] = job
        self.concurrent_peak = max(self.concurrent_peak, len(self._running))
        return job

    def pick_task(self) -> TaskSpec:
        return self.rng.choices(self.tasks, weights=[t.weight for t in self.tasks])[0]

    async def group(self, group_id: str, task: TaskSpec | None = None, put: bool = True) -> list[Trajectory]:
        """Run one GRPO group with redundancy: launch ``size + redundancy``, keep the first ``size``."""
        task = task or self.pick_task()
        want = self.group_size
        launch = math.ceil(want * (1 + self.redundancy))
        jobs = {self._launch(group_id, task) for _ in range(launch)}
        done: list[Trajectory] = []
        replaced = 0
        try:
            while jobs and len(done) < want:
                finished, jobs = await asyncio.wait(jobs, return_when=asyncio.FIRST_COMPLETED)
                for j in finished:
                    if j.cancelled():
                        continue
                    if j.exception() is not None:  # replaced at once, so the redundancy margin holds
                        if len(done) + len(jobs) < launch and replaced < self.max_replacements:
                            replaced += 1
                            self.metrics.replacements += 1
                            jobs.add(self._launch(group_id, task))
                        continue
                    traj = j.result()
                    if len(done) < want:
                        done.append(traj)
                        self.bound.finish(traj.trajectory_id)
                        self._running.pop(traj.trajectory_id, None)
                        if put:
                            self.buffer.put(traj)
                        else:
                            self.ledger.end(traj, "buffered")
                    else:
                        self._end(traj, "aborted", "redundant")
        finally:
            for j in jobs:  # the redundant rest: abort them (their engines' requests are aborted too)
                j.traj.reason = "redundant"  # type: ignore[attr-defined]
                j.cancel()
            if jobs:
                await asyncio.gather(*jobs, return_exceptions=True)
        return done

    async def batched_group(self, group_id: str, task: TaskSpec) -> list[Trajectory]:
        """veRL's batch-level interaction: a barrier after every reset, generation and step of the group.

        The same :class:`EnvManager` phases as a trajectory-level run (timeouts, failure kinds, the
        tokenizer path on vLLM), only gathered: each phase waits for every live environment. Rewards are
        requested together once the group is done (what veRL's batch reward does).
        """
        mgrs = [EnvManager(task, self.proxy, self.policy, self.rng.randrange(1 << 30), self.tokenizer)
                for _ in range(self.group_size)]
        trajs = [self._new(group_id, task) for _ in mgrs]

        async def barrier(live: list[int], phase: Callable[[int], Any]) -> list[tuple[int, Any]]:
            results = await asyncio.gather(*(phase(i) for i in live), return_exceptions=True)
            ok = []
            for i, r in zip(live, results):
                if isinstance(r, BaseException):
                    self._failed(trajs[i], r)  # an environment or generation failure ends that trajectory
                else:
                    ok.append((i, r))
            return ok

        live = [i for i, _ in await barrier(list(range(len(mgrs))), lambda i: mgrs[i].begin())]
        for _ in range(task.max_turns):
            if not live:
                break
            replies = dict(await barrier(live, lambda i: mgrs[i].ask(trajs[i])))
            ended = await barrier(list(replies), lambda i, r=replies: mgrs[i].act(trajs[i], *r[i]))
            live = [i for i, done in ended if not done]
        done = [t for t in trajs if t.status == "running"]
        got = await asyncio.gather(*(self._reward(t) for t in done), return_exceptions=True)
        out = []
        for t, r in zip(done, got):
            if isinstance(r, BaseException):
                if t.status == "finished":  # not a RewardFailed (which _reward ended): still end it, named
                    self._end(t, "aborted", "reward_failed")
                continue
            self._end(t, "buffered", "")
            out.append(t)
        return out

    async def train(self, iterations: int, batch_groups: int, train_step_s: float | Callable[[list], float],
                    groups_in_flight: int | None = None) -> dict:
        """The asynchronous workflow for ``iterations`` training steps; returns the run's metrics.

        ``train_step_s`` is the training step's time, or a function of the batch that returns it.
        """
        loop = asyncio.get_running_loop()
        want = batch_groups * self.group_size
        in_flight = groups_in_flight or max(batch_groups, math.ceil(batch_groups * (1 + self.buffer.bound)))
        producers: set[asyncio.Task] = set()
        gid = 0

        def refill() -> None:
            nonlocal gid
            while len(producers) < in_flight:
                gid += 1
                p = loop.create_task(self.group(f"g{gid}"))
                producers.add(p)
                p.add_done_callback(producers.discard)

        refill()
        t_prev = t_start = loop.time()
        try:
            for it in range(iterations):
                getter = loop.create_task(self.buffer.get_batch(want))
                while not getter.done():
                    refill()
                    await asyncio.wait({getter, *producers}, return_when=asyncio.FIRST_COMPLETED)
                batch = getter.result()
                for t in batch:
                    self.metrics.staleness[self.buffer.version - t.version_started] += 1
                self.metrics.trained += len(batch)
                self.proxy.suspend()
                await self.proxy.quiesced()  # engines that keep KV are frozen before new weights land
                if self.weights is not None:
                    await self.weights.update(self.buffer.version + 1)
                version = self.buffer.version + 1
                for tid in self.bound.on_new_version(version):  # too old to finish: abort in flight
                    job = self._running.get(tid)
                    if job is not None:
                        job.traj.reason = "stale"  # type: ignore[attr-defined]
                        job.cancel()
                self.buffer.set_version(version)
                self.proxy.resume(version)
                await asyncio.sleep(train_step_s(batch) if callable(train_step_s) else train_step_s)
                if self.weights is not None:  # the new version exists: its cross-cluster copy starts now
                    self.weights.publish(version + 1)
                now = loop.time()
                self.metrics.step_s.append(now - t_prev)
                t_prev = now
                if self.progress:
                    self.progress(f"step {it + 1}/{iterations}: {now - t_start:.1f} s, {self.metrics.trained} trajectories "
                                  f"trained, {len(self._running)} running")
        finally:
            for p in list(producers):
                p.cancel()
            await asyncio.gather(*producers, return_exceptions=True)
            for job in list(self._running.values()):
                job.cancel()
            await asyncio.gather(*self._running.values(), return_exceptions=True)
            for t in self.ledger.open():  # finished but not yet placed when the run stopped
                self._end(t, "aborted", "run_ended")
        return self.summary()

    def summary(self) -> dict:
        lat = sorted(self.metrics.reward_latency_s)
        return {"ledger": self.ledger.check(), "env_failures": dict(self.metrics.env_failures),
                "replacements": self.metrics.replacements, "redundant_aborted": self.metrics.redundant_aborted,
                "stale_aborted": self.metrics.stale_aborted, "staleness": dict(self.metrics.staleness),
                "reward_latency_p50_s": lat[len(lat) // 2] if lat else 0.0, "trained": self.metrics.trained,
                "step_s": list(self.metrics.step_s), "concurrent_peak": self.concurrent_peak,
                "routing_p99_ms": self.proxy.routing_p99_ms(), "rerouted": self.proxy.rerouted,
                "resubmitted_on_update": self.proxy.interrupted, "kv_resumed_on_update": self.proxy.kv_resumed,
                "idle_s_by_pool": _idle_by_pool(self.proxy),
                "worker_failures": {w.name: w.failure for w in self.proxy.workers if w.failure}}


def _idle_by_pool(proxy: LLMProxy) -> dict:
    loop = asyncio.get_running_loop()
    out: dict[str, float] = {}
    for w in proxy.workers:
        out[w.pool] = out.get(w.pool, 0.0) + max(0.0, loop.time() - w.started_s - w.busy_s)
    return out
