"""Build the parameter list a schedule needs from real models: Megatron-core modules and state dicts.

Design note
-----------
A :class:`~collectives.layout.ParamSpec` needs, per parameter, the engine's name and canonical shape
and how each side shards it. Nobody should write that by hand for a 70B model, and getting one
fused layout wrong corrupts weights silently, so the builders read it from the sources of truth:

* **Megatron-core** marks every tensor-parallel parameter with ``tensor_model_parallel``,
  ``partition_dim`` and ``partition_stride`` (``partition_stride = 2`` is how it builds SwiGLU's
  ``linear_fc1``: the master weight ``[gate; up]`` cut into ``2 * tp`` chunks, rank ``k`` taking
  chunks ``k`` and ``k + tp``). Its fused ``linear_qkv`` interleaves query groups
  (``q_g, k_g, v_g`` for each group) and splits that order evenly; its vocabularies are padded to a
  multiple of ``make_vocab_size_divisible_by * tp``. :func:`megatron_specs` turns a rank's
  ``named_parameters()`` into specs, expert (MoE) parameters included.
* **vLLM** fuses ``qkv_proj`` (``QKVParallelLinear``: query heads split, KV heads split or, when
  there are fewer KV heads than ranks, replicated) and ``gate_up_proj``
  (``MergedColumnParallelLinear``), pads vocabularies to a multiple of 64
  (``VocabParallelEmbedding``) and stacks experts (``FusedMoE``'s ``w13_weight``/``w2_weight``);
  :func:`vllm_layout` describes that engine side by parameter name.
* A state dict (Hugging Face or vLLM names, whole or TP-local tensors) goes through
  :func:`state_dict_specs`, which also finds tied weights (two names, one storage) so a shared
  tensor is sent once and delivered under both names.

Names are mapped with a list of ``(regex, replacement)`` rules (:data:`MEGATRON_TO_VLLM`); the
trainer's dtype is kept as ``source_dtype`` so fp32 masters or fp32 norms are cast to the engine's
dtype on the trainer, rank by rank, while sending.
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass, replace
from typing import Callable, Iterable, Mapping, Sequence

from orchestrl.fabric.errors import ConfigError

from orchestrl.collectives.layout import DTYPE_BYTES, ParamSpec
from orchestrl.collectives.sharding import Sharding

__all__ = ["ModelShape", "MEGATRON_TO_VLLM", "rename", "vllm_layout", "hf_layout", "megatron_specs",
           "megatron_named_parameters", "state_dict_specs", "merge_specs"]

#: Megatron-core GPT parameter names -> vLLM's (Llama, Qwen2, Mixtral, Qwen2-MoE families).
#: ``{layer}`` and ``{expert}`` are filled with the *global* layer and expert numbers.
MEGATRON_TO_VLLM: tuple[tuple[str, str], ...] = (
    (r"^embedding\.word_embeddings\.weight$", "model.embed_tokens.weight"),
    (r"^decoder\.layers\.(\d+)\.input_layernorm\.weight$", "model.layers.{layer}.input_layernorm.weight"),
    (r"^decoder\.layers\.(\d+)\.self_attention\.linear_qkv\.layer_norm_weight$",
     "model.layers.{layer}.input_layernorm.weight"),
    (r"^decoder\.layers\.(\d+)\.self_attention\.linear_qkv\.(weight|bias)$", r"model.layers.{layer}.self_attn.qkv_proj.\2"),
    (r"^decoder\.layers\.(\d+)\.self_attention\.linear_proj\.(weight|bias)$", r"model.layers.{layer}.self_attn.o_proj.\2"),
    (r"^decoder\.layers\.(\d+)\.pre_mlp_layernorm\.weight$", "model.layers.{layer}.post_attention_layernorm.weight"),
    (r"^decoder\.layers\.(\d+)\.mlp\.linear_fc1\.layer_norm_weight$",
     "model.layers.{layer}.post_attention_layernorm.weight"),
    (r"^decoder\.layers\.(\d+)\.mlp\.linear_fc1\.weight$", "model.layers.{layer}.mlp.gate_up_proj.weight"),
    (r"^decoder\.layers\.(\d+)\.mlp\.linear_fc2\.weight$", "model.layers.{layer}.mlp.down_proj.weight"),
    (r"^decoder\.layers\.(\d+)\.mlp\.router\.weight$", "model.layers.{layer}.mlp.gate.weight"),
    (r"^decoder\.layers\.(\d+)\.mlp\.experts\.local_experts\.(\d+)\.linear_fc1\.weight$",
     "model.layers.{layer}.mlp.experts.w13_weight[{expert}]"),
    (r"^decoder\.layers\.(\d+)\.mlp\.experts\.local_experts\.(\d+)\.linear_fc2\.weight$",
     "model.layers.{layer}.mlp.experts.w2_weight[{expert}]"),
    (r"^decoder\.final_layernorm\.weight$", "model.norm.weight"),
    (r"^output_layer\.weight$", "lm_head.weight"),
)

_EXPERT_NAME = re.compile(r"\.experts\.(?:local_experts\.(\d+)\.|.*\[(\d+)\]$)")


@dataclass(frozen=True)
class ModelShape:
    """The few model dimensions fused and padded layouts depend on.

    Parameters
    ----------
    num_attention_heads, num_key_value_heads, head_dim : int
        Query heads, KV heads (query groups) and head size.
    vocab_size : int
        The true vocabulary (the canonical row count of embeddings and the LM head).
    num_experts : int
        Experts per MoE layer (0 for a dense model).
    """

    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    vocab_size: int
    num_experts: int = 0

    @classmethod
    def from_hf_config(cls, config: Mapping[str, object]) -> "ModelShape":
        """From a Hugging Face ``config.json`` (Llama, Qwen2, Mixtral, Qwen2-MoE fields)."""
        heads = int(config["num_attention_heads"])  # type: ignore[arg-type]
        head_dim = int(config.get("head_dim") or int(config["hidden_size"]) // heads)  # type: ignore[arg-type]
        experts = int(config.get("num_local_experts") or config.get("num_experts") or 0)  # type: ignore[arg-type]
        return cls(heads, int(config.get("num_key_value_heads") or heads), head_dim,  # type: ignore[arg-type]
                   int(config["vocab_size"]), experts)  # type: ignore[arg-type]

    @classmethod
    def from_megatron(cls, config, vocab_size: int) -> "ModelShape":
        """From a Megatron-core ``TransformerConfig`` and the true (unpadded) vocabulary size."""
        heads = int(config.num_attention_heads)
        return cls(heads, int(config.num_query_groups or heads), int(config.kv_channels), int(vocab_size),
                   int(config.num_moe_experts or 0))

    @property
    def qkv_parts(self) -> tuple[int, int, int]:
        """Rows of q, k and v in a fused QKV weight."""
        kv = self.num_key_value_heads * self.head_dim
        return (self.num_attention_heads * self.head_dim, kv, kv)


#: A layout rule: (engine or trainer name, canonical split-dimension rows) -> (tp_dim, Sharding).
Layout = Callable[[str, int, ModelShape], tuple[int | None, Sharding]]


def vllm_layout(name: str, rows: int, shape: ModelShape, *, vocab_padding: int = 64) -> tuple[int | None, Sharding]:
    """How vLLM shards parameter ``name`` (vLLM's names) over its TP ranks.

    Examples
    --------
    >>> s = ModelShape(num_attention_heads=8, num_key_value_heads=2, head_dim=4, vocab_size=100)
    >>> vllm_layout("model.layers.0.self_attn.qkv_proj.weight", 48, s)
    (0, Sharding(parts=(32, 8, 8), heads=(8, 2, 2), groups=0, pad_multiple=1, pad_per_tp=False))
    >>> vllm_layout("model.norm.weight", 32, s)[0] is None
    True
    """
    if re.search(r"qkv_proj\.(weight|bias)$", name):
        return 0, Sharding.fused(*shape.qkv_parts, heads=(shape.num_attention_heads,) + (shape.num_key_value_heads,) * 2)
    if re.search(r"(gate_up_proj\.weight|w13_weight\[\d+\])$", name):
        return 0, Sharding.fused(rows // 2, rows // 2)
    if re.search(r"(o_proj|down_proj)\.weight$|w2_weight\[\d+\]$", name):
        return 1, Sharding()
    if re.search(r"(embed_tokens|lm_head)\.weight$", name):
        return 0, Sharding.padded(vocab_padding)
    return None, Sharding()


def hf_layout(name: str, rows: int, shape: ModelShape) -> tuple[int | None, Sharding]:
    """Tensor-parallel layout of Hugging Face (unfused) names, as column/row-parallel layers split them."""
    if re.search(r"(q_proj|gate_proj|up_proj|w1|w3)\.(weight|bias)$", name):
        return 0, Sharding()
    if re.search(r"(k_proj|v_proj)\.(weight|bias)$", name):
        return 0, Sharding.fused(rows, heads=(shape.num_key_value_heads,))  # KV heads replicate past their count
    if re.search(r"(o_proj|down_proj|w2)\.weight$", name):
        return 1, Sharding()
    if re.search(r"(embed_tokens|lm_head)\.weight$", name):
        return 0, Sharding.padded(64)
    return None, Sharding()


def rename(name: str, rules: Sequence[tuple[str, str]] | Mapping[str, str] | Callable[[str], str | None] | None, *,
           layer_offset: int = 0, expert_offset: int = 0) -> str | None:
    """Map a trainer name to the engine's with ``rules`` (None when no rule matches).

    ``{layer}`` / ``{expert}`` in a replacement become the first / second number captured, plus
    ``layer_offset`` / ``expert_offset`` (a pipeline stage's first layer, an expert rank's first expert).

    Examples
    --------
    >>> rename("decoder.layers.1.mlp.linear_fc1.weight", MEGATRON_TO_VLLM, layer_offset=4)
    'model.layers.5.mlp.gate_up_proj.weight'
    """
    if rules is None:
        return name
    if callable(rules):
        return rules(name)
    if isinstance(rules, Mapping):
        return rules.get(name)
    for pattern, repl in rules:
        m = re.match(pattern, name)
        if m:
            nums = [int(g) for g in m.groups() if g is not None and g.isdigit()]
            out = m.expand(repl)
            if "{layer}" in out:
                out = out.replace("{layer}", str(nums[0] + layer_offset))
            if "{expert}" in out:
                out = out.replace("{expert}", str(nums[1] + expert_offset))
            return out
    return None


def _dtype(t) -> str:
    name = str(t.dtype).removeprefix("torch.")
    if name not in DTYPE_BYTES:
        raise ConfigError("model", "dtype", f"unsupported dtype {name}", ", ".join(DTYPE_BYTES))
    return name


def megatron_named_parameters(model) -> list[tuple[str, object]]:
    """This rank's parameters under the names :func:`megatron_specs` gives them as sources.

    ``model`` is a Megatron-core model or the list of its virtual-pipeline chunks. One chunk keeps
    ``named_parameters()``'s names; with several, chunk ``i``'s names get the prefix ``vp<i>.`` (each
    chunk numbers its layers from 0, so plain names would collide). Pass the result to
    :meth:`WeightSync.send`.
    """
    chunks = list(model) if isinstance(model, (list, tuple)) else [model]
    if len(chunks) == 1:
        return list(chunks[0].named_parameters())
    return [(f"vp{i}.{n}", p) for i, chunk in enumerate(chunks) for n, p in chunk.named_parameters()]


_LAYER_MODULE = re.compile(r"^(?:.*\.)?layers\.(\d+)$")
_LOCAL_EXPERT = re.compile(r"\.local_experts\.(\d+)\.")


def _global_names(model) -> tuple[list[tuple[str, str, object]], bool]:
    """(source name, name with global layer and expert numbers, parameter) per parameter, and whether the
    model ties its output layer to the embedding.

    Megatron numbers layers from 0 on every pipeline stage and virtual chunk and local experts from 0
    on every expert rank; the global numbers come from the modules themselves: a ``TransformerLayer``'s
    ``layer_number`` (1-based, offset included) and an ``MoELayer``'s ``local_expert_indices``.
    """
    chunks = list(model) if isinstance(model, (list, tuple)) else [model]
    sources = {id(p): n for n, p in megatron_named_parameters(chunks)}
    out, tied = [], False
    for chunk in chunks:
        tied = tied or bool(getattr(chunk, "share_embeddings_and_output_weights", False))
        layers: dict[str, int] = {}
        experts: dict[str, list[int]] = {}
        for prefix, module in chunk.named_modules():
            if _LAYER_MODULE.match(prefix) and isinstance(getattr(module, "layer_number", None), int):
                layers[prefix + "."] = module.layer_number - 1
            indices = getattr(module, "local_expert_indices", None)
            if indices is not None:
                experts[prefix + "."] = [int(i) for i in indices]
        for name, param in chunk.named_parameters():
            glob = name
            for prefix, layer in layers.items():
                if name.startswith(prefix):
                    glob = re.sub(r"layers\.\d+\.", f"layers.{layer}.", prefix, count=1) + name[len(prefix):]
                    break
            for prefix, indices in experts.items():
                m = _LOCAL_EXPERT.search(name) if name.startswith(prefix) else None
                if m and int(m.group(1)) < len(indices):
                    glob = _LOCAL_EXPERT.sub(f".local_experts.{indices[int(m.group(1))]}.", glob, count=1)
            out.append((sources[id(param)], glob, param))
    return out, tied


def megatron_specs(named_params, shape: ModelShape, *, tp_size: int,
                   dtype: str = "bfloat16", name_map=MEGATRON_TO_VLLM, engine: Layout = vllm_layout,
                   pp_stage: int | None = None, layer_offset: int = 0, ep_size: int = 1, ep_rank: int = 0,
                   expert_tp_size: int | None = None, make_vocab_size_divisible_by: int = 128,
                   gated_linear_unit: bool = True) -> list[ParamSpec]:
    """Return specs for one Megatron-core rank's parameters (its pipeline stage, its experts).

    Parameters
    ----------
    named_params : Megatron-core model, list of virtual-pipeline chunks, or iterable of (name, parameter)
        Give the model (or its chunks): global layer and expert numbers then come from the model's
        own modules and the pipeline stage from megatron-core's parallel state, so pipeline, virtual
        pipeline and expert parallelism need no renaming, and a tied output layer on the last stage
        becomes the embedding (sent once). The sources are :func:`megatron_named_parameters`'s names.
        An iterable of ``model.named_parameters()`` (the older form) relies on ``pp_stage``,
        ``layer_offset``, ``ep_size`` and ``ep_rank`` instead.
    shape : ModelShape
        Heads, KV heads, head size, true vocabulary (``ModelShape.from_megatron``).
    tp_size : int
        The trainer's tensor-parallel size (``expert_tp_size`` for expert parameters, default the same).
    dtype : str
        The engine's dtype; parameters held in another dtype are cast while sending.
    name_map, engine
        Trainer-to-engine name rules and the engine's layout by name.
    pp_stage : int, optional
        This rank's pipeline stage (default: megatron-core's parallel state when it is initialised,
        else 0).
    layer_offset, ep_size, ep_rank : int
        Only with (name, parameter) pairs: the global number of this stage's first layer, and the
        trainer's expert parallelism (this rank's local experts are global experts ``ep_rank * local + i``).
    make_vocab_size_divisible_by : int
        Megatron's vocabulary padding rule (padded to a multiple of this times ``tp_size``).
    gated_linear_unit : bool
        Whether ``linear_fc1`` holds ``[gate; up]`` (SwiGLU); older Megatron versions mark it with
        ``partition_stride = 1``, so the config says it.

    Raises
    ------
    ConfigError
        If a parameter has no engine name, or its sizes contradict the model shape.

    Notes
    -----
    O(N) for N parameters. With pipeline or expert parallelism, build the list on every rank and
    combine them with :func:`merge_specs` (e.g. after ``torch.distributed.all_gather_object``).
    """
    out: list[ParamSpec] = []
    etp = expert_tp_size or tp_size
    if hasattr(named_params, "named_parameters") or (
            isinstance(named_params, (list, tuple)) and named_params and hasattr(named_params[0], "named_parameters")):
        entries, tied = _global_names(named_params)
        layer_offset, ep_size, ep_rank = 0, 1, 0  # the names are global already
        if pp_stage is None:
            pp_stage = _megatron_pp_rank()
    else:
        entries, tied = [(n, n, p) for n, p in named_params], False
    pp_stage = pp_stage or 0
    for mname, gname, param in entries:
        local = tuple(int(s) for s in param.shape)  # type: ignore[attr-defined]
        if tied and gname == "output_layer.weight":  # the last stage's copy of the tied embedding
            gname = "embedding.word_embeddings.weight"
        expert_match = _EXPERT_NAME.search(gname)
        local_expert = int(expert_match.group(1)) if expert_match and expert_match.group(1) else None
        n_local = max(1, shape.num_experts // ep_size) if shape.num_experts else 0
        expert = None if local_expert is None else ep_rank * n_local + local_expert
        name = rename(gname, name_map, layer_offset=layer_offset, expert_offset=ep_rank * n_local)
        if name is None:
            raise ConfigError("megatron_specs", mname, "matches no name_map rule", "a rule mapping it to the engine's name")
        if not getattr(param, "tensor_model_parallel", False):
            out.append(ParamSpec(name, local, dtype, None, pp_stage, source=mname, source_dtype=_source(param, dtype),
                                 expert=expert, num_experts=shape.num_experts if expert is not None else 0))
            continue
        dim = int(param.partition_dim)  # type: ignore[attr-defined]
        tp = etp if expert is not None else tp_size
        full = list(local)
        full[dim] = local[dim] * tp
        rows = full[dim]
        stride = int(getattr(param, "partition_stride", 1))
        trainer = Sharding()
        if re.search(r"word_embeddings\.weight$|^output_layer\.weight$", gname):
            trainer = Sharding.padded(make_vocab_size_divisible_by, per_tp=True)
            if trainer.padded_extent(shape.vocab_size, tp) != rows:
                raise ConfigError("megatron_specs", mname, f"{rows} padded rows, but a vocabulary of {shape.vocab_size} "
                                  f"padded to a multiple of {make_vocab_size_divisible_by} x TP {tp} gives "
                                  f"{trainer.padded_extent(shape.vocab_size, tp)}",
                                  "the true vocab_size in ModelShape and Megatron's make_vocab_size_divisible_by")
            rows = full[dim] = shape.vocab_size
        elif re.search(r"linear_qkv\.(weight|bias)$", gname):
            if sum(shape.qkv_parts) != rows:
                raise ConfigError("megatron_specs", mname, f"{rows} rows, but heads {shape.num_attention_heads} / "
                                  f"KV {shape.num_key_value_heads} x {shape.head_dim} give {sum(shape.qkv_parts)}",
                                  "the model's num_attention_heads, num_query_groups and kv_channels")
            trainer = Sharding.interleaved(*shape.qkv_parts, groups=shape.num_key_value_heads)
        elif stride > 1 or (gated_linear_unit and re.search(r"linear_fc1\.weight$", gname)):
            parts = stride if stride > 1 else 2
            trainer = Sharding.fused(*([rows // parts] * parts))
        tp_dim, engine_sharding = engine(name, rows, shape)
        if tp_dim is None or tp_dim != dim:
            raise ConfigError("megatron_specs", mname, f"is split along dimension {dim} on the trainer but the engine "
                              f"layout gives {tp_dim} for {name!r}", "an engine layout that splits it the same way")
        out.append(ParamSpec(name, tuple(full), dtype, dim, pp_stage, trainer, engine_sharding, source=mname,
                             source_dtype=_source(param, dtype), expert=expert,
                             num_experts=shape.num_experts if expert is not None else 0))
    return out


def _megatron_pp_rank() -> int:
    """This rank's pipeline stage from megatron-core's parallel state (0 when it is not initialised)."""
    ps = sys.modules.get("megatron.core.parallel_state")  # a model built by megatron-core imported it already
    return ps.get_pipeline_model_parallel_rank() if ps is not None and ps.model_parallel_is_initialized() else 0


def _source(param, dtype: str) -> str:
    src = _dtype(param)
    return "" if src == dtype else src


def state_dict_specs(state_dict: Mapping[str, object] | Iterable[tuple[str, object]], shape: ModelShape, *,
                     tp_size: int = 1, dtype: str | None = None, name_map=None, layout: Layout = vllm_layout,
                     trainer_layout: Layout | None = None, pp_stage: int = 0) -> list[ParamSpec]:
    """Return specs for a state dict (Hugging Face or vLLM names), finding tied weights.

    Parameters
    ----------
    state_dict : mapping or iterable of (name, tensor)
        Whole tensors (``tp_size=1``) or one TP rank's local tensors (``tp_size`` > 1, laid out as
        ``trainer_layout`` says, default ``layout``).
    shape : ModelShape
        Heads, KV heads, head size and true vocabulary.
    dtype : str, optional
        The engine's dtype (default: each tensor's own); other dtypes are cast while sending.
    name_map : rules, mapping or callable, optional
        Names in the state dict -> engine names (None keeps them); a name mapped to None is skipped.
    layout, trainer_layout : callable
        The engine's and the trainer's layout by name (:func:`vllm_layout`, :func:`hf_layout`).

    Raises
    ------
    ConfigError
        If two different tensors map to one engine name.

    Notes
    -----
    O(N) for N tensors. Tensors that share storage (same data pointer, offset, shape and strides)
    become one spec whose other names are ``aliases``: sent once, delivered under every name.
    """
    items = state_dict.items() if isinstance(state_dict, Mapping) else state_dict
    out: list[ParamSpec] = []
    by_storage: dict[tuple, int] = {}
    seen: dict[str, str] = {}
    seen_any, first = 0, ""
    for sname, tensor in items:
        seen_any, first = seen_any + 1, first or sname
        name = rename(sname, name_map)
        if name is None:
            continue
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape),  # type: ignore[attr-defined]
               tuple(tensor.stride()))  # type: ignore[attr-defined]
        if key in by_storage:  # a tied weight: one tensor, several names
            k = by_storage[key]
            out[k] = replace(out[k], aliases=out[k].aliases + (name,))
            continue
        if name in seen:
            raise ConfigError("state_dict_specs", sname, f"maps to {name!r} like {seen[name]!r}, a different tensor",
                              "a name map that gives every tensor its own engine name")
        seen[name] = sname
        full = [int(x) for x in tensor.shape]  # type: ignore[attr-defined]
        src = _dtype(tensor)
        # Which dimension is split (and how) does not depend on the row count, but a layout may
        # need a plausible one (a fused [gate; up] halves it): probe with the local rows times TP.
        tp_dim, probe = layout(name, (full[0] if full else 1) * tp_size, shape)
        if (len(probe.parts) > 1 and _module(sname) != _module(name)  # q_proj -> qkv_proj: a part, not the whole
                and len((trainer_layout or layout)(sname, (full[0] if full else 1) * tp_size, shape)[1].parts) <= 1):
            raise ConfigError("state_dict_specs", sname, f"maps to the fused engine tensor {name!r}, but is one of its "
                              "parts: weight sync moves each trainer tensor as one engine tensor and does not "
                              "concatenate separate q/k/v (or gate/up) tensors",
                              "keep the checkpoint names unfused and let vLLM's loader fuse them "
                              "(vllm_backend with is_checkpoint_format=True, planned with checkpoint_receivers), or "
                              f"torch.cat the parts in the trainer and send them as one tensor named {name!r}")
        trainer = engine_sharding = Sharding()
        if tp_dim is not None:
            local_rows = full[tp_dim]
            if probe.pad_multiple > 1:
                rows = shape.vocab_size
            elif probe.heads:  # replicated heads: the canonical size comes from the model, not local * tp
                rows = sum(shape.qkv_parts) if len(probe.heads) == 3 else shape.num_key_value_heads * shape.head_dim
            else:
                rows = local_rows * tp_size
            trainer = (trainer_layout or layout)(sname if trainer_layout else name, rows, shape)[1]
            if trainer.pad_multiple > 1 and local_rows * tp_size == rows:
                trainer = Sharding()  # a checkpoint keeps the true vocabulary, unpadded
            if trainer.local_extent(rows, tp_size) != local_rows:
                raise ConfigError("state_dict_specs", sname, f"has {local_rows} rows along dimension {tp_dim}, but "
                                  f"{rows} rows sharded over TP {tp_size} give {trainer.local_extent(rows, tp_size)}",
                                  "tp_size and a ModelShape that match the tensors")
            full[tp_dim] = rows
            engine_sharding = layout(name, rows, shape)[1]
        by_storage[key] = len(out)
        out.append(ParamSpec(name, tuple(full), dtype or src, tp_dim, pp_stage, trainer, engine_sharding, source=sname,
                             source_dtype="" if (dtype or src) == src else src))
    if not out and name_map is not None and seen_any:
        raise ConfigError("state_dict_specs", "name_map", f"maps none of the {seen_any} tensors to an engine name "
                          f"(first: {first!r})", "rules whose patterns match from the start of the name (re.match), "
                          "a mapping of full names, or a callable")
    return out


def _module(name: str) -> str:
    """The module a parameter belongs to: ``...self_attn.q_proj.weight`` -> ``q_proj``."""
    parts = name.split(".")
    return parts[-2] if len(parts) > 1 else name


def merge_specs(*lists: Sequence[ParamSpec]) -> list[ParamSpec]:
    """Combine per-stage (or per-expert-rank) spec lists, keeping the first spec of each engine name.

    A pipeline's last stage may hold a copy of the first stage's embedding (tied output layer);
    the copy is dropped, so the tensor is sent once.
    """
    out: dict[str, ParamSpec] = {}
    for specs in lists:
        for p in specs:
            out.setdefault(p.name, p)
    return list(out.values())
