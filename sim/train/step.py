"""One training step of a Megatron-style job: its traffic, and how compute and communication add up.

Design note
-----------
The MFU calibration (:mod:`sim.train.mfu`) and the training stage (:mod:`sim.stages.training`) must
add time up the same way, or the efficiency fitted on published points would not mean the same
thing in the simulator. This module is that shared arithmetic. What overlaps (Megatron-LM with the
options its performance recipes use):

* **TP** (sequence parallel): two all-gathers and two reduce-scatters of activations per layer in
  forward, as many in backward, overlapped with the layer's GEMMs (``--tp-comm-overlap``); only the
  part longer than those GEMMs is exposed.
* **CP**: a ring exchange of K and V chunks per layer (``cp - 1`` steps forward, twice that in
  backward for K, V and their gradients), overlapped with the attention core; the excess is exposed.
* **EP**: a dispatch and a combine all-to-all per MoE layer in forward, two more in backward, each
  sending ``topk`` copies of every token (Megatron's all-to-all dispatcher; DeepEP's one copy per
  node is :mod:`sim.train.dispatch`, which the default calibration leaves out); a fraction
  ``ep_exposed`` of their time is on the critical path (fitted: 1.0, nothing hidden).
* **PP**: one activation (forward) or gradient (backward) transfer per stage boundary and
  micro-batch; overlapped in the steady state, exposed while the pipeline fills and drains.
* **DP**: gradients reduce-scattered in fp32 (distributed optimizer) and parameters all-gathered in
  bf16 once per optimizer step over the ``dp-cp`` group (dense) and the ``expert-dp`` group (experts).

Per-GPU work is balanced: every GPU does ``1 / world`` of the FLOPs (experts force-balanced, as in
every calibration point; ``expert_imbalance`` scales expert time and all-to-all for a skewed router).
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrl.fabric.errors import ConfigError
from orchestrl.fabric.layout import ParallelLayout
from orchestrl.sim.train.flops import BF16_BYTES, ArchSpec, TokenFlops

__all__ = ["TrainLayout", "MicrobatchTraffic", "GradTraffic", "Efficiency", "LayerComm", "MicrobatchTimes",
           "microbatch_traffic", "grad_traffic", "microbatch_times", "GRAD_REDUCE_BYTES", "OPTIMIZER_BYTES_PER_PARAM"]

GRAD_REDUCE_BYTES = 4  # Megatron reduces bf16 models' gradients in fp32
OPTIMIZER_BYTES_PER_PARAM = 32  # Adam over its shard: read fp32 grad, master, m, v; write master, m, v, bf16 param


@dataclass(frozen=True)
class TrainLayout:
    """The parallel sizes the step model needs (Megatron's names; ``etp`` is the expert TP size)."""

    tp: int = 1
    cp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    etp: int = 1
    vp: int = 1  # virtual pipeline stages per rank (interleaved 1F1B); 1 = plain 1F1B

    def __post_init__(self) -> None:
        for name in ("tp", "cp", "pp", "dp", "ep", "etp", "vp"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ConfigError("TrainLayout", name, f"expected a positive integer, got {v!r}", "an integer >= 1")
        if self.world % (self.etp * self.ep * self.pp):
            raise ConfigError("TrainLayout", "ep", f"etp*ep*pp = {self.etp * self.ep * self.pp} does not divide "
                              f"the world size {self.world}", "sizes whose product divides tp*cp*dp*pp")

    @classmethod
    def from_parallel(cls, layout: ParallelLayout, vp: int = 1) -> "TrainLayout":
        return cls(tp=layout.tp, cp=layout.cp, pp=layout.pp, dp=layout.dp, ep=layout.ep,
                   etp=layout.expert_tp_size, vp=vp)

    @property
    def world(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def expert_dp(self) -> int:
        return self.world // (self.etp * self.ep * self.pp)


@dataclass(frozen=True)
class MicrobatchTraffic:
    """Bytes each rank moves per collective, for one micro-batch of ``tokens`` tokens per pipeline."""

    ep_bytes: float  # send buffer of one dispatch (or combine) all-to-all of one MoE layer
    cp_chunk_bytes: float  # K and V of one sequence chunk (one ring step) of one layer
    tp_bytes: float  # gathered activation of one TP all-gather (= input of one reduce-scatter)
    pp_bytes: float  # activation crossing one stage boundary


@dataclass(frozen=True)
class GradTraffic:
    """Gradients and parameters each rank synchronises once per optimizer step."""

    dense_params_per_gpu: float
    expert_params_per_gpu: float

    def reduce_scatter_bytes(self, kind: str) -> float:
        return GRAD_REDUCE_BYTES * (self.dense_params_per_gpu if kind == "dense" else self.expert_params_per_gpu)

    def all_gather_bytes(self, kind: str) -> float:
        return BF16_BYTES * (self.dense_params_per_gpu if kind == "dense" else self.expert_params_per_gpu)


@dataclass(frozen=True)
class Efficiency:
    """Achieved fraction of the GPU's peak bf16 FLOP/s, per kernel kind."""

    dense: float
    expert: float
    attention: float


@dataclass(frozen=True)
class LayerComm:
    """Completion times (s) of one rank's collectives for one micro-batch (all groups concurrent)."""

    ep_a2a_s: float = 0.0  # one dispatch or combine all-to-all of one MoE layer
    cp_step_s: float = 0.0  # one ring step of K/V chunks (all CP groups at once)
    tp_layer_s: float = 0.0  # the 4 TP collectives of one layer's forward
    pp_p2p_s: float = 0.0  # one stage-boundary transfer


@dataclass(frozen=True)
class MicrobatchTimes:
    """One micro-batch on one pipeline stage: forward and backward wall time, and where it went."""

    fwd_s: float
    bwd_s: float
    compute_s: float  # fwd + bwd (+ recompute) kernels
    ep_exposed_s: float
    cp_exposed_s: float
    tp_exposed_s: float
    attention_s: float  # attention-core kernels (overlaps the CP ring)
    dense_kernel_s: float = 0.0  # dense-GEMM kernels of fwd + bwd (without recomputation)
    expert_kernel_s: float = 0.0  # expert-GEMM kernels of fwd + bwd (without recomputation)

    @property
    def total_s(self) -> float:
        return self.fwd_s + self.bwd_s


def microbatch_traffic(arch: ArchSpec, lay: TrainLayout, tokens: float) -> MicrobatchTraffic:
    """Return what each rank sends per collective for a micro-batch of ``tokens`` tokens.

    Each CP rank holds ``tokens / cp`` tokens; sequence parallelism splits them again over TP for
    the all-to-all (each TP rank dispatches its own share) and the stage-boundary activation.

    Examples
    --------
    >>> from orchestrl.compute_sched.hardware import load_model
    >>> a = ArchSpec.from_model(load_model("Qwen2-57B-A14B"))
    >>> t = microbatch_traffic(a, TrainLayout(tp=4, ep=16, dp=64), tokens=8192)
    >>> t.ep_bytes / (8192 / 4 * 8 * 3584 * 2)  # tokens per rank x topk x d_model x bf16
    1.0
    """
    per_cp = tokens / lay.cp
    per_rank = per_cp / lay.tp
    return MicrobatchTraffic(ep_bytes=per_rank * arch.topk * arch.d_model * BF16_BYTES if arch.is_moe else 0.0,
                             cp_chunk_bytes=per_cp * arch.kv_bytes_per_token_layer / lay.tp,
                             tp_bytes=per_cp * arch.d_model * BF16_BYTES,
                             pp_bytes=per_rank * arch.d_model * BF16_BYTES)


def grad_traffic(arch: ArchSpec, lay: TrainLayout) -> GradTraffic:
    """Return the parameters each GPU holds: dense ones split over TP and PP, experts over ETP, EP, PP."""
    return GradTraffic(dense_params_per_gpu=arch.dense_params / (lay.tp * lay.pp),
                       expert_params_per_gpu=arch.expert_params / (lay.etp * lay.ep * lay.pp))


def microbatch_times(arch: ArchSpec, lay: TrainLayout, flops: TokenFlops, eff: Efficiency, comm: LayerComm,
                     peak_flops: float, *, ep_exposed: float = 1.0, recompute: bool = False,
                     expert_imbalance: float = 1.0) -> MicrobatchTimes:
    """Return forward and backward time of one micro-batch on one stage.

    Parameters
    ----------
    flops : TokenFlops
        Model FLOPs (fwd + bwd) of one micro-batch through the *whole* model (one pipeline).
    eff : Efficiency
        Kernel efficiencies (fraction of ``peak_flops``).
    comm : LayerComm
        Collective times of one micro-batch (0 where a dimension is 1).
    ep_exposed : float
        Fraction of each all-to-all on the critical path.
    recompute : bool
        Full activation recomputation: backward re-runs the forward (kernels and all-to-alls).
    expert_imbalance : float
        Busiest expert rank's load over the mean (1 = balanced).

    Notes
    -----
    O(1). Forward is one third of the kernels' time, backward two thirds (plus the recomputed
    forward).
    """
    gpus_per_replica = lay.tp * lay.cp * lay.pp  # one pipeline replica; experts balance across replicas
    kernel = lambda f, e: f / (e * peak_flops * gpus_per_replica)  # noqa: E731
    dense_s = kernel(flops.dense_gemm, eff.dense)
    expert_s = kernel(flops.expert_gemm, eff.expert) * expert_imbalance
    attn_s = kernel(flops.attention, eff.attention)
    layers = arch.layers / lay.pp
    moe_layers = arch.moe_layers / lay.pp
    fwd_kernels = (dense_s + expert_s + attn_s) / 3.0
    # exposed communication of one forward pass of this stage's layers
    ep_f = ep_exposed * 2.0 * moe_layers * comm.ep_a2a_s * expert_imbalance
    cp_f = max(0.0, (lay.cp - 1) * comm.cp_step_s - attn_s / 3.0 / max(layers, 1e-9)) * layers if lay.cp > 1 else 0.0
    tp_f = max(0.0, comm.tp_layer_s - dense_s / 3.0 / max(layers, 1e-9)) * layers if lay.tp > 1 else 0.0
    cp_b = (max(0.0, 2 * (lay.cp - 1) * comm.cp_step_s - 2 * attn_s / 3.0 / max(layers, 1e-9)) * layers
            if lay.cp > 1 else 0.0)
    tp_b = max(0.0, comm.tp_layer_s - 2 * dense_s / 3.0 / max(layers, 1e-9)) * layers if lay.tp > 1 else 0.0
    redo = 1.0 if recompute else 0.0
    fwd = fwd_kernels + ep_f + cp_f + tp_f
    bwd = 2.0 * fwd_kernels + ep_f + cp_b + tp_b + (fwd if recompute else 0.0)
    compute = fwd_kernels * (3.0 + redo)
    return MicrobatchTimes(fwd_s=fwd, bwd_s=bwd, compute_s=compute, ep_exposed_s=ep_f * (2.0 + redo),
                           cp_exposed_s=cp_f * (1.0 + redo) + cp_b, tp_exposed_s=tp_f * (1.0 + redo) + tp_b,
                           attention_s=attn_s * (1.0 + redo / 3.0), dense_kernel_s=dense_s, expert_kernel_s=expert_s)

