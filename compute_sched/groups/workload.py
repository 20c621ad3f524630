"""Synthetic RL job traces for the replay simulator: RollMux Table 6 profiles, §7.5-shaped arrivals.

Design note
-----------
§7.5 takes arrival times and durations from a 300-job, 580-hour segment of the Philly trace (mean
duration 14.4 h, longest 142.9 h) and synthesises the RL side from Table 6. The Philly segment
itself is not public here, so arrivals are a Poisson process at the segment's rate (300 / 580 h)
modulated by a day/night cycle (multi-tenant clusters submit in bursts during working hours), and
durations are log-normal with the segment's mean, its spread chosen so that the expected longest of
300 jobs is 142.9 h; both derivations are done in code below from those three statistics.

Each job's Table 6 times are the *conservative* estimates (every response at the maximum length);
realised phases are drawn per iteration from a heavy-tailed response-length model, so rollouts
usually end near the worst case (a straggler hits the limit) while most responses finish early.
That is the testbed's situation (§4.2, §7.3-§7.4). §7.5's simulation defines a job by its Table 6
times alone; ``ResponseModel(deterministic=True)`` replays that: every phase takes its stated time.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from statistics import NormalDist
from typing import Sequence

import numpy as np

from orchestrl.compute_sched.groups.config import TABLE2_RESIDENT_GB
from orchestrl.compute_sched.groups.model import JobSpec
from orchestrl.fabric.errors import ConfigError

__all__ = ["TABLE6", "SIZES", "WORKLOADS", "TraceStats", "ResponseModel", "synthesize_jobs", "job_from_profile"]

#: RollMux Table 6: (T_roll range, T_train range) in seconds, by workload and size.
TABLE6: dict[str, dict[str, tuple[tuple[float, float], tuple[float, float]]]] = {
    "balanced": {"S": ((50, 100), (50, 100)), "M": ((100, 200), (100, 200)), "L": ((200, 300), (200, 300))},
    "rollout-heavy": {"S": ((100, 200), (25, 50)), "M": ((200, 400), (50, 100)), "L": ((400, 600), (100, 200))},
    "train-heavy": {"S": ((25, 50), (100, 200)), "M": ((50, 100), (200, 400)), "L": ((100, 200), (400, 600))},
}
WORKLOADS = (*TABLE6, "mixed")
_SHORT = {"balanced": "BL", "rollout-heavy": "RH", "train-heavy": "TH"}

#: Job size -> (model billions, rollout nodes, training nodes); Table 6 does not give resources, so
#: they follow RollMux Table 3 (7B and 14B jobs on 8+8 GPUs, 32B on 16+16).
SIZES: dict[str, tuple[int, int, int]] = {"S": (7, 1, 1), "M": (14, 1, 1), "L": (32, 2, 2)}


@dataclass(frozen=True)
class TraceStats:
    """The statistics §7.5 gives of its Philly segment."""

    jobs: int = 300
    span_h: float = 580.0
    mean_duration_h: float = 14.4
    max_duration_h: float = 142.9
    diurnal_peak_to_trough: float = 3.0  # submission rate at the daily peak over the nightly trough

    def lognormal(self) -> tuple[float, float]:
        """Return ``(mu, sigma)`` with the given mean whose expected maximum of ``jobs`` draws is the longest.

        Solves ``mu + sigma^2/2 = ln(mean)`` and ``mu + z sigma = ln(max)`` with ``z`` the normal quantile
        at ``1 - 1/jobs``; the smaller root keeps the bulk of the jobs near the mean.

        Examples
        --------
        >>> mu, sigma = TraceStats().lognormal()
        >>> round(math.exp(mu + sigma ** 2 / 2), 1), round(sigma, 2)
        (14.4, 1.05)
        """
        z = NormalDist().inv_cdf(1.0 - 1.0 / self.jobs)
        a, b = math.log(self.mean_duration_h), math.log(self.max_duration_h)
        disc = z * z - 2.0 * (b - a)
        if disc < 0:
            raise ConfigError("trace stats", "max_duration_h", f"{self.max_duration_h} h is unreachable from mean "
                                                               f"{self.mean_duration_h} h", "a smaller maximum")
        sigma = z - math.sqrt(disc)
        return a - sigma * sigma / 2.0, sigma


@dataclass(frozen=True)
class ResponseModel:
    """Heavy-tailed response lengths as fractions of the maximum length (RollMux Figure 11-left)."""

    median_fraction: float = 0.3  # typical response at 30% of the limit
    sigma: float = 0.7  # log-normal spread; with 64 responses ~94% of batches have one at the limit
    responses: int = 64  # responses sampled per rollout (a batch in miniature)
    train_fixed_fraction: float = 0.3  # share of the worst-case training time that does not scale with tokens
    # True: every phase takes exactly its stated time, as a job of §7.5's simulation is "defined by
    # its rollout time and train time" (Table 6); realised slowdowns then equal planned ones.
    deterministic: bool = False

    def draw(self, rng: np.random.Generator, iterations: int, jobs: int, tail_threshold: float) -> np.ndarray:
        """Return per-(iteration, job) fractions of the worst case: rollout end, tail-bound point, training.

        Examples
        --------
        >>> d = ResponseModel().draw(np.random.default_rng(0), 50, 2, 0.8)
        >>> d.shape, bool((d <= 1).all()), bool((d[..., 1] <= d[..., 0]).all())
        ((50, 2, 3), True, True)
        >>> bool((ResponseModel(deterministic=True).draw(np.random.default_rng(0), 4, 2, 0.8) == 1.0).all())
        True
        """
        if self.deterministic:
            return np.ones((iterations, jobs, 3))
        lengths = np.minimum(1.0, rng.lognormal(math.log(self.median_fraction), self.sigma,
                                                size=(iterations, jobs, self.responses)))
        out = np.empty((iterations, jobs, 3))
        out[..., 0] = lengths.max(axis=-1)
        out[..., 1] = np.quantile(lengths, tail_threshold, axis=-1)
        out[..., 2] = self.train_fixed_fraction + (1.0 - self.train_fixed_fraction) * lengths.mean(axis=-1)
        return out


def job_from_profile(job_id: str, workload: str, size: str, rng: np.random.Generator, *, slo: float,
                     arrival_s: float = 0.0, duration_s: float = 3600.0, prefill_share: float = 0.0) -> JobSpec:
    """Return one job of a Table 6 profile, its phase times drawn from the profile's uniform ranges."""
    if workload not in TABLE6:
        raise ConfigError("workload", "workload", f"unknown profile {workload!r}", ", ".join(TABLE6))
    if size not in SIZES:
        raise ConfigError("workload", "size", f"unknown size {size!r}", ", ".join(SIZES))
    (r_lo, r_hi), (t_lo, t_hi) = TABLE6[workload][size]
    model_b, roll_nodes, train_nodes = SIZES[size]
    roll_mem, train_mem = TABLE2_RESIDENT_GB[model_b]
    # RollArt §3.1: multi-turn (rollout-heavy, agentic) tasks are bimodal, many-turn ones prefill-heavy.
    kind = "prefill" if workload == "rollout-heavy" and rng.random() < prefill_share else "decode"
    return JobSpec(job_id, float(rng.uniform(r_lo, r_hi)), float(rng.uniform(t_lo, t_hi)), roll_nodes, train_nodes,
                   roll_mem, train_mem, slo, kind, model_b * 1e9, arrival_s, duration_s,
                   f"{_SHORT[workload]}-{size}")


