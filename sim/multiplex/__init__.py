"""RLSim for JigsawRL: pipelines' steps on the engine model, then several pipelines on shared GPUs.

``workload`` (tasks, Table 1, samples), ``rollout`` (one DP worker's rollout on the simulated engine
and its sub-stage chain; reference and training time), ``runner`` (the event loop of a group of
pipelines under a multiplexing policy), ``baselines`` (veRL, RollMux, StreamRL, AReaL). The
figures are ``sim/experiments/jigsaw_*.py``; docs/jigsaw.md.
"""
