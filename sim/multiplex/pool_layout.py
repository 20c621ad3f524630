"""JigsawRL on RollMux's pools (RLSim): a disaggregated layout for two pipelines, and the long-run rule that picks it.

The layouts of :mod:`sim.multiplex.layouts` keep every worker doing all of a pipeline's stages (``uniform``,
``halves``) or give each pipeline its own half (``split``, veRL split). Where the rollout is a long tail (Fig. 13's
64-GPU settings: the last 5% of responses take over half of the rollout), none of them uses what RollMux uses: the
rollout hardly shortens with more replicas while training does, so a small rollout pool shared by both jobs and a
larger training pool serve both faster (docs/jigsaw.md, "Why RollMux beats veRL split"). The ``pool`` layout
(:func:`~sim.multiplex.runner.run_group`'s ``pool``) is that layout under JigsawRL's policy: both pipelines'
rollouts on the first ``k`` workers, where the look-ahead co-locates one pipeline's long tail with the other's
next rollout and §4.3's merge moves a tail onto fewer workers; both pipelines' reference and training on the other
``d - k`` workers. RollMux instead runs the pool's jobs in turn and moves a tail to free replicas for the next one.

Measure and rule (both long-run, as RollMux is timed):

* :func:`marginal_pass_s`: the time a pass over the steps adds once the run is under way, ``(M(P) - M(1)) /
  (P - 1)`` from a run of ``P`` passes and a run of one (makespans from a cold start). It is the estimator RollMux's
  baseline uses (:func:`~sim.multiplex.baselines.longrun_pass_s`, the first pass's end inside the same run), but
  from a separate one-pass run, so a policy that lets one pipeline run ahead cannot shorten it (every pipeline must
  finish all ``P`` passes in ``M(P)``). veRL's steps have no ramp to exclude. The two-step rule times JigsawRL by its
  makespan per pass, the first pass's ramp included (harsher on it than on RollMux where the ramp is long, kinder
  where a cold start's overlap helps, as on ``uniform``).
* :func:`decide`: the profiling draws of :func:`~sim.multiplex.layouts.profile_steps` (other batches of the same
  workloads), each layout and pool size run for one and for :data:`PROFILE_PASSES` passes; the layout, pool size and
  rollout TP degree whose summed marginal pass is shortest, ``split``'s shortened by
  :data:`~sim.multiplex.layouts.ROUTING_MARGIN` (the two-step rule's margin, on the long-run measure). Nothing measured on
  the evaluated steps decides it.

``bench/jigsaw_pool.py`` evaluates it against the two-step rule (Fig. 13's settings whose rollout is over 60% of
the step, Fig. 12's, held-out pairs); ``jigsaw_common.Case(rule="longrun")`` runs it, which the long-run figures
(``jigsaw-fig12``, ``jigsaw-fig13``, ``bench/jigsaw.py``) and ``orchestrl sim jigsaw --long-run --rule longrun`` do
(docs/jigsaw.md, "A pool layout").
"""

from __future__ import annotations

from typing import Mapping, Sequence

from orchestrl.fabric.errors import ConfigError
from orchestrl.sim.multiplex.baselines import PASSES, POOL_OFFSETS, repeat_steps
from orchestrl.sim.multiplex.layouts import PROFILE_DRAWS, ROUTING_MARGIN, ROUTINGS, profile_draws, routing_args
from orchestrl.sim.multiplex.runner import GroupResult, PipelineSteps, run_group

__all__ = ["POOL_PREFIX", "PROFILE_PASSES", "pool_sizes", "layouts_for", "pool_size", "needed_replicas", "run_layout",
           "marginal_pass_s", "LayoutCosts", "profile_marginal", "decide"]

POOL_PREFIX = "pool:"
#: passes each profiling draw is run for (besides one): the horizon the run is scored on
#: (:data:`~sim.multiplex.baselines.PASSES`), so a layout whose pass grows over the run (a drifting share) shows it.
#: Two passes until 2026-11-29: against a bar set first, four chose better on Fig. 13's 64-A100 settings (Qwen2.5-14B
#: 0.968x -> 1.018x RollMux on seeds 0-2, 1.004x -> 1.031x on held-out seeds 3-5) and no worse elsewhere
#: (docs/jigsaw.md, "Profiling over the run's horizon")
PROFILE_PASSES = PASSES


