"""Replay one generation step under a policy on the simulated engine (``orchestrl sched replay``).

Policies (OrchestrRL §6 baselines and ablations):

=====================  ========================================================================
``static-tp:K``        fixed TP=K instances on every GPU, the batch split in contiguous chunks
``verl-to``            veRL tuned for throughput: the best ``static-tp`` of a sweep over 1,2,4,8
``verl-lo``            veRL tuned for latency: TP = one node (8)
``partial-rollout``    veRL-TO's layout, the step ends once all but ``partial_fraction`` finished;
                       the rest carry over to the next step
``orchestrl``          Algorithm 1: proactive planner + reactive balancer
``orchestrl-pp``       planner only (ablation +PP)
``orchestrl-rb``       balancer only (ablation +RB)
``planner-exact``      Algorithm 1 with every output length known: one member of the clairvoyant
                       family (:mod:`compute_sched.clairvoyant`), not a bound and not a policy
=====================  ========================================================================

The policies that plan (``orchestrl*``) see a forecast histogram, never the trace's lengths,
unless the caller asks: ``forecast="prior"`` (default) is the bundled Figure 3 shape at the trace's
cap and batch size (:func:`compute_sched.workload.prior_histogram`), a :class:`LengthHistogram`
is used as given (e.g. ``LengthForecaster`` over earlier steps), and ``forecast="oracle"`` is the
histogram of the trace's own true lengths: clairvoyant, labelled so in ``detail["forecast"]``.

The ``orchestrl*`` policies start from veRL-TO's layout (``ReplayOptions.initial_tp="verl-to"``):
the paper's ablation builds +PP and +RB on veRL-TO (§6.2.1), and its case study starts OrchestrRL
on veRL-TO's eight TP=2 instances (§6.2.2).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any, Sequence

from orchestrl.compute_sched.costs import CostModel
from orchestrl.compute_sched.engine import RECOMPUTE_ONLY, EngineCapabilities, GenerationRequest
from orchestrl.compute_sched.intents import IntentSink
from orchestrl.compute_sched.layout import InstanceConfig, homogeneous
from orchestrl.compute_sched.perf import PerfModel
from orchestrl.compute_sched.scheduler import GenerationScheduler, SchedulerConfig, StepReport
from orchestrl.compute_sched.sim_engine import SimEngine
from orchestrl.compute_sched.traces import Trace
from orchestrl.compute_sched.workload import LengthHistogram, prior_histogram
from orchestrl.fabric.errors import ConfigError

__all__ = ["POLICIES", "FORECASTS", "ReplayOptions", "ReplayResult", "replay", "launch_contiguous", "step_forecast",
           "trace_requests"]

POLICIES = ("static-tp:K", "verl-to", "verl-lo", "partial-rollout", "orchestrl", "orchestrl-pp", "orchestrl-rb",
            "planner-exact")

FORECASTS = ("prior", "oracle")  # named forecasts; a LengthHistogram is the third kind
PRIOR_LABEL = "prior: bundled Figure 3 shape, not read from this trace"
ORACLE_LABEL = "ORACLE: the trace's own true length histogram (clairvoyant; no real scheduler has it)"


@dataclass(frozen=True)
class ReplayOptions:
    """Settings of a replay; the scheduler's own knobs sit in ``scheduler``."""

    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)
    initial_tp: int | str = "verl-to"  # where the orchestrl policies start: "verl-to" (its sweep's best TP) or a TP
    partial_fraction: float = 0.1
    sweep_tps: tuple[int, ...] = (1, 2, 4, 8)
    max_num_seqs: int | None = None  # vLLM batch limit per instance; None: the calibration's (perf.cal)
    capabilities: EngineCapabilities = RECOMPUTE_ONLY  # how the engine migrates; transfer only as a labelled what-if


@dataclass(frozen=True)
class ReplayResult:
    policy: str
    initial_layout: str
    report: StepReport
    detail: dict[str, Any]

    @property
    def makespan_s(self) -> float:
        return self.report.makespan_s


def trace_requests(trace: Trace) -> list[GenerationRequest]:
    """The trace's requests as an engine takes them (each may run to the trace's cap; progress kept)."""
    return [GenerationRequest(q.request_id, q.prompt_tokens, trace.max_tokens, q.group_id,
                              generated_tokens=q.generated_tokens) for q in trace.requests]


