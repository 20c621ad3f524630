"""The Training stage of RLSim: one RL iteration's optimizer step(s) of a Megatron job, on the fabric.

Design note
-----------
A step is compute from FLOPs at the calibrated efficiency (:mod:`sim.train.mfu`), the per-layer
TP/CP/EP collectives and the PP transfers of each micro-batch, a 1F1B pipeline
(:func:`sim.train.schedule.one_f_one_b`), then the gradient reduce-scatter, the optimizer and the
parameter all-gather over the DP groups. Every collective is built from the job's Megatron-core
groups (:func:`fabric.layout.parallel_groups`) and timed on the :class:`sim.network.NetworkSim`
with *all* groups of its kind running at once, so oversubscribed uplinks or missing circuits show
up as they would. What overlaps is stated in :mod:`sim.train.step`.

RL specifics: the samples of the iteration are packed into micro-batches of ``microbatch_tokens``
(at least the longest sample), balanced over the DP ranks; attention FLOPs follow the real length
distribution. The stage ends when the updated weights are all-gathered (what weight sync reads), so
the all-gather is on the critical path here, unlike in pre-training.

RFabric: each step enters its fwd-bwd period (intent ``train``) and its grad-sync period (intent
``train-dp``) through :func:`sim.train.periods.enter_period` -- the real controller and the job's
safe-window gate -- and reports the job's collective boundaries to the gate as they happen in
the schedule. Per-layer collectives are timed on the circuits in force when the period starts;
DP traffic on the circuit timeline from its start.

Caching: collective timings are memoised per (kind, fabric state); a warm iteration on an
unchanged fabric re-times nothing and rebuilds only the schedule of a new micro-batch count.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, NoReturn, Sequence

import numpy as np

from orchestrl.compute_sched.hardware import GpuSpec, ModelSpec
from orchestrl.fabric.errors import ConfigError
from orchestrl.fabric.intent import Collective, Intent
from orchestrl.fabric.layout import ParallelLayout, parallel_groups
from orchestrl.sim.network.collectives import collective_flows, intent_flows
from orchestrl.sim.network.config import GPUS_PER_SERVER
from orchestrl.sim.network.netsim import NetworkSim
from orchestrl.sim.network.reconfig import RFabricDriver
from orchestrl.sim.stages.base import StageResult, UnservedTraffic
from orchestrl.sim.train.flops import ArchSpec
from orchestrl.sim.train.mfu import MfuParams, default_params, efficiency
from orchestrl.sim.train.periods import busy_intervals, enter_period, feed_events
from orchestrl.sim.train.schedule import one_f_one_b
from orchestrl.sim.train.step import (OPTIMIZER_BYTES_PER_PARAM, LayerComm, TrainLayout, grad_traffic, microbatch_times,
                            microbatch_traffic)

__all__ = ["TrainBatch", "TrainingOptions", "TrainingStage", "UnservedTraffic"]

RECONFIGURE = ("adaptive", "per-period")


@dataclass(frozen=True)
class TrainBatch:
    """What an RL iteration trains on: its samples' lengths (prompt + response tokens)."""

    seq_lens: tuple[int, ...]

    def __post_init__(self) -> None:
        lens = tuple(int(x) for x in self.seq_lens)
        if not lens or min(lens) < 1:
            raise ConfigError("TrainBatch", "seq_lens", "needs at least one sample of >= 1 token", "positive lengths")
        object.__setattr__(self, "seq_lens", lens)

    @classmethod
    def uniform(cls, samples: int, seq_len: int) -> "TrainBatch":
        return cls((int(seq_len),) * int(samples))

    @property
    def samples(self) -> int:
        return len(self.seq_lens)

    @property
    def tokens(self) -> int:
        return int(sum(self.seq_lens))

    @property
    def max_len(self) -> int:
        return max(self.seq_lens)


