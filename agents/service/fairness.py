"""How tenants share OCS-Core: max-min fair shares of each PoD's boundary fibres over the tenants' demands.

Design note
-----------
A Core circuit between PoDs p and q uses one boundary fibre of p and one of q; ToRs belong to one
job, but boundary fibres are shared by every job with GPUs in the PoD. Left alone, the first
job to commit takes every fibre its demand wants and a second job's cross-PoD intent gets none.

The stated policy: per PoD, the fibres are split **max-min fair over the tenants' standing demands**,
where a job's ask for a period is the number of the PoD's fibres that intent's plan uses when planned
on the whole fabric (other tenants ignored), and its standing demand is its largest ask over its
latest intent of each stage family (:meth:`agents.service.sharing.SharingMixin._standing_demand`), so
a weight-sync claim holds while the job trains and every job gets its share in every period of
its own. Water-filling gives each job ``min(demand, level)`` fibres, the level rising until the
PoD's fibres are used up; left-over units (integers) go to the largest unmet demands, ties by job
id. A job is planned with at most its share usable in each PoD; when another job holds more than its
own share there (its plan predates the demand), that job is re-planned to its share (its change
commits in its own safe window) and the job kept short is reported ``starved`` with what it asked
for and what it got, and re-planned once the fibres are free.

Everything here is pure; :class:`agents.service.core.ControlService` records the asks and applies
the shares when it plans.
"""

from __future__ import annotations

from collections import Counter
from typing import Iterable, Mapping

from orchestrl.fabric.plan import CircuitPlan
from orchestrl.fabric.topology import PortRef, Topology

__all__ = ["max_min_fair", "core_fibres_by_pod", "fair_shares", "cap_ports", "POLICY"]

POLICY = "max-min fair over tenants' standing OCS-Core demands (largest ask per stage family), per PoD boundary"


def max_min_fair(capacity: int, asks: Mapping[str, int]) -> dict[str, int]:
    """Return integer max-min fair shares of ``capacity`` units over ``asks``.

    Notes
    -----
    O(J log J) for J jobs (one sort, then one pass).

    Examples
    --------
    >>> max_min_fair(16, {"a": 16, "b": 16})
    {'a': 8, 'b': 8}
    >>> max_min_fair(16, {"a": 4, "b": 16, "c": 16})
    {'a': 4, 'b': 6, 'c': 6}
    >>> max_min_fair(5, {"a": 3, "b": 3})
    {'a': 3, 'b': 2}
    """
    out = {j: 0 for j in asks}
    left = max(0, int(capacity))
    pending = sorted((max(0, int(a)), j) for j, a in asks.items())
    while pending and left > 0:
        level = left // len(pending)
        if level == 0:  # fewer units than jobs: one each to the largest asks, ties by id
            for a, j in sorted(pending, key=lambda x: (-x[0], x[1]))[:left]:
                out[j] += 1
            break
        smallest, j0 = pending[0]
        if smallest - out[j0] <= level:  # the smallest unmet ask is satisfied; the rest share what is left
            give = smallest - out[j0]
            out[j0] += give
            left -= give
            pending.pop(0)
            continue
        for a, j in pending:
            out[j] += level
        left -= level * len(pending)
        pending = [(a, j) for a, j in pending if a > out[j]]
    return out


def core_fibres_by_pod(plan: CircuitPlan | None, topology: Topology) -> dict[int, int]:
    """Return, per PoD, the boundary fibres the Core circuits of ``plan`` use."""
    if plan is None:
        return {}
    by_core = topology.fibre_by_core
    used: Counter[int] = Counter()
    for c in plan.circuits:
        if c.tier != "core":
            continue
        for ref in c.xc.ports():
            fibre = by_core.get(ref)
            if fibre is not None:
                used[fibre.pod] += 1
    return dict(used)


def fair_shares(topology: Topology, asks: Mapping[str, Mapping[int, int]],
                pods_of: Mapping[str, Iterable[int]]) -> dict[str, dict[int, int]]:
    """Return each job's share of each of its PoDs' usable boundary fibres (max-min fair over ``asks``)."""
    out: dict[str, dict[int, int]] = {j: {} for j in pods_of}
    pods = sorted({p for ps in pods_of.values() for p in ps})
    for pod in pods:
        jobs = [j for j, ps in pods_of.items() if pod in ps]
        capacity = len(topology.usable_boundary(pod)) if hasattr(topology, "usable_boundary") else len(
            topology.boundary.get(pod, ()))
        shares = max_min_fair(capacity, {j: asks.get(j, {}).get(pod, 0) for j in jobs})
        for j in jobs:
            out[j][pod] = shares[j]
    return out


def cap_ports(topology: Topology, shares: Mapping[int, int], keep: Iterable[PortRef] = (),
              taken: Iterable[PortRef] = ()) -> list[PortRef]:
    """Return the Core-side fibre ports to reserve so a job can use at most ``shares[pod]`` fibres per PoD.

    Fibres in ``keep`` (the job's own circuits) stay usable first, then free ones; ``taken`` (other
    jobs' circuits, already reserved) count as unusable.
    """
    keep, taken = set(keep), set(taken)
    out: list[PortRef] = []
    for pod, share in sorted(shares.items()):
        fibres = [f for f in topology.boundary.get(pod, ()) if f.core not in taken]
        fibres.sort(key=lambda f: (f.core not in keep, f.index))
        out += [f.core for f in fibres[max(0, share):]]
    return out
