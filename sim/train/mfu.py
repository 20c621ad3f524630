"""Model FLOP utilisation per (model, layout): a small physical model fitted to published H100 points.

Design note
-----------
A training step is kernels plus whatever communication and pipeline bubble they do not hide
(:mod:`sim.train.step`). What is fitted is how fast the kernels run and how much all-to-all shows:

* ``eta0`` -- the fraction of peak bf16 FLOP/s that large GEMMs and flash attention reach;
* ``c_dense`` -- norms, activations, residuals and rotary embeddings cost time that scales with
  ``d_model`` per token while the dense GEMMs scale with ``d_model^2``:
  ``eta_dense = eta0 / (1 + c_dense * 1024 / d_model)``;
* ``c_expert`` -- the same for expert GEMMs against ``expert_ffn / etp`` (narrow experts, and
  permutation work per routed token): ``eta_expert = eta0 / (1 + c_expert * 1024 etp / expert_ffn)``;
* ``ep_exposed`` -- the fraction of each all-to-all on the critical path.

:data:`FREE_PARAMS` says which are fitted; the others stay 0. Each point also records its source's
EP dispatcher and router (DeepEP's per-node deduplication: :mod:`sim.train.dispatch`) and activation
recomputation; :data:`SETUP` says which of these the fit models (:func:`as_modelled`). The points
(``sim/specs/mfu_points.yaml``) ran on DGX-H100-class clusters, so their communication is timed on
an :class:`IdealNetwork` -- non-blocking, one 400 Gb/s NIC and NVLink 4 per GPU -- in closed form;
``tests/sim/test_training.py`` checks the closed form against :class:`sim.network.NetworkSim` on a
fat tree. The fit minimises squared log errors of the predicted MFU with
``scipy.optimize.least_squares``; :func:`calibrate` reports leave-one-out predictions of every
fitted point and the held-out points the fit never sees; :func:`format_variants` compares the
nested variants by leave-one-out error (which is how the default was chosen, so its own
leave-one-out error is slightly optimistic).

Run ``python -m orchestrl.sim.train.mfu [--json] [--setup dispatch,recompute]`` for the calibration table.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from dataclasses import dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Sequence

import numpy as np
from scipy.optimize import least_squares

from orchestrl.compute_sched.hardware import load_model
from orchestrl.fabric.config import Reader, load_document
from orchestrl.fabric.errors import ConfigError
from orchestrl.fabric.layout import ParallelLayout, parallel_groups
from orchestrl.sim.network.collectives import bus_factor, collective_steps
from orchestrl.sim.train.dispatch import DISPATCHERS, ROUTINGS, TokenCopies, token_copies
from orchestrl.sim.train.flops import ArchSpec
from orchestrl.sim.train.step import (OPTIMIZER_BYTES_PER_PARAM, Efficiency, LayerComm, TrainLayout, grad_traffic,
                            microbatch_times, microbatch_traffic)

__all__ = ["MfuParams", "IdealNetwork", "PublishedPoint", "PointPrediction", "Calibration", "POINTS_FILE",
           "FREE_PARAMS", "SETUP_FACTS", "SETUP", "SETUPS", "efficiency", "load_points", "predict_point", "fit",
           "as_modelled", "calibrate", "default_calibration",
           "default_params",
           "constant_baseline", "format_calibration", "format_variants"]

POINTS_FILE = Path(__file__).resolve().parents[1] / "specs" / "mfu_points.yaml"
_BOUNDS = {"eta0": (0.05, 1.0), "c_dense": (0.0, 50.0), "c_expert": (0.0, 50.0), "ep_exposed": (0.0, 1.0)}
#: The parameters the default calibration fits; the others stay at 0. Chosen by leave-one-out error
#: among the nested variants (``python -m orchestrl.sim.train.mfu --variants``); c_expert did not help.
FREE_PARAMS = ("eta0", "c_dense", "ep_exposed")
#: What of each source's recorded setup the model can take into account: its EP dispatcher and
#: router (``dispatch``, :mod:`sim.train.dispatch`) and full activation recomputation (``recompute``).
SETUP_FACTS = ("dispatch", "recompute")
#: The facts the default calibration uses: none. A fact is taken in only if it lowers the mean
#: leave-one-out error without raising the worst (``--variants``); neither does (docs/sim-training.md §2).
SETUP: tuple[str, ...] = ()
SETUPS = ((), ("dispatch",), ("recompute",), ("dispatch", "recompute"))
VARIANTS = (("eta0", "ep_exposed"), ("eta0", "c_dense", "ep_exposed"), ("eta0", "c_expert", "ep_exposed"),
            ("eta0", "c_dense", "c_expert", "ep_exposed"))


@dataclass(frozen=True)
class MfuParams:
    """The fitted efficiency model (see the module note)."""

    eta0: float = 0.5
    c_dense: float = 0.0
    c_expert: float = 0.0
    ep_exposed: float = 0.5


def efficiency(arch: ArchSpec, tp: int, etp: int, params: MfuParams) -> Efficiency:
    """Return the kernel efficiencies of ``arch`` with its experts split over ``etp`` ranks.

    ``tp`` does not enter: sequence parallelism splits the elementwise work over TP as it splits
    the GEMMs, so their ratio depends on ``d_model`` alone.

    Examples
    --------
    >>> from orchestrl.compute_sched.hardware import load_model
    >>> e = efficiency(ArchSpec.from_model(load_model("Qwen2.5-72B")), 8, 8, MfuParams(0.5, 1.0, 1.0, 1.0))
    >>> round(e.dense, 3)  # 0.5 / (1 + 1024 / 8192)
    0.444
    """
    dense = params.eta0 / (1.0 + params.c_dense * 1024.0 / arch.d_model)
    expert = params.eta0 / (1.0 + params.c_expert * 1024.0 * etp / arch.expert_ffn) if arch.is_moe else params.eta0
    return Efficiency(dense=dense, expert=expert, attention=params.eta0)


@dataclass(frozen=True)
class IdealNetwork:
    """A non-blocking fabric in closed form: NVLink inside a server, one NIC per GPU outside it.

    Collective times follow the alpha-beta model the simulator uses: a group that spans servers
    runs at the NIC rate (NCCL rings use every NIC of a server), one inside a server at the NVLink
    rate; an all-to-all sends the off-server share over the NIC and the rest over NVLink at once.
    """

    nic_bytes_per_s: float = 50e9
    nvlink_bytes_per_s: float = 450e9
    gpus_per_server: int = 8
    latency_s: float = 5e-6  # one step between servers (a few links and switches)
    nvlink_latency_s: float = 1e-6  # one step inside a server

    def _alpha(self, n: int, per_server: int) -> float:
        return self.latency_s if per_server < n else self.nvlink_latency_s

    def ring_s(self, primitive: str, size_bytes: float, n: int, per_server: int) -> float:
        if n <= 1 or size_bytes <= 0:
            return 0.0
        rate = self.nic_bytes_per_s if per_server < n else self.nvlink_bytes_per_s
        return bus_factor(primitive, n) * size_bytes / rate + collective_steps(primitive, n) * self._alpha(n, per_server)

    def alltoall_s(self, size_bytes: float, n: int, per_server: int) -> float:
        if n <= 1 or size_bytes <= 0:
            return 0.0
        off = size_bytes * (n - per_server) / n / self.nic_bytes_per_s
        on = size_bytes * (per_server - 1) / n / self.nvlink_bytes_per_s
        return max(off, on) + self._alpha(n, per_server)

    def dispatch_s(self, copy_bytes: float, copies: TokenCopies, n: int, per_server: int) -> float:
        """One EP dispatch (or combine) sending ``copies`` of ``copy_bytes`` (one copy of every token of
        a rank) over the NIC and NVLink at once; with the ``alltoall`` copies this is :meth:`alltoall_s`."""
        if n <= 1 or copy_bytes <= 0:
            return 0.0
        off = copy_bytes * copies.nic / self.nic_bytes_per_s
        on = copy_bytes * copies.nvlink / self.nvlink_bytes_per_s
        return max(off, on) + self._alpha(n, per_server)

    def p2p_s(self, size_bytes: float, cross_server: bool) -> float:
        if size_bytes <= 0:
            return 0.0
        if cross_server:
            return size_bytes / self.nic_bytes_per_s + self.latency_s
        return size_bytes / self.nvlink_bytes_per_s + self.nvlink_latency_s


@dataclass(frozen=True)
class PublishedPoint:
    """One published throughput measurement and the configuration it was taken on."""

    id: str
    arch: ArchSpec
    gpus: int
    seq: int
    layout: TrainLayout
    mbs: int
    gbs: int
    mfu: float
    flops_per_token: float  # the source's FLOP count per token
    framework: str
    source: str
    url: str
    note: str
    use: str  # "fit" or "holdout"
    fsdp: bool = False
    recompute: bool = False  # full activation recomputation (every layer's forward re-run in backward)
    dispatcher: str = "alltoall"  # EP token dispatcher (sim.train.dispatch): "alltoall" | "deepep"
    routing: str = "random"  # how the benchmark's router picks experts: "random" | "sequential"

    @property
    def microbatches(self) -> int:
        return max(1, self.gbs // (self.layout.dp * self.mbs))


def _arches(r: Reader) -> dict[str, ArchSpec]:
    out = {}
    for i, m in enumerate(r.raw("models")):
        spec = ArchSpec.from_mapping(m, r.source, f"models[{i}]")
        out[spec.name] = spec
    return out


def load_points(path: str | Path | None = None) -> tuple[list[PublishedPoint], IdealNetwork, float]:
    """Return the published points, the network they ran on, and the GPUs' peak bf16 FLOP/s.

    Raises
    ------
    ConfigError
        Naming the file and field of a bad entry (unknown model, layout that does not divide the
        GPUs, MFU outside (0, 1], ...).
    """
    r = load_document(path or POINTS_FILE)
    r.reject_unknown({"gpu", "models", "points"})
    g = r.section("gpu")
    g.reject_unknown({"name", "bf16_flops", "hbm_bytes_per_s", "nvlink_bytes_per_s", "nic_bps"})
    peak = g.float("bf16_flops", minimum=0.0, exclusive_minimum=True)
    net = IdealNetwork(nic_bytes_per_s=g.float("nic_bps", minimum=1.0) / 8.0,
                       nvlink_bytes_per_s=g.float("nvlink_bytes_per_s", minimum=1.0))
    g.float("hbm_bytes_per_s", minimum=1.0)
    g.str("name")
    arches = _arches(r)
    points = []
    for i, p in enumerate(r.sections("points")):
        p.reject_unknown({"id", "model", "gpus", "seq", "layout", "mfu", "tflops_per_gpu", "tokens_per_s_per_gpu",
                          "framework", "source", "note", "use", "dispatch"})
        name = p.str("model")
        arch = arches.get(name)
        if arch is None:
            try:
                arch = ArchSpec.from_model(load_model(name))
            except ConfigError:
                raise p.error("model", f"{name!r} is neither in models: nor a bundled model",
                              ", ".join(sorted(arches))) from None
        gpus = p.int("gpus", minimum=1)
        lay = p.section("layout")
        lay.reject_unknown({"tp", "pp", "cp", "ep", "etp", "vp", "mbs", "gbs", "fsdp", "recompute"})
        tp, pp, cp = (lay.int(k, default=1, minimum=1) for k in ("tp", "pp", "cp"))
        if gpus % (tp * pp * cp):
            raise lay.error("tp", f"tp*pp*cp = {tp * pp * cp} does not divide gpus={gpus}", "a divisor of gpus")
        layout = TrainLayout(tp=tp, cp=cp, pp=pp, dp=gpus // (tp * pp * cp), ep=lay.int("ep", default=1, minimum=1),
                             etp=lay.int("etp", default=1 if arch.is_moe else tp, minimum=1),
                             vp=lay.int("vp", default=1, minimum=1))
        seq = p.int("seq", minimum=1)
        mfu = p.float("mfu", minimum=0.0, maximum=1.0, exclusive_minimum=True)
        tflops = p.float("tflops_per_gpu", minimum=0.0) if p.has("tflops_per_gpu") else None
        tok_s = p.float("tokens_per_s_per_gpu", minimum=0.0) if p.has("tokens_per_s_per_gpu") else None
        if tflops and tok_s:
            fpt = tflops * 1e12 / tok_s
        else:  # no token rate given: the source is taken to count model FLOPs as we do (causal attention)
            fpt = arch.flops(float(seq), tokens=1.0).total
        src = p.section("source")
        disp = p.section("dispatch", default={})
        disp.reject_unknown({"type", "routing", "source"})
        dispatcher = disp.str("type", default="alltoall", choices=DISPATCHERS)
        routing = disp.str("routing", default="random", choices=ROUTINGS)
        if disp.has("type"):
            disp.str("source")  # a dispatcher is a claim about the source's setup: say where it is from
        points.append(PublishedPoint(
            id=p.str("id"), arch=arch, gpus=gpus, seq=seq, layout=layout, mbs=lay.int("mbs", default=1, minimum=1),
            gbs=lay.int("gbs", minimum=1), mfu=mfu, flops_per_token=fpt, framework=p.str("framework"),
            source=src.str("title"), url=src.str("url"), note=p.str("note", default=""),
            use=p.str("use", choices=("fit", "holdout")), fsdp=lay.bool("fsdp", default=False),
            recompute=lay.bool("recompute", default=False), dispatcher=dispatcher, routing=routing))
    return points, net, peak


@lru_cache(maxsize=256)
def _group_shape(lay: TrainLayout, kind: str, gpus_per_server: int) -> tuple[int, int]:
    """Return (group size, most members of one group on one server) for a group kind of ``lay``."""
    par = ParallelLayout(tp=lay.tp, cp=lay.cp, ep=lay.ep, dp=lay.dp, pp=lay.pp, expert_tp=lay.etp)
    groups = parallel_groups(par, range(lay.world))[kind]
    g = np.asarray(groups[0])
    return len(g), int(np.bincount(g // gpus_per_server).max())


def _layer_comm(pt: PublishedPoint, net: IdealNetwork) -> tuple[LayerComm, float]:
    lay, arch = pt.layout, pt.arch
    traffic = microbatch_traffic(arch, lay, pt.mbs * pt.seq)
    s = net.gpus_per_server
    ep = 0.0
    if arch.is_moe and lay.ep > 1:
        ep_n, ep_k = _group_shape(lay, "ep", s)
        copies = token_copies(arch.experts, arch.topk, ep_n, ep_k, pt.dispatcher, pt.routing)
        ep = net.dispatch_s(traffic.ep_bytes / arch.topk, copies, ep_n, ep_k)
    cp_n, cp_k = _group_shape(lay, "cp", s)
    cp = net.p2p_s(traffic.cp_chunk_bytes, cp_k < cp_n) if lay.cp > 1 else 0.0
    tp_n, tp_k = _group_shape(lay, "tp", s)
    tp = 2 * (net.ring_s("all-gather", traffic.tp_bytes, tp_n, tp_k)
              + net.ring_s("reduce-scatter", traffic.tp_bytes, tp_n, tp_k))
    pp = net.p2p_s(traffic.pp_bytes, lay.world // lay.pp >= s) if lay.pp > 1 else 0.0
    grads = grad_traffic(arch, lay)
    dp_rs = net.ring_s("reduce-scatter", grads.reduce_scatter_bytes("dense"), *_group_shape(lay, "dp-cp", s))
    if arch.is_moe:
        dp_rs += net.ring_s("reduce-scatter", grads.reduce_scatter_bytes("expert"), *_group_shape(lay, "expert-dp", s))
    return LayerComm(ep_a2a_s=ep, cp_step_s=cp, tp_layer_s=tp, pp_p2p_s=pp), dp_rs


@dataclass(frozen=True)
class PointPrediction:
    """What the model says about one published point."""

    id: str
    use: str
    observed: float
    predicted: float
    step_s: float
    parts_s: dict = field(default_factory=dict)

    @property
    def rel_error(self) -> float:
        return self.predicted / self.observed - 1.0


def predict_point(pt: PublishedPoint, params: MfuParams, net: IdealNetwork, peak_flops: float) -> PointPrediction:
    """Return the MFU the model predicts for a published point (pre-training step, ideal network).

    Notes
    -----
    The step is ``(m + (pp - 1) / vp)`` micro-batch rounds (interleaved 1F1B), the pipeline's
    fill and drain transfers, the part of the gradient reduce-scatter the last backward does not
    hide, and the optimizer's pass over its shard (the parameter all-gather overlaps the next
    step's forward, as ``--overlap-param-gather`` does in pre-training). O(1) after the first call
    per layout (group shapes are cached).
    """
    lay, arch = pt.layout, pt.arch
    comm, dp_rs = _layer_comm(pt, net)
    eff = efficiency(arch, lay.tp, lay.etp, params)
    mb = microbatch_times(arch, lay, arch.flops(float(pt.seq), tokens=float(pt.mbs * pt.seq)), eff, comm,
                          peak_flops, ep_exposed=params.ep_exposed, recompute=pt.recompute)
    m = pt.microbatches
    pipe = (m + (lay.pp - 1) / lay.vp) * mb.total_s + 2 * (lay.pp - 1) * comm.pp_p2p_s
    dp = max(0.0, dp_rs - mb.bwd_s)
    grads = grad_traffic(arch, lay)
    opt = (grads.dense_params_per_gpu / (lay.dp * lay.cp) + grads.expert_params_per_gpu / lay.expert_dp) \
        * OPTIMIZER_BYTES_PER_PARAM / 3.35e12
    step = pipe + dp + opt
    tokens_per_s_gpu = pt.gbs * pt.seq / (pt.gpus * step)
    parts = {"compute_s": m * mb.compute_s, "bubble_s": (lay.pp - 1) / lay.vp * mb.total_s,
             "ep_s": m * mb.ep_exposed_s, "cp_s": m * mb.cp_exposed_s, "tp_s": m * mb.tp_exposed_s,
             "pp_s": 2 * (lay.pp - 1) * comm.pp_p2p_s, "dp_s": dp, "optimizer_s": opt}
    return PointPrediction(pt.id, pt.use, pt.mfu, pt.flops_per_token * tokens_per_s_gpu / peak_flops, step, parts)


def _residuals(x: np.ndarray, free: Sequence[str], points: Sequence[PublishedPoint], net: IdealNetwork,
               peak: float) -> np.ndarray:
    params = MfuParams(**dict(zip(free, x)))
    return np.array([math.log(predict_point(p, params, net, peak).predicted / p.mfu) for p in points])


def fit(points: Sequence[PublishedPoint], net: IdealNetwork, peak_flops: float, start: MfuParams | None = None,
        free: Sequence[str] = FREE_PARAMS) -> MfuParams:
    """Return the parameters minimising the squared log error of the predicted MFU over ``points``.

    Only the parameters named in ``free`` are fitted; the others are 0.

    Notes
    -----
    Trust-region reflective least squares (``scipy.optimize.least_squares``) under the bounds
    ``eta0`` in [0.05, 1], ``c_*`` in [0, 50], ``ep_exposed`` in [0, 1]; a few hundred cheap
    evaluations of :func:`predict_point`.
    """
    start = start or MfuParams()
    x0 = np.array([min(max(getattr(start, f), _BOUNDS[f][0]), _BOUNDS[f][1]) for f in free])
    lo, hi = zip(*(_BOUNDS[f] for f in free))
    res = least_squares(_residuals, x0, args=(tuple(free), list(points), net, peak_flops), bounds=(lo, hi),
                        x_scale="jac")
    return MfuParams(**dict(zip(free, res.x)))


@dataclass(frozen=True)
class Calibration:
    """A fit, its in-sample predictions, leave-one-out predictions and held-out predictions."""

    params: MfuParams
    fitted: tuple[PointPrediction, ...]
    leave_one_out: tuple[PointPrediction, ...]
    holdout: tuple[PointPrediction, ...]

    def summary(self) -> dict[str, float]:
        def stats(preds):
            e = np.abs([p.rel_error for p in preds]) if preds else np.array([np.nan])
            return float(np.mean(e)), float(np.max(e))
        out = {}
        for name, preds in (("in_sample", self.fitted), ("leave_one_out", self.leave_one_out),
                            ("holdout", self.holdout)):
            out[f"{name}_mean_abs"], out[f"{name}_max_abs"] = stats(preds)
        return out

    def to_json(self) -> dict:
        row = lambda p: {"id": p.id, "use": p.use, "observed": p.observed, "predicted": p.predicted,  # noqa: E731
                         "rel_error": p.rel_error}
        return {"params": self.params.__dict__, "summary": self.summary(),
                "fitted": [row(p) for p in self.fitted], "leave_one_out": [row(p) for p in self.leave_one_out],
                "holdout": [row(p) for p in self.holdout]}


def as_modelled(points: Sequence[PublishedPoint], setup: Sequence[str] = SETUP) -> list[PublishedPoint]:
    """Return ``points`` with the parts of each source's setup outside ``setup`` (of :data:`SETUP_FACTS`)
    replaced by the plain default: the all-to-all dispatcher, no recomputation."""
    unknown = set(setup) - set(SETUP_FACTS)
    if unknown:
        raise ConfigError("as_modelled", "setup", f"unknown facts {sorted(unknown)}", ", ".join(SETUP_FACTS))
    plain_dispatch = {} if "dispatch" in setup else {"dispatcher": "alltoall", "routing": "random"}
    plain_recompute = {} if "recompute" in setup else {"recompute": False}
    return [replace(p, **plain_dispatch, **plain_recompute) for p in points]


def calibrate(path: str | Path | None = None, free: Sequence[str] = FREE_PARAMS,
              setup: Sequence[str] = SETUP) -> Calibration:
    """Fit the points marked ``use: fit``; predict each of them with a fit that left it out, and
    the ``holdout`` points with the full fit.

    ``setup`` names what of each source's recorded setup the model takes into account
    (:func:`as_modelled`).

    Notes
    -----
    N + 1 fits for N fitted points (each about 0.1 s here).
    """
    points, net, peak = load_points(path)
    points = as_modelled(points, setup)
    train = [p for p in points if p.use == "fit"]
    held = [p for p in points if p.use == "holdout"]
    params = fit(train, net, peak, free=free)
    fitted = tuple(predict_point(p, params, net, peak) for p in train)
    loo = []
    for i, p in enumerate(train):
        sub = fit(train[:i] + train[i + 1:], net, peak, start=params, free=free)
        loo.append(predict_point(p, sub, net, peak))
    return Calibration(params, fitted, tuple(loo), tuple(predict_point(p, params, net, peak) for p in held))


@lru_cache(maxsize=1)
def default_calibration() -> Calibration:
    """Return the calibration on the bundled points, with its validation (fitted once per process)."""
    return calibrate()


@lru_cache(maxsize=1)
def default_params() -> MfuParams:
    """Return the model fitted to the bundled points (one fit, about 0.2 s, once per process)."""
    points, net, peak = load_points()
    return fit([p for p in as_modelled(points) if p.use == "fit"], net, peak)


def format_calibration(cal: Calibration) -> str:
    """Return the calibration as a table: observed, fitted, leave-one-out MFU per point."""
    loo = {p.id: p for p in cal.leave_one_out}
    p = cal.params
    lines = [f"MFU model: eta0={p.eta0:.3f} c_dense={p.c_dense:.3f} c_expert={p.c_expert:.3f} "
             f"ep_exposed={p.ep_exposed:.3f}",
             f"{'point':<40} {'use':<8} {'published':>9} {'fitted':>8} {'err':>7} {'LOO':>8} {'err':>7}"]
    for f in cal.fitted + cal.holdout:
        lo = loo.get(f.id)
        lo_txt = f"{lo.predicted:8.3f} {lo.rel_error:+7.1%}" if lo else f"{'-':>8} {'-':>7}"
        lines.append(f"{f.id:<40} {f.use:<8} {f.observed:9.3f} {f.predicted:8.3f} {f.rel_error:+7.1%} {lo_txt}")
    s = cal.summary()
    lines.append(f"mean |error|: in-sample {s['in_sample_mean_abs']:.1%}, leave-one-out {s['leave_one_out_mean_abs']:.1%}"
                 f" (max {s['leave_one_out_max_abs']:.1%}), held out {s['holdout_mean_abs']:.1%}")
    return "\n".join(lines)


def constant_baseline(path: str | Path | None = None) -> tuple[float, float]:
    """Return (mean, max) |error| of predicting each fitted point's MFU by the geometric mean of the
    others' -- what one would use without a model, and the bar the model has to clear."""
    points, _, _ = load_points(path)
    mfu = np.array([p.mfu for p in points if p.use == "fit"])
    errs = [math.exp(np.mean(np.log(np.delete(mfu, i)))) / x - 1.0 for i, x in enumerate(mfu)]
    return float(np.mean(np.abs(errs))), float(np.max(np.abs(errs)))


