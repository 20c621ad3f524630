"""Realised-slowdown admission check: an SLO is a ratio, and a ratio's worst case is not the ratio of worst cases.

Design note
-----------
RollMux §4.2 admits a job when every member keeps ``T^co <= SLO * T^solo`` with both times at their
worst case (every response at the maximum length). That bounds the *absolute* co-execution
iteration time, and the schedule is monotone, so the realised iteration never exceeds the plan. But
a job's SLO is a tolerated *slowdown* against running alone, and realised phases do not shrink
evenly: a rollout ends with its longest response, which nearly always reaches the length limit
(about 1.0 of the worst case), while training scales with the *mean* response length (about 0.57 of
the worst case under :class:`~compute_sched.groups.workload.ResponseModel`). A train-heavy job's solo
iteration therefore shrinks far more than a co-execution cycle dominated by other jobs' rollouts,
and its realised slowdown can exceed its SLO though the worst-case check passed (measured: 39 of
1,000 jobs over ten 100-job mixed traces, seeds 100-109, 38 of them train-heavy or balanced).

:class:`RealisedSloCheck` adds the missing condition: with phases drawn from the job's profiled
response-length model, each member's mean co-execution iteration must stay within
``SLO * (1 - margin)`` of its mean solo iteration under the same draws. The draws come from the
scheduler's own random stream (salted, keyed by job), never the replay's, so the check predicts
out of sample; ``margin`` covers the difference between its sample and the realised one. Under
``ResponseModel(deterministic=True)`` every draw is the worst case and the check is the §4.2 one,
so it is skipped.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Mapping, Sequence

import numpy as np

from orchestrl.compute_sched.groups.config import GroupConfig
from orchestrl.compute_sched.groups.intra import GroupJob, round_robin
from orchestrl.compute_sched.groups.model import JobSpec
from orchestrl.compute_sched.groups.workload import ResponseModel
from orchestrl.fabric.errors import ConfigError

__all__ = ["RealisedSloCheck", "DEFAULT_MARGIN"]

#: Headroom on the predicted realised slowdown (``SLO * (1 - margin)``): the smallest of 0-5% with no
#: miss on tuning seeds 100-139 (``bench/groups.py --tune-margin``), never its held-out seeds.
DEFAULT_MARGIN = 0.03
_SOLO_CACHE: dict[tuple, float] = {}
_SALT = 0x5C4ED  # keeps the scheduler's draws apart from the replay's (which use [seed, crc32(job)])


@lru_cache(maxsize=65536)
def _plan_draws(job_id: str, seed: int, iterations: int, responses: ResponseModel, threshold: float) -> np.ndarray:
    rng = np.random.default_rng([_SALT, seed, zlib.crc32(job_id.encode())])
    return responses.draw(rng, iterations, 1, threshold)[:, 0, :]


@dataclass(frozen=True)
class RealisedSloCheck:
    """Predict each member's realised slowdown from sampled phases and refuse a group that would break an SLO.

    Examples
    --------
    Two train-heavy jobs pass the worst-case check (500 s co-execution vs 2 x 250 s) but their
    sampled training phases shrink to about 0.57 of the worst case, their rollouts do not:

    >>> from orchestrl.compute_sched.groups.intra import worst_case_iteration_s
    >>> cfg = GroupConfig(warm_start_s=0.0)
    >>> a, b = JobSpec("a", 50.0, 200.0, slo=2.0), JobSpec("b", 200.0, 50.0, slo=2.0)
    >>> members = [GroupJob("a", (0,), 50.0, 200.0), GroupJob("b", (0,), 200.0, 50.0)]
    >>> worst_case_iteration_s(members, cfg)["a"] <= a.slo_budget_s
    True
    >>> check = RealisedSloCheck(ResponseModel())
    >>> s = check.slowdowns(members, {"a": a, "b": b}, cfg)
    >>> bool(s["a"] > 1.4), bool(s["b"] < s["a"])
    (True, True)
    """

    responses: ResponseModel = field(default_factory=ResponseModel)
    iterations: int = 48  # sampled meta-iterations; the mean is taken over the second half
    margin: float = DEFAULT_MARGIN  # required headroom: slowdown <= SLO * (1 - margin)
    seed: int = 0  # the scheduler's stream (salted apart from the replay's draws)

    def __post_init__(self) -> None:
        if self.iterations < 4:
            raise ConfigError("realised SLO check", "iterations", f"{self.iterations} is below 4", ">= 4, e.g. 48")
        if not 0.0 <= self.margin < 1.0:
            raise ConfigError("realised SLO check", "margin", f"{self.margin} is outside [0, 1)", "e.g. 0.02")

    @property
    def active(self) -> bool:
        """Whether the check can refuse anything (a deterministic phase model realises the worst case)."""
        return not self.responses.deterministic

    def draws(self, job_ids: Sequence[str], config: GroupConfig) -> np.ndarray:
        """Return the scheduler's sampled phase fractions, shape (iterations, jobs, 3), fixed per job."""
        return np.stack([_plan_draws(j, self.seed, self.iterations, self.responses, config.tail_threshold)
                         for j in job_ids], axis=1)

    def solo_s(self, job: JobSpec, config: GroupConfig) -> float:
        """Return ``job``'s sampled mean solo iteration on the nodes it asked for (what its SLO is relative to)."""
        key = (self, job, config.tail_threshold, config.tail_capacity_fraction, config.migration_s,
               config.long_tail_migration)  # GroupConfig holds dicts, so it cannot key a cache itself
        if key not in _SOLO_CACHE:
            if len(_SOLO_CACHE) > 65536:
                _SOLO_CACHE.clear()
            member = GroupJob(job.job_id, tuple(range(job.roll_nodes)), job.t_roll_s, job.t_train_s)
            sched = round_robin([member], job.roll_nodes, config, draws=self.draws([job.job_id], config))
            _SOLO_CACHE[key] = sched.iteration_s[job.job_id]
        return _SOLO_CACHE[key]

    def slowdowns(self, members: Sequence[GroupJob], jobs: Mapping[str, JobSpec], config: GroupConfig,
                  n_train_nodes: int = 1) -> dict[str, float]:
        """Return each member's predicted realised slowdown (mean co-execution over mean solo iteration).

        Notes
        -----
        One round-robin simulation of ``iterations`` meta-iterations, O(iterations * pinned nodes),
        plus one cached solo simulation per job.
        """
        draws = self.draws([m.job_id for m in members], config)
        co = round_robin(members, 1, config, draws=draws, n_train_nodes=n_train_nodes).iteration_s
        return {m.job_id: co[m.job_id] / self.solo_s(jobs[m.job_id], config) for m in members}

    def admits(self, members: Sequence[GroupJob], jobs: Mapping[str, JobSpec], config: GroupConfig,
               n_train_nodes: int = 1) -> bool:
        """Return whether every member's predicted slowdown stays within ``SLO * (1 - margin)``.

        A job alone in its group needs no margin: no other job's luck enters its schedule, so on the
        nodes it asked for its prediction is its solo run exactly (slowdown 1).
        """
        if not self.active:
            return True
        pred = self.slowdowns(members, jobs, config, n_train_nodes)
        keep = 1.0 - self.margin if len(members) > 1 else 1.0
        return all(pred[j] <= jobs[j].slo * keep + 1e-9 for j in pred)

