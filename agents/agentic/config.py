"""Run files of ``orchestrl agentic run``: validated YAML, every refusal naming the file, the field and the fix.

A run file names the model, the generation pools (GPU type, workers, TP, batch limit), the
``hw_mapping`` from task tags to pools in priority order, the tasks (a Gymnasium id each, any
registered toy-text id works through the text wrapper, with injected latency and failures), the
rollout knobs (group size, redundancy, asynchronous bound, batch, iterations), the reward (in-process
or a service URL), the weight update and, optionally, the control proxy that each cross-cluster copy is
announced to as a ``weight-sync`` intent (``fabric``). ``examples/agentic/frozenlake-math.yaml`` is a complete one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import gymnasium as gym

from orchestrl.agents.agentic.envs import LatencySpec
from orchestrl.agents.agentic.reward import REWARD_FUNCTIONS
from orchestrl.agents.agentic.runtime import TaskSpec
from orchestrl.compute_sched.agentic.routing import HwMapping
from orchestrl.compute_sched.hardware import bundled_gpus, bundled_models
from orchestrl.fabric.config import Reader, load_document
from orchestrl.fabric.errors import ConfigError
from orchestrl.fabric.intent import parse_gpu_set

__all__ = ["PoolSpec", "RunConfig", "load_run"]


@dataclass(frozen=True)
class PoolSpec:
    name: str
    gpu: str
    workers: int
    tp: int = 1
    max_batch: int | None = 256


@dataclass(frozen=True)
class RunConfig:
    source: str
    model: str
    pools: tuple[PoolSpec, ...]
    mapping: HwMapping
    tasks: tuple[TaskSpec, ...]
    group_size: int = 4
    redundancy: float = 0.0
    bound: int = 1
    batch_groups: int = 4
    iterations: int = 3
    train_step_s: float = 1.0
    max_replacements: int = 8
    reward_function: str = "env_return"
    reward_url: str | None = None
    reward_timeout_s: float = 5.0
    reward_retries: int = 2
    weights: dict = field(default_factory=dict)
    seed: int = 0
    resume: str = "recompute"  # after a weight update: recompute the context, or kv_reuse (the engine keeps KV)
    fabric: dict | None = None  # announce each cross-cluster copy to the control proxy (proxy_url, token_env, ...)


def _latency(r: Reader) -> LatencySpec:
    r.reject_unknown(("reset_median_s", "step_median_s", "sigma", "failure_rate", "failure_modes", "hang_s", "seed"))
    modes = tuple(v for _, v in r.items("failure_modes", ["raise", "hang", "malformed"]))
    for path, v in r.items("failure_modes", ["raise", "hang", "malformed"]):
        if v not in ("raise", "hang", "malformed"):
            raise ConfigError(r.source, path, f"unknown failure mode {v!r}", "raise, hang, malformed")
    return LatencySpec(r.float("reset_median_s", 0.0, minimum=0), r.float("step_median_s", 0.0, minimum=0),
                       r.float("sigma", 1.0, minimum=0, maximum=5), r.float("failure_rate", 0.0, minimum=0, maximum=1),
                       modes, r.float("hang_s", 3600.0, minimum=0), r.int("seed", 0))


def load_run(path: str | os.PathLike[str]) -> RunConfig:
    """Read and validate a run file (see the module note)."""
    r = load_document(path)
    src = r.source
    r.reject_unknown(("model", "pools", "hw_mapping", "tasks", "rollout", "reward", "weights", "fabric", "seed"))
    models = bundled_models()
    model = r.str("model")
    if model not in models:
        raise r.error("model", f"unknown model {model!r}", ", ".join(models))
    gpus = bundled_gpus()
    pools = []
    for p in r.sections("pools"):
        p.reject_unknown(("name", "gpu", "workers", "tp", "max_batch"))
        gpu = p.str("gpu")
        if gpu not in gpus:
            raise p.error("gpu", f"unknown GPU {gpu!r}", ", ".join(gpus))
        mb = p.raw("max_batch", 256)
        pools.append(PoolSpec(p.str("name"), gpu, p.int("workers", minimum=1, maximum=4096), p.int("tp", 1, minimum=1,
                                                                                                 maximum=8),
                              None if mb is None else p.int("max_batch", 256, minimum=1)))
    if not pools:
        raise r.error("pools", "is empty", "at least one pool of generation workers")
    names = [p.name for p in pools]
    if len(set(names)) != len(names):
        raise r.error("pools", f"pool names repeat: {names}", "a unique name per pool")
    tags = {}
    raw_map = r.raw("hw_mapping", {})
    if not isinstance(raw_map, dict):
        raise r.error("hw_mapping", "expected a mapping of tag -> [pools]", "e.g. {frozenlake: [h800, h20]}")
    for tag, pl in raw_map.items():
        if not isinstance(pl, list) or not pl or any(x not in names for x in pl):
            raise ConfigError(src, f"hw_mapping.{tag}", f"{pl!r} is not a list of pool names",
                              f"pools in priority order from {names}")
        tags[str(tag)] = tuple(pl)
    default = tags.pop("default", tuple(names))
    tasks = []
    for t in r.sections("tasks"):
        t.reject_unknown(("name", "env", "tag", "weight", "max_turns", "reply_median_tokens", "reply_sigma",
                          "max_reply_tokens", "prompt_tokens", "latency", "reset_timeout_s", "step_timeout_s"))
        env = t.str("env")
        try:
            gym.spec(env)
        except Exception:  # noqa: BLE001 - gymnasium raises several kinds for an unknown id
            raise t.error("env", f"{env!r} is not a registered Gymnasium id",
                          "e.g. FrozenLake-v1, CliffWalking-v1, orchestrl/MathSingleTurn-v0") from None
        tag = t.str("tag", t.str("name"))
        tasks.append(TaskSpec(t.str("name"), env, tag, t.float("weight", 1.0, minimum=0, exclusive_minimum=True),
                              t.int("max_turns", 20, minimum=1, maximum=1000),
                              t.float("reply_median_tokens", 64.0, minimum=1), t.float("reply_sigma", 0.6, minimum=0),
                              t.int("max_reply_tokens", 4096, minimum=1), t.int("prompt_tokens", 200, minimum=0),
                              _latency(t.section("latency", {})), t.float("reset_timeout_s", 30.0, minimum=0,
                                                                          exclusive_minimum=True),
                              t.float("step_timeout_s", 30.0, minimum=0, exclusive_minimum=True)))
    if not tasks:
        raise r.error("tasks", "is empty", "at least one task")
    ro = r.section("rollout", {})
    ro.reject_unknown(("group_size", "redundancy", "bound", "batch_groups", "iterations", "train_step_s",
                       "max_replacements", "resume"))
    rw = r.section("reward", {})
    rw.reject_unknown(("function", "url", "timeout_s", "retries"))
    fn = rw.str("function", "env_return", choices=REWARD_FUNCTIONS)
    url = rw.raw("url", None)
    if url is not None and (not isinstance(url, str) or not url.startswith(("http://", "https://"))):
        raise rw.error("url", f"{url!r} is not an http(s) URL", "e.g. http://127.0.0.1:8088, or leave it out (in-process)")
    wt = r.section("weights", {})
    wt.reject_unknown(("backend", "model_bytes", "cross_cluster_gbps", "intra_cluster_gbps", "asynchronous",
                       "move_bytes", "generators"))
    weights = {"backend": wt.str("backend", "relay", choices=("relay", "mooncake")),
               "model_bytes": wt.float("model_bytes", 16.4e9, minimum=0),
               "cross_cluster_bps": 1e9 * wt.float("cross_cluster_gbps", 200.0, minimum=0, exclusive_minimum=True),
               "intra_cluster_bps": 1e9 * wt.float("intra_cluster_gbps", 400.0, minimum=0, exclusive_minimum=True),
               "asynchronous": wt.bool("asynchronous", True),
               # move real bytes between processes (agents/agentic/transfer.py) instead of timing the copy
               "move_bytes": wt.bool("move_bytes", False),
               "generators": wt.int("generators", 2, minimum=1, maximum=64)}
    if weights["move_bytes"] and weights["model_bytes"] > 2 * 2**30:
        raise wt.error("model_bytes", f"{weights['model_bytes']:.3g} bytes would be moved for real every version",
                       "at most 2 GiB with move_bytes: true (or move_bytes: false to time the copy)")
    fabric = None
    if r.raw("fabric", None) is not None:
        fb = r.section("fabric", {})
        fb.reject_unknown(("proxy_url", "token_env", "job", "train_gpus", "gen_gpus"))
        purl = fb.raw("proxy_url", None)
        if not isinstance(purl, str) or not purl.startswith(("http://", "https://")):
            raise fb.error("proxy_url", f"{purl!r} is not an http(s) URL",
                           "the control proxy's address, e.g. http://127.0.0.1:8080 (or leave out the fabric section)")
        fabric = {"proxy_url": purl, "token_env": fb.str("token_env", "ORCHESTRL_JOB_TOKEN"),
                  "job": fb.str("job", "agentic"), "train_gpus": fb.str("train_gpus"), "gen_gpus": fb.str("gen_gpus")}
        for key in ("train_gpus", "gen_gpus"):  # the intent's GPU sets, checked as the proxy will read them
            parse_gpu_set(fabric[key], src, f"fabric.{key}")
    return RunConfig(src, model, tuple(pools), HwMapping(tags, default), tuple(tasks),
                     ro.int("group_size", 4, minimum=1, maximum=1024), ro.float("redundancy", 0.0, minimum=0, maximum=4),
                     ro.int("bound", 1, minimum=0, maximum=100), ro.int("batch_groups", 4, minimum=1),
                     ro.int("iterations", 3, minimum=1), ro.float("train_step_s", 1.0, minimum=0),
                     ro.int("max_replacements", 8, minimum=0), fn, url, rw.float("timeout_s", 5.0, minimum=0,
                                                                                    exclusive_minimum=True),
                     rw.int("retries", 2, minimum=0, maximum=10), weights, r.int("seed", 0),
                     ro.str("resume", "recompute", choices=("recompute", "kv_reuse")), fabric)
