"""Engine hooks for a multiplexing decision: an SM budget, a KV pool size, a training micro-batch.

A decision of the look-ahead scheduler is an SM share and a memory level per sub-stage. These
functions turn it into what engines take:

* :func:`mps_environment` -- the SM budget as an MPS thread percentage
  (``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE``), for an engine process started under an MPS daemon (Fig. 7's
  method); :func:`budgeted_factory` wraps a :class:`~compute_sched.vllm_engine.VllmEngine` factory so
  the engine it builds (and the engine-core process vLLM starts from it) runs under that budget with
  a KV pool sized by the level (vLLM's ``gpu_memory_utilization``);
* :func:`green_context_stream` -- the SM budget as a CUDA green context (§4.2): a stream limited to
  ``num_sms`` SMs, via ``torch.cuda.green_contexts``; only where CUDA supports it (it raises naming
  why otherwise). The profiler, ``bench/gpu_slowdown_profile.py``, makes its green contexts through
  the CUDA driver API (``cuda.bindings``) instead;
* :func:`training_microbatch` -- the micro-batch that fits a memory level (Fig. 9's knob), from the
  same memory model as the modelled grid.

What is not done: vLLM's model runner replaying its captured graphs on a green-context stream per
decode step (the paper's pre-recorded graph groups); an MPS percentage applies per process at start.
"""

from __future__ import annotations

import math
import numbers
import os
from typing import Any, Callable

from orchestrl.compute_sched.hardware import GpuSpec, ModelSpec
from orchestrl.fabric.errors import ConfigError

__all__ = ["mps_environment", "kv_pool_args", "budgeted_factory", "green_context_stream", "training_microbatch"]


def mps_environment(sm_frac: float) -> dict[str, str]:
    """Environment that limits a process started under MPS to ``sm_frac`` of the SMs.

    >>> mps_environment(0.25)
    {'CUDA_MPS_ACTIVE_THREAD_PERCENTAGE': '25'}
    """
    if not 0 < sm_frac <= 1:
        raise ConfigError("SM budget", "sm_frac", f"{sm_frac!r}", "a share in (0, 1]")
    return {"CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": str(max(1, round(100 * sm_frac)))}


def kv_pool_args(mem_pct: float, budget: float = 0.9) -> dict[str, float]:
    """vLLM engine arguments for a memory level: the share of the GPU the engine (weights + KV) may use.

    >>> kv_pool_args(40)
    {'gpu_memory_utilization': 0.36}
    """
    _percent("memory level", "mem_pct", mem_pct)
    if not _real(budget) or not 0 < budget <= 1:
        raise ConfigError("memory level", "budget", f"{budget!r}", "the share of the GPU's memory the levels divide, in (0, 1], e.g. 0.9")
    return {"gpu_memory_utilization": round(budget * mem_pct / 100.0, 4)}


def _real(v: object) -> bool:
    return not isinstance(v, bool) and isinstance(v, numbers.Real) and math.isfinite(v)


def _percent(what: str, fld: str, v: object) -> None:
    """A memory level: a percentage in [1, 100] (a fraction such as 0.4 is refused: it would size a pool of 0.4%)."""
    if not _real(v) or not 1 <= v <= 100:
        raise ConfigError(what, fld, f"{v!r}", "a percentage of the GPU's memory budget in [1, 100], e.g. 40 (not 0.4)")


def budgeted_factory(factory: Callable[..., Any], sm_frac: float, mem_pct: float) -> Callable[..., Any]:
    """Wrap ``factory(config, gpu_ids, **engine_args)`` so its engine runs under the SM budget and memory level.

    The MPS variable is set in the building thread's process environment for the call (vLLM's engine
    core inherits it when it starts) and restored after; the KV pool arguments are passed through.
    """
    env = mps_environment(sm_frac)
    kv = kv_pool_args(mem_pct)

    def build(config: Any, gpu_ids: tuple[int, ...]) -> Any:
        saved = {k: os.environ.get(k) for k in env}
        os.environ.update(env)
        try:
            return factory(config, gpu_ids, **kv)
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
    return build


def green_context_stream(num_sms: int, device: int = 0) -> Any:
    """A CUDA stream limited to ``num_sms`` SMs (a green context); raises where CUDA cannot make one."""
    import torch

    gc = getattr(torch.cuda, "green_contexts", None)
    if gc is None or not torch.cuda.is_available() or not getattr(gc, "SUPPORTED", False):
        raise ConfigError("green context", "device", "this PyTorch/CUDA cannot create green contexts "
                          f"(cuda available: {torch.cuda.is_available()})", "a CUDA 12.4+ GPU and driver")
    ctx = gc.GreenContext.create(num_sms=num_sms, device_id=device)
    return ctx.Stream()


def training_microbatch(model: ModelSpec, gpu: GpuSpec, mem_pct: float, shards: int, seq_tokens: int = 1024,
                        tp: int = 1) -> int:
    """The largest micro-batch (sequences of ``seq_tokens``) whose activations fit next to FSDP state at ``mem_pct``.

    >>> from orchestrl.compute_sched.hardware import load_gpu, load_model
    >>> m, g = load_model("Qwen3-4B"), load_gpu("H100")
    >>> training_microbatch(m, g, 80, 8) > training_microbatch(m, g, 40, 8) >= 1
    True
    """
    _percent("micro-batch", "mem_pct", mem_pct)
    for fld, v in (("shards", shards), ("seq_tokens", seq_tokens), ("tp", tp)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral) or v < 1:
            raise ConfigError("micro-batch", fld, f"{v!r}", "an integer >= 1")
    budget = gpu.hbm_bytes * 0.9 * mem_pct / 100.0
    state = 16.0 * model.params_total / (shards * tp)
    act = 34.0 * model.d_model * seq_tokens * model.layers / tp
    mb = int((budget - state) // act)
    if mb < 1:
        raise ConfigError("micro-batch", "mem_pct", f"{mem_pct}% of {gpu.name} cannot hold {model.name}'s training "
                          f"state on {shards} shards", "a higher memory level, more shards, or CPU offload")
    return mb
