"""One run file under several trace seeds: mean and 95% interval of every headline number.

A single seed's throughput carries the luck of its length draw: the fixed-scheduler runs of Figure 17
move by about 6% between seeds because their steps wait for the longest response, enough to flip an
ordering. :func:`run_seeds` runs ``loop.seed, loop.seed + 1, ...`` as independent cases on the sweep
backend (:mod:`sim.sweep`: a process pool, or Ray) and reports each metric's mean and Student-t 95%
interval (:func:`sim.experiments.common.mean_ci`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from orchestrl.sim.config import RunConfig, validate
from orchestrl.sim.experiments.common import mean_ci

__all__ = ["METRICS", "SeedSummary", "run_seeds", "run_one_seed"]

#: The numbers a seeded run reports (each: mean, ci_low, ci_high, per_seed).
METRICS = ("samples_per_s", "tokens_per_s", "samples_per_usd", "gen_s", "train_s", "weight_sync_s")


def run_one_seed(cfg: RunConfig) -> dict[str, Any]:
    """Simulate ``cfg`` (its own ``loop.seed``); return its headline numbers (module-level: the pool pickles it)."""
    from orchestrl.sim.run import simulate

    res = simulate(cfg)
    stages = res.stage_means_s()
    return {"seed": cfg.loop.seed, "samples_per_s": res.throughput.samples_per_s,
            "tokens_per_s": res.throughput.tokens_per_s, "samples_per_usd": res.samples_per_usd,
            "gen_s": stages["gen"], "train_s": stages["train"], "weight_sync_s": stages["weight-sync"],
            "train_gpus": res.detail["train_gpus"]}


@dataclass(frozen=True)
class SeedSummary:
    """Per-seed results and, per metric, the mean and its 95% interval."""

    seeds: tuple[int, ...]
    per_seed: tuple[dict[str, Any], ...]

    def stat(self, metric: str) -> tuple[float, float, float]:
        return mean_ci([r[metric] for r in self.per_seed])

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"seeds": list(self.seeds), "per_seed": list(self.per_seed)}
        for m in METRICS:
            mean, lo, hi = self.stat(m)
            out[m] = {"mean": mean, "ci_low": lo, "ci_high": hi}
        return out


def run_seeds(cfg: RunConfig, seeds: int, *, workers: int | None = None, ray_address: str | None = None,
              progress=None) -> SeedSummary:
    """Run ``cfg`` under ``seeds`` consecutive trace seeds from its own; return the summary.

    Notes
    -----
    ``seeds`` independent simulations on the sweep backend; each finds its own Train/Gen split when
    the file leaves ``cluster.train_gpus`` out.
    """
    from orchestrl.sim.sweep import run_sweep

    base = cfg.loop.seed
    cases = [validate(replace(cfg, loop=replace(cfg.loop, seed=base + k))) for k in range(seeds)]
    backend = "ray" if ray_address else "pool"
    address = None if ray_address in (None, "local") else ray_address
    got = run_sweep(run_one_seed, cases, backend=backend, workers=workers, ray_address=address, progress=progress)
    return SeedSummary(tuple(base + k for k in range(seeds)), tuple(got))
