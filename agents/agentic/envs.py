"""Environments of the agentic runtime, through the Gymnasium API (a real package: ``gymnasium``).

* :class:`TextEnv` wraps any registered toy-text environment (FrozenLake, Taxi, CliffWalking,
  Blackjack: discrete actions, ``render_mode="ansi"``) so an LLM sees text and answers text: the
  observation is the ANSI rendering with the ANSI escapes removed plus the legal actions; an action is
  parsed from ``<action>NAME</action>`` (or the last legal name in the reply). A reply with no legal
  action is a format error: the step costs ``format_penalty`` and the state does not move (as
  ROLL's agentic envs do), and it is counted.
* ``orchestrl/MathSingleTurn-v0``: a decode-heavy single-turn task (a GEM-math-like arithmetic
  question; one reply ends the episode, the reward says whether the number is right).
* :class:`FaultyEnv` injects the latency and failures RollArt §3.1 characterises -- ``reset`` tails of
  hundreds of seconds (lognormal, p99 >= 10x the median by default), failures about once in ten
  iterations -- either raising, hanging, or returning a malformed observation.

:func:`make_env` builds any of them from a run file's ``env`` section by Gymnasium id.
"""

from __future__ import annotations

import asyncio
import math
import random
import re
from dataclasses import dataclass
from typing import Any

import gymnasium as gym

from orchestrl.fabric.errors import ConfigError

__all__ = ["TextEnv", "MathSingleTurn", "FaultyEnv", "EnvFault", "LatencySpec", "make_env", "ACTION_NAMES"]

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
#: Action names of the toy-text environments (Gymnasium's documented action meanings).
ACTION_NAMES = {
    "FrozenLake": ("LEFT", "DOWN", "RIGHT", "UP"),
    "CliffWalking": ("UP", "RIGHT", "DOWN", "LEFT"),
    "Taxi": ("SOUTH", "NORTH", "EAST", "WEST", "PICKUP", "DROPOFF"),
    "Blackjack": ("STICK", "HIT"),
}


class EnvFault(RuntimeError):
    """An environment raised, hung or answered malformed data; the manager replaces it and counts it."""


class TextEnv(gym.Wrapper):
    """A discrete toy-text environment as text in, text out (see the module note)."""

    def __init__(self, env: gym.Env, format_penalty: float = -0.1) -> None:
        super().__init__(env)
        if not isinstance(env.action_space, gym.spaces.Discrete):
            raise ConfigError(str(env.spec.id if env.spec else env), "env.id", "has a non-discrete action space",
                              "a toy-text environment with discrete actions")
        base = env.spec.id.split("/")[-1].split("-")[0] if env.spec else ""
        base = re.sub(r"8x8$", "", base)
        n = int(env.action_space.n)
        self.names = ACTION_NAMES.get(base, tuple(f"A{i}" for i in range(n)))[:n]
        self.format_penalty = format_penalty
        self.format_errors = 0
        self._last_obs: str = ""

    def _text(self, obs: Any) -> str:
        try:
            board = self.env.render()
        except Exception:  # noqa: BLE001 - an env without ansi rendering still has its raw observation
            board = None
        body = _ANSI.sub("", board).strip("\n") if isinstance(board, str) and board.strip() else f"state {obs}"
        return f"{body}\nactions: {', '.join(self.names)}\nanswer with <action>NAME</action>"

    def reset(self, **kw: Any):
        obs, info = self.env.reset(**kw)
        self._last_obs = self._text(obs)
        return self._last_obs, info

    def parse(self, reply: str) -> int | None:
        m = re.search(r"<action>\s*([A-Za-z0-9]+)\s*</action>", reply or "")
        words = [m.group(1).upper()] if m else re.findall(r"[A-Za-z0-9]+", (reply or "").upper())[::-1]
        for w in words:
            if w in self.names:
                return self.names.index(w)
        return None

    def step(self, reply: str):
        a = self.parse(reply)
        if a is None:
            self.format_errors += 1
            return self._last_obs, self.format_penalty, False, False, {"format_error": True}
        obs, reward, terminated, truncated, info = self.env.step(a)
        self._last_obs = self._text(obs)
        return self._last_obs, float(reward), terminated, truncated, info


