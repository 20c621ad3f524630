"""Check every tensor a sync reads from or writes into before a byte moves.

A chunk is raw bytes: written into a tensor of the wrong dtype it passes every checksum and still
turns into garbage, and a tensor of the wrong shape or on the wrong device fails later or not at
all. So every source tensor a trainer hands to ``send`` and every destination tensor an engine
hands to ``receive(into=...)`` (or that the vLLM worker extension finds in the engine) is checked
here for dtype, shape, device and contiguity, and refused with a :class:`fabric.errors.ConfigError`
that names the parameter, what was expected and what was given.

Engine parameters that stack experts (vLLM's ``FusedMoE`` keeps ``w13_weight`` as
``[local experts, 2 * intermediate / tp, hidden]``) are addressed as ``"<name>[<i>]"``: the ``i``-th
local slice of the stacked tensor along its first dimension.
"""

from __future__ import annotations

import re
from typing import Mapping

import torch

from orchestrl.fabric.errors import ConfigError

from orchestrl.collectives.codec import TORCH_DTYPES
from orchestrl.collectives.schedule import Schedule

__all__ = ["check_tensor", "resolve_targets"]

_INDEXED = re.compile(r"^(?P<base>.+)\[(?P<index>\d+)\]$")


def check_tensor(tensor: object, *, where: str, name: str, shape: tuple[int, ...], dtype: str,
                 device: torch.device, contiguous: bool = True) -> torch.Tensor:
    """Return ``tensor`` if it is a tensor of this shape, dtype and device; raise ConfigError otherwise.

    Examples
    --------
    >>> check_tensor(torch.zeros(2, 3, dtype=torch.float32), where="receive(into=...)", name="w",
    ...              shape=(2, 3), dtype="bfloat16", device=torch.device("cpu"))
    Traceback (most recent call last):
    ...
    orchestrl.fabric.errors.ConfigError: receive(into=...): field 'w': is a torch.float32 tensor but the parameter is bfloat16; \
its bytes would be reinterpreted, not converted (allowed: a torch.bfloat16 tensor of shape (2, 3) on cpu)
    """
    want = f"a torch.{dtype} tensor of shape {shape} on {device}"
    if not isinstance(tensor, torch.Tensor):
        raise ConfigError(where, name, f"is {type(tensor).__name__}, not a tensor", want)
    if tensor.dtype != TORCH_DTYPES[dtype]:
        raise ConfigError(where, name, f"is a {tensor.dtype} tensor but the parameter is {dtype}; its bytes "
                          "would be reinterpreted, not converted", want)
    if tuple(tensor.shape) != tuple(shape):
        raise ConfigError(where, name, f"has shape {tuple(tensor.shape)} but this rank's shard is {shape}", want)
    if tensor.device.type != device.type or (device.index is not None and tensor.device.index != device.index):
        raise ConfigError(where, name, f"is on {tensor.device} but the transport moves data on {device}", want)
    if contiguous and not tensor.is_contiguous():
        raise ConfigError(where, name, "is not contiguous, so it cannot be written in place", want + ", contiguous")
    return tensor


def resolve_targets(schedule: Schedule, rank: int, named: Mapping[str, torch.Tensor], device: torch.device, *,
                    where: str = "receive(into=...)", first_expert: Mapping[str, int] | None = None,
                    required: bool = False) -> dict[int, list[torch.Tensor]]:
    """Return, per parameter index, the checked tensors that receive it on ``rank``.

    Parameters
    ----------
    schedule, rank
        The schedule and the (generator) rank receiving.
    named : mapping name -> tensor
        Candidate destinations: ``into=`` or an engine's ``named_parameters()``. A parameter is
        looked up under its name and each alias; ``"<name>[<i>]"`` names a slice of a stacked tensor.
    device : torch.device
        Where the transport delivers data; every target must live there.
    first_expert : mapping base name -> int, optional
        For stacked expert tensors: global expert index of slice 0 on this rank (default: the lowest
        expert of that tensor the schedule gives this rank, which is what an engine with expert
        parallelism stacks first).
    required : bool
        Raise if some parameter this rank needs has no target.

    Raises
    ------
    ConfigError
        If a target has the wrong dtype, shape, device or layout, or a required one is missing.
    """
    out: dict[int, list[torch.Tensor]] = {}
    first = {**_first_experts(schedule, rank), **(first_expert or {})}
    for i, spec in enumerate(schedule.params):
        shape = schedule.local_shape(rank, i)
        if shape is None:
            continue
        found: list[torch.Tensor] = []
        for name in spec.names:
            tensor = _lookup(named, name, first)
            if tensor is None:
                continue
            tensor = check_tensor(tensor, where=where, name=name, shape=shape, dtype=spec.dtype, device=device)
            if not any(t.data_ptr() == tensor.data_ptr() for t in found):  # tied in the engine too: write once
                found.append(tensor)
        if found:
            out[i] = found
        elif required:
            raise ConfigError(where, spec.name, f"has no destination tensor (shard {shape}, {spec.dtype})",
                              "a tensor under the parameter's name or one of its aliases " + str(list(spec.names)))
    return out


def _first_experts(schedule: Schedule, rank: int) -> dict[str, int]:
    """Base name -> the lowest global expert this rank holds of it: slice 0 of its stacked tensor.

    An engine with expert parallelism stacks only its own experts (vLLM's ``FusedMoE`` on EP rank
    ``r`` of ``n`` holds experts ``r * E/n ...``), so ``w13_weight[e]`` is slice ``e - first`` there.
    """
    first: dict[str, int] = {}
    for i, spec in enumerate(schedule.params):
        if spec.expert is None or schedule.local_shape(rank, i) is None:
            continue
        for name in spec.names:
            m = _INDEXED.match(name)
            if m:
                first[m["base"]] = min(first.get(m["base"], int(m["index"])), int(m["index"]))
    return first


def _lookup(named: Mapping[str, torch.Tensor], name: str, first_expert: Mapping[str, int]) -> torch.Tensor | None:
    if name in named:
        return named[name]
    m = _INDEXED.match(name)
    if m and m["base"] in named:
        stacked = named[m["base"]]
        local = int(m["index"]) - first_expert.get(m["base"], 0)
        if 0 <= local < stacked.shape[0]:
            return stacked[local]
    return None
