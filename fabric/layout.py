"""Parallel groups of a Megatron-style job, ranked exactly the way Megatron-core ranks them.

Design note
-----------
An intent names its collectives by parallel dimension ("all-to-all over ep"), so the fabric must
know *which GPUs* form each TP/CP/DP/PP/EP group. Getting this wrong silently moves demand between
ToRs, so the rank arithmetic reproduces Megatron-core's ``RankGenerator`` and
``generate_masked_orthogonal_rank_groups`` (NVIDIA/Megatron-LM, ``megatron/core/parallel_state.py``)
rather than re-deriving it:

* a rank is a mixed-radix number whose digits are the per-dimension ranks, the *first* dimension
  of ``order`` varying fastest (default ``"tp-cp-ep-dp-pp"``: TP neighbours are adjacent ranks);
* a group for a set of dimensions holds all ranks that agree on every *other* digit;
* dense (attention) groups come from a generator with ``ep=1``; expert (MoE) groups from a second
  generator with ``tp=expert_tp``, ``cp=1`` and ``dp=expert_dp = world / (expert_tp * ep * pp)``.

Job rank ``r`` runs on ``gpus[r]``; :func:`parallel_groups` returns groups of global GPU indices.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

from orchestrl.fabric.errors import ConfigError

__all__ = ["ParallelLayout", "GROUP_NAMES", "parallel_groups", "masked_orthogonal_rank_groups"]

_DIMENSIONS = ("tp", "cp", "ep", "dp", "pp")

#: Group kinds :func:`parallel_groups` returns, and what each one carries in training.
GROUP_NAMES: dict[str, str] = {
    "tp": "tensor parallel (dense layers): activations all-reduce / all-gather",
    "cp": "context parallel: KV exchange between sequence chunks",
    "dp": "data parallel without CP",
    "dp-cp": "data x context parallel: the group dense gradients are all-reduced over",
    "pp": "pipeline stages, in stage order: activations forward, gradients backward",
    "ep": "expert parallel: MoE token dispatch / combine all-to-all",
    "expert-tp": "tensor parallel inside expert layers",
    "tp-ep": "expert tensor x expert model parallel (Megatron's expert TP-EP group)",
    "expert-dp": "expert data parallel: the group expert gradients are all-reduced over",
}

_LAYOUT_SOURCE = "ParallelLayout"


@dataclass(frozen=True)
class ParallelLayout:
    """Parallel sizes of one job and the rank order Megatron-core uses for them.

    Parameters
    ----------
    tp, cp, ep, dp, pp : int
        Tensor, context, expert, data and pipeline parallel sizes. As in Megatron-core the job's
        world size is ``tp * cp * dp * pp``; ``ep`` re-partitions the same ranks for expert layers.
    order : str
        Hyphen-joined dimension names, fastest-varying first (Megatron's ``order`` argument).
        Dimensions left out are appended at the end; a dimension of size > 1 must be named.
    expert_tp : int, optional
        Tensor parallel size inside expert layers (Megatron's ``expert_tensor_parallel_size``);
        ``None`` means ``tp``, Megatron's default.

    Raises
    ------
    ConfigError
        If a size is not a positive integer, ``order`` is malformed, ``expert_tp * ep * pp`` does
        not divide the world size, or the dense and expert pipeline groups would differ (the same
        checks ``initialize_model_parallel`` makes).

    Examples
    --------
    >>> lay = ParallelLayout(tp=2, ep=4, dp=4, pp=2)
    >>> lay.world_size, lay.expert_dp
    (16, 1)
    """

    tp: int = 1
    cp: int = 1
    ep: int = 1
    dp: int = 1
    pp: int = 1
    order: str = "tp-cp-ep-dp-pp"
    expert_tp: int | None = None

    def __post_init__(self) -> None:
        for name in (*_DIMENSIONS, "expert_tp"):
            value = getattr(self, name)
            if name == "expert_tp" and value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(_LAYOUT_SOURCE, name, f"expected a positive integer, got {value!r}",
                                  "an integer >= 1")
        self._check_order()
        expert_model = self.expert_tp_size * self.ep * self.pp
        if self.world_size % expert_model:
            raise ConfigError(_LAYOUT_SOURCE, "ep",
                              f"expert_tp*ep*pp = {expert_model} does not divide the world size "
                              f"tp*cp*dp*pp = {self.world_size}",
                              "ep (and expert_tp) such that expert_tp*ep*pp divides tp*cp*dp*pp")
        # Megatron asserts both rules below in initialize_model_parallel; a layout it would refuse
        # cannot describe a running job, so neither can it here.
        if not self._full_order.endswith("pp") and self.pp > 1 and self.expert_dp != self.dp:
            raise ConfigError(_LAYOUT_SOURCE, "order",
                              f"order {self.order!r} does not end with pp, so attention and MoE layers "
                              f"need equal DP sizes, but dp={self.dp} and expert dp={self.expert_dp}",
                              "an order ending in '-pp', or ep/expert_tp giving expert dp == dp")
        if self.pp > 1 and self._pp_stride(dense=True) != self._pp_stride(dense=False):
            raise ConfigError(_LAYOUT_SOURCE, "order",
                              f"order {self.order!r} gives different pipeline groups to dense and expert "
                              "layers", "an order where the dimensions before pp have equal products "
                                        "for the dense (tp, cp, dp) and expert (expert_tp, ep, expert dp) sizes")

    # -- derived sizes ----------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        """Number of ranks (GPUs) of the job: ``tp * cp * dp * pp``."""
        return self.tp * self.cp * self.dp * self.pp

    @property
    def expert_tp_size(self) -> int:
        """Effective expert tensor parallel size (``expert_tp``, defaulting to ``tp``)."""
        return self.tp if self.expert_tp is None else self.expert_tp

    @property
    def expert_dp(self) -> int:
        """Expert data parallel size: ``world / (expert_tp * ep * pp)``."""
        return self.world_size // (self.expert_tp_size * self.ep * self.pp)

    def _sizes(self, dense: bool) -> dict[str, int]:
        if dense:
            return {"tp": self.tp, "cp": self.cp, "ep": 1, "dp": self.dp, "pp": self.pp}
        return {"tp": self.expert_tp_size, "cp": 1, "ep": self.ep, "dp": self.expert_dp, "pp": self.pp}

    @property
    def _full_order(self) -> str:
        tokens = self.order.lower().split("-")
        return "-".join(tokens + [d for d in _DIMENSIONS if d not in tokens])

    def _pp_stride(self, dense: bool) -> int:
        # Pipeline groups are arithmetic progressions with this step, so two generators produce the
        # same pipeline groups exactly when the steps agree (cheaper than Megatron's list compare).
        sizes = self._sizes(dense)
        stride = 1
        for token in self._full_order.split("-"):
            if token == "pp":
                return stride
            stride *= sizes[token]
        return stride

    def _check_order(self) -> None:
        if not isinstance(self.order, str) or not self.order:
            raise ConfigError(_LAYOUT_SOURCE, "order", f"expected a string, got {self.order!r}",
                              "hyphen-joined names from " + ", ".join(_DIMENSIONS))
        tokens = self.order.lower().split("-")
        for token in tokens:
            if token not in _DIMENSIONS:
                raise ConfigError(_LAYOUT_SOURCE, "order", f"unknown dimension {token!r} in {self.order!r}",
                                  "hyphen-joined names from " + ", ".join(_DIMENSIONS))
        if len(set(tokens)) != len(tokens):
            raise ConfigError(_LAYOUT_SOURCE, "order", f"a dimension repeats in {self.order!r}",
                              "each of " + ", ".join(_DIMENSIONS) + " at most once")
        for name in _DIMENSIONS:
            size = max(self._sizes(True)[name], self._sizes(False)[name])
            if name not in tokens and size != 1:
                raise ConfigError(_LAYOUT_SOURCE, "order", f"{name} has size {size} but is missing from "
                                  f"{self.order!r}", f"an order that names {name}")


def masked_orthogonal_rank_groups(world_size: int, parallel_size: Sequence[int],
                                  mask: Sequence[bool]) -> list[list[int]]:
    """Return the rank groups spanning the masked dimensions, as Megatron-core generates them.

    A port of ``generate_masked_orthogonal_rank_groups`` in Megatron-LM's
    ``megatron/core/parallel_state.py``: ranks are mixed-radix numbers over ``parallel_size``
    (first dimension fastest); each group fixes the digits of the unmasked dimensions and runs
    through every combination of the masked ones, the first masked dimension fastest.

    Parameters
    ----------
    world_size : int
        Product of ``parallel_size``.
    parallel_size : sequence of int
        Size of each dimension, in rank order.
    mask : sequence of bool
        ``True`` for the dimensions a group spans.

    Returns
    -------
    list of list of int
        ``world_size / prod(masked sizes)`` groups, ordered by the unmasked digits.

    Notes
    -----
    O(world_size * len(parallel_size)) time and memory.

    Examples
    --------
    >>> masked_orthogonal_rank_groups(8, [2, 2, 2], [False, True, False])  # tp-pp-dp: pp groups
    [[0, 2], [1, 3], [4, 6], [5, 7]]
    """
    strides = _prefix_products(parallel_size)
    # Offsets inside a group do not depend on the group, so compute them once; both lists run
    # through their digits first dimension fastest, as Megatron's decompose-and-dot does.
    offsets = _mixed_radix([(s, d) for s, d, m in zip(parallel_size, strides, mask) if m])
    bases = _mixed_radix([(s, d) for s, d, m in zip(parallel_size, strides, mask) if not m])
    return [[base + off for off in offsets] for base in bases[:world_size // len(offsets)]]


def _mixed_radix(dims: Sequence[tuple[int, int]]) -> list[int]:
    """Return ``sum(digit_k * stride_k)`` for every digit vector over ``(size, stride)`` dims, first fastest."""
    values = [0]
    for size, stride in dims:
        values = [v + k * stride for k in range(size) for v in values]
    return values


def parallel_groups(layout: ParallelLayout, gpus: Sequence[int]) -> dict[str, list[list[int]]]:
    """Return every parallel group of a job, as lists of the global GPU indices it runs on.

    Parameters
    ----------
    layout : ParallelLayout
        The job's parallel sizes and rank order.
    gpus : sequence of int
        ``gpus[r]`` is the GPU job rank ``r`` runs on; its length must be ``layout.world_size``.

    Returns
    -------
    dict
        One entry per name in :data:`GROUP_NAMES` (``tp``, ``cp``, ``dp``, ``dp-cp``, ``pp``,
        ``ep``, ``expert-tp``, ``tp-ep``, ``expert-dp``), each a list of groups in Megatron's order;
        members of a ``pp`` group are listed by pipeline stage.

    Raises
    ------
    ValueError
        If ``gpus`` has the wrong length or repeats a GPU.

    Notes
    -----
    O(W * D) for W ranks and D = 5 dimensions per group kind.

    Examples
    --------
    >>> g = parallel_groups(ParallelLayout(tp=2, pp=2, dp=2), range(100, 108))
    >>> g["tp"]
    [[100, 101], [102, 103], [104, 105], [106, 107]]
    >>> g["dp"]
    [[100, 102], [101, 103], [104, 106], [105, 107]]
    >>> g["pp"]
    [[100, 104], [101, 105], [102, 106], [103, 107]]
    """
    gpus = list(gpus)
    if len(gpus) != layout.world_size:
        raise ValueError(f"layout {layout} has {layout.world_size} ranks but {len(gpus)} GPUs were given")
    if len(set(gpus)) != len(gpus):
        raise ValueError("a GPU appears twice in the job's GPU list")
    order = layout._full_order
    dense = _RankGenerator(layout._sizes(True), order)
    expert = _RankGenerator(layout._sizes(False), order)
    ranks = {
        "tp": dense.ranks("tp"),
        "cp": dense.ranks("cp"),
        "dp": dense.ranks("dp"),
        "dp-cp": dense.ranks("dp-cp"),
        "pp": dense.ranks("pp"),
        "ep": expert.ranks("ep"),
        "expert-tp": expert.ranks("tp"),
        "tp-ep": expert.ranks("tp-ep"),
        "expert-dp": expert.ranks("dp"),
    }
    return {name: [[gpus[r] for r in group] for group in groups] for name, groups in ranks.items()}


class _RankGenerator:
    """Megatron-core's ``RankGenerator`` without the rank offset (one job, ranks from 0)."""

    def __init__(self, sizes: dict[str, int], order: str) -> None:
        self.order = order.split("-")
        self.sizes = [sizes[t] for t in self.order]
        self.world_size = _prefix_products(self.sizes)[-1]

    def ranks(self, token: str) -> list[list[int]]:
        wanted = token.split("-")
        mask = [t in wanted for t in self.order]
        return masked_orthogonal_rank_groups(self.world_size, self.sizes, mask)


def _prefix_products(values: Sequence[int]) -> list[int]:
    out = [1]
    for v in values:
        out.append(out[-1] * v)
    return out
