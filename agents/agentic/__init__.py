"""RollArt's agentic rollout runtime: LLM proxy, generation workers, environment managers, reward service.

``worker`` (one engine behind a non-blocking command loop), ``proxy`` (routing, retries, suspend and
resume), ``envs`` (Gymnasium environments as text, the math task, latency and failure injection),
``buffer`` (trajectories, the ledger, the sample buffer under the asynchronous bound), ``reward``
(stateless reward functions over HTTP), ``weights`` (asynchronous cross-cluster weight update),
``runtime`` (environment managers, redundant groups, the asynchronous training loop), ``config``
(validated run files), ``ray_actors`` (the same objects as Ray actors). See docs/agentic.md.
"""
