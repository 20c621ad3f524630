"""A synthetic transformer-shaped model whose every slice can be regenerated independently.

Tests and the benchmark need tensors that a trainer rank can create for its own shard and a
generator rank can recompute for its own slice, to check what arrived bit for bit, without anyone
materialising the whole model. Element values are a hash of (parameter index, global element index),
written as raw bit patterns of the parameter's dtype.
"""

from __future__ import annotations

from math import prod
from typing import TYPE_CHECKING

from orchestrl.collectives.layout import ParamSpec
from orchestrl.collectives.sharding import Runs

if TYPE_CHECKING:  # torch is only needed to generate tensors, not to describe the model
    import torch

__all__ = ["synthetic_model", "synthetic_region", "synthetic_local"]


def synthetic_model(model_bytes: int, *, hidden: int = 256, dtype: str = "bfloat16", pp: int = 1) -> list[ParamSpec]:
    """Return transformer-like layers totalling about ``model_bytes``.

    Each layer has a column-parallel QKV (``tp_dim=0``), a row-parallel output projection
    (``tp_dim=1``), column/row-parallel MLP weights and replicated norms; layers are spread evenly
    over ``pp`` pipeline stages. ``hidden`` must be divisible by every TP degree in use.

    Examples
    --------
    >>> ps = synthetic_model(1 << 20, hidden=64)
    >>> sum(p.nbytes for p in ps) >= 1 << 20, {p.tp_dim for p in ps} == {0, 1, None}
    (True, True)
    """
    item = ParamSpec("x", (1,), dtype).itemsize
    h = hidden
    per_layer = (3 * h * h + h * h + 4 * h * h + 4 * h * h + 2 * h) * item
    layers = max(pp, -(-model_bytes // per_layer))
    out: list[ParamSpec] = []
    for i in range(layers):
        stage = i * pp // layers
        pre = f"layers.{i}."
        out += [
            ParamSpec(pre + "input_norm.weight", (h,), dtype, None, stage),
            ParamSpec(pre + "attn.qkv_proj.weight", (3 * h, h), dtype, 0, stage),
            ParamSpec(pre + "attn.o_proj.weight", (h, h), dtype, 1, stage),
            ParamSpec(pre + "post_norm.weight", (h,), dtype, None, stage),
            ParamSpec(pre + "mlp.up_proj.weight", (4 * h, h), dtype, 0, stage),
            ParamSpec(pre + "mlp.down_proj.weight", (h, 4 * h), dtype, 1, stage),
        ]
    return out


def synthetic_region(spec: ParamSpec, index: int, lo: int, hi: int, device: "str | torch.device" = "cpu",
                     seed: int = 0) -> "torch.Tensor":
    """Return canonical rows ``[lo, hi)`` (along ``spec.split_dim``) of synthetic parameter ``index``.

    The same element always gets the same bits, whichever slice it is generated in. Floating-point
    values are finite (the top exponent bit is clear), so casting them up and back is exact.
    """
    import torch

    from orchestrl.collectives.codec import TORCH_DTYPES

    words = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
    shape = spec.shape or (1,)
    d = spec.split_dim
    outer, ext, inner = prod(shape[:d]), shape[d], prod(shape[d + 1:])
    # 32-bit arithmetic for elements of up to 4 bytes (half the memory traffic of 64-bit: generating the data
    # costs more CPU than a loopback sync of it); the hash wraps modulo 2**32 alike in every process
    wide = spec.itemsize == 8
    word = torch.int64 if wide else torch.int32
    if outer == 1:  # rows [lo, hi) of a 1-D or row-split tensor: one contiguous range of element numbers
        g = torch.arange(lo * inner, hi * inner, dtype=torch.int64, device=device).to(word)
    else:
        o = torch.arange(outer, dtype=torch.int64, device=device).view(-1, 1, 1)
        j = torch.arange(lo, hi, dtype=torch.int64, device=device).view(1, -1, 1)
        k = torch.arange(inner, dtype=torch.int64, device=device).view(1, 1, -1)
        g = ((o * ext + j) * inner + k).to(word)

    def c(v: int) -> int:  # a constant as the signed word it is modulo 2**bits
        bits = 64 if wide else 32
        v %= 1 << bits
        return v - (1 << bits) if v >= 1 << (bits - 1) else v

    x = g * c(0x9E3779B1)
    x += c((index + 1) * 0x85EBCA77 + seed * 0xC2B2AE3D)
    x ^= x >> 15
    x *= c(0x2C1B3C6D)
    x ^= x >> 13
    if spec.dtype.startswith(("float", "bfloat")):
        x &= c(~(1 << (8 * spec.itemsize - 2)))  # no Inf/NaN: keeps values exact through casts
    bits = x.to(words[spec.itemsize]) if spec.itemsize < 4 else x
    out = bits.view(TORCH_DTYPES[spec.dtype])
    return out.reshape(spec.region_shape(lo, hi))


def synthetic_local(spec: ParamSpec, index: int, runs: Runs, device: "str | torch.device" = "cpu", seed: int = 0,
                    dtype: str = "") -> "torch.Tensor":
    """Return a rank's local tensor of synthetic parameter ``index``: its runs in order, then zero padding.

    ``dtype`` (default: the parameter's) lets a trainer hold the values in another dtype (fp32
    masters); they are exact casts of the parameter's values.
    """
    import torch

    from orchestrl.collectives.codec import TORCH_DTYPES

    rows, pad = runs
    parts = [synthetic_region(spec, index, lo, hi, device, seed) for lo, hi in rows]
    if pad:
        parts.append(torch.zeros(spec.region_shape(0, pad), dtype=TORCH_DTYPES[spec.dtype], device=device))
    out = torch.cat(parts, dim=spec.split_dim) if len(parts) > 1 else parts[0]
    return out.to(TORCH_DTYPES[dtype]) if dtype and dtype != spec.dtype else out
