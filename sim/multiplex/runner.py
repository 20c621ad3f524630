"""RLSim for JigsawRL: two pipelines on the same DP workers, run step by step under a multiplexing policy.

Design note
-----------
Each pipeline's steps are simulated on the real engine model first (:mod:`sim.multiplex.steps`, :mod:`sim.multiplex.rollout`):
per DP worker, a rollout chain of sub-stages from its step records, then reference and training.
Worker ``i`` hosts replica ``i`` of both pipelines, so its two chains are what the scheduler of
:mod:`compute_sched.multiplex.lookahead` decides over; the runner is the event loop around it:

* every worker runs its current action until the earliest event anywhere (a sub-stage ends, a
  barrier opens, a merge), then re-decides -- the same ``decide`` a deployment would call;
* barriers: a step's reference and training start once every replica's rollout is done, the next
  rollout once training is done everywhere (synchronous GRPO); until a barrier opens, the tasks
  behind it carry the predicted opening time (the slowest replica's remaining work alone);
* merging (§4.3): when two or more replicas of a pipeline are in their last, small-batch sub-stage,
  :func:`~compute_sched.multiplex.ops.merge_gain` decides whether to move them onto one worker
  (recomputing their context there at the prefill MFU); the aggregated tail decodes all of them at
  once, priced by the performance model at the combined batch;
* balancing (§4.3): when a barrier opens, a replica whose worker still carries the other pipeline's
  rollout (its aggregated or its own long tail) or its reference and training gets a smaller share of
  the reference and training work, by how long that work holds the worker and how much it slows the
  share at the pair's best split -- or all of that time, where sharing loses to taking turns or does not
  fit (``co_runner_overlap``, ``overlap_balanced_shares``); only the part that scales with tokens moves,
  each worker keeps the post model's fixed per-step part;
* layout (§4.3's skew at its extreme, and the static split as a fallback): every pipeline on every
  worker (``uniform``), each pipeline's samples on its own half of the workers (``partition``: the
  steps simulated on half the replicas) with reference and training still spread over all of them
  (``halves``), or each pipeline wholly on its own half (``split``, ``own_post``: veRL split's layout);
  :func:`sim.multiplex.layouts.predict_routing` decides once per run from profiling steps;
* a disaggregated layout (``pool``, RollMux's pools under JigsawRL's policy): every pipeline's rollout on
  a rollout pool of workers, where the pipelines' rollouts share the workers (one's long tail beside the
  other's next rollout), every pipeline's reference and training on the rest (:mod:`sim.multiplex.pool_layout`).

Policies: ``jigsaw`` (look-ahead W = 3, merging, balancing), ``jigsaw-greedy`` (W = 1),
``jigsaw-nomerge``, ``muxserve`` (JigsawRL-MuxServe: rollouts share the GPU half and half,
reference and training run alone). Every executed action is audited for memory: the levels held
must fit the budget and every running sub-stage its floor (``memory_violations``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Sequence

from orchestrl.compute_sched.hardware import load_gpu, load_model
from orchestrl.compute_sched.multiplex.catalog import model_for
from orchestrl.compute_sched.multiplex.grid import IDLE, MEM_LEVELS_PCT
from orchestrl.compute_sched.multiplex.lookahead import (MEMORY_BUDGET_PCT, SM_SPLITS, Action, Scheduler, Task,
                                                          WorkerState)
from orchestrl.compute_sched.multiplex.ops import (Tail, co_runner_overlap, merge_gain, migration_cost_s,
                                                   overlap_balanced_shares)
from orchestrl.compute_sched.multiplex.substage import rollout_chain
from orchestrl.compute_sched.perf import PerfModel
from orchestrl.compute_sched.layout import InstanceConfig
from orchestrl.fabric.errors import ConfigError
from orchestrl.sim.multiplex import rollout as _rollout
from orchestrl.sim.multiplex.steps import PipelineSteps, mem_floor_pct, simulate_steps

__all__ = ["POLICIES", "PipelineSteps", "simulate_steps", "GroupResult", "run_group", "mem_floor_pct"]

POLICIES = ("jigsaw", "jigsaw-greedy", "jigsaw-nomerge", "muxserve")
_FAR = 1e9


@dataclass
class GroupResult:
    """What a mux group did: per pipeline step end times, the executed actions, audits."""

    policy: str
    makespan_s: float
    step_end_s: dict[str, list[float]]
    tokens: int
    flops: float
    actions: int = 0
    decisions: int = 0
    decide_s: float = 0.0
    merges: int = 0
    memory_violations: int = 0
    busy: list[tuple[float, float, float]] = field(default_factory=list)  # (t0, t1, useful FLOP/s) per worker action

    @property
    def throughput_tps(self) -> float:
        return self.tokens / self.makespan_s if self.makespan_s > 0 else 0.0

    def latency_s(self, name: str) -> float:
        """Mean step latency of pipeline ``name`` (its step end times' spacing)."""
        ends = self.step_end_s[name]
        return ends[-1] / len(ends) if ends else 0.0


class _Group:
    """The event loop of one group (see the module note); state kept per worker and per pipeline."""

    def __init__(self, runs: Sequence[PipelineSteps], policy: str, grid: str, scale: float, window: int,
                 start_s: Sequence[float] | None = None, partition: Sequence[PipelineSteps] | None = None,
                 routed: Sequence[bool] | None = None, own_post: bool = False,
                 pool: Sequence[PipelineSteps] | None = None) -> None:
        if policy not in POLICIES:
            raise ConfigError("jigsaw run", "policy", f"{policy!r}", ", ".join(POLICIES))
        self.runs, self.policy = list(runs), policy
        self.names = [r.spec.name for r in runs]
        self.d = runs[0].replicas
        gpu = runs[0].gpu
        # each pipeline's own grid, of its model and TP degree: a modelled grid's compute shares are the model's and
        # its memory axis is the KV pool or micro-batch left beside each GPU's share of the weights (a measured grid
        # has one memory axis for every model and degree)
        self.models = tuple(model_for(gpu, r.spec.model, grid, scale, tp=r.spec.tp) for r in runs)
        self.sch = Scheduler(self.models, window=1 if policy == "jigsaw-greedy" else window)
        self.merge = policy in ("jigsaw", "jigsaw-greedy")
        self.balance = policy != "muxserve"
        # steps whose post work is confined to workers that never carry the other pipeline's rollout (split: each
        # pipeline's own half; pool: the training pool): balancing has nothing to move there
        self.split_steps = {k for k in range(max(r.steps for r in runs))
                            if pool is not None or (partition is not None and own_post and (routed is None or routed[k]))}
        self.gpu = gpu
        self.perf = [PerfModel(load_model(r.spec.model), load_gpu(gpu)) for r in runs]
        # chains[w][p]: tasks of pipeline p on worker w, all steps; gates[(p, k, stage)] -> open time or None
        self.chains: list[list[list[Task]]] = [[[] for _ in runs] for _ in range(self.d)]
        self.bounds: dict[tuple[int, int], tuple[int, int, int]] = {}  # (p, k) -> rollout start, post start, end index
        self.tail_info: dict[tuple[int, int, int], tuple] = {}  # (p, k, replica) -> (seqs, ctx, tail s, samples)
        half = self.d // 2
        npool = pool[0].replicas if pool is not None else 0
        for p, r in enumerate(runs):
            for w in range(self.d):
                for k in range(r.steps):
                    part = partition is not None and (routed is None or routed[k])
                    if pool is not None:  # both pipelines' samples on the rollout pool, workers [0, npool)
                        tr = pool[p].traces[k][w] if w < npool else None
                        per_rep = r.spec.samples // npool
                    elif part:  # routed: pipeline p's samples go to its half of the workers only
                        mine = p * half <= w < (p + 1) * half
                        tr = partition[p].traces[k][w - p * half] if mine else None
                        per_rep = r.spec.samples // half
                    else:
                        tr, per_rep = r.traces[k][w], r.spec.samples // self.d
                    start = len(self.chains[w][p])
                    gate = (float(start_s[p]) if start_s else 0.0) if k == 0 else _FAR
                    if tr is None:  # no samples here this step: an empty rollout (a marker the barrier opens)
                        self.chains[w][p].append(Task(IDLE, 1e-6, 0.0, None, gate, f"roll:{k}"))
                        self.tail_info[(p, k, w)] = (0, 0.0, 0.0, 0)
                    else:
                        floor = mem_floor_pct("decode_large", r.spec, gpu, self.d, tr.peak_seqs, tr.peak_kv_tokens)
                        roll = rollout_chain(r.spec.name, w, tr.segments, floor, min_s=0.05)
                        for i, s in enumerate(roll):
                            self.chains[w][p].append(Task(s.kind, s.work_s, s.mem_min_pct, f"{p}:{k}",
                                                          gate if i == 0 else 0.0, f"roll:{k}"))
                        # the long tail: what is left after 80% of the samples finished (RollMux's threshold)
                        self.tail_info[(p, k, w)] = (tr.tail_seqs, tr.tail_ctx_tokens,
                                                     max(0.0, tr.end_s - tr.at80_s), len(tr.records) and per_rep)
                    post_i = len(self.chains[w][p])
                    if pool is not None and w < npool:  # the rollout pool neither trains nor holds training state
                        self.chains[w][p].append(Task(IDLE, 1e-6, 0.0, None, _FAR, f"ref:{k}"))
                        self.chains[w][p].append(Task(IDLE, 1e-6, 0.0, None, 0.0, f"train:{k}"))
                    elif pool is not None:  # the training pool: the step's tokens spread over its workers
                        ref_s, train_s = _rollout.post_times(r.spec, r.tokens[k] / (self.d - npool), gpu)
                        group = self.d - npool
                        self.chains[w][p].append(Task("reference", ref_s, mem_floor_pct("reference", r.spec, gpu, group),
                                                      None, _FAR, f"ref:{k}"))
                        self.chains[w][p].append(Task("train", train_s, mem_floor_pct("train", r.spec, gpu, group),
                                                      None, 0.0, f"train:{k}"))
                    elif part and own_post and not mine:  # split: this pipeline neither trains nor holds state here
                        self.chains[w][p].append(Task(IDLE, 1e-6, 0.0, None, _FAR, f"ref:{k}"))
                        self.chains[w][p].append(Task(IDLE, 1e-6, 0.0, None, 0.0, f"train:{k}"))
                    else:
                        group = half if part and own_post else self.d  # the workers its FSDP state is sharded over
                        ref_s, train_s = partition[p].post[k][w - p * half] if part and own_post else r.post[k][w]
                        self.chains[w][p].append(Task("reference", ref_s,
                                                      mem_floor_pct("reference", r.spec, gpu, group),
                                                      None, _FAR, f"ref:{k}"))
                        self.chains[w][p].append(Task("train", train_s, mem_floor_pct("train", r.spec, gpu, group),
                                                      None, 0.0, f"train:{k}"))
                    self.bounds[(p, k, w)] = (start, post_i, len(self.chains[w][p]))
        self.states = [WorkerState.start([tuple(c) for c in self.chains[w]]) for w in range(self.d)]
        self.opened: set[tuple[int, int, str]] = {(p, 0, "roll") for p in range(len(runs))}
        self.merged: set[tuple[int, int]] = set()
        self.eta: dict[tuple[int, int, int], float] = {}
        self.result = GroupResult(policy, 0.0, {n: [] for n in self.names}, sum(sum(r.tokens) for r in runs),
                                  sum(r.useful_flops(k) for r in runs for k in range(r.steps)))

    # -- chain surgery ------------------------------------------------------------------------------
    def _set_task(self, w: int, p: int, i: int, task: Task) -> None:
        st = self.states[w]
        chains = list(st.chains)
        c = list(chains[p])
        c[i] = task
        chains[p] = tuple(c)
        rem = list(st.rem)
        if st.idx[p] == i:
            done = st.chains[p][i].work_s - st.rem[p]
            rem[p] = max(0.0, task.work_s - done) if task.work_s > done else 0.0
            if rem[p] <= 0.0:
                rem[p] = 1e-12
        self.states[w] = WorkerState(tuple(chains), st.t, st.idx, tuple(rem), st.held, st.finish)

    def _progress(self, p: int, k: int, w: int) -> str:
        """Where replica ``w`` of pipeline ``p`` is in step ``k``: before, rollout, post, done."""
        start, post_i, end = self.bounds[(p, k, w)]
        i = self.states[w].idx[p]
        return "before" if i < start else "rollout" if i < post_i else "post" if i < end else "done"

    def _predict_gates(self, now: float) -> None:
        """Predict when each closed barrier opens: the slowest replica's work left alone, step after step."""
        self.eta = {}
        for p, r in enumerate(self.runs):
            t = now
            for k in range(r.steps):
                if (p, k, "roll") not in self.opened:
                    t += max(self._remaining(p, k - 1, w, 1, 2) for w in range(self.d))
                    self.eta[(p, k, 0)] = t
                if (p, k, "post") not in self.opened:
                    t = max(t, now) + max(self._remaining(p, k, w, 0, 1) for w in range(self.d))
                    self.eta[(p, k, 1)] = t

    def _predicted(self, w: int, now: float) -> WorkerState:
        """Worker ``w``'s state as the scheduler plans on it: closed barriers at their predicted opening
        (never before ``now`` plus a millisecond, so a closed barrier is never seen as open)."""
        st = self.states[w]
        chains = [list(c) for c in st.chains]
        for (p, k, which), eta in self.eta.items():
            i = self.bounds[(p, k, w)][which]
            if i >= st.idx[p]:
                chains[p][i] = replace(chains[p][i], ready_s=max(eta, now + 1e-3))
        return WorkerState(tuple(tuple(c) for c in chains), st.t, st.idx, st.rem, st.held, st.finish)

    def _remaining(self, p: int, k: int, w: int, lo: int, hi: int) -> float:
        """Alone work left in ``bounds[lo]:bounds[hi]`` of step ``k`` on worker ``w`` (0: rollout, 1: post)."""
        b = self.bounds[(p, k, w)]
        start, stop = b[lo], b[hi]
        st = self.states[w]
        i = st.idx[p]
        if i >= stop:
            return 0.0
        total = st.rem[p] if i >= start else 0.0
        for j in range(max(i + 1, start), stop):
            total += st.chains[p][j].work_s
        return total

    def _open_gates(self, now: float) -> bool:
        changed = False
        for p, r in enumerate(self.runs):
            for k in range(r.steps):
                if (p, k, "post") not in self.opened and (p, k, "roll") in self.opened and \
                        all(self._progress(p, k, w) in ("post", "done") for w in range(self.d)):
                    self.opened.add((p, k, "post"))
                    self._balance(p, k)
                    for w in range(self.d):
                        i = self.bounds[(p, k, w)][1]
                        self._set_task(w, p, i, replace(self.states[w].chains[p][i], ready_s=now))
                    changed = True
                if (p, k, "post") in self.opened and k + 1 < r.steps and (p, k + 1, "roll") not in self.opened and \
                        all(self._progress(p, k, w) == "done" for w in range(self.d)):
                    self.opened.add((p, k + 1, "roll"))
                    self.result.step_end_s[self.names[p]].append(now)
                    for w in range(self.d):
                        i = self.bounds[(p, k + 1, w)][0]
                        self._set_task(w, p, i, replace(self.states[w].chains[p][i], ready_s=now))
                    changed = True
                if k + 1 == r.steps and len(self.result.step_end_s[self.names[p]]) == k and \
                        all(self._progress(p, k, w) == "done" for w in range(self.d)):
                    self.result.step_end_s[self.names[p]].append(now)
        return changed

    def _balance(self, p: int, k: int) -> None:
        """§4.3: workers that carry the other pipeline's work get less of this post stage's work.

        The other pipeline's work on a worker is its rollout (the sub-stage it is in, for as long as its rollout has
        work left there) or its own reference and training. A worker's share runs beside it at the SM and memory
        split that serves the pair best (a rollout keeps the KV pool it holds; training gets the rest), or after it
        where even that split is slower than taking turns or does not fit (:func:`co_runner_overlap`); the shares
        equalise the finish times (:func:`overlap_balanced_shares`). The paper states the rule for the worker
        carrying an aggregated (merged) tail, ``T(bs_t)/T(bs_i) = 1/s``; an unmerged long tail, or the other
        pipeline's training, occupies the worker the same way, so they count too (work about to end costs almost
        nothing).
        """
        if not self.balance or self.d < 2 or len(self.runs) < 2 or k in self.split_steps:
            return
        o = 1 - p
        slow, overlap = [], []
        for w in range(self.d):
            ko = self._cur_step(o, w)
            head = self.states[w].head(o)
            where = self._progress(o, ko, w)
            if head is None or head.kind == IDLE or where not in ("rollout", "post"):
                slow.append(1.0)
                overlap.append(0.0)
                continue
            held = self.states[w].held[o]
            sw, so = self._beside(p, head.kind, (MEMORY_BUDGET_PCT - held,) if where == "rollout" and held > 0
                                  else MEM_LEVELS_PCT)
            s, ov = co_runner_overlap(sw, so, self._remaining(o, ko, w, *((0, 1) if where == "rollout" else (1, 2))))
            slow.append(s)
            overlap.append(ov)
        if all(x <= 1.0 for x in slow):
            return
        # each worker keeps its fixed part (paid by every worker of the pipeline's group whatever its share);
        # what scales with tokens is moved, the reference's and the training's in the same shares
        idx = [[self.bounds[(p, k, w)][1] + off for w in range(self.d)] for off in range(2)]  # reference, training
        fixed = [[min(self.runs[p].post_fixed_s[off], self.states[w].chains[p][i].work_s) for w, i in enumerate(ix)]
                 for off, ix in enumerate(idx)]
        var = [sum(self.states[w].chains[p][i].work_s for w, i in enumerate(ix)) - sum(f)
               for ix, f in zip(idx, fixed)]
        shares = overlap_balanced_shares(sum(var), slow, overlap, [fixed[0][w] + fixed[1][w] for w in range(self.d)])
        for ix, f, v in zip(idx, fixed, var):
            for w, i in enumerate(ix):
                self._set_task(w, p, i, replace(self.states[w].chains[p][i], work_s=f[w] + v * shares[w]))

    def _beside(self, p: int, kind: str, mems: Sequence[float]) -> tuple[float, float]:
        """Slowdowns (pipeline ``p``'s training, the other pipeline's ``kind`` beside it) at the split that serves
        the pair best: the SM shares the scheduler offers, the training's memory one of ``mems`` (the co-runner
        gets the rest); each priced by its own pipeline's model."""
        best = None
        for sg in SM_SPLITS:
            for m in mems:
                mine, theirs = (max(1.0, x) for x in self.models[p].pair("train", kind, sg, m, other=self.models[1 - p]))
                if best is None or 1.0 / mine + 1.0 / theirs > 1.0 / best[0] + 1.0 / best[1]:
                    best = (mine, theirs)
        return best

    def _cur_step(self, p: int, w: int) -> int:
        for k in range(self.runs[p].steps):
            if self._progress(p, k, w) != "done":
                return k
        return self.runs[p].steps - 1

    def _try_merge(self, now: float) -> bool:
        if not self.merge:
            return False
        changed = False
        for p, r in enumerate(self.runs):
            k = min(self._cur_step(p, w) for w in range(self.d))
            if (p, k) in self.merged or (p, k, "roll") not in self.opened:
                continue
            prog = [self._progress(p, k, w) for w in range(self.d)]
            tails = []
            for w in range(self.d):
                if prog[w] != "rollout":
                    continue
                st = self.states[w]
                i = st.idx[p]
                if i != self.bounds[(p, k, w)][1] - 1 or st.chains[p][i].kind != "decode_small":
                    tails = None
                    break
                o = 1 - p if len(self.runs) == 2 else None
                oh = st.head(o) if o is not None else None
                ok = oh.kind if oh is not None and oh.ready_s <= now + 1e-9 else None
                seqs, ctx, tail_s, samples = self.tail_info[(p, k, w)]
                if st.rem[p] > tail_s + 1e-9:  # not yet in its long tail (over 20% of its samples still decode)
                    tails = None
                    break
                left = max(1, math.ceil(0.2 * samples * st.rem[p] / max(tail_s, 1e-9)))
                per_seq = ctx / max(seqs, 1)
                s_t, s_o = (self.models[p].pair("decode_small", ok, 0.25, other=self.models[o])
                            if ok and ok != IDLE else (1.0, 1.0))
                tails.append(Tail(w, st.rem[p], per_seq * left, left, ok,
                                  st.rem[o] if oh is not None and ok else 0.0, s_t, s_o))
            if not tails or len(tails) < 2 or any(x not in ("rollout", "post", "done") for x in prog):
                continue
            target = max(tails, key=lambda t: t.work_s)
            perf = self.perf[p]
            cfg = InstanceConfig("tp", tp=r.spec.tp)
            seqs = sum(t.sequences for t in tails)
            ctx = sum(t.context_tokens for t in tails)
            # the aggregated tail must fit the KV pool the target sized when its rollout began (§4.2: pools
            # are not resized mid-step); a merge that would not fit is not made
            held = self.states[target.replica].held[p]
            if mem_floor_pct("decode_large", r.spec, self.gpu, self.d, seqs, ctx) > held + 1e-9:
                continue
            own = perf.decode_step_s(cfg, target.sequences, target.context_tokens)
            agg = perf.decode_step_s(cfg, seqs, ctx)
            aggregated = target.work_s * agg / own
            mig = lambda t: migration_cost_s(perf.model, t.context_tokens, r.spec.tp, perf.gpu.bf16_flops)  # noqa: E731
            dec = merge_gain(tails, target.replica, aggregated, mig,
                             lambda k2, x: self.models[1 - p if len(self.runs) == 2 else p].s(k2, "decode_small", 0.75, 60))
            if dec.delta_s <= 0:
                continue
            self.merged.add((p, k))
            self.result.merges += 1
            for t in tails:
                i = self.states[t.replica].idx[p]
                task = self.states[t.replica].chains[p][i]
                if t.replica == target.replica:
                    self._set_task(t.replica, p, i, replace(task, work_s=task.work_s - t.work_s + aggregated
                                                            + dec.migration_s))
                else:
                    self._set_task(t.replica, p, i, replace(task, work_s=task.work_s - t.work_s + 1e-9))
            changed = True
        return changed

    # -- policies and the loop --------------------------------------------------------------------
    def _decide(self, w: int, now: float) -> Action | None:
        st = self._predicted(w, now)
        if self.policy == "muxserve":
            return self._muxserve(st)
        self.sch._memo.clear()
        return self.sch.decide(st)

    def _muxserve(self, st: WorkerState) -> Action | None:
        n = len(st.chains)
        ready = [c for c in range(n) if st.head(c) is not None and st.head(c).ready_s <= st.t + 1e-9]
        roll = [c for c in ready if st.head(c).sticky is not None]
        post = [c for c in ready if st.head(c).sticky is None]
        held = [st.held[c] for c in range(n)]
        if post:  # training and reference run alone (their memory); a waiting rollout keeps its pool
            c = post[0]
            others = sum(held[o] for o in range(n) if o != c)
            lvl = max([x for x in MEM_LEVELS_PCT if x <= MEMORY_BUDGET_PCT - others] or [0])
            if lvl + 1e-9 < st.head(c).mem_min_pct and lvl < MEM_LEVELS_PCT[-1]:
                if not roll:
                    return None
            else:
                return Action(tuple(k == c for k in range(n)), 1.0, tuple(lvl if k == c else held[k] for k in range(n)))
        # MuxServe shares the GPU half and half between two rollouts when both fit in half of it
        if len(roll) == 2 and all(st.head(c).mem_min_pct <= 50.0 and held[c] in (0.0, 50.0) for c in roll):
            return Action((True, True), 0.5, (50.0, 50.0))
        for c in roll:  # otherwise one rollout at a time, in the memory it holds (or all that is left)
            others = sum(held[o] for o in range(n) if o != c)
            lvl = held[c] or max([x for x in (50.0, *MEM_LEVELS_PCT) if x <= MEMORY_BUDGET_PCT - others] or [0.0])
            if lvl + 1e-9 >= st.head(c).mem_min_pct or lvl >= MEM_LEVELS_PCT[-1]:
                return Action(tuple(k == c for k in range(n)), 1.0, tuple(lvl if k == c else held[k] for k in range(n)))
        return None

    def _audit(self, st: WorkerState, a: Action) -> None:
        total = 0.0
        for c in range(len(st.chains)):
            head = st.head(c)
            lvl = a.mem[c] if c < len(a.mem) else 0.0
            if a.run[c]:
                floor = head.mem_min_pct if head.kind != IDLE else 0.0
                if lvl + 1e-9 < floor and floor < MEM_LEVELS_PCT[-1]:
                    self.result.memory_violations += 1
                total += lvl
            else:
                total += st.held[c]
        if total > MEMORY_BUDGET_PCT + 1e-6:
            self.result.memory_violations += 1

    def run(self) -> GroupResult:
        import time
        now = 0.0
        actions: list[Action | None] = [None] * self.d
        guard = 0
        while not all(s.done for s in self.states):
            guard += 1
            if guard > 200_000:
                raise RuntimeError("jigsaw group simulation does not terminate")  # a bug, never an input
            self._predict_gates(now)
            ends = []
            for w in range(self.d):
                st = self.states[w]
                if st.done:
                    ends.append(math.inf)
                    continue
                if actions[w] is None:
                    t0 = time.perf_counter()
                    actions[w] = self._decide(w, now)
                    self.result.decide_s += time.perf_counter() - t0
                    self.result.decisions += 1
                if actions[w] is None:  # nothing can run: wait for a barrier (an event elsewhere) or a ready time
                    wait = min(st.head(c).ready_s for c in range(len(st.chains)) if st.head(c) is not None)
                    ends.append(wait if wait < _FAR / 2 else math.inf)
                    continue
                nst, _ = self.sch.apply(st, actions[w])
                ends.append(nst.t)
            t_next = min(ends)
            if not math.isfinite(t_next):
                raise RuntimeError("jigsaw group simulation is stuck")  # a bug, never an input
            for w in range(self.d):
                st = self.states[w]
                if st.done:
                    continue
                a = actions[w]
                if a is None:
                    self.states[w] = WorkerState(st.chains, t_next, st.idx, st.rem, st.held, st.finish)
                    continue
                self._audit(st, a)
                nst, step = self.sch.apply(st, a, until=t_next)
                self.result.actions += 1
                self.states[w] = nst
                if nst.idx != st.idx or ends[w] <= t_next + 1e-12:
                    actions[w] = None
            now = t_next
            changed = self._open_gates(now)
            changed = self._try_merge(now) or changed
            if changed:
                actions = [None] * self.d
        self.result.makespan_s = now
        return self.result


def run_group(runs: Sequence[PipelineSteps], policy: str = "jigsaw", grid: str = "default", scale: float = 1.0,
              window: int = 3, start_s: Sequence[float] | None = None,
              partition: Sequence[PipelineSteps] | None = None,
              routed: Sequence[bool] | str | None = None, own_post: bool = False,
              pool: Sequence[PipelineSteps] | None = None) -> GroupResult:
    """Run the pipelines of ``runs`` (same DP workers) under ``policy`` to the end of their steps.

    ``start_s`` delays each pipeline's first rollout (a phase shift between the pipelines, so one's
    rollout can meet the other's training; docs/jigsaw.md gives what it measured). Default: all at 0.
    ``partition`` (the same pipelines' steps simulated on half the workers) routes pipeline ``p``'s
    samples to workers ``[p * d/2, (p + 1) * d/2)`` on the steps where ``routed[k]`` is true (every step
    when ``routed`` is None); reference and training still spread over every worker, or with ``own_post``
    stay on the pipeline's half too (its training state sharded over that half, the halves' own reference
    and training times). :func:`sim.multiplex.layouts.run_auto` chooses the layout for the whole run first.
    ``pool`` (the same pipelines' steps simulated on ``k`` replicas, ``1 <= k < d``) disaggregates instead: every
    pipeline's samples go to the rollout pool, workers ``[0, k)``, where the pipelines' rollouts share the workers
    under the policy; every pipeline's reference and training run on the other ``d - k`` workers, its training
    state sharded over them (:mod:`sim.multiplex.pool_layout`).
    """
    if len({r.replicas for r in runs}) != 1 or len({r.gpu for r in runs}) != 1:
        raise ConfigError("jigsaw run", "pipelines", "pipelines of one group must share workers and GPU type",
                          "the same replica count and GPU")
    if start_s is not None and (len(start_s) != len(runs) or any(not (x >= 0) for x in start_s)):
        raise ConfigError("jigsaw run", "start_s", f"{list(start_s)!r}", "one start time >= 0 per pipeline")
    if pool is not None:
        if partition is not None or routed is not None or own_post:
            raise ConfigError("jigsaw run", "pool", "a rollout pool together with a partition by halves",
                              "one layout: pool (sim/multiplex/pool_layout.py) or partition (layouts.routing_args)")
        k = pool[0].replicas if pool else 0
        if len(pool) != len(runs) or any(x.spec.name != r.spec.name or x.replicas != k or x.steps < r.steps
                                          or x.tokens[:r.steps] != r.tokens for x, r in zip(pool, runs)) \
                or not 1 <= k < runs[0].replicas:
            raise ConfigError("jigsaw run", "pool", f"steps on {k} replica(s) for a group of {runs[0].replicas} workers",
                              "every pipeline's same steps simulated on one pool size from 1 to the workers less one "
                              "(the rest train), in the pipelines' order")
    if partition is not None:
        if len(runs) != 2 or len(partition) != 2 or runs[0].replicas % 2 or \
                any(h.replicas * 2 != r.replicas or h.steps < r.steps for h, r in zip(partition, runs)):
            raise ConfigError("jigsaw run", "partition", "routing by halves needs two pipelines on an even number of "
                              "workers", "each pipeline's steps simulated on half the replicas, as many steps")
        steps = max(r.steps for r in runs)
        if routed is not None and (isinstance(routed, str) or len(routed) < steps
                                   or any(not isinstance(x, bool) for x in routed)):
            raise ConfigError("jigsaw run", "routed", f"{routed!r}",
                              f"true/false for each of the {steps} steps (true: by halves); layouts.run_auto decides it")
    elif routed is not None or own_post:
        raise ConfigError("jigsaw run", "routed" if routed is not None else "own_post",
                          f"{routed!r}" if routed is not None else "True",
                          "a partition (the steps on half the workers) too")
    return _Group(runs, policy, grid, scale, window, start_s, partition, routed, own_post, pool).run()
