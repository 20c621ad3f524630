"""Reconfiguration costs of OrchestrRL §4.1: switching ``C^sw`` and request-state migration ``C^mig``.

Switching re-shards the weights of a GPU group for a new configuration. A GPU that already holds
what its new shard needs moves nothing; otherwise it fetches the missing bytes from a peer over
the profiled path (NVLink inside a node, the NIC across nodes) or reloads them from host memory
(PCIe, where standby configurations are pre-mapped), whichever is faster, plus a fixed switch-over
time (engine rebuild, CUDA graphs, warm-up).

Migration moves a request's KV cache to its new instance either by direct transfer (fixed
connection setup plus bytes over the link) or by recomputation (a prefill of its prompt plus the
tokens generated so far on the destination); the cheaper one is chosen (Appendix A, Figure 19:
transfer wins for large caches, recomputation for small ones or slow links) -- but transfer only
when the engine can do it (:class:`~compute_sched.engine.EngineCapabilities`). The vLLM adapter
cannot (vLLM has no public path to hand a running request's KV to another engine), and
OrchestrRL §6.2.2 itself paid "5.4 s for KV-cache recomputation" when it reconfigured, so
recompute-only is the default; :meth:`CostModel.for_engine` builds the model an engine can honour.

With a network seam on the performance model (``perf.network``, :mod:`compute_sched.netseam`) the
peer path of a reshard and a KV transfer are estimated at the rate the fabric gives (per GPU, and a
KV transfer over every KV-holding GPU of the destination, Appendix A's "multiple NICs") instead of
one NIC; the engine then times the real transfers as flows on the fabric.
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrl.compute_sched.engine import RECOMPUTE_ONLY, Engine, EngineCapabilities
from orchestrl.compute_sched.layout import InstanceConfig
from orchestrl.compute_sched.perf import PerfModel

__all__ = ["SwitchCost", "MigrationCost", "CostModel"]


@dataclass(frozen=True)
class SwitchCost:
    """``C^sw`` of bringing one instance to a new configuration."""

    seconds: float
    bytes_moved: float  # weight bytes fetched by the slowest GPU
    path: str  # "none", "nvlink", "nic" or "host"


@dataclass(frozen=True)
class MigrationCost:
    """``C^mig`` of moving a set of requests' state to one destination instance."""

    seconds: float
    method: str  # "none", "transfer" or "recompute"
    kv_bytes: float
    tokens: int


