"""Model and GPU descriptions the performance model reads: Table 3 models, H800/H20/H100/A100 GPUs.

The bundled files live in ``compute_sched/specs/models/`` and ``compute_sched/specs/gpus/``; a user
file is any YAML with the same fields. Every number carries its unit in its name, and every file is
validated on load (unknown keys are refused, errors name the file and field).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from orchestrl.fabric.config import Reader, load_document
from orchestrl.fabric.errors import ConfigError

__all__ = ["ModelSpec", "GpuSpec", "load_model", "load_gpu", "bundled_models", "bundled_gpus", "SPECS_DIR"]

SPECS_DIR = Path(__file__).resolve().parent / "specs"
DTYPE_BYTES = 2  # bf16 weights and KV cache


@dataclass(frozen=True)
class ModelSpec:
    """Architecture of one decoder-only model (OrchestrRL Table 3).

    Examples
    --------
    >>> m = load_model("Qwen2.5-14B")
    >>> m.kv_bytes_per_token  # 2 (K and V) x 48 layers x 8 heads x 128 dims x 2 bytes
    196608
    >>> m.is_moe
    False
    """

    name: str
    params_total: float
    d_model: int
    layers: int
    ffn_intermediate: int  # per expert for MoE models
    query_heads: int
    kv_heads: int
    head_dim: int
    vocab: int
    experts: int = 0  # 0 for a dense model
    experts_per_token: int = 0

    @cached_property  # read per decode step by the planner's estimates; the spec is frozen
    def is_moe(self) -> bool:
        return self.experts > 0

    @cached_property
    def expert_params(self) -> float:
        """Parameters of all routed experts (gate, up and down projections); 0 for dense models."""
        return float(self.layers * self.experts * 3 * self.d_model * self.ffn_intermediate)

    @cached_property
    def dense_params(self) -> float:
        """Parameters every token uses: attention, embeddings, norms, shared experts."""
        return self.params_total - self.expert_params

    @cached_property
    def active_params(self) -> float:
        """Parameters one token touches (dense part plus its routed experts)."""
        if not self.is_moe:
            return self.params_total
        return self.dense_params + self.expert_params * self.experts_per_token / self.experts

    @cached_property
    def weight_bytes(self) -> float:
        return self.params_total * DTYPE_BYTES

    @cached_property
    def expert_bytes_each(self) -> float:
        """Bytes of one expert in one layer."""
        return 3.0 * self.d_model * self.ffn_intermediate * DTYPE_BYTES

    @cached_property
    def kv_bytes_per_token(self) -> int:
        """KV-cache bytes one token occupies over all layers and KV heads."""
        return 2 * self.layers * self.kv_heads * self.head_dim * DTYPE_BYTES

    @cached_property
    def attention_dim(self) -> int:
        return self.query_heads * self.head_dim


@dataclass(frozen=True)
class GpuSpec:
    """One accelerator type and the links around it, from its datasheet."""

    name: str
    hbm_bytes: float
    hbm_bytes_per_s: float
    bf16_flops: float
    nvlink_bytes_per_s: float  # per direction, per GPU
    nic_bps: float  # scale-out network, bits per second per GPU
    pcie_bytes_per_s: float  # host <-> GPU
    gpus_per_node: int = 8

    @property
    def nic_bytes_per_s(self) -> float:
        return self.nic_bps / 8.0


def _resolve(name_or_path: str | os.PathLike[str], kind: str) -> str:
    text = os.fspath(name_or_path)
    if os.path.exists(text):
        return text
    wanted = text.lower().replace("_", "-")
    for path in sorted((SPECS_DIR / kind).glob("*.yaml")):
        if path.stem == wanted or _name_of(path).lower() == wanted:
            return str(path)
    known = ", ".join(_bundled(kind))
    raise ConfigError(text, "<file>", f"is neither a file nor a bundled {kind[:-1]} name", known)


def _name_of(path: Path) -> str:
    data = load_document(path).data
    return str(data.get("name", path.stem))


def _bundled(kind: str) -> list[str]:
    return [_name_of(p) for p in sorted((SPECS_DIR / kind).glob("*.yaml"))]


def bundled_models() -> list[str]:
    """Return the names of the bundled model files (Table 3)."""
    return _bundled("models")


def bundled_gpus() -> list[str]:
    """Return the names of the bundled GPU files."""
    return _bundled("gpus")


def load_model(name_or_path: str | os.PathLike[str]) -> ModelSpec:
    """Return the model in a YAML file, or the bundled model of that name (``"Qwen2.5-32B"``).

    Raises
    ------
    ConfigError
        Naming the file and field for a missing, unknown or out-of-range value.
    """
    r = load_document(_resolve(name_or_path, "models"))
    r.reject_unknown({"name", "params_total", "d_model", "layers", "ffn_intermediate", "query_heads", "kv_heads",
                      "head_dim", "vocab", "experts", "experts_per_token"})
    ints = {k: r.int(k, minimum=1) for k in ("d_model", "layers", "ffn_intermediate", "query_heads", "kv_heads",
                                               "head_dim", "vocab")}
    experts = r.int("experts", default=0, minimum=0)
    per_token = r.int("experts_per_token", default=0, minimum=0)
    if experts and not 1 <= per_token <= experts:
        raise r.error("experts_per_token", f"{per_token} with {experts} experts", f"1..{experts}")
    spec = ModelSpec(name=r.str("name"), params_total=r.float("params_total", minimum=1.0, exclusive_minimum=True),
                     experts=experts, experts_per_token=per_token, **ints)
    if spec.dense_params <= 0:
        raise r.error("params_total", f"{spec.params_total:.3g} is smaller than the routed experts alone "
                                      f"({spec.expert_params:.3g})", "the model's total parameter count")
    if spec.kv_heads > spec.query_heads or spec.query_heads % spec.kv_heads:
        raise r.error("kv_heads", f"{spec.kv_heads} does not divide query_heads={spec.query_heads}",
                      "a divisor of query_heads")
    return spec


#: Upper bounds of a GPU file's rates and sizes: 10-100x today's largest parts, so a typo or a unit slip
#: (bits for bytes, 1e30) is refused with the field named instead of silently dominating a result.
GPU_FIELD_MAX = {"hbm_bytes": 2e12, "hbm_bytes_per_s": 1e14, "bf16_flops": 1e17, "nvlink_bytes_per_s": 1e13,
                 "nic_bps": 1e13, "pcie_bytes_per_s": 1e12}


def load_gpu(name_or_path: str | os.PathLike[str]) -> GpuSpec:
    """Return the GPU in a YAML file, or the bundled GPU of that name (``"H800"``)."""
    r: Reader = load_document(_resolve(name_or_path, "gpus"))
    r.reject_unknown({"name", "hbm_bytes", "hbm_bytes_per_s", "bf16_flops", "nvlink_bytes_per_s", "nic_bps",
                      "pcie_bytes_per_s", "gpus_per_node"})
    floats = {k: r.float(k, minimum=0.0, exclusive_minimum=True, maximum=GPU_FIELD_MAX[k]) for k in GPU_FIELD_MAX}
    return GpuSpec(name=r.str("name"), gpus_per_node=r.int("gpus_per_node", default=8, minimum=1), **floats)
