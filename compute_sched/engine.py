"""The engine protocol: exactly what the compute scheduler needs from a generation cluster.

Two engines implement it: :class:`compute_sched.sim_engine.SimEngine` (discrete-event, for tests,
benchmarks and the simulator) and :class:`compute_sched.vllm_engine.VllmEngine` (vLLM's public
APIs). The scheduler (:mod:`compute_sched.scheduler`) only ever talks to this protocol, so a policy
tested on the simulator runs unchanged against vLLM.

Everything that crosses it is a frozen dataclass with units in its field names.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Callable, Iterable, Mapping, Protocol, Sequence, runtime_checkable

from orchestrl.compute_sched.layout import InstanceConfig, Layout
from orchestrl.compute_sched.workload import RequestState

__all__ = ["EngineCapabilities", "RECOMPUTE_ONLY", "GenerationRequest", "WorkerState", "ClusterSnapshot", "Migration",
           "MigrationReport", "SwitchReport", "FinishedRequest", "Engine"]


@dataclass(frozen=True)
class EngineCapabilities:
    """What an engine can really do to move a request between instances; the cost model prices only this.

    Every engine can migrate by recomputation (abort, re-submit prompt + generated tokens, prefill
    again on the destination). Moving the KV cache itself needs a path the engine drives for a
    running request; the vLLM adapter has none through vLLM's public API (see
    :mod:`compute_sched.vllm_engine`), so recompute-only is the default everywhere.

    Examples
    --------
    >>> RECOMPUTE_ONLY.kv_transfer, EngineCapabilities.assume_kv_transfer().label
    (False, 'what-if: KV transfer assumed')
    """

    kv_transfer: bool = False  # can ship a running request's KV cache to another instance
    kv_connector: str | None = None  # the KV connector the engine was built with, if any (reported, not assumed usable)
    label: str = "recompute only"  # shown next to results, so a what-if is never mistaken for a measurement

    @staticmethod
    def assume_kv_transfer(label: str = "what-if: KV transfer assumed") -> "EngineCapabilities":
        """Capabilities of a hypothetical engine that migrates KV by transfer (what-if studies only)."""
        return EngineCapabilities(kv_transfer=True, label=label)


RECOMPUTE_ONLY = EngineCapabilities()  # what the vLLM adapter can do


@dataclass(frozen=True)
class GenerationRequest:
    """A request to submit: a prompt and the step's generation cap."""

    request_id: str
    prompt_tokens: int
    max_tokens: int
    group_id: str = ""
    prompt_token_ids: tuple[int, ...] = ()  # what a real engine needs; the simulator only reads the count
    generated_tokens: int = 0  # progress carried in (partial rollout) -- recomputed on admission
    generated_token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class WorkerState:
    """One instance as the balancer sees it (Eq. 5 inputs)."""

    instance: int  # index into the layout's instances
    config: InstanceConfig
    running: tuple[RequestState, ...]  # Q^run: decoding now
    waiting: tuple[RequestState, ...]  # Q^wait: queued, preempted or arriving by migration
    kv_used_tokens: int
    kv_capacity_tokens: int
    decode_rate_tps: float  # observed decode throughput (tokens/s), R~_w
    available: bool = True  # False while the instance is switching configuration
    max_batch: int | None = None  # sequences it decodes at once (vLLM max_num_seqs): caps B^cap; None: KV only

    @property
    def kv_free_tokens(self) -> int:
        return max(0, self.kv_capacity_tokens - self.kv_used_tokens)


@dataclass(frozen=True)
class ClusterSnapshot:
    """State of the whole generation cluster at ``time_s``."""

    time_s: float
    layout: Layout
    workers: tuple[WorkerState, ...]
    finished: int  # requests finished so far in this step

    @property
    def pending(self) -> list[RequestState]:
        return [r for w in self.workers for r in (*w.running, *w.waiting)]

    def running_context(self) -> Mapping[str, int]:
        """Map each running request id (the ones holding KV) to its context tokens (read-only; built once)."""
        return memo_map(self, "_running_context",
                        lambda: {r.request_id: r.context_tokens for w in self.workers for r in w.running})

    def instance_of(self) -> Mapping[str, int]:
        """Map each pending request id to the instance holding it (read-only; built once per snapshot)."""
        return memo_map(self, "_instance_of",
                        lambda: {r.request_id: w.instance for w in self.workers for r in (*w.running, *w.waiting)})


def memo_map(owner: object, name: str, build: Callable[[], dict]) -> Mapping:
    """``build()`` once per frozen ``owner`` (kept in its ``__dict__`` under ``name``), handed out read-only.

    A frozen snapshot's or class table's maps never change, and the planner asks for them several
    times per plan; the plain dict is what is kept, so the owner stays picklable.
    """
    got = owner.__dict__.get(name)
    if got is None:
        got = owner.__dict__[name] = build()
    return MappingProxyType(got)


@dataclass(frozen=True)
class Migration:
    """Move one request's state from instance ``src`` to ``dst`` (``method``: transfer, recompute, auto).

    An engine without :attr:`EngineCapabilities.kv_transfer` recomputes whatever ``method`` says, and
    its :class:`MigrationReport` counts the move under ``"recompute"``.
    """

    request_id: str
    src: int
    dst: int
    method: str = "auto"


@dataclass(frozen=True)
class MigrationReport:
    moved: tuple[str, ...]
    refused: tuple[tuple[str, str], ...]  # (request id, reason)
    seconds: float  # longest per-destination migration cost
    methods: Mapping[str, int] = field(default_factory=dict)  # method -> requests


@dataclass(frozen=True)
class SwitchReport:
    """What a layout change cost: ``C^sw`` (slowest instance) and the migrations it caused."""

    switch_s: float
    migration: MigrationReport
    kept_instances: int


@dataclass(frozen=True)
class FinishedRequest:
    request_id: str
    output_tokens: int
    finish_time_s: float
    instance: int
    group_id: str = ""
    token_ids: tuple[int, ...] = ()  # the generated tokens, where a real engine has them (the simulator has none)


@runtime_checkable
class Engine(Protocol):
    """A generation cluster the scheduler can observe and steer."""

    @property
    def capabilities(self) -> EngineCapabilities:
        """How this engine can migrate requests; the scheduler's cost model must price only that."""

    def now_s(self) -> float:
        """Seconds since the step started (simulated or wall clock)."""

    def snapshot(self) -> ClusterSnapshot:
        """Pending and running requests with progress, KV usage and capacity, decode rates."""

    def add_requests(self, requests: Sequence[GenerationRequest], instance: int | None = None) -> None:
        """Queue requests on ``instance`` (None: the engine's least-loaded instance)."""

    def abort(self, request_ids: Iterable[str]) -> list[str]:
        """Abort requests wherever they are; return those that were pending."""

    def migrate(self, moves: Sequence[Migration]) -> MigrationReport:
        """Move request state between instances of the current layout."""

    def change_layout(self, layout: Layout, placement: Mapping[str, int]) -> SwitchReport:
        """Redeploy as ``layout``; ``placement`` maps every pending request to a new instance."""

    def advance(self, seconds: float) -> list[FinishedRequest]:
        """Run for ``seconds`` and return the requests that finished meanwhile, in finishing order."""

    def idle(self) -> bool:
        """Whether no request is pending."""