def synthesize_jobs(workload: str, jobs: int, seed: int, *, slo: float | str = "uniform",
                    stats: TraceStats = TraceStats(), arrival_scale: float = 1.0,
                    prefill_share: float = 0.0) -> list[JobSpec]:
    """Return ``jobs`` jobs of a workload with §7.5-shaped arrivals and durations.

    Parameters
    ----------
    workload : str
        ``balanced``, ``rollout-heavy``, ``train-heavy`` or ``mixed`` (uniform over all nine configs).
    slo : float or "uniform"
        A fixed slowdown tolerance for every job, or ``"uniform"`` for Unif(1, 2) per job (§7.4).
    arrival_scale : float
        Multiplies inter-arrival gaps (< 1 packs arrivals together, e.g. for small dense instances).
    prefill_share : float
        Share of rollout-heavy (multi-turn) jobs whose generation is prefill-heavy (RollArt §3.1);
        0 keeps RollMux's all-decode setting, 0.5 exercises hardware affinity.

    Examples
    --------
    >>> js = synthesize_jobs("mixed", 5, seed=1)
    >>> len(js), all(1.0 <= j.slo <= 2.0 for j in js), js[0].arrival_s <= js[-1].arrival_s
    (5, True, True)
    """
    if workload not in WORKLOADS:
        raise ConfigError("workload", "--workload", f"unknown workload {workload!r}", ", ".join(WORKLOADS))
    if jobs < 1:
        raise ConfigError("workload", "--jobs", f"{jobs} is below 1", ">= 1")
    if not (slo == "uniform" or (isinstance(slo, (int, float)) and slo >= 1.0)):
        raise ConfigError("workload", "--slo", f"{slo!r}", "'uniform' (Unif(1, 2)) or a number >= 1")
    rng = np.random.default_rng(seed)
    mu, sigma = stats.lognormal()
    rate_per_h = stats.jobs / stats.span_h
    amp = (stats.diurnal_peak_to_trough - 1.0) / (stats.diurnal_peak_to_trough + 1.0)
    t_h, out = 0.0, []
    profiles: Sequence[str] = list(TABLE6) if workload == "mixed" else [workload]
    for i in range(jobs):
        while True:  # thinning: a Poisson process whose rate follows the day
            t_h += rng.exponential(1.0 / (rate_per_h * (1.0 + amp))) * arrival_scale
            if rng.random() <= (1.0 + amp * math.sin(2.0 * math.pi * t_h / (24.0 * arrival_scale))) / (1.0 + amp):
                break
        duration_h = float(min(stats.max_duration_h, max(0.1, rng.lognormal(mu, sigma))))
        prof = profiles[int(rng.integers(len(profiles)))]
        size = list(SIZES)[int(rng.integers(len(SIZES)))]
        job_slo = float(rng.uniform(1.0, 2.0)) if slo == "uniform" else float(slo)
        out.append(job_from_profile(f"j{i:04d}", prof, size, rng, slo=job_slo, arrival_s=t_h * 3600.0,
                                    duration_s=duration_h * 3600.0, prefill_share=prefill_share))
    return out
