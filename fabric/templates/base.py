"""What a stage topology template is: which endpoint pairs may get circuits, and port reservations.

A template (OrchestrRL §5.2, Figure 8) does not decide *how many* circuits a pair gets -- the
allocator does that from demand. It decides the *shape*: which OCS-Core PoD pairs are eligible,
whether OCS-Agg may join ToRs to ToRs and ToRs to the PoD boundary, how many boundary ports a PoD
may use (a reservation), and whether the Core problem is bipartite (so the allocator should use
its utilisation-aware tie-breaker).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

__all__ = ["TemplateScope", "Template", "pod_endpoint", "pod_of_endpoint"]


def pod_endpoint(pod: int) -> str:
    """OCS-Core allocator endpoint name of a PoD."""
    return f"pod{pod}"


def pod_of_endpoint(name: str) -> int:
    """Inverse of :func:`pod_endpoint`."""
    return int(name[3:])


@dataclass(frozen=True)
class TemplateScope:
    """A template instantiated for one intent: the concrete eligibility the allocator sees."""

    template: str
    core_pairs: frozenset[frozenset[str]]  # eligible OCS-Core PoD pairs (pod endpoints)
    core_port_cap: Mapping[int, int] = field(default_factory=dict)  # pod -> max boundary ports usable
    agg_tor_tor: bool = True  # OCS-Agg may join two ToRs of a PoD
    agg_lift_drop: bool = True  # OCS-Agg may join a ToR to the PoD boundary
    core_bipartite: bool = False  # Core pairs form a bipartite graph (Train PoDs -> Gen PoDs)
    relay_unlifted: bool = True  # a ToR the boundary cannot lift reaches it through a lifted ToR (OCS-Agg)
    roles: Mapping[int, str] = field(default_factory=dict)  # pod -> "train" | "gen" | "mixed", for reports

    def core_eligible(self, a: str, b: str) -> bool:
        return frozenset((a, b)) in self.core_pairs


@dataclass(frozen=True)
class Template:
    """A stage topology template of §5.2.

    ``scope`` is computed from *which PoDs exchange which primitive* in an intent -- membership,
    not volume -- so the same template serves every iteration of a recurring period.
    """

    name: str
    description: str  # one line, shown in plan summaries
    figure: str  # where the paper draws it
    core_policy: str  # "none" | "demanded" | "mesh" | "bipartite" | "slice"
    core_slice_ports: int = 0  # per-PoD boundary ports reserved for the "slice" policy
    agg_tor_tor: bool = True
    agg_lift_drop: bool = True
    relay_unlifted: bool = True  # see TemplateScope; off where the Core share is a deliberate slice

    def instantiate(self, pod_flows: Mapping[str, set[tuple[int, int]]], pods: set[int]) -> TemplateScope:
        """Return the scope for PoD-level flows grouped by primitive.

        Parameters
        ----------
        pod_flows : mapping primitive -> set of (src_pod, dst_pod) with src != dst
            Which PoD pairs the intent's collectives connect (from its rank-pair traffic).
        pods : set of int
            Every PoD that hosts a participant of the intent.
        """
        core: set[frozenset[str]] = set()
        cap: dict[int, int] = {}
        roles: dict[int, str] = {p: "mixed" for p in pods}
        if self.core_policy == "demanded":
            for flows in pod_flows.values():
                core.update(frozenset((pod_endpoint(a), pod_endpoint(b))) for a, b in flows)
        elif self.core_policy == "mesh":
            ordered = sorted(pods)
            core.update(frozenset((pod_endpoint(a), pod_endpoint(b)))
                        for i, a in enumerate(ordered) for b in ordered[i + 1:])
        elif self.core_policy == "bipartite":
            flows = pod_flows.get("weight-sync", set())
            senders = {a for a, _ in flows}
            receivers = {b for _, b in flows} - senders
            # Only shard holders' PoDs may feed Gen PoDs: Gen-to-Gen boundary crossings would replicate
            # a shard across the boundary twice; Phase B fans out inside each PoD instead (App. E).
            core.update(frozenset((pod_endpoint(a), pod_endpoint(b))) for a, b in flows
                        if a in senders and b in receivers)
            roles.update({p: "train" for p in senders})
            roles.update({p: "gen" for p in receivers})
        elif self.core_policy == "slice":
            flows = pod_flows.get("response-stream", set())
            gen_pods = {a for a, _ in flows}
            train_pods = {b for _, b in flows}
            core.update(frozenset((pod_endpoint(a), pod_endpoint(b))) for a, b in flows)
            for p in gen_pods:
                cap[p] = self.core_slice_ports
            roles.update({p: "gen" for p in pods})
            roles.update({p: "train" for p in train_pods - gen_pods})
        elif self.core_policy != "none":
            raise ValueError(f"template {self.name!r}: unknown core_policy {self.core_policy!r}")
        return TemplateScope(
            template=self.name,
            core_pairs=frozenset(core),
            core_port_cap=cap,
            agg_tor_tor=self.agg_tor_tor,
            agg_lift_drop=self.agg_lift_drop,
            core_bipartite=self.core_policy == "bipartite",
            relay_unlifted=self.relay_unlifted and self.agg_tor_tor,
            roles=roles,
        )