@dataclass(frozen=True)
class TrainingOptions:
    """How the job trains; every field has the default the experiments use."""

    microbatch_tokens: int = 8192  # tokens packed per micro-batch per pipeline (raised to the longest sample)
    optimizer_steps: int = 1  # mini-batches per RL iteration, each ending in a DP sync
    recompute: bool = False  # full activation recomputation
    expert_imbalance: float = 1.0  # busiest expert rank's load / mean (the calibration data is balanced)
    reconfigure: str = "adaptive"  # RFabric: "adaptive" (the gate decides) | "per-period" (Appendix I)

    def __post_init__(self) -> None:
        src = "TrainingOptions"
        if not isinstance(self.microbatch_tokens, int) or self.microbatch_tokens < 1:
            raise ConfigError(src, "microbatch_tokens", f"expected a positive integer, got {self.microbatch_tokens!r}")
        if not isinstance(self.optimizer_steps, int) or self.optimizer_steps < 1:
            raise ConfigError(src, "optimizer_steps", f"expected a positive integer, got {self.optimizer_steps!r}")
        if not self.expert_imbalance >= 1.0:
            raise ConfigError(src, "expert_imbalance", f"expected >= 1, got {self.expert_imbalance!r}", ">= 1")
        if self.reconfigure not in RECONFIGURE:
            raise ConfigError(src, "reconfigure", f"unknown mode {self.reconfigure!r}", ", ".join(RECONFIGURE))


def _groups(groups: dict, kind: str) -> tuple[tuple[int, ...], ...]:
    return tuple(tuple(g) for g in groups[kind])


