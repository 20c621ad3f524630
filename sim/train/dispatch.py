"""How many copies of a token an expert-parallel dispatch puts on the NICs and on NVLink.

Design note
-----------
A MoE layer sends each token's hidden state to the EP ranks that hold its ``topk`` experts, and
the combine sends the results back the same way. What crosses the network depends on the
dispatcher, not only on ``topk``:

* ``alltoall`` -- Megatron-core's all-to-all dispatcher (``moe_token_dispatcher_type: alltoall``,
  veRL's default): the tokens are permuted per (token, expert) pair, so a token goes out ``topk``
  times, spread over the ``n`` EP ranks; ``topk (n - m) / n`` copies leave the server and
  ``topk (m - 1) / n`` stay on NVLink (``m`` EP ranks per server).
* ``deepep`` -- DeepEP's normal kernels (Megatron's ``flex`` dispatcher, NeMo AutoModel's
  ``enable_deepep``): ``get_dispatch_layout`` marks each token once per destination *rank* and
  once per destination *node*; the internode kernel sends one RDMA copy per remote node that holds
  any of the token's experts, to the GPU with the sender's local index there, which forwards it
  over NVLink to the node's other GPUs that hold one. So a token costs ``E[remote nodes hit]``
  NIC copies and ``E[GPUs hit] (m - 1) / m`` NVLink copies (every hit GPU except the forwarder).

The expected number of hit holders (nodes or GPUs, each holding an equal contiguous block of
experts) depends on the router:

* ``random`` -- ``topk`` distinct experts drawn uniformly (Megatron's
  ``moe_router_force_load_balancing`` replaces the logits by Gaussian noise; a well-balanced learned
  router is exchangeable in the same way). A holder of ``b`` of the ``E`` experts is missed with
  the hypergeometric probability ``C(E - b, k) / C(E, k)``, so ``E[hit] = G (1 - C(E-b, k) / C(E, k))``.
* ``sequential`` -- NeMo AutoModel's ``FakeBalancedGate`` (its benchmark's ``fake_balanced_gate``):
  token ``t`` takes experts ``t k, t k + 1, ..., t k + k - 1`` (mod ``E``), a contiguous block that
  mostly lands on one rank and one node; averaged exactly over the gate's period.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from orchestrl.fabric.errors import ConfigError

__all__ = ["DISPATCHERS", "ROUTINGS", "TokenCopies", "distinct_holders", "token_copies"]

DISPATCHERS = ("alltoall", "deepep")
ROUTINGS = ("random", "sequential")


@dataclass(frozen=True)
class TokenCopies:
    """Copies of one token's hidden state one EP rank sends in one dispatch (or one combine)."""

    nic: float  # copies that leave the server (RDMA)
    nvlink: float  # copies that move between GPUs of one server (direct or forwarded)


def distinct_holders(experts: int, topk: int, holders: int, routing: str = "random") -> float:
    """Return the expected number of holders that receive a token routed to ``topk`` of ``experts``.

    Holder ``h`` of ``holders`` holds experts ``[h b, (h + 1) b)`` with ``b = experts / holders``
    (Megatron's and AutoModel's contiguous expert placement).

    Parameters
    ----------
    experts, topk, holders : int
        Routed experts, experts per token, and GPUs (or nodes) the experts are split over.
    routing : {"random", "sequential"}
        See the module note.

    Raises
    ------
    ConfigError
        If ``holders`` does not divide ``experts``, ``topk`` exceeds ``experts``, or ``routing`` is unknown.

    Notes
    -----
    ``random``: closed form, O(1). ``sequential``: exact mean over the gate's period of
    ``experts / gcd(topk, experts)`` tokens, O(experts log topk).

    Examples
    --------
    >>> round(distinct_holders(128, 8, 4), 3)  # Qwen3-235B over 4 nodes: 4 (1 - C(96, 8) / C(128, 8))
    3.629
    >>> distinct_holders(256, 8, 8, "sequential")  # AutoModel's gate: 8 consecutive experts, one node
    1.0
    """
    src = "distinct_holders"
    if routing not in ROUTINGS:
        raise ConfigError(src, "routing", f"unknown routing {routing!r}", ", ".join(ROUTINGS))
    if not 1 <= topk <= experts:
        raise ConfigError(src, "topk", f"topk={topk} for {experts} experts", f"1..{experts}")
    if holders < 1 or experts % holders:
        raise ConfigError(src, "holders", f"{holders} holders do not split {experts} experts evenly",
                          f"a divisor of {experts}")
    block = experts // holders
    if routing == "random":
        return holders * (1.0 - math.comb(experts - block, topk) / math.comb(experts, topk))
    period = experts // math.gcd(topk, experts)
    held_by = np.sort(((np.arange(period)[:, None] * topk + np.arange(topk)) % experts) // block, axis=1)
    return float(np.mean(1 + np.count_nonzero(np.diff(held_by, axis=1), axis=1)))


def token_copies(experts: int, topk: int, ep: int, per_server: int, dispatcher: str = "alltoall",
                 routing: str = "random") -> TokenCopies:
    """Return the copies of each token one EP rank sends per dispatch, by link kind.

    Parameters
    ----------
    experts, topk : int
        Routed experts and experts per token.
    ep : int
        EP group size (GPUs the experts are split over).
    per_server : int
        EP ranks of one group on one server (the group spans ``ep / per_server`` servers).
    dispatcher : {"alltoall", "deepep"}
    routing : {"random", "sequential"}
        Only ``deepep`` depends on it (``alltoall`` sends ``topk`` copies whatever the router).

    Raises
    ------
    ConfigError
        Naming the argument: unknown dispatcher, a group that does not split into whole servers.

    Examples
    --------
    >>> token_copies(128, 8, 32, 8)  # all-to-all: 8 copies, 3/4 of them off the server
    TokenCopies(nic=6.0, nvlink=1.75)
    >>> c = token_copies(128, 8, 32, 8, "deepep")  # one RDMA copy per remote node hit
    >>> round(c.nic, 3), round(c.nvlink, 3)
    (2.722, 6.439)
    """
    src = "token_copies"
    if dispatcher not in DISPATCHERS:
        raise ConfigError(src, "dispatcher", f"unknown dispatcher {dispatcher!r}", ", ".join(DISPATCHERS))
    if not 1 <= per_server <= ep or ep % per_server:
        raise ConfigError(src, "per_server", f"{per_server} ranks per server do not split an EP group of {ep}",
                          f"a divisor of {ep}")
    if dispatcher == "alltoall":
        return TokenCopies(nic=topk * (ep - per_server) / ep, nvlink=topk * (per_server - 1) / ep)
    nodes = ep // per_server
    gpus_hit = distinct_holders(experts, topk, ep, routing)
    nodes_hit = distinct_holders(experts, topk, nodes, routing)
    return TokenCopies(nic=nodes_hit * (nodes - 1) / nodes, nvlink=gpus_hit * (per_server - 1) / per_server)
