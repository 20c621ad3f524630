"""The step model of each GPU type the agentic runtime and RLSim use: one seam.

Today every GPU type is :class:`~compute_sched.perf.PerfModel`'s roofline over the hardware table
(``compute_sched/specs/gpus/*.yaml``). H800 is H100 silicon (989 TFLOP/s bf16, 3.35 TB/s HBM3, NVLink
cut to 400 GB/s); **H20 is derived**, not measured: its datasheet numbers (148 TFLOP/s bf16, 4.0 TB/s
HBM3, 96 GB, NVLink 900 GB/s) in the same roofline, so prefill and large-batch GEMMs slow by
989/148 = 6.7x and memory-bound decode speeds up by 4.0/3.35 = 1.19x. ``docs/agentic.md`` checks
that against RollArt §3.1's cost-equivalent runs (2 H800 vs 6 H20). When issue 30's measured step
model lands, :func:`step_model` is the only function to change.
"""

from __future__ import annotations

from functools import lru_cache

from orchestrl.compute_sched.hardware import GpuSpec, ModelSpec
from orchestrl.compute_sched.perf import PerfModel

__all__ = ["step_model"]


@lru_cache(maxsize=None)
def step_model(model: ModelSpec, gpu: GpuSpec) -> PerfModel:
    """Return the step model of ``model`` on ``gpu`` (today: the roofline; see the module note).

    >>> from orchestrl.compute_sched.hardware import load_gpu, load_model
    >>> from orchestrl.compute_sched.layout import InstanceConfig
    >>> m, tp1 = load_model("Qwen3-8B"), InstanceConfig("tp", tp=1)
    >>> h800, h20 = step_model(m, load_gpu("H800")), step_model(m, load_gpu("H20"))
    >>> h20.prefill_s(tp1, 8192) / h800.prefill_s(tp1, 8192) > 5  # compute-bound: H800 wins
    True
    >>> h20.decode_step_s(tp1, 8, 8 * 4096) < h800.decode_step_s(tp1, 8, 8 * 4096)  # bandwidth-bound: H20 wins
    True
    """
    return PerfModel(model, gpu)