class TrainingStage:
    """Simulate the training stage of RL iterations of one Megatron job on the network simulator.

    Parameters
    ----------
    model : ModelSpec
        A Table 3 model (``compute_sched.hardware.load_model``).
    layout : ParallelLayout
        Megatron parallel sizes and rank order; ``world_size`` must equal ``len(gpus)``.
    gpus : sequence of int
        ``gpus[r]`` is the global GPU job rank ``r`` runs on.
    gpu : GpuSpec
        The accelerator (peak bf16 FLOP/s, HBM bandwidth).
    net : NetworkSim
        The fabric. With ``driver`` (RFabric), build it with ``circuits="fixed"``.
    driver : RFabricDriver, optional
        RFabric's controller, gate and circuit timeline; the stage announces its intents to it.
    job : str
    options : TrainingOptions, optional
    mfu : MfuParams, optional
        Efficiency model (default: the calibration on the bundled published points).

    Raises
    ------
    ConfigError
        If the layout does not fit the GPUs or the model (experts over EP, layers over PP, heads
        over TP), naming the field.

    Examples
    --------
    >>> from orchestrl.compute_sched.hardware import load_model, load_gpu
    >>> stage = TrainingStage(load_model("Qwen2.5-14B"), ParallelLayout(tp=8, pp=2, dp=2), range(32),
    ...                       load_gpu("H800"), NetworkSim("ft", gpus=32))
    >>> r = stage.run(TrainBatch.uniform(64, 4096))
    >>> r.stage, r.tokens, 0.2 < r.detail["mfu"] < 0.5
    ('train', 262144.0, True)
    """

    def __init__(self, model: ModelSpec, layout: ParallelLayout, gpus: Sequence[int], gpu: GpuSpec, net: NetworkSim,
                 driver: RFabricDriver | None = None, *, job: str = "train", options: TrainingOptions | None = None,
                 mfu: MfuParams | None = None) -> None:
        self.model, self.layout, self.gpu, self.net, self.driver, self.job = model, layout, gpu, net, driver, job
        self.options = options or TrainingOptions()
        self.gpus = tuple(int(g) for g in gpus)
        self._validate()
        self.arch = ArchSpec.from_model(model)
        self.lay = TrainLayout.from_parallel(layout)
        self.params = mfu or default_params()
        self.eff = efficiency(self.arch, self.lay.tp, self.lay.etp, self.params)
        self.groups = parallel_groups(layout, self.gpus)
        self._crosses = {k: any(len({g // GPUS_PER_SERVER for g in grp}) > 1 for grp in v)
                         for k, v in self.groups.items()}
        self._memo: dict[tuple, object] = {}
        self._schedules: dict[tuple, object] = {}
        self._intent_memo: dict[object, Intent | None] = {}  # period intents, one object per distinct period
        self._last_end_s = float("-inf")  # RFabric: the gate needs events in time order

    # ------------------------------------------------------------------ validation
    def _validate(self) -> None:
        lay, m, src = self.layout, self.model, "TrainingStage"
        if lay.world_size != len(self.gpus) or len(set(self.gpus)) != len(self.gpus):
            raise ConfigError(src, "gpus", f"{len(self.gpus)} GPUs (distinct: {len(set(self.gpus))}) for a layout of "
                              f"world size {lay.world_size}", "one distinct GPU per rank")
        if max(self.gpus) >= self.net.fabric.gpus:
            raise ConfigError(src, "gpus", f"GPU {max(self.gpus)} is outside the {self.net.fabric.gpus}-GPU fabric",
                              f"GPUs 0..{self.net.fabric.gpus - 1}")
        if m.query_heads % lay.tp or (m.kv_heads % lay.tp and lay.tp % m.kv_heads):
            raise ConfigError(src, "layout.tp", f"tp={lay.tp} does not split {m.query_heads} query / {m.kv_heads} KV "
                              f"heads of {m.name}", "a divisor of the head counts")
        if m.layers < lay.pp:
            raise ConfigError(src, "layout.pp", f"pp={lay.pp} exceeds the {m.layers} layers of {m.name}", f"<= {m.layers}")
        if m.is_moe and m.experts % lay.ep:
            raise ConfigError(src, "layout.ep", f"ep={lay.ep} does not divide the {m.experts} experts of {m.name}",
                              f"a divisor of {m.experts}")
        if not m.is_moe and lay.ep > 1:
            raise ConfigError(src, "layout.ep", f"{m.name} is dense; ep={lay.ep} has no experts to split", "1")

    # ------------------------------------------------------------------ fabric state and timing
    def _timeline(self, t_s: float | None) -> tuple:
        """The circuit states in force from ``t_s`` on (RFabric with a driver), times relative to ``t_s``."""
        if self.driver is None or t_s is None:
            return ()
        return tuple((t - t_s, s) for t, s in self.driver.timeline(since_s=t_s))

    def _time(self, c: Collective, tl: tuple) -> float:
        if not tl:
            return self.net.time_collective(c).time_s
        return self.net.time_collective(c, timeline=list(tl)).time_s

    def _layer_collectives(self) -> dict[str, Collective]:
        """One micro-batch's per-layer collectives, by the :class:`LayerComm` field each one times."""
        lay, arch, g = self.lay, self.arch, self.groups
        tr = microbatch_traffic(arch, lay, self._mb_tokens)
        out = {}
        if arch.is_moe and lay.ep > 1:
            out["ep_a2a_s"] = Collective("all-to-all", _groups(g, "ep"), tr.ep_bytes)
        if lay.cp > 1:  # one ring pass over the CP group is an all-gather of cp chunks (cp - 1 steps)
            out["cp_step_s"] = Collective("all-gather", _groups(g, "cp"), lay.cp * tr.cp_chunk_bytes)
        if lay.tp > 1:
            out["tp_layer_s"] = Collective("all-gather", _groups(g, "tp"), tr.tp_bytes)
            out["tp_layer_s/rs"] = Collective("reduce-scatter", _groups(g, "tp"), tr.tp_bytes)
        if lay.pp > 1:
            out["pp_p2p_s"] = Collective("p2p", _groups(g, "pp"), tr.pp_bytes)
        return out

    def _layer_comm(self, tl: tuple) -> LayerComm:
        """Per-micro-batch collective times on the circuits of ``tl``'s first state (memoised per state).

        A time is ``inf`` where some flow has no path on those circuits (:meth:`run` then raises
        :class:`UnservedTraffic`; a what-if cost uses the ``inf``).
        """
        tl = tl[:1]
        key = ("layer", self._mb_tokens, tuple(s.signature for _, s in tl))
        if key in self._memo:
            return self._memo[key]
        t = {k: self._time(c, tl) for k, c in self._layer_collectives().items()}
        out = LayerComm(ep_a2a_s=t.get("ep_a2a_s", 0.0),
                        cp_step_s=t["cp_step_s"] / (self.lay.cp - 1) if "cp_step_s" in t else 0.0,
                        tp_layer_s=2 * (t["tp_layer_s"] + t["tp_layer_s/rs"]) if "tp_layer_s" in t else 0.0,
                        pp_p2p_s=t.get("pp_p2p_s", 0.0))
        self._memo[key] = out
        return out

    def _unserved(self, period: str, colls: Iterable[Collective], tl: tuple, at_s: float, entry: dict) -> NoReturn:
        """Raise :class:`UnservedTraffic` naming the collectives of ``colls`` with flows stuck on ``tl``.

        Called only for the fabric state a step will run on, never inside a what-if cost (where
        ``inf`` correctly says "these circuits do not carry the period").
        """
        topo = getattr(self.net.fabric, "topology", None)
        kinds: list[str] = []
        pairs: list[str] = []
        for c in colls:
            flows = collective_flows(c, topo)
            res = self.net.time_flows(flows, list(tl) if tl else None)
            if not res.unfinished.any():
                continue
            kinds.append(f"{c.primitive} over {len(c.groups)} groups")
            stuck = sorted({(int(x), int(y)) for x, y in zip(flows.src[res.unfinished], flows.dst[res.unfinished])})
            for x, y in stuck[:3]:
                where = f" ({topo.tor_of_gpu(x)} -> {topo.tor_of_gpu(y)})" if topo is not None else ""
                pairs.append(f"GPU {x} -> {y}{where}")
            if len(stuck) > 3:
                pairs.append(f"{len(stuck)} GPU pairs in all")
        how = f"; the period began as '{entry['action']}': {entry['reason']}" if entry else ""
        raise UnservedTraffic(
            f"training job {self.job!r}: the {period} period cannot run: its {' and '.join(kinds) or 'traffic'} "
            f"has flows with no path on the {self.net.fabric.name} fabric as it stands at t={at_s:.6g} s "
            f"({'; '.join(pairs)}){how}. The circuits in force do not serve these pairs (another stage's "
            "plan kept, a plan the controller refused, or pairs its allocation left without circuits)")

    def _dp_collectives(self, which: str) -> tuple[Collective, ...]:
        """Gradient reduce-scatter (``"rs"``) or parameter all-gather (``"ag"``), dense and expert groups."""
        grads = grad_traffic(self.arch, self.lay)
        prim, size = (("reduce-scatter", grads.reduce_scatter_bytes) if which == "rs"
                      else ("all-gather", grads.all_gather_bytes))
        out = []
        if self.lay.dp * self.lay.cp > 1:
            out.append(Collective(prim, _groups(self.groups, "dp-cp"), size("dense")))
        if self.arch.is_moe and self.lay.expert_dp > 1:
            out.append(Collective(prim, _groups(self.groups, "expert-dp"), size("expert")))
        return tuple(out)

    def _dp_time(self, which: str, tl: tuple) -> float:
        """DP collectives of one kind, dense and expert groups at once, across the timeline ``tl``."""
        colls = self._dp_collectives(which)
        if not colls:
            return 0.0
        key = ("dp", which, tuple((t, s.signature) for t, s in tl))
        if key not in self._memo:
            flows = intent_flows(Intent("train-dp", self.job, "grad-sync", colls))
            self._memo[key] = self.net.time_flows(flows, list(tl) if tl else None).makespan_s
        return self._memo[key]

    def _microbatch(self, comm: LayerComm):
        return microbatch_times(self.arch, self.lay, self._mb_flops, self.eff, comm, self.gpu.bf16_flops,
                                ep_exposed=self.params.ep_exposed, recompute=self.options.recompute,
                                expert_imbalance=self.options.expert_imbalance)

    def _pipeline_cost(self, m: int, t_s: float):
        def cost(state) -> float:
            tl = self._timeline(t_s) if state is None else ((0.0, state),)
            comm = self._layer_comm(tl)
            mb = self._microbatch(comm)
            return self._schedule(m, mb.fwd_s, mb.bwd_s, comm.pp_p2p_s).makespan_s
        return cost

    def _dp_cost(self, t_s: float):
        def cost(state) -> float:
            tl = self._timeline(t_s) if state is None else ((0.0, state),)
            return self._dp_time("rs", tl) + self._dp_time("ag", tl)
        return cost

    # ------------------------------------------------------------------ intents
    def _fwd_bwd_intent(self, m: int) -> Intent | None:
        # one object per distinct period: the RFabric driver remembers a materialisation per intent object
        key = ("fwd-bwd", m, self._mb_tokens)
        if key not in self._intent_memo:
            self._intent_memo[key] = self._new_fwd_bwd_intent(m)
        return self._intent_memo[key]

    def _new_fwd_bwd_intent(self, m: int) -> Intent | None:
        lay, arch = self.lay, self.arch
        tr = microbatch_traffic(arch, lay, self._mb_tokens)
        redo = 1 if self.options.recompute else 0  # recomputation repeats the forward's collectives
        colls = []
        if arch.is_moe and lay.ep > 1 and self._crosses["ep"]:  # 2 all-to-alls forward, 2 backward, per MoE layer
            colls.append(Collective("all-to-all", _groups(self.groups, "ep"),
                                    tr.ep_bytes * (4 + 2 * redo) * arch.moe_layers / lay.pp * m))
        if lay.cp > 1 and self._crosses["cp"]:  # one ring pass forward, two backward, per layer
            colls.append(Collective("all-gather", _groups(self.groups, "cp"),
                                    lay.cp * tr.cp_chunk_bytes * (3 + redo) * arch.layers / lay.pp * m))
        if lay.pp > 1 and self._crosses["pp"]:
            colls.append(Collective("p2p", _groups(self.groups, "pp"), tr.pp_bytes * m))
        return Intent("train", self.job, "fwd-bwd", tuple(colls)) if colls else None

    def _grad_intent(self) -> Intent | None:
        if "grad-sync" not in self._intent_memo:
            self._intent_memo["grad-sync"] = self._new_grad_intent()
        return self._intent_memo["grad-sync"]

    def _new_grad_intent(self) -> Intent | None:
        colls = tuple(c for c in self._dp_collectives("rs") + self._dp_collectives("ag")
                      if any(len({x // GPUS_PER_SERVER for x in grp}) > 1 for grp in c.groups))
        return Intent("train-dp", self.job, "grad-sync", colls) if colls else None

    def _enter(self, intent: Intent | None, t_s: float, cost) -> tuple[float, dict]:
        if self.driver is None or intent is None:
            return t_s, {}
        entry = enter_period(self.driver, intent, t_s, per_period=self.options.reconfigure == "per-period", cost=cost)
        ready = entry.ready_s
        if entry.action == "unchanged" and self.driver.changes:  # announced earlier (prepare): wait if still switching
            ready = max(ready, self.driver.changes[-1].end_s)
        return ready, {"period": intent.period, "action": entry.action, "reason": entry.reason,
                       "switching_s": entry.switching_s, "reconfigured": entry.reconfigured}

    def prepare(self, batch: TrainBatch, t_s: float) -> dict:
        """Announce the next step's fwd-bwd intent at ``t_s`` (RFabric), ahead of :meth:`run`.

        The iteration loop calls this when the train job's circuits are free again (e.g. when weight
        sync ends), so the gate can commit the plan in the idle gap and the switch is off the
        critical path; :meth:`run` then finds it in force. Returns the period entry (empty without a
        driver).
        """
        if self.driver is None:
            return {}
        self._mb_tokens = max(self.options.microbatch_tokens, batch.max_len)
        m = max(1, math.ceil(batch.tokens / self.options.optimizer_steps / self.lay.dp / self._mb_tokens))
        self._mb_flops = self.arch.flops(np.asarray(batch.seq_lens, dtype=np.float64)).scaled(
            1.0 / (self.options.optimizer_steps * self.lay.dp * m))
        return self._enter(self._fwd_bwd_intent(m), t_s, self._pipeline_cost(m, t_s))[1]

    # ------------------------------------------------------------------ the step
    def _schedule(self, m: int, fwd: float, bwd: float, p2p: float):
        key = (m, round(fwd, 12), round(bwd, 12), round(p2p, 12))
        run = self._schedules.get(key)
        if run is None:
            run = one_f_one_b(self.lay.pp, m, fwd, bwd, p2p)
            if len(self._schedules) > 64:
                self._schedules.clear()
            self._schedules[key] = run
        return run

    def _gate_slots(self, comm: LayerComm, mb) -> list[tuple[float, float]]:
        """Inter-server collectives of one layer's slot: (fraction of the slot where each starts, seconds).

        A slot is the layer's attention and dense work, then (MoE) the dispatch, the experts and the
        combine; the CP ring runs alongside attention from the slot's start.
        """
        slots: list[tuple[float, float]] = []
        total = mb.dense_kernel_s + mb.attention_s + mb.expert_kernel_s + 1e-30
        if self.lay.cp > 1 and self._crosses["cp"]:
            slots.append((0.0, (self.lay.cp - 1) * comm.cp_step_s))
        if self.arch.is_moe and self.lay.ep > 1 and self._crosses["ep"]:
            dense = (mb.dense_kernel_s + mb.attention_s) / total
            expert = mb.expert_kernel_s / total
            slots += [(dense, comm.ep_a2a_s), (min(dense + expert, 1.0), comm.ep_a2a_s)]
        return slots

    def run(self, batch: TrainBatch, now_s: float = 0.0) -> StageResult:
        """Return the stage's time for training on ``batch`` starting at ``now_s``.

        Notes
        -----
        Per optimizer step: O(S M) for the 1F1B schedule (S stages, M micro-batches), plus on
        RFabric O(S M L) gate events; collective timings are cached per fabric state.
        """
        opt, lay, arch, peak = self.options, self.lay, self.arch, self.gpu.bf16_flops
        if self.driver is not None and now_s < self._last_end_s:
            raise ConfigError("TrainingStage.run", "now_s", f"{now_s} precedes the end of the previous step at "
                              f"{self._last_end_s} (the gate sees the job's collectives in time order)",
                              f">= {self._last_end_s}")
        self._mb_tokens = max(opt.microbatch_tokens, batch.max_len)
        flops = arch.flops(np.asarray(batch.seq_lens, dtype=np.float64))
        steps = opt.optimizer_steps
        m = max(1, math.ceil(batch.tokens / steps / lay.dp / self._mb_tokens))
        self._mb_flops = flops.scaled(1.0 / (steps * lay.dp * m))
        grads = grad_traffic(arch, lay)
        opt_s = (grads.dense_params_per_gpu / (lay.dp * lay.cp) + grads.expert_params_per_gpu / lay.expert_dp) \
            * OPTIMIZER_BYTES_PER_PARAM / self.gpu.hbm_bytes_per_s
        parts = dict.fromkeys(("compute_s", "bubble_s", "ep_s", "cp_s", "tp_s", "pp_s", "dp_sync_s", "optimizer_s",
                               "reconfig_wait_s"), 0.0)
        periods: list[dict] = []
        late, events, t = [], 0, now_s
        for _ in range(steps):
            fwd_intent = self._fwd_bwd_intent(m)
            start, info = self._enter(fwd_intent, t, self._pipeline_cost(m, t))
            parts["reconfig_wait_s"] += start - t
            periods += [info] if info else []
            tl = self._timeline(start)
            comm = self._layer_comm(tl)
            if not all(map(math.isfinite, (comm.ep_a2a_s, comm.cp_step_s, comm.tp_layer_s, comm.pp_p2p_s))):
                self._unserved("fwd-bwd", self._layer_collectives().values(), tl[:1], start, info)
            mb = self._microbatch(comm)
            run = self._schedule(m, mb.fwd_s, mb.bwd_s, comm.pp_p2p_s)
            no_p2p = self._schedule(m, mb.fwd_s, mb.bwd_s, 0.0).makespan_s
            for k, v in (("compute_s", mb.compute_s), ("ep_s", mb.ep_exposed_s), ("cp_s", mb.cp_exposed_s),
                         ("tp_s", mb.tp_exposed_s)):
                parts[k] += m * v
            parts["bubble_s"] += max(0.0, no_p2p - m * mb.total_s)
            parts["pp_s"] += run.makespan_s - no_p2p
            if self.driver is not None and fwd_intent is not None:
                s, e = busy_intervals(run, max(1, round(arch.layers / lay.pp)), self._gate_slots(comm, mb),
                                      comm.pp_p2p_s if self._crosses["pp"] else 0.0)
                late += feed_events(self.driver, self.job, "train", fwd_intent.collectives[0].primitive, s, e, start)
                events += 2 * len(s)
            flush = start + run.makespan_s
            grad_intent = self._grad_intent()
            dp_start, info = self._enter(grad_intent, flush, self._dp_cost(flush))
            parts["reconfig_wait_s"] += dp_start - flush
            periods += [info] if info else []
            rs = self._dp_time("rs", self._timeline(dp_start))
            if not math.isfinite(rs):
                self._unserved("grad-sync", self._dp_collectives("rs"), self._timeline(dp_start), dp_start, info)
            ag_start = dp_start + rs + opt_s
            ag = self._dp_time("ag", self._timeline(ag_start))
            if not math.isfinite(ag):
                self._unserved("grad-sync", self._dp_collectives("ag"), self._timeline(ag_start), ag_start, info)
            if self.driver is not None and grad_intent is not None:
                for prim, a, b in (("reduce-scatter", dp_start, dp_start + rs), ("all-gather", ag_start, ag_start + ag)):
                    late += feed_events(self.driver, self.job, "train-dp", prim, np.array([a]), np.array([b]))
                events += 4
            parts["dp_sync_s"] += rs + ag
            parts["optimizer_s"] += opt_s
            t = ag_start + ag
        time_s = t - now_s
        self._last_end_s = t
        reconfigs = sum(p["reconfigured"] for p in periods) + sum(d.action == "commit" for d in late)
        detail = {"mfu": float(flops.total / (lay.world * peak * time_s)) if time_s > 0 else 0.0,
                  "microbatches": m, "microbatch_tokens": self._mb_tokens, "optimizer_steps": steps,
                  "layout": {"tp": lay.tp, "cp": lay.cp, "pp": lay.pp, "dp": lay.dp, "ep": lay.ep, "etp": lay.etp},
                  "efficiency": {"dense": self.eff.dense, "expert": self.eff.expert, "attention": self.eff.attention},
                  "model_flops": float(flops.total), "periods": periods, "gate_events": events,
                  "late_commits": [d.reason for d in late if d.action == "commit"]}
        parts = {k: float(v) for k, v in parts.items()}
        return StageResult("train", float(time_s), parts, tokens=float(batch.tokens), samples=batch.samples,
                           intents=len(periods), reconfigurations=int(reconfigs), detail=detail)