def pool_sizes(d: int) -> tuple[int, ...]:
    """The rollout pool sizes (workers) the ``pool`` layout is tried at on ``d`` workers: RollMux's
    (:data:`~sim.multiplex.baselines.POOL_OFFSETS` around half), each leaving at least one worker to train.

    >>> pool_sizes(8), pool_sizes(4), pool_sizes(2)
    ((3, 4, 5), (1, 2, 3), (1,))
    """
    return tuple(d // 2 + o for o in POOL_OFFSETS if 1 <= d // 2 + o < d)


def layouts_for(d: int, pools: bool = True) -> tuple[str, ...]:
    """Every layout name on ``d`` workers: :data:`~sim.multiplex.layouts.ROUTINGS` (halving needs an even ``d``),
    then ``pool:k`` for each of :func:`pool_sizes` when ``pools``."""
    base = ROUTINGS if d % 2 == 0 else ("uniform",)
    return base + (tuple(f"{POOL_PREFIX}{k}" for k in pool_sizes(d)) if pools else ())


def pool_size(layout: str) -> int | None:
    """``k`` of ``pool:k``; None for the layouts of :data:`~sim.multiplex.layouts.ROUTINGS`; a ConfigError otherwise."""
    if layout in ROUTINGS:
        return None
    k = layout[len(POOL_PREFIX):]
    if not layout.startswith(POOL_PREFIX) or not k.isdigit() or int(k) < 1:
        raise ConfigError("jigsaw run", "layout", f"{layout!r}",
                          f"one of {', '.join(ROUTINGS)} or {POOL_PREFIX}k with k the rollout pool's workers, e.g. pool:3")
    return int(k)


def needed_replicas(layouts: Sequence[str], d: int) -> set[int]:
    """The replica counts whose steps running ``layouts`` on ``d`` workers needs (``d``, half, the pool sizes)."""
    out = {d}
    for x in layouts:
        k = pool_size(x)
        out.add(d // 2 if k is None else k)
    return out


def run_layout(layout: str, on: Mapping[int, Sequence[PipelineSteps]], d: int, passes: int = 1,
               policy: str = "jigsaw", grid: str = "default", scale: float = 1.0) -> GroupResult:
    """Run the pipelines in ``layout`` over their steps ``passes`` times (``on``: replica count -> the pipelines'
    same steps simulated on that many replicas; :func:`needed_replicas` says which)."""
    k = pool_size(layout)
    missing = [n for n in sorted(needed_replicas([layout], d)) if n not in on]
    if missing:
        raise ConfigError("jigsaw run", "steps", f"no steps on {missing} replica(s) for layout {layout!r}",
                          "the pipelines' steps simulated on every replica count needed_replicas names")
    rep = lambda runs: [repeat_steps(r, passes) for r in runs]  # noqa: E731
    full = rep(on[d])
    if k is not None:
        return run_group(full, policy, grid, scale, pool=rep(on[k]))
    return run_group(full, policy, grid, scale, **routing_args(layout, rep(on[d // 2]), on[d][0].steps * passes))


def marginal_pass_s(one_pass_s: float, passes_s: float, passes: int) -> float:
    """The time one pass adds in the long run: ``(passes_s - one_pass_s) / (passes - 1)``, from a run of ``passes``
    passes (``passes_s``) and a run of one (``one_pass_s``), both from a cold start. A ConfigError for ``passes``
    below 2 or a longer one-pass run (the runs are not of the same steps)."""
    if isinstance(passes, bool) or not isinstance(passes, int) or passes < 2:
        raise ConfigError("long-run timing", "passes", f"{passes!r}", "an integer >= 2")
    if not 0 < one_pass_s <= passes_s:
        raise ConfigError("long-run timing", "makespans", f"one pass {one_pass_s!r} s, {passes} passes {passes_s!r} s",
                          "the one-pass run no longer than the run of several passes (same steps, same layout)")
    return (passes_s - one_pass_s) / (passes - 1)


LayoutCosts = dict[str, float]


def profile_marginal(runs: Sequence[PipelineSteps], layouts: Sequence[str], draws: int = PROFILE_DRAWS,
                     passes: int = PROFILE_PASSES, policy: str = "jigsaw", grid: str = "default",
                     scale: float = 1.0, steps: Sequence[Mapping[int, Sequence[PipelineSteps]]] | None = None
                     ) -> list[LayoutCosts]:
    """Each profiling draw's marginal pass (:func:`marginal_pass_s` over ``passes`` passes) in every layout of
    ``layouts``, on ``grid`` with every slowdown's excess scaled by ``scale``. The draws are
    :func:`~sim.multiplex.layouts.profile_draws`' (the two-step rule's draws), on every replica count the layouts
    need; ``steps``: those draws simulated already (independent of the grid: simulate once, decide on every grid)."""
    d = runs[0].replicas
    if steps is None:
        steps = profile_draws(runs, sorted(needed_replicas(layouts, d)), draws)
    out = []
    for on in steps:
        costs = {}
        for x in layouts:
            one = run_layout(x, on, d, 1, policy, grid, scale).makespan_s
            costs[x] = marginal_pass_s(one, run_layout(x, on, d, passes, policy, grid, scale).makespan_s, passes)
        out.append(costs)
    return out


def decide(costs: Mapping[int, Sequence[LayoutCosts]], margin: float = ROUTING_MARGIN) -> tuple[int, str]:
    """(rollout TP degree, layout) whose profiled marginal pass, summed over the draws, is shortest (``costs``:
    degree -> :func:`profile_marginal`'s draws; every degree runs the same samples, so seconds compare across
    degrees). ``split``'s is shortened by ``margin`` (a layout sharing workers must beat the static split by it, as
    in :func:`~sim.multiplex.layouts.choose`); ties go to the smaller degree, then the earlier layout."""
    if not costs:
        raise ConfigError("jigsaw run", "profile costs", "none", "the profile of at least one rollout TP degree")
    if len({len(dr) for dr in costs.values()}) != 1:
        raise ConfigError("jigsaw run", "profile costs", f"draws per degree {[len(dr) for dr in costs.values()]}",
                          "the same profiling draws at every degree (sums compare only then)")
    best = None
    for t in sorted(costs):
        draws = costs[t]
        for x in draws[0]:
            v = sum(dr[x] for dr in draws) * ((1.0 - margin) if x == "split" else 1.0)
            if best is None or v < best[0]:
                best = (v, t, x)
    return best[1], best[2]
