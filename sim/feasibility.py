"""Load-time feasibility of an RLSim run: training memory, parallel shapes, problem size.

Design note
-----------
A simulator that accepts a run no cluster could execute gives silently wrong answers (Qwen3-235B
trained on 8 H800s used to report "train 63 s"). These checks refuse such runs when the run file is
loaded, each with the field a user would change. They are *lower bounds* on what a layout needs,
so they never refuse a run that fits:

* **training memory** per GPU of the most loaded pipeline stage, Megatron-style (Korthikanti et
  al., "Reducing Activation Recomputation in Large Transformer Models", §4; Megatron-core's
  distributed optimizer): bf16 weights (2 bytes per parameter), fp32 main gradients (4), Adam's
  fp32 master weights and two moments (12) sharded over the data-parallel ranks, and activations
  at their smallest -- full recomputation keeps one ``tokens x d_model`` bf16 input per layer and
  micro-batch in flight, split over TP (sequence parallelism) and CP; 1F1B keeps up to ``pp``
  micro-batches in flight on the first stage. Dense parameters are split over TP x PP, routed
  experts over EP x expert-TP x PP (expert TP = TP, Megatron-core's default), the input embedding
  and the LM head sit on the first and last stages, split over TP;
* **parallel shapes**: a TP degree must divide the query heads (vLLM and Megatron shard heads;
  AFD's attention side may pad them, as §7.3.2's 28-head model at TP=8), an EP degree the routed
  experts, and a generation TP group must stay inside one server (its all-reduces run every layer;
  EP and AFD shapes are how instances span servers);
* **problem size**: the GPU count is bounded where the generation planner's routing of the
  fabric would run for minutes without output (:data:`MAX_GPUS`).
"""

from __future__ import annotations

from dataclasses import dataclass

from orchestrl.compute_sched.hardware import GpuSpec, ModelSpec
from orchestrl.fabric.errors import ConfigError

__all__ = ["TrainingMemory", "training_memory", "check_training_memory", "check_parallel_shapes",
           "MAX_GPUS", "WEIGHT_BYTES", "GRAD_BYTES", "ADAM_BYTES"]

WEIGHT_BYTES = 2  # bf16 parameters
GRAD_BYTES = 4  # fp32 main gradients (Megatron accumulates and reduces bf16 models' gradients in fp32)
ADAM_BYTES = 12  # fp32 master weights, first and second moments; sharded over DP by the distributed optimizer
#: Largest cluster a run file may ask for: the 16,384-GPU fat-tree's first iteration takes ~10 minutes
#: here (the generation planner routes every instance's pattern over the fabric); 65,536 took over 2
#: minutes before printing anything.
MAX_GPUS = 16384


@dataclass(frozen=True)
class TrainingMemory:
    """Bytes one GPU of the most loaded training stage needs at least, and what it has."""

    weights_bytes: float
    grads_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    hbm_bytes: float

    @property
    def total_bytes(self) -> float:
        return self.weights_bytes + self.grads_bytes + self.optimizer_bytes + self.activations_bytes

    @property
    def fits(self) -> bool:
        return self.total_bytes <= self.hbm_bytes

    def describe(self) -> str:
        gb = 1e9
        return (f"{self.total_bytes / gb:,.0f} GB per GPU (weights {self.weights_bytes / gb:,.0f}, gradients "
                f"{self.grads_bytes / gb:,.0f}, optimizer {self.optimizer_bytes / gb:,.0f}, activations at least "
                f"{self.activations_bytes / gb:,.1f}) against {self.hbm_bytes / gb:,.0f} GB of HBM")