@dataclass(frozen=True)
class CostModel:
    """Profiled transfer paths and fixed costs; :class:`PerfModel` supplies the sizes and prefill times.

    Examples
    --------
    >>> from orchestrl.compute_sched.hardware import load_gpu, load_model
    >>> perf = PerfModel(load_model("Qwen2.5-32B"), load_gpu("H800"))
    >>> dst = InstanceConfig("tp", tp=4)
    >>> costs = CostModel(perf)  # recompute only: what the vLLM adapter can do
    >>> costs.migration(dst, [300]).method, costs.migration(dst, [12000] * 64).method
    ('recompute', 'recompute')
    >>> what_if = CostModel(perf, capabilities=EngineCapabilities.assume_kv_transfer())
    >>> what_if.migration(dst, [300]).method, what_if.migration(dst, [12000] * 64).method
    ('recompute', 'transfer')
    """

    perf: PerfModel
    capabilities: EngineCapabilities = RECOMPUTE_ONLY  # which migration methods exist at all
    switch_fixed_s: float = 1.5  # engine switch-over (OrchestrRL §6.2.2 measured ~1.5 s)
    transfer_setup_s: float = 0.2  # KV transfer: connection, registration, synchronisation
    transfer_link_bps: float | None = None  # None: the destination's NIC (Appendix A assumes one 200G NIC)

    @classmethod
    def for_engine(cls, perf: PerfModel, engine: Engine, **knobs: float) -> "CostModel":
        """The cost model of ``engine``: it prices transfer only if ``engine.capabilities`` allows it.

        Every scheduler, planner and balancer should get its costs from here (or from an explicit,
        labelled :meth:`EngineCapabilities.assume_kv_transfer` for a what-if study), so predicted
        gains never rest on a migration path the engine does not have.
        """
        return cls(perf, capabilities=engine.capabilities, **knobs)

    def switch(self, old: InstanceConfig | None, new: InstanceConfig, same_gpus: bool = True) -> SwitchCost:
        """Return ``C^sw`` of turning the GPUs of ``old`` (None: idle GPUs) into an instance of ``new``."""
        if old == new and same_gpus:
            return SwitchCost(0.0, 0.0, "none")
        need = self.perf.weights_per_gpu_bytes(new)
        have = 0.0
        if old is not None and same_gpus and old.kind == new.kind == "tp" and new.tp >= old.tp:
            have = need  # a finer TP shard is a slice of the shard already held
        missing = max(0.0, need - have)
        if missing == 0.0:
            return SwitchCost(self.switch_fixed_s, 0.0, "none")
        g = self.perf.gpu
        intra = new.gpus <= g.gpus_per_node
        peer_bw = g.nvlink_bytes_per_s if intra else self._peer_bytes_per_s(new)
        options = {"nvlink" if intra else "nic": missing / peer_bw, "host": missing / g.pcie_bytes_per_s}
        path = min(options, key=options.__getitem__)
        return SwitchCost(self.switch_fixed_s + options[path], missing, path)

    def _peer_bytes_per_s(self, new: InstanceConfig) -> float:
        """Per-GPU rate of a weight fetch from peers in other nodes: the NIC, or the network seam's estimate."""
        net = self.perf.network
        return self.perf.gpu.nic_bytes_per_s if net is None else net.transfer_bytes_per_s(new)

    def _link_bytes_per_s(self, dst: InstanceConfig | None = None) -> float:
        net = self.perf.network
        if net is not None and self.transfer_link_bps is None:  # every KV-holding GPU of dst receives
            gpus = dst.attn_gpus if dst is not None and dst.kind == "afd" else (dst.gpus if dst is not None else 1)
            return gpus * net.transfer_bytes_per_s(dst)
        bps = self.transfer_link_bps if self.transfer_link_bps is not None else self.perf.gpu.nic_bps
        return bps / 8.0

    def transfer_s(self, tokens: int, dst: InstanceConfig | None = None) -> float:
        """Seconds to ship ``tokens`` tokens of KV cache to another instance (of ``dst``, if known)."""
        if tokens <= 0:
            return 0.0
        return self.transfer_setup_s + tokens * self.perf.model.kv_bytes_per_token / self._link_bytes_per_s(dst)

    def recompute_s(self, dst: InstanceConfig, contexts: list[int]) -> float:
        """Seconds for ``dst`` to rebuild the KV of requests with these context lengths (one batched prefill)."""
        tokens = sum(contexts)
        if tokens <= 0:
            return 0.0
        mean_ctx = sum(c * c for c in contexts) / (2.0 * tokens)
        return self.perf.prefill_s(dst, tokens, mean_ctx)

    def migration(self, dst: InstanceConfig, contexts: list[int]) -> MigrationCost:
        """Return the cheaper of KV transfer and recomputation for moving these requests to ``dst``.

        Transfer is a candidate only when ``capabilities.kv_transfer``; otherwise this is recomputation.

        Notes
        -----
        O(len(contexts)).
        """
        tokens = int(sum(contexts))
        if tokens <= 0:
            return MigrationCost(0.0, "none", 0.0, 0)
        kv = tokens * float(self.perf.model.kv_bytes_per_token)
        r = self.recompute_s(dst, list(contexts))
        if not self.capabilities.kv_transfer:
            return MigrationCost(r, "recompute", kv, tokens)
        t = self.transfer_s(tokens, dst)
        if t <= r:
            return MigrationCost(t, "transfer", kv, tokens)
        return MigrationCost(r, "recompute", kv, tokens)

    def per_token_s(self, dst: InstanceConfig, typical_context: int = 4096, batch: int = 64) -> float:
        """Marginal migration seconds per context token at a typical size (the planner's linear term)."""
        c = self.migration(dst, [typical_context] * batch)
        return c.seconds / max(1, c.tokens)
