"""JigsawRL's layout for two pipelines on shared workers (RLSim): which of :data:`ROUTINGS` to run, decided once per
run on simulated profiling steps (:func:`predict_routing`), and the :func:`~sim.multiplex.runner.run_group`
arguments of each (:func:`routing_args`). docs/jigsaw.md ("Layout") gives how the rule was calibrated.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Iterable, Sequence

from orchestrl.fabric.errors import ConfigError
from orchestrl.sim.multiplex.baselines import repeat_each, steady_passes
from orchestrl.sim.multiplex.runner import GroupResult, PipelineSteps, _Group, run_group, simulate_steps

__all__ = ["ROUTINGS", "routing_args", "profile_draws", "profile_steps", "predict_routing", "PROFILE_SEED", "PROFILE_STEPS",
           "PROFILE_DRAWS", "ROUTING_MARGIN", "Profile", "run_auto", "choose", "margin_adjusted", "profile_costs"]


#: the seed offset of the profiling steps :func:`predict_routing` draws (batches none of the measured steps use);
#: draw ``i`` of :data:`PROFILE_DRAWS` offsets each pipeline's seed by ``(i + 1) * PROFILE_SEED``
PROFILE_SEED = 7919
#: how many profiling steps a draw has: two, so that the profile crosses a step boundary, where what one pipeline's
#: training on the other's workers costs shows (it delays that pipeline's next rollout); over Fig. 12's seven
#: settings x three trace seeds one step chose a worse layout 7 times of 21, two steps 3 times (docs/jigsaw.md)
PROFILE_STEPS = 2
#: how many independent draws of :data:`PROFILE_STEPS` steps are profiled (each layout's makespans summed over
#: them), and how much shorter than the static split (``"split"``) a layout that shares workers must then be to
#: be chosen: the profile is other draws of the workload, so a small predicted gain is often a loss on the run.
#: Both were set on held-out trace seeds (Fig. 12's seven settings and Fig. 16's pair x seeds 3-5; the figures
#: report seeds 0-2): one draw chose a worse layout than the best on 3-5 of 24 whatever the margin (best 2-4%),
#: two draws on 3 of 24 at a 1-3% margin (4 with none, 3 at 4%, 4 at 5-6%, 6 at 8%), the highest mean at 1-2%;
#: 1.5% is the middle. On seeds 0-2 that rule chose a worse layout 1 time of 24 (one draw, 4%: 3; no margin:
#: 3). docs/jigsaw.md gives the numbers.
PROFILE_DRAWS = 2
ROUTING_MARGIN = 0.015

Profile = Sequence[tuple[Sequence[PipelineSteps], Sequence[PipelineSteps]]]


def profile_draws(runs: Sequence[PipelineSteps], replicas: Iterable[int],
                  draws: int = PROFILE_DRAWS) -> list[dict[int, list[PipelineSteps]]]:
    """``draws`` independent profiling draws, each the pipelines' :data:`PROFILE_STEPS` steps simulated on every
    replica count of ``replicas`` (count -> steps): other batches of the same workloads (draw ``i`` offsets each
    pipeline's seed by ``(i + 1) * PROFILE_SEED``, so none of the measured steps). What both layout rules decide
    on (:func:`profile_steps`, :func:`~sim.multiplex.pool_layout.profile_marginal`)."""
    if draws < 1:
        raise ConfigError("jigsaw run", "profile draws", f"{draws!r}", "at least 1")
    gpu = runs[0].gpu
    out = []
    for i in range(draws):
        specs = [replace(r.spec, seed=r.spec.seed + (i + 1) * PROFILE_SEED) for r in runs]
        out.append({n: [simulate_steps(s, gpu, n, PROFILE_STEPS) for s in specs] for n in dict.fromkeys(replicas)})
    return out


def profile_steps(runs: Sequence[PipelineSteps], draws: int = PROFILE_DRAWS, steady: bool = False) -> Profile:
    """The profiling steps :func:`predict_routing` decides on: ``draws`` independent draws, each the pipelines'
    steps on all and on half the workers, other batches of the same workloads (each pipeline's seed offset by a
    multiple of :data:`PROFILE_SEED`, so none of the measured steps), :data:`PROFILE_STEPS` of them. Independent
    of the grid: compute them once and pass them to every decision of a case. ``steady``: each draw's pipelines
    repeated as the steady-state measure repeats the measured ones (:func:`~sim.multiplex.baselines.steady_passes`),
    balanced by that draw's own halves, not the measured steps."""
    d = runs[0].replicas
    out = []
    for on in profile_draws(runs, (d, d // 2), draws):
        full, half = on[d], on[d // 2]
        if steady:
            passes = steady_passes(half)
            full, half = repeat_each(full, passes), repeat_each(half, passes)
        out.append((full, half))
    return tuple(out)


#: the layouts :func:`predict_routing` chooses between: every pipeline on every worker; each pipeline's rollout on
#: its own half, its reference and training on every worker; each pipeline wholly on its half (veRL split's
#: layout, where co-location costs more than it brings: no worker then pays two pipelines' fixed per-step costs)
ROUTINGS = ("uniform", "halves", "split")


def routing_args(routing: str, half: Sequence[PipelineSteps] | None, steps: int) -> dict:
    """:func:`~sim.multiplex.runner.run_group`'s keyword arguments for ``routing`` (one of :data:`ROUTINGS`) over ``steps`` steps."""
    if routing not in ROUTINGS:
        raise ConfigError("jigsaw run", "routing", f"{routing!r}", ", ".join(ROUTINGS))
    if routing == "uniform":
        return {}
    if half is None:
        raise ConfigError("jigsaw run", "routing", f"{routing!r} without the halves' steps",
                          "the pipelines' steps simulated on half the workers, or 'uniform'")
    return {"partition": half, "routed": [True] * steps, "own_post": routing == "split"}


def profile_costs(profile: Profile, policy: str = "jigsaw", grid: str = "default", scale: float = 1.0,
                  window: int = 3, choices: Sequence[str] = ROUTINGS) -> list[dict[str, float]]:
    """Each profile draw's makespan in every layout of ``choices`` (layout -> seconds), what
    :func:`predict_routing` sums and compares. Makespan also for draws made by ``profile_steps(..., steady=True)``:
    comparing those by the steady-state measure itself (tokens/s while both pipelines run) was tried and chose
    worse on the 18 held-out cases (0.9913x veRL against 1.0000x, docs/jigsaw.md)."""
    out = []
    for prof, halves in profile:
        steps = max(r.steps for r in prof)  # the steady measure's pipelines run different step counts
        out.append({r: _Group(prof, policy, grid, scale, window, **routing_args(r, halves, steps)).run().makespan_s
                    for r in choices})
    return out


def predict_routing(runs: Sequence[PipelineSteps], policy: str = "jigsaw", grid: str = "default", scale: float = 1.0,
                    window: int = 3, profile: Profile | None = None,
                    choices: Sequence[str] = ROUTINGS, margin: float = ROUTING_MARGIN) -> str:
    """The layout of :data:`ROUTINGS` to run the pipelines in (§4.3's skew at its extreme, and the static split
    as the fallback), decided once per run from profiling steps.

    The profiling steps (:func:`profile_steps`, or ``profile``: a sequence of such draws) are run each
    way on ``grid``, each layout's makespans summed over the draws; the shortest wins (§4.1's inter-step
    consistency: the steps that follow look alike; ties go to the earlier layout of :data:`ROUTINGS`),
    except that a layout sharing workers must beat ``"split"`` (when it is a choice) by ``margin``
    (:data:`ROUTING_MARGIN`, a fraction of split's makespan). Once per run, not per step: a switch between layouts mid-run costs more than either (the steps of the two overlap at the
    switch), which a one-step re-run does not see. Only two pipelines on an even number of workers can be
    split; otherwise ``"uniform"`` (a ConfigError if ``choices`` leaves it out). ``choices`` narrows the
    layouts considered (e.g. without ``"split"``: the layout sharing workers the profile picks).
    """
    if not choices or any(c not in ROUTINGS for c in choices):
        raise ConfigError("jigsaw run", "routing choices", f"{list(choices)!r}", f"a subset of {', '.join(ROUTINGS)}")
    if not (0.0 <= margin < 1.0):
        raise ConfigError("jigsaw run", "routing margin", f"{margin!r}",
                          "a fraction of the split layout's makespan in [0, 1), e.g. 0.015")
    if len(runs) != 2 or runs[0].replicas % 2:
        if "uniform" not in choices:
            raise ConfigError("jigsaw run", "routing choices", f"{list(choices)!r} for {len(runs)} pipeline(s) on "
                              f"{runs[0].replicas if runs else 0} workers",
                              "include 'uniform': only two pipelines on an even number of workers can be halved")
        return "uniform"
    draws = profile_steps(runs) if profile is None else profile
    costs = profile_costs(draws, policy, grid, scale, window, choices)
    return choose({r: sum(c[r] for c in costs) for r in choices}, margin)


def margin_adjusted(times: dict[str, float], margin: float = ROUTING_MARGIN) -> dict[str, float]:
    """``times`` (layout -> profiled makespan) with ``"split"``'s shortened by ``margin``: what :func:`choose`
    compares (a sharing layout must beat the static split by the margin)."""
    return {r: v * (1.0 - margin) if r == "split" else v for r, v in times.items()}


def choose(times: dict[str, float], margin: float = ROUTING_MARGIN) -> str:
    """The layout of ``times`` (layout -> profiled makespan) with the shortest time, ``"split"``'s shortened by
    ``margin`` (what a sharing layout must beat); ties go to the earlier layout of :data:`ROUTINGS`."""
    t = margin_adjusted(times, margin)
    return min((r for r in ROUTINGS if r in t), key=lambda r: t[r])


def run_auto(runs: Sequence[PipelineSteps], half: Sequence[PipelineSteps], policy: str = "jigsaw",
             grid: str = "default", scale: float = 1.0, window: int = 3) -> GroupResult:
    """:func:`~sim.multiplex.runner.run_group` in the layout :func:`predict_routing` chooses for the whole run
    (``half``: the pipelines' steps simulated on half the workers)."""
    steps = max(r.steps for r in runs)
    return run_group(runs, policy, grid, scale, window,
                     **routing_args(predict_routing(runs, policy, grid, scale, window), half, steps))