def training_memory(model: ModelSpec, gpu: GpuSpec, *, tp: int, cp: int, ep: int, pp: int, dp: int,
                    microbatch_tokens: int = 8192) -> TrainingMemory:
    """Return the least memory one training GPU needs for ``model`` under the layout (see the module note).

    Examples
    --------
    >>> from orchestrl.compute_sched.hardware import load_gpu, load_model
    >>> m = training_memory(load_model("Qwen3-235B-A22B"), load_gpu("H800"), tp=8, cp=1, ep=1, pp=1, dp=1)
    >>> round(m.total_bytes / 1e9), m.fits  # 235B parameters x 18 bytes on 8 GPUs, 80 GB each
    (528, False)
    """
    embed = 2.0 * model.vocab * model.d_model  # input embedding and untied LM head
    body_dense = max(0.0, model.dense_params - embed)
    dense_gpu = body_dense / (tp * pp) + model.vocab * model.d_model / tp  # a first/last stage holds one table
    etp = tp  # Megatron-core's expert_tensor_parallel_size defaults to the TP size
    expert_gpu = model.expert_params / (ep * etp * pp) if model.is_moe else 0.0
    params = dense_gpu + expert_gpu
    expert_dp = max(1, (tp * cp * dp) // (ep * etp))
    optimizer = ADAM_BYTES * (dense_gpu / (dp * cp) + expert_gpu / expert_dp)
    in_flight = pp  # 1F1B: the first stage holds pp micro-batches
    layers_here = -(-model.layers // pp)
    acts = in_flight * layers_here * microbatch_tokens / (tp * cp) * model.d_model * WEIGHT_BYTES
    return TrainingMemory(params * WEIGHT_BYTES, params * GRAD_BYTES, optimizer, acts, gpu.hbm_bytes)


def check_training_memory(source: str, model: ModelSpec, gpu: GpuSpec, train_gpus: int, *, tp: int, cp: int,
                          ep: int, pp: int, field: str = "cluster.train_gpus") -> TrainingMemory:
    """Raise a :class:`ConfigError` naming ``field`` when the training layout cannot hold ``model``."""
    dp = max(1, train_gpus // (tp * cp * pp))
    mem = training_memory(model, gpu, tp=tp, cp=cp, ep=ep, pp=pp, dp=dp)
    if not mem.fits:
        static = (mem.weights_bytes + mem.grads_bytes) / 1e9
        raise ConfigError(source, field, f"{model.name} trained on {train_gpus} {gpu.name} GPUs (tp={tp}, pp={pp}, "
                          f"ep={ep}, dp={dp}) needs {mem.describe()}",
                          f"more model parallelism (train.tp, pp, ep: weights and gradients alone take {static:,.0f} GB "
                          "per GPU here) and more training GPUs (the optimizer state shards over data-parallel ranks); "
                          "this is a lower bound (distributed optimizer, full recomputation)")
    return mem


def check_parallel_shapes(source: str, model: ModelSpec, gpus_per_server: int, *, instance_field: str,
                          tp: int | None = None, ep: int | None = None, gen_tp: int | None = None,
                          gen_kind: str = "tp") -> None:
    """Raise a :class:`ConfigError` for TP/EP degrees the model's heads or experts cannot be split into.

    ``tp`` and ``ep`` are training degrees (fields ``train.tp``/``train.ep``); ``gen_tp`` a generation
    instance's attention TP (field ``instance_field``) of an instance of kind ``gen_kind``. A TP
    instance must divide the query heads (vLLM's rule); an AFD instance's attention side only must
    not exceed them (§7.3.2 runs Qwen2-57B-A14B's 28 heads at TP=8: head padding).
    """
    if tp is not None and model.query_heads % tp:
        raise ConfigError(source, "train.tp", f"{tp} does not divide {model.name}'s {model.query_heads} query heads",
                          _divisors(model.query_heads))
    if ep is not None and ep > 1:
        if not model.is_moe:
            raise ConfigError(source, "train.ep", f"{model.name} is dense: it has no experts to spread over {ep}",
                              "1 for a dense model")
        if model.experts % ep:
            raise ConfigError(source, "train.ep", f"{ep} does not divide {model.name}'s {model.experts} experts",
                              _divisors(model.experts))
    if gen_tp is not None:
        if gen_tp > model.query_heads or (gen_kind != "afd" and model.query_heads % gen_tp):
            raise ConfigError(source, instance_field, f"TP={gen_tp} does not divide {model.name}'s "
                              f"{model.query_heads} query heads", f"TP in {_divisors(model.query_heads)}")
        if gen_tp > gpus_per_server:
            raise ConfigError(source, instance_field, f"a TP={gen_tp} group spans {gen_tp // gpus_per_server} servers: "
                              "its all-reduces would cross the network every layer",
                              f"TP <= {gpus_per_server} (GPUs per server); span servers with an epN-tpK or "
                              "afdA:F-tpK shape")


def _divisors(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0 and d <= 64)