class MathSingleTurn(gym.Env):
    """One arithmetic question; one reply; reward 1 if its last number is the answer (decode-heavy in RL)."""

    metadata = {"render_modes": []}

    def __init__(self, render_mode: str | None = None) -> None:
        self.observation_space = gym.spaces.Text(512)
        self.action_space = gym.spaces.Text(8192)
        self._answer = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        rng = self.np_random
        a, b, c = (int(x) for x in rng.integers(2, 999, size=3))
        self._answer = a * b + c
        return f"Compute {a} * {b} + {c}. Think step by step, then give the number.", {}

    def step(self, reply: str):
        nums = re.findall(r"-?\d+", reply or "")
        ok = bool(nums) and int(nums[-1]) == self._answer
        return "", 1.0 if ok else 0.0, True, False, {"answer": self._answer}

    def parse(self, reply: str) -> str:
        return reply


if "orchestrl/MathSingleTurn-v0" not in gym.envs.registry:
    gym.register("orchestrl/MathSingleTurn-v0", entry_point=MathSingleTurn, max_episode_steps=1)


@dataclass(frozen=True)
class LatencySpec:
    """Injected latency of ``reset`` and ``step`` (lognormal) and failures (RollArt §3.1)."""

    reset_median_s: float = 0.0
    step_median_s: float = 0.0
    sigma: float = 1.0  # lognormal shape; p99 / median = exp(2.33 sigma) (~10x at 1.0)
    failure_rate: float = 0.0  # per reset or step
    failure_modes: tuple[str, ...] = ("raise", "hang", "malformed")
    hang_s: float = 3600.0  # a hung call sleeps this long (the manager's timeout ends it first)
    seed: int = 0

    def __post_init__(self) -> None:
        for f in ("reset_median_s", "step_median_s", "sigma", "hang_s"):
            if not getattr(self, f) >= 0 or not math.isfinite(getattr(self, f)):
                raise ConfigError("env latency", f, f"{getattr(self, f)!r}", "a finite number >= 0")
        if not 0 <= self.failure_rate <= 1:
            raise ConfigError("env latency", "failure_rate", f"{self.failure_rate!r}", "a probability in [0, 1]")
        bad = set(self.failure_modes) - {"raise", "hang", "malformed"}
        if bad:
            raise ConfigError("env latency", "failure_modes", f"unknown {sorted(bad)}", "raise, hang, malformed")


class FaultyEnv:
    """Wrap an environment's ``reset`` and ``step`` as coroutines that take injected time and may fail.

    The delays are ``asyncio.sleep``: real seconds in the runtime, simulated seconds in RLSim.
    """

    def __init__(self, env: Any, spec: LatencySpec, rng: random.Random | None = None) -> None:
        self.env, self.spec = env, spec
        self.rng = rng or random.Random(spec.seed)

    def _draw(self, median: float) -> float:
        return median * math.exp(self.rng.gauss(0.0, self.spec.sigma)) if median > 0 else 0.0

    async def _fault(self, what: str) -> str | None:
        if self.spec.failure_rate and self.rng.random() < self.spec.failure_rate:
            mode = self.rng.choice(self.spec.failure_modes)
            if mode == "raise":
                raise EnvFault(f"{what}: injected failure")
            if mode == "hang":
                await asyncio.sleep(self.spec.hang_s)
                raise EnvFault(f"{what}: hung")
            return "malformed"
        return None

    async def reset(self, **kw: Any):
        await asyncio.sleep(self._draw(self.spec.reset_median_s))
        bad = await self._fault("reset")
        obs, info = self.env.reset(**kw)
        return (None if bad else obs), info

    async def step(self, action: Any):
        await asyncio.sleep(self._draw(self.spec.step_median_s))
        bad = await self._fault("step")
        out = self.env.step(action)
        return (None, *out[1:]) if bad else out

    def parse(self, reply: str) -> Any:
        return self.env.parse(reply)


def make_env(env_id: str, *, source: str = "run file", **kwargs: Any) -> Any:
    """Build ``env_id`` as a text environment: toy-text ids through :class:`TextEnv`, text tasks as they are."""
    try:
        spec = gym.spec(env_id)
    except Exception as exc:  # noqa: BLE001 - gymnasium raises several kinds for an unknown id
        raise ConfigError(source, "env.id", f"{env_id!r} is not a registered Gymnasium id ({type(exc).__name__})",
                          "e.g. FrozenLake-v1, Taxi-v3, orchestrl/MathSingleTurn-v0") from None
    if "toy_text" in str(spec.entry_point):
        return TextEnv(gym.make(env_id, render_mode="ansi", **kwargs))
    return gym.make(env_id, **kwargs).unwrapped