def format_variants(path: str | Path | None = None, setups: Sequence[Sequence[str]] = SETUPS) -> str:
    """Return the leave-one-out comparison of the model variants (fitted parameters x setup facts
    taken into account) and the constant baseline."""
    lines = [f"{'setup':<19} {'fitted parameters':<36} {'in-sample mean/max':>19} {'leave-one-out mean/max':>23}"]
    for setup in setups:
        for free in VARIANTS:
            s = calibrate(path, free, setup).summary()
            mark = "  <- default" if tuple(free) == FREE_PARAMS and tuple(setup) == SETUP else ""
            lines.append(f"{'+'.join(setup) or 'neither':<19} {', '.join(free):<36} "
                         f"{s['in_sample_mean_abs']:8.1%} / {s['in_sample_max_abs']:6.1%}"
                         f"   {s['leave_one_out_mean_abs']:10.1%} / {s['leave_one_out_max_abs']:6.1%}{mark}")
    mean, mx = constant_baseline(path)
    lines.append(f"{'constant MFU (geometric mean of the others)':<56} {'':>19}   {mean:10.1%} / {mx:6.1%}")
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="Fit and validate the training stage's MFU model.")
    ap.add_argument("--points", default=None, help="points file (default: sim/specs/mfu_points.yaml)")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--variants", action="store_true", help="compare the nested model variants (leave-one-out)")
    ap.add_argument("--setup", default=",".join(SETUP),
                    help=f"comma-separated facts of each source's setup to model, of {', '.join(SETUP_FACTS)} "
                         f"(default: {','.join(SETUP) or 'none'})")
    args = ap.parse_args(argv)
    if args.variants:
        print(format_variants(args.points))
        return 0
    setup = tuple(f for f in args.setup.split(",") if f)
    if set(setup) - set(SETUP_FACTS):
        ap.error(f"--setup: unknown {sorted(set(setup) - set(SETUP_FACTS))}; choose from {', '.join(SETUP_FACTS)}")
    cal = calibrate(args.points, FREE_PARAMS, setup)
    print(json.dumps(cal.to_json(), indent=1) if args.json else format_calibration(cal))
    return 0


if __name__ == "__main__":
    sys.exit(main())
