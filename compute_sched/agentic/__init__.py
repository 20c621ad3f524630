"""RollArt policies (pure): hardware-affinity routing, the per-GPU-type step model seam.

``routing`` (task tag -> pools with priority and fallback, environment affinity, least-loaded within a
pool), ``steps`` (which step model times a GPU type; one seam for issue 30's measured model). The
asynchronous bound and redundant rollouts are ``compute_sched.admission``'s. See docs/agentic.md.
"""
