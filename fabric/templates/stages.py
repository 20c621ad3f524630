"""The four stage templates of OrchestrRL §5.2 / Figure 8."""

from __future__ import annotations

from orchestrl.fabric.templates.base import Template

__all__ = ["TRAIN", "TRAIN_DP", "GEN", "WEIGHT_SYNC", "TEMPLATES", "DEFAULT_GEN_CORE_SLICE_PORTS"]

# A "small slice" of core bandwidth per Gen PoD for streaming responses back (§5.2 item 2).
# Responses are KBs per sample, so a couple of circuits per PoD is ample at 200 Gbps.
DEFAULT_GEN_CORE_SLICE_PORTS = 2

TRAIN = Template(
    name="train",
    description="Train fwd/bwd: high intra-PoD ToR-to-ToR bisection on OCS-Agg",
    figure="Figure 8(a)",
    core_policy="demanded",  # cross-PoD PP/EP hops, if the job spans PoDs, get what they demand
)
TRAIN_DP = Template(
    name="train-dp",
    description="Train gradient sync: inter-PoD mesh on OCS-Core among the job's PoDs",
    figure="Figure 8(b)",
    core_policy="mesh",
)
GEN = Template(
    name="gen",
    description="Gen: isolated intra-PoD fabrics, small core slice for response streaming",
    figure="Figure 8(c)",
    core_policy="slice",
    core_slice_ports=DEFAULT_GEN_CORE_SLICE_PORTS,
    # The slice lifts two ToRs per PoD for KB-scale response streaming on purpose; relaying every
    # other ToR to them would spend the ToR ports Gen's own traffic uses, and add circuits that
    # the next Train period must tear down inside its first safe window.
    relay_unlifted=False,
)
WEIGHT_SYNC = Template(
    name="weight-sync",
    description="Weight sync: Train->Gen seeding on OCS-Core, intra-PoD fanout on OCS-Agg",
    figure="Figure 8(d-e)",
    core_policy="bipartite",
)

TEMPLATES = {t.name: t for t in (TRAIN, TRAIN_DP, GEN, WEIGHT_SYNC)}