def launch_contiguous(engine: SimEngine, requests: list[GenerationRequest],
                      instances: Sequence[int] | None = None) -> None:
    """Add a batch the way veRL splits it: contiguous per-replica chunks, in batch order, over
    ``instances`` (default: every instance of the engine's layout)."""
    targets = list(range(len(engine.layout.instances)) if instances is None else instances)
    chunk = -(-len(requests) // len(targets))
    for j, k in enumerate(targets):
        engine.add_requests(requests[j * chunk:(j + 1) * chunk], k)


def _run(trace: Trace, perf: PerfModel, gpus: int, tp: int, sched: SchedulerConfig, opts: ReplayOptions,
         forecast: LengthHistogram | None, sink: IntentSink | None, exact: bool, job: str) -> tuple[str, StepReport]:
    layout = homogeneous(InstanceConfig("tp", tp=tp), gpus)
    lengths = {q.request_id: q.output_tokens for q in trace.requests}
    engine = SimEngine(perf, layout, lengths, max_num_seqs=opts.max_num_seqs, capabilities=opts.capabilities)
    launch_contiguous(engine, trace_requests(trace))
    sched_obj = GenerationScheduler(engine, perf, CostModel.for_engine(perf, engine), forecast, sched,
                                    exact_lengths=lengths if exact else None, sink=sink, job=job)
    return layout.describe(), sched_obj.run_step()


def step_forecast(trace: Trace, forecast: LengthHistogram | str) -> tuple[LengthHistogram, str]:
    """Return the histogram a replay of ``trace`` plans with, and a label saying where it came from.

    Only ``"oracle"`` reads the trace's output lengths; ``"prior"`` reads its cap and batch size,
    which a scheduler knows before the step starts.

    Raises
    ------
    ConfigError
        For a name other than ``"prior"`` or ``"oracle"``.
    """
    if isinstance(forecast, LengthHistogram):
        return forecast, "given histogram"
    if forecast == "prior":
        return prior_histogram(trace.max_tokens, len(trace.requests)), PRIOR_LABEL
    if forecast == "oracle":
        return LengthHistogram.from_lengths([q.output_tokens for q in trace.requests], trace.max_tokens), ORACLE_LABEL
    raise ConfigError("replay", "forecast", f"unknown forecast {forecast!r}",
                      "'prior', 'oracle' (clairvoyant), or a LengthHistogram from LengthForecaster")


def replay(trace: Trace, perf: PerfModel, gpus: int, policy: str, *, forecast: LengthHistogram | str = "prior",
           options: ReplayOptions | None = None, sink: IntentSink | None = None, job: str = "gen") -> ReplayResult:
    """Replay ``trace`` on ``gpus`` GPUs under ``policy``; see the module table.

    ``forecast`` is what the planning policies see of the step's lengths: ``"prior"`` (default, the
    Figure 3 shape), a histogram (e.g. forecast from earlier steps), or ``"oracle"`` (the trace's
    true length histogram, clairvoyant). ``detail["forecast"]`` says which.

    Raises
    ------
    ConfigError
        For an unknown policy or forecast, or a TP degree that does not fit the model or the cluster.
    """
    opts = options or ReplayOptions()
    forecast, forecast_label = step_forecast(trace, forecast)
    static = replace(opts.scheduler, proactive=False, reactive=False)

    def fits(tp: int) -> bool:
        return tp <= gpus and gpus % tp == 0 and perf.fits(InstanceConfig("tp", tp=tp))

    if policy.startswith("static-tp:"):
        try:
            tp = int(policy.split(":", 1)[1])
        except ValueError:
            raise ConfigError("replay", "policy", f"cannot read {policy!r}", "static-tp:K with K an integer") from None
        if not fits(tp):
            raise ConfigError("replay", "policy", f"TP={tp} does not fit {perf.model.name} on {gpus} {perf.gpu.name}",
                              "a TP degree that divides the GPUs and holds the weights")
        lay, rep = _run(trace, perf, gpus, tp, static, opts, None, None, False, job)
        return ReplayResult(policy, lay, rep, {"tp": tp})
    if policy in ("verl-to", "partial-rollout"):
        sweep = {}
        for tp in (t for t in opts.sweep_tps if fits(t)):
            sweep[tp] = _run(trace, perf, gpus, tp, static, opts, None, None, False, job)
        if not sweep:
            raise ConfigError("replay", "gpus", f"no TP degree of {opts.sweep_tps} fits", "more GPUs")
        best = min(sweep, key=lambda t: sweep[t][1].makespan_s)
        detail = {"tp": best, "sweep_s": {t: r.makespan_s for t, (_, r) in sweep.items()}}
        if policy == "verl-to":
            return ReplayResult(policy, sweep[best][0], sweep[best][1], detail)
        keep = max(1, round(len(trace.requests) * (1.0 - opts.partial_fraction)))
        lay, rep = _run(trace, perf, gpus, best, replace(static, stop_after_finished=keep), opts, None, None, False,
                        job)
        return ReplayResult(policy, lay, rep, {**detail, "carried_over": len(rep.unfinished)})
    if policy == "verl-lo":
        tp = perf.gpu.gpus_per_node
        if not fits(tp):
            raise ConfigError("replay", "gpus", f"{gpus} GPUs cannot host TP={tp}", f"a multiple of {tp} GPUs")
        lay, rep = _run(trace, perf, gpus, tp, static, opts, None, None, False, job)
        return ReplayResult(policy, lay, rep, {"tp": tp})
    flags = {"orchestrl": (True, True), "orchestrl-pp": (True, False), "orchestrl-rb": (False, True),
             "planner-exact": (True, True)}
    if policy == "oracle":
        raise ConfigError("replay", "policy", "'oracle' is now 'planner-exact': Algorithm 1 fed exact lengths is "
                          "not a bound (it can lose to OrchestrRL)", "planner-exact, or bench/gen_sched.py's "
                          "clairvoyant schedule and lower bound")
    if policy not in flags:
        raise ConfigError("replay", "policy", f"unknown policy {policy!r}", ", ".join(POLICIES))
    if opts.initial_tp == "verl-to":
        tp = replay(trace, perf, gpus, "verl-to", options=opts, job=job).detail["tp"]
    elif isinstance(opts.initial_tp, int) and fits(opts.initial_tp):
        tp = opts.initial_tp
    else:
        raise ConfigError("replay", "initial_tp", f"{opts.initial_tp!r} does not fit {perf.model.name} on {gpus} "
                          f"{perf.gpu.name}", "'verl-to' or a TP degree that divides the GPUs and holds the weights")
    pp, rb = flags[policy]
    sched = replace(opts.scheduler, proactive=pp, reactive=rb)
    lay, rep = _run(trace, perf, gpus, tp, sched, opts, forecast, sink, policy == "planner-exact", job)
    return ReplayResult(policy, lay, rep, {"tp": tp, "forecast": forecast_label})
