"""One replay experiment described as data, shared by ``orchestrl groups replay`` and ``bench/groups.py``."""

from __future__ import annotations

from dataclasses import dataclass

from orchestrl.compute_sched.groups.baselines import POLICIES, make_policy
from orchestrl.compute_sched.groups.config import GroupConfig
from orchestrl.compute_sched.groups.gantt import render_gantt
from orchestrl.compute_sched.groups.intra import round_robin
from orchestrl.compute_sched.groups.nodes import NodeAllocator
from orchestrl.compute_sched.groups.optimal import OptimalPolicy
from orchestrl.compute_sched.groups.perf import draws_for
from orchestrl.compute_sched.groups.replay import ReplayResult, replay
from orchestrl.compute_sched.groups.slo import RealisedSloCheck
from orchestrl.compute_sched.groups.workload import ResponseModel, synthesize_jobs
from orchestrl.fabric.errors import ConfigError

__all__ = ["ReplaySetup", "run_replay", "gantt_text", "POLICY_NAMES", "PHASE_MODELS"]

POLICY_NAMES = (*POLICIES, "optimal")
PHASE_MODELS = ("stochastic", "deterministic")


@dataclass(frozen=True)
class ReplaySetup:
    """Everything that defines a replay; the defaults are §7.5's (mixed, Unif(1, 2) SLOs, groups of <= 5)."""

    workload: str = "mixed"  # balanced | rollout-heavy | train-heavy | mixed (Table 6)
    jobs: int = 100
    seed: int = 0
    policy: str = "rollmux"
    slo: float | str = "uniform"  # "uniform" = Unif(1, 2) per job, or one tolerance for all
    max_group_size: int = 5
    affinity: bool = False  # RollArt §4.1: H800 rollout nodes allowed; half the multi-turn jobs prefill-heavy
    arrival_scale: float = 1.0  # < 1 packs arrivals (more concurrent jobs)
    rollout_topology: str | None = None  # fabric YAML of the rollout cluster (PoD-aware placement)
    train_topology: str | None = None  # fabric YAML of the training cluster
    fabric_aware: bool = True
    prune_saturated: str = "paper"
    # "stochastic": Table 6 times are worst-case bounds and realised phases follow heavy-tailed
    # response lengths (the testbed, §7.4); "deterministic": every phase takes its Table 6 time, as
    # in §7.5's simulation, so a placement's planned slowdown is the one the job lives with.
    phases: str = "stochastic"

    def config(self) -> GroupConfig:
        cfg = GroupConfig(max_group_size=self.max_group_size, prune_saturated=self.prune_saturated)
        return cfg.with_affinity() if self.affinity else cfg

    def responses(self) -> ResponseModel:
        """Return the model of realised phase times this setup replays with."""
        return ResponseModel(deterministic=self.phases == "deterministic")


def run_replay(setup: ReplaySetup) -> ReplayResult:
    """Synthesise the setup's trace and replay it under its policy."""
    if setup.policy not in POLICY_NAMES:
        raise ConfigError("replay", "--policy", f"unknown policy {setup.policy!r}", ", ".join(POLICY_NAMES))
    if setup.prune_saturated not in ("paper", "train"):
        raise ConfigError("replay", "--prune", f"unknown rule {setup.prune_saturated!r}", "paper, train")
    if setup.phases not in PHASE_MODELS:
        raise ConfigError("replay", "phases", f"unknown phase model {setup.phases!r}", ", ".join(PHASE_MODELS))
    cfg = setup.config()
    jobs = synthesize_jobs(setup.workload, setup.jobs, setup.seed, slo=setup.slo, arrival_scale=setup.arrival_scale,
                           prefill_share=0.5 if setup.affinity else 0.0)
    topologies = {}
    if setup.rollout_topology or setup.train_topology:
        from orchestrl.fabric.topology import load_topology

        for pool, path in (("rollout", setup.rollout_topology), ("train", setup.train_topology)):
            if path:
                topologies[pool] = load_topology(path)
    allocator = NodeAllocator(cfg, topologies, fabric_aware=setup.fabric_aware)
    if setup.policy == "optimal":
        policy = OptimalPolicy(cfg, RealisedSloCheck(setup.responses(), seed=setup.seed))
    else:
        policy = make_policy(setup.policy, cfg, setup.seed, setup.responses())
    return replay(jobs, policy, cfg, responses=setup.responses(), seed=setup.seed, allocator=allocator)


def gantt_text(result: ReplayResult, setup: ReplaySetup, meta_iterations: int = 3) -> str:
    """Return a Gantt chart of the largest round-robin group of a replay, with realised phases."""
    snap = result.gantt
    if snap is None:
        return "(no round-robin group to draw)"
    cfg = setup.config()
    draws = draws_for(cfg, setup.responses(), list(snap.job_ids), setup.seed, meta_iterations)
    sched = round_robin(snap.members, snap.rollout_nodes, cfg, draws=draws, record=True)
    title = (f"group of {len(snap.job_ids)} jobs, {snap.rollout_nodes} rollout node(s), "
             f"{meta_iterations} meta-iterations (realised phases, long-tail migration "
             f"{'on' if cfg.long_tail_migration else 'off'})")
    return render_gantt(sched.segments, title=title)
