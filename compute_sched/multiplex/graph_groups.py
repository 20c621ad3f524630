"""A per-step SM budget for an engine's forward step: CUDA graphs captured per green context (§4.2).

JigsawRL changes a sub-stage's SM share between steps. An MPS percentage (``hooks.budgeted_factory``)
is fixed when a process starts, so the paper pre-records graph groups: the step is captured once per
SM budget, each on a stream of a green context that owns that many SMs, and every step replays the
graph of the budget the scheduler chose. :class:`SmBudgetGraphs` is that mechanism for any
``step() -> None`` whose buffers are static (a model runner's decode step, as vLLM and SGLang capture
them for CUDA graphs).

Why graphs are captured on the green stream itself: on an H100 a graph captured on an ordinary stream
and replayed on a green-context stream ignored the split (``compute_sched/data/slowdown/README.md``).
Green contexts come from NVIDIA's driver bindings (``cuda.bindings``: ``cuDevSmResourceSplitByCount``,
``cuGreenCtxCreate``, ``cuGreenCtxStreamCreate``), as FlashInfer's ``green_ctx`` makes them; the whole
GPU is an ordinary stream. Without CUDA or the bindings, construction raises a ``ConfigError`` naming
what is missing. What is not done here: wiring it into vLLM's ``CUDAGraphRunner`` (its graphs are
captured by vLLM per batch size; a budget would multiply them).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from orchestrl.fabric.errors import ConfigError

__all__ = ["split_green_stream", "SmBudgetGraphs"]


def _driver() -> Any:
    try:
        import torch
    except ImportError:
        raise ConfigError("SM budget", "torch", "PyTorch is not installed", "the comms extra") from None
    if not torch.cuda.is_available():
        raise ConfigError("SM budget", "device", "CUDA is not available here", "a CUDA GPU (H100: 132 SMs)")
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        raise ConfigError("SM budget", "cuda.bindings", f"NVIDIA's driver bindings do not import ({exc})",
                          "pip install cuda-python (CUDA 12.4+ driver)") from None
    return driver


def split_green_stream(num_sms: int, device: int = 0) -> tuple[Any, int]:
    """A torch stream whose kernels run on a green context of ``num_sms`` SMs; returns (stream, SMs granted).

    The driver rounds to its SM granularity (8 on an H100), so the count granted is returned.
    """
    import torch
    driver = _driver()

    def ok(res):
        if int(res[0]) != 0:
            raise ConfigError("SM budget", "num_sms", f"CUDA driver error {res[0]} for {num_sms} SMs",
                              "a count the device can split (a multiple of 8 on Hopper)")
        return res[1:] if len(res) > 2 else (res[1] if len(res) == 2 else None)

    driver.cuInit(0)
    dev = ok(driver.cuDeviceGet(device))
    whole = ok(driver.cuDeviceGetDevResource(dev, driver.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM))
    groups, _, _ = ok(driver.cuDevSmResourceSplitByCount(1, whole, 0, int(num_sms)))
    desc = ok(driver.cuDevResourceGenerateDesc([groups[0]], 1))
    ctx = ok(driver.cuGreenCtxCreate(desc, dev, driver.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM))
    raw = ok(driver.cuGreenCtxStreamCreate(ctx, driver.CUstream_flags.CU_STREAM_NON_BLOCKING, 0))
    wrap = getattr(torch.cuda, "get_stream_from_external", None) or torch.cuda.ExternalStream
    return wrap(int(raw)), int(groups[0].sm.smCount)


class SmBudgetGraphs:
    """``step`` captured as one CUDA graph per SM budget; :meth:`replay` runs the budget a decision names.

    Parameters
    ----------
    step : callable
        One forward step over static buffers (no allocation or host sync inside).
    budgets_pct : sequence of float
        SM budgets in percent of the device's SMs (the grid's 25/50/75/100 by default); 100 is the whole GPU.
    warmup : int
        Eager runs on each stream before its capture (lazy initialisation, autotuning).
    """

    def __init__(self, step: Callable[[], None], budgets_pct: Sequence[float] = (25, 50, 75, 100), *,
                 device: int = 0, warmup: int = 2) -> None:
        if not budgets_pct or any(not 0 < b <= 100 for b in budgets_pct):
            raise ConfigError("SM budget", "budgets_pct", f"{list(budgets_pct)!r}", "percentages in (0, 100]")
        _driver()
        import torch
        n_sm = torch.cuda.get_device_properties(device).multi_processor_count
        self.total_sms = n_sm
        self.sms: dict[float, int] = {}
        self._graphs: dict[float, tuple[Any, Any]] = {}
        for pct in sorted(set(float(b) for b in budgets_pct)):
            if pct >= 100:
                stream, granted = torch.cuda.Stream(device), n_sm
            else:
                stream, granted = split_green_stream(max(8, int(n_sm * pct / 100) // 8 * 8), device)
            with torch.cuda.stream(stream):
                for _ in range(warmup):
                    step()
            stream.synchronize()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, stream=stream):
                step()
            self._graphs[pct] = (graph, stream)
            self.sms[pct] = granted

    def budget_for(self, sm_pct: float) -> float:
        """The captured budget a decision of ``sm_pct`` runs under: the largest not above it (never more SMs
        than the scheduler granted, so a co-runner's share is respected), else the smallest."""
        fitting = [b for b in self._graphs if b <= sm_pct + 1e-9]
        return max(fitting) if fitting else min(self._graphs)

    def replay(self, sm_pct: float) -> Any:
        """Launch the step within ``sm_pct`` of the SMs; returns the stream it runs on (wait on it for results)."""
        import torch
        graph, stream = self._graphs[self.budget_for(sm_pct)]
        with torch.cuda.stream(stream):  # a graph launches on the current stream: its own green one
            graph.replay()
        return stream
