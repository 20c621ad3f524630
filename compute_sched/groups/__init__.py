"""RollMux multi-job co-execution groups: placement (Algorithm 1), round-robin schedule, baselines, replay.

Modules, bottom up: ``config`` (prices, memory, speeds), ``model`` (jobs, nodes, groups), ``intra``
(round-robin meta-iteration, long-tail migration), ``nodes`` (pools, PoD-aware allocation, cross-PoD
traffic), ``cluster`` (groups and decisions), ``inter`` (Algorithm 1), ``baselines``, ``optimal``,
``workload`` (Table 6 traces), ``perf`` and ``replay`` (trace-driven simulation), ``scenario``,
``gantt``, and ``permits`` (the run-permit state machine behind ``agents/phase.py``).
See docs/groups.md.
"""
