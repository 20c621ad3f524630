"""One RLSim run as data: every setting a dataclass field with a default and a help text.

Design note
-----------
A run is a :class:`RunConfig` of sections (cluster, fabric, train, generation, workload, loop,
cost). Each field carries its help text and its allowed values in ``field(metadata=...)``, so the
same declaration documents the YAML file (:func:`config_reference` prints it), validates it on load
(:func:`load_run_config`, through :class:`fabric.config.Reader`, so every refusal names the file, the
field and what is allowed) and is what the simulator reads. Unknown keys are refused: a typo must not
fall back to a default. Checks that span fields (a layout that does not tile the training GPUs, a
topology of the wrong size) are made at load time too, and name the field a user would change.

A YAML file needs only what differs from the defaults::

    name: qwen14b-64
    model: Qwen2.5-14B
    cluster: {gpus: 64, train_gpus: 32}
    fabric: {kind: rfabric, link_gbps: 200, ocs: piezo}
    loop: {mode: async, iterations: 3, seed: 0}
"""

from __future__ import annotations

import math
import os
import typing
from dataclasses import MISSING, dataclass, field, fields, replace
from typing import Any, Mapping

from orchestrl.compute_sched.hardware import SPECS_DIR, GpuSpec, ModelSpec, bundled_gpus, bundled_models, load_gpu, load_model
from orchestrl.compute_sched.traces import load_trace
from orchestrl.fabric.config import Reader, load_document
from orchestrl.fabric.cost import PRICES_USD, default_rfabric_spec
from orchestrl.fabric.errors import ConfigError
from orchestrl.fabric.fabric_spec import OCS_TECHNOLOGIES, FabricSpec
from orchestrl.fabric.layout import ParallelLayout
from orchestrl.fabric.topology import load_topology
from orchestrl.sim.network.config import FABRICS, GPUS_PER_SERVER
from orchestrl.sim.workload import step_size

__all__ = ["ClusterSettings", "FabricSettings", "TrainSettings", "GenerationSettings", "WorkloadSettings",
           "LoopSettings", "CostSettings", "RunConfig", "load_run_config", "config_from_mapping",
           "config_reference", "validate", "default_rfabric_for_run", "no_split_error", "MODES", "GEN_POLICIES",
           "SYNC_METHODS", "ALLOCATIONS", "MAX_RESPONSES_PER_GPU", "MAX_CONTEXT_TOKENS"]

MODES = ("sync", "async")
GEN_POLICIES = ("orchestrl", "orchestrl-pp", "orchestrl-rb", "verl-to", "static", "two-phase")  # as sim.stages.generation
GEN_STEP_MODELS = ("measured", "analytical")  # compute_sched.calibration.STEP_MODELS, the default first
SYNC_METHODS = ("planned", "flat")
ALLOCATIONS = ("greedy", "greedy+ls", "uniform")
# A sanity bound on a step, 16x App. F's 16 responses per generation GPU: past it the engines only queue
# behind full batches, so throughput no longer moves (64 GPUs: 11.1 -> 11.8 samples/s from 128 to 1,024
# per generation GPU) while simulating one iteration grows superlinearly (1,024: 87 s; 8,192: > 10 min).
MAX_RESPONSES_PER_GPU = 256
# The longest context of the bundled models (Qwen2.5 and Qwen3, 128K tokens with YaRN).
MAX_CONTEXT_TOKENS = 131072


def _f(default: Any, help: str, **meta: Any) -> Any:
    """A dataclass field with its help text and validation metadata (choices, min, max)."""
    return field(default=default, metadata={"help": help, **meta})


@dataclass(frozen=True)
class ClusterSettings:
    gpus: int = _f(64, "GPUs in the cluster, in servers of 8 with one NIC per GPU (§7.2); at most 16,384 "
                       "(sim/feasibility.py: the generation planner's routing grows with the fabric)", min=16,
                   max=16384)
    gpu: str = _f("H800", "accelerator spec: a YAML file, relative to this file (absolute paths as they are), "
                          "or else a bundled name (compute_sched/specs/gpus)")
    train_gpus: int | None = _f(None, "GPUs of the training cluster (GPUs 0..train_gpus-1; the rest generate). "
                                      "Omit for the balanced split: StreamRL's rule, the candidate with the most "
                                      "samples per step period, found by running both stages", min=8)


@dataclass(frozen=True)
class FabricSettings:
    kind: str = _f("rfabric", "the network fabric (§7.2)", choices=FABRICS)
    link_gbps: int = _f(200, "line rate of every NIC, switch link and circuit, Gb/s (a Table 4 price point)",
                        choices=tuple(PRICES_USD))
    ocs: str | None = _f(None, "OCS technology of RFabric's devices (Table 2); sets the switching delay. "
                               "Omit for the topology's own (piezo, 25 ms, by default)", choices=tuple(OCS_TECHNOLOGIES))
    topology: str | None = _f(None, "RFabric topology file, relative to this file (used only when kind is "
                                    "rfabric); omit for the cost model's RFabric for the GPU count (PoDs of 32 "
                                    "servers, piezo OCS), which below 256 GPUs is cut into two or more equal PoDs "
                                    "(64 GPUs: 2 of 4 servers, as §6's testbed) so Train and Gen get whole PoDs")
    allocation: str = _f("greedy", "RFabric circuit allocation of the controller (greedy = Algorithm 3)",
                         choices=ALLOCATIONS)
    ecmp: str = _f("fluid", "ECMP as a fluid split over equal-cost paths, or one hashed path per flow",
                   choices=("fluid", "hash"))
    switch_radix: int = _f(64, "ports of every EPS switch (Clos fabrics, RFabric's ToRs), in the simulator and "
                               "the cost model; 16 makes a 64-GPU Clos two-tier, so FT-OS is oversubscribed",
                           choices=(8, 16, 32, 64, 128))
    oversubscription: int = _f(3, "FT-OS's leaf down:up ratio R:1 (the paper's 3); the simulator's wiring only "
                                  "(the cost model prices the 3:1 FT-OS)", min=1, max=63)
    mtu_bytes: int = _f(9216, "packet size: every hop adds one MTU of store-and-forward serialisation (§7.2: 9216)",
                        min=64, max=65536)
    same_server: str = _f("nvlink", "how a flow between GPUs of one server travels: NVLink (a DGX-style server) or "
                                    "network (out of its NIC and back: one NIC per host, as packet simulators "
                                    "model hosts)", choices=("nvlink", "network"))
    ocs_delay_s: float | None = _f(None, "RFabric's OCS switching delay in seconds, any value; overrides "
                                         "fabric.ocs's Table 2 delay. Omit for the technology's", min=0.0,
                                   max=3600.0)


@dataclass(frozen=True)
class TrainSettings:
    tp: int = _f(8, "tensor parallel size of training (Appendix C: 72B TP8 PP2 CP3; 57B TP4 EP16)", min=1)
    cp: int = _f(1, "context parallel size", min=1)
    ep: int = _f(1, "expert parallel size (MoE; re-partitions the same ranks)", min=1)
    pp: int = _f(1, "pipeline parallel size", min=1)
    order: str = _f("tp-cp-ep-dp-pp", "Megatron rank order, fastest dimension first")


@dataclass(frozen=True)
class GenerationSettings:
    policy: str = _f("orchestrl", "generation scheduler: OrchestrRL's (Algorithm 1; -pp planner only, -rb "
                                  "balancer only), static veRL-TO (best TP of a sweep), static (`instance` on every "
                                  "GPU, e.g. AFD), or two-phase (`instance`, then `switch_to`, §7.3.2)",
                     choices=GEN_POLICIES)
    instance: str | None = _f(None, "generation instance shape (tp8, ep16-tp1, afd24:16-tp8: 24 attention + "
                                    "16 FFN GPUs, TP8 attention); required by static and two-phase, the start "
                                    "layout of orchestrl; omit for the policy's own")
    switch_to: str | None = _f(None, "two-phase: the instance shape every GPU switches to, e.g. tp8")
    switch_at: float = _f(0.5, "two-phase: share of the step's requests finished when the switch happens",
                          min=0.0, max=1.0)
    weight_sync_tp: int = _f(8, "TP degree of the generation engines the weights are resharded into at the "
                                "weight-sync boundary", min=1, max=64)
    step_model: str = _f("measured", "step times of the generation engines: measured (sums of measured GPU "
                                     "operator times, docs/step-model.md) or analytical (the roofline of "
                                     "compute_sched/perf.py)", choices=GEN_STEP_MODELS)


@dataclass(frozen=True)
class WorkloadSettings:
    responses_per_prompt: int = _f(8, "GRPO group size: responses sampled per prompt", min=1)
    responses_per_gen_gpu: int = _f(16, "responses per step per generation GPU when prompts_per_step is "
                                        "omitted (App. F sizes steps at 16 requests per GPU)", min=1,
                                    max=MAX_RESPONSES_PER_GPU)
    prompts_per_step: int | None = _f(None, "prompts per RL step; omit to scale the step to the generation "
                                            "GPUs (responses_per_gen_gpu). A step holds at most "
                                            f"{MAX_RESPONSES_PER_GPU} responses per GPU of the cluster (past that "
                                            "engines only queue: throughput is flat, simulation time is not)", min=1)
    max_tokens: int = _f(15360, "generation length cap, tokens (§6: 15K and 25K; at most the bundled models' "
                                "longest context, 128K)", min=16, max=MAX_CONTEXT_TOKENS)
    length_scale: float = _f(1.0, "multiplies every response length of the synthetic trace", min=0.01)
    drift_per_step: float = _f(0.0, "relative growth of response lengths per RL step", min=0.0, max=1.0)
    trace: str | None = _f(None, "a generation-step trace file (compute_sched/traces.py format), relative to "
                                 "this file; whole GRPO groups are resampled to the step size. Omit for the "
                                 "deepmath-style synthetic heavy tail")


@dataclass(frozen=True)
class LoopSettings:
    mode: str = _f("async", "synchronous (Gen -> Train -> Sync) or one-step asynchronous (Figure 1)",
                   choices=MODES)
    iterations: int = _f(3, "RL iterations to simulate", min=1, max=10000)
    seed: int = _f(0, "seed of the length traces", min=0)
    weight_sync: str = _f("planned", "weight-sync schedule: the collectives planner (App. E) or the flat "
                                     "veRL-style baseline", choices=SYNC_METHODS)
    job: str = _f("rl-job", "job name on the fabric controller")


@dataclass(frozen=True)
class CostSettings:
    gpu_usd_per_hour: float | None = _f(None, "GPU price per hour; omit for RollMux Table 1 (H800 $5.28/h, "
                                              "H20 $1.85/h)", min=0.0)
    network_amortization_years: float = _f(3.0, "years the network's purchase price is spread over to give "
                                                 "a price per hour (an assumption; Table 4 prices are one-off)",
                                           min=0.1)
    min_clos_tiers: int = _f(1, "fewest tiers of the Clos fabrics in the cost model (3: the k-ary fat-tree "
                                "of [29]; see docs/cost-model.md)", min=1, max=3)


@dataclass(frozen=True)
class RunConfig:
    name: str = _f("run", "a label for reports")
    model: str = _f("Qwen2.5-14B", "policy model: a YAML file, relative to this file (absolute paths as they "
                                   "are), or else a Table 3 name (compute_sched/specs/models)")
    cluster: ClusterSettings = field(default_factory=ClusterSettings, metadata={"help": "GPUs and the Train/Gen split"})
    fabric: FabricSettings = field(default_factory=FabricSettings, metadata={"help": "the network"})
    train: TrainSettings = field(default_factory=TrainSettings, metadata={"help": "training layout"})
    generation: GenerationSettings = field(default_factory=GenerationSettings, metadata={"help": "generation"})
    workload: WorkloadSettings = field(default_factory=WorkloadSettings, metadata={"help": "length traces"})
    loop: LoopSettings = field(default_factory=LoopSettings, metadata={"help": "RL iterations"})
    cost: CostSettings = field(default_factory=CostSettings, metadata={"help": "throughput per dollar"})
    source: str = field(default="<defaults>", compare=False, metadata={"help": "", "internal": True})

    def with_fabric(self, kind: str) -> "RunConfig":
        """Return this run on another fabric (everything else equal), validated."""
        return validate(replace(self, fabric=replace(self.fabric, kind=kind)))

    def train_layout(self, train_gpus: int) -> ParallelLayout:
        """Return the training layout on ``train_gpus`` GPUs (DP fills what TP x CP x PP leaves)."""
        t = self.train
        return ParallelLayout(tp=t.tp, cp=t.cp, ep=t.ep, pp=t.pp, dp=train_gpus // (t.tp * t.cp * t.pp), order=t.order)

    def resolve(self, path: str | None) -> str | None:
        """Return a path of the file relative to the config file's folder."""
        if path is None or os.path.isabs(path) or self.source.startswith("<"):
            return path
        return os.path.join(os.path.dirname(os.path.abspath(self.source)), path)

    def model_spec(self) -> ModelSpec:
        """Return the policy model: ``model`` as a file relative to this file, else a bundled name."""
        return load_model(_spec_file(self, "model", self.model, "models", bundled_models))

    def gpu_spec(self) -> GpuSpec:
        """Return the accelerator: ``cluster.gpu`` as a file relative to this file, else a bundled name."""
        return load_gpu(_spec_file(self, "cluster.gpu", self.cluster.gpu, "gpus", bundled_gpus))

    def rfabric_spec(self) -> FabricSpec:
        """Return the RFabric this run simulates and prices (its topology file's, or the default)."""
        f = self.fabric
        if f.topology is not None:
            return _topology_spec(self)
        try:
            return default_rfabric_for_run(self.cluster.gpus, f.link_gbps, switch_radix=f.switch_radix)
        except ConfigError as exc:
            raise ConfigError(self.source, "cluster.gpus", exc.problem,
                              exc.allowed.replace("or pass rfabric_spec", "or set fabric.topology")) from None

    def to_json(self) -> dict[str, Any]:
        return {f.name: (_section_json(getattr(self, f.name)) if _is_section(f) else getattr(self, f.name))
                for f in fields(self) if not f.metadata.get("internal")}


def _is_section(f) -> bool:
    return f.default_factory is not MISSING


def _section_json(section: Any) -> dict[str, Any]:
    return {f.name: getattr(section, f.name) for f in fields(section)}


# ------------------------------------------------------------------ loading


def load_run_config(path: str | os.PathLike[str]) -> RunConfig:
    """Return the run described by a YAML (or JSON) file, validated field by field.

    Raises
    ------
    ConfigError
        Naming the file, the field and what is allowed, for any bad or unknown value.
    """
    return config_from_mapping(load_document(path))


def config_from_mapping(reader: Reader | Mapping[str, Any], source: str = "<config>") -> RunConfig:
    """Return the run a mapping describes (a :class:`fabric.config.Reader` or a plain dict)."""
    r = reader if isinstance(reader, Reader) else Reader(reader, source)
    top = _read(r, RunConfig)
    return validate(replace(top, source=r.source))


def _read(r: Reader, cls: type) -> Any:
    hints = typing.get_type_hints(cls)
    names = [f.name for f in fields(cls) if not f.metadata.get("internal")]
    r.reject_unknown(names)
    values: dict[str, Any] = {}
    for f in fields(cls):
        if f.metadata.get("internal") or not r.has(f.name) or r.data[f.name] is None:
            continue
        if _is_section(f):
            values[f.name] = _read(r.section(f.name), hints[f.name])
            continue
        kind = _base_type(hints[f.name])
        lo, hi, choices = f.metadata.get("min"), f.metadata.get("max"), f.metadata.get("choices")
        if kind is int:
            v = r.int(f.name, minimum=lo, maximum=hi)
            if choices is not None and v not in choices:
                raise r.error(f.name, f"unsupported value {v}", ", ".join(str(c) for c in choices))
        elif kind is float:
            v = r.float(f.name, minimum=lo, maximum=hi)
        elif kind is bool:
            v = r.bool(f.name)
        else:
            v = r.str(f.name, choices=choices)
        values[f.name] = v
    return cls(**values)


def _base_type(hint: Any) -> type:
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


def validate(cfg: RunConfig) -> RunConfig:
    """Check what spans fields; raise :class:`ConfigError` naming the field to change."""
    src = cfg.source
    _check_fields(cfg)
    c, t = cfg.cluster, cfg.train
    model = cfg.model_spec()  # a file's own errors name that file and its field
    cfg.gpu_spec()
    if c.gpus % GPUS_PER_SERVER:
        raise ConfigError(src, "cluster.gpus", f"{c.gpus} is not a whole number of 8-GPU servers", "a multiple of 8")
    unit = t.tp * t.cp * t.pp
    if c.train_gpus is not None:
        if c.train_gpus % GPUS_PER_SERVER or not 0 < c.train_gpus < c.gpus:
            raise ConfigError(src, "cluster.train_gpus", f"{c.train_gpus} of {c.gpus} GPUs",
                              f"a multiple of 8 between 8 and {c.gpus - 8}, leaving GPUs to generate")
        if c.train_gpus % unit:
            raise ConfigError(src, "cluster.train_gpus", f"{c.train_gpus} is not a multiple of tp*cp*pp = {unit}",
                              f"a multiple of {unit}")
    try:
        if c.train_gpus is not None:
            cfg.train_layout(c.train_gpus)
        else:
            ParallelLayout(order=t.order)  # the order alone; the sizes are checked per candidate split
    except ConfigError as exc:
        raise ConfigError(src, f"train.{exc.field}", exc.problem, exc.allowed) from None
    if t.pp > model.layers:
        raise ConfigError(src, "train.pp", f"{t.pp} stages for {model.layers} layers", f"at most {model.layers}")
    _check_generation(cfg, model)
    _check_feasible(cfg, model)
    wtp = cfg.generation.weight_sync_tp
    if model.kv_heads * model.head_dim % wtp or model.d_model % wtp:
        raise ConfigError(src, "generation.weight_sync_tp", f"TP={wtp} does not split {model.name}'s "
                          f"{model.kv_heads} KV heads of {model.head_dim} evenly", "1, 2, 4 or 8")
    if c.train_gpus is not None and (c.gpus - c.train_gpus) % wtp:
        raise ConfigError(src, "generation.weight_sync_tp", f"TP={wtp} does not divide the "
                          f"{c.gpus - c.train_gpus} generation GPUs", "a divisor of cluster.gpus - cluster.train_gpus")
    f = cfg.fabric
    if f.kind == "rfabric":
        spec = cfg.rfabric_spec()
        gpus = spec.pods * spec.servers_per_pod * spec.gpus_per_server
        if f.topology is not None and gpus != c.gpus:
            raise ConfigError(src, "fabric.topology", f"{f.topology} has {gpus} GPUs, the run {c.gpus}",
                              "a topology of cluster.gpus GPUs")
        if f.topology is not None and abs(spec.link_bps - f.link_gbps * 1e9) > 1:
            raise ConfigError(src, "fabric.link_gbps", f"{f.link_gbps} differs from {f.topology}'s "
                              f"{spec.link_bps / 1e9:g} Gb/s", "the topology's link speed")
    w = cfg.workload
    responses = w.responses_per_prompt * step_size(w.responses_per_prompt, w.responses_per_gen_gpu,
                                                   c.gpus - (c.train_gpus or GPUS_PER_SERVER), w.prompts_per_step)
    if responses > MAX_RESPONSES_PER_GPU * c.gpus:
        name = "prompts_per_step" if w.prompts_per_step is not None else "responses_per_prompt"
        raise ConfigError(src, f"workload.{name}", f"a step of {responses:,} responses is over {MAX_RESPONSES_PER_GPU} "
                          f"per GPU of the {c.gpus}-GPU cluster, a sanity bound (16x App. F's step): past it the "
                          "engines only queue, so throughput stays flat while simulation time grows superlinearly",
                          f"prompts_per_step x responses_per_prompt <= {MAX_RESPONSES_PER_GPU * c.gpus:,}, or "
                          "more cluster.gpus")
    if w.trace is not None:
        path = cfg.resolve(w.trace)
        if not os.path.isfile(path):
            raise ConfigError(src, "workload.trace", f"{w.trace} does not exist ({path} is not a file)",
                              "a trace file relative to this file")
        load_trace(path)  # its own errors name the trace file and field, before any simulation
    return cfg


def _check_generation(cfg: RunConfig, model: Any) -> None:
    """Instance shapes parse and hold the model; static and two-phase name theirs."""
    from orchestrl.compute_sched.layout import parse_config  # light: layouts only
    from orchestrl.compute_sched.perf import PerfModel

    g, src = cfg.generation, cfg.source
    perf = PerfModel(model, cfg.gpu_spec())
    for name in ("instance", "switch_to"):
        value = getattr(g, name)
        if value is None:
            continue
        try:
            shape = parse_config(value)
        except ConfigError:
            raise ConfigError(src, f"generation.{name}", f"{value!r} is not an instance shape",
                              "tpK, epN-tpK or afdA:F-tpK, e.g. tp8, ep16-tp1 or afd24:16-tp8") from None
        gen_gpus = cfg.cluster.gpus - (cfg.cluster.train_gpus or 0)
        if shape.gpus > gen_gpus:
            raise ConfigError(src, f"generation.{name}", f"{shape.name} needs {shape.gpus} GPUs, the run generates "
                              f"on {gen_gpus}", "a smaller shape, or more generation GPUs")
        if not perf.fits(shape):
            raise ConfigError(src, f"generation.{name}", f"{model.name} does not fit {shape.name} on "
                              f"{cfg.cluster.gpu}", "a shape with more GPUs per instance")
    if g.policy in ("static", "two-phase") and g.instance is None:
        raise ConfigError(src, "generation.instance", f"policy {g.policy!r} needs an instance shape",
                          "e.g. instance: afd24:16-tp8")
    if g.policy == "two-phase" and g.switch_to is None:
        raise ConfigError(src, "generation.switch_to", "policy 'two-phase' needs the shape it switches to",
                          "e.g. switch_to: tp8")
    if g.policy != "two-phase" and g.switch_to is not None:
        raise ConfigError(src, "generation.switch_to", f"is only read by policy 'two-phase', not {g.policy!r}",
                          "remove it, or set policy: two-phase")


def _check_feasible(cfg: RunConfig, model: ModelSpec) -> None:
    """Refuse layouts no cluster could run (sim/feasibility.py): head/expert splits, training memory, size."""
    from orchestrl.compute_sched.layout import parse_config
    from orchestrl.sim.feasibility import MAX_GPUS, check_parallel_shapes, check_training_memory

    c, t, g, src = cfg.cluster, cfg.train, cfg.generation, cfg.source
    if c.gpus > MAX_GPUS:
        raise ConfigError(src, "cluster.gpus", f"{c.gpus:,} GPUs: the generation planner routes every instance's "
                          "traffic over the whole fabric, which takes minutes per iteration past 16K GPUs",
                          f"at most {MAX_GPUS:,}; or simulate one slice of the cluster")
    check_parallel_shapes(src, model, GPUS_PER_SERVER, instance_field="generation.instance", tp=t.tp, ep=t.ep)
    for name in ("instance", "switch_to"):
        value = getattr(g, name)
        if value is not None:
            shape = parse_config(value)
            check_parallel_shapes(src, model, GPUS_PER_SERVER, instance_field=f"generation.{name}",
                                  gen_tp=shape.tp, gen_kind=shape.kind)
    gpu = cfg.gpu_spec()
    user_file = os.path.isfile(cfg.resolve(c.gpu) or "")
    if user_file and abs(gpu.nic_bps - cfg.fabric.link_gbps * 1e9) > 1.0:
        # every number a user sets is used or refused: RLSim's NICs run at the fabric's line rate
        raise ConfigError(src, "cluster.gpu", f"{c.gpu} sets nic_bps = {gpu.nic_bps:.3g}, but the simulated NICs run "
                          f"at fabric.link_gbps = {cfg.fabric.link_gbps} Gb/s and would ignore it",
                          f"nic_bps: {cfg.fabric.link_gbps}e9 in {c.gpu}, or fabric.link_gbps set to the NIC's rate")
    # the largest training share any split can take: a bound, so refuse only what no split can hold
    train = c.train_gpus if c.train_gpus is not None else c.gpus - GPUS_PER_SERVER
    check_training_memory(src, model, gpu, train, tp=t.tp, cp=t.cp, ep=t.ep, pp=t.pp,
                          field="cluster.train_gpus" if c.train_gpus is not None else "cluster.gpus")


def _check_fields(cfg: RunConfig) -> None:
    """Check every field against its declared choices and range (for configs built in code)."""
    for f in fields(RunConfig):
        if f.metadata.get("internal"):
            continue
        section = getattr(cfg, f.name)
        items = ([(f"{f.name}.{g.name}", getattr(section, g.name), g.metadata) for g in fields(section)]
                 if _is_section(f) else [(f.name, section, f.metadata)])
        for path, value, meta in items:
            if value is None:
                continue
            choices, lo, hi = meta.get("choices"), meta.get("min"), meta.get("max")
            if choices is not None and value not in choices:
                raise ConfigError(cfg.source, path, f"unknown value {value!r}", ", ".join(str(c) for c in choices))
            if (lo is not None and value < lo) or (hi is not None and value > hi):
                raise ConfigError(cfg.source, path, f"value {value} is out of range", _allowed(meta))


def _topology_spec(cfg: RunConfig) -> FabricSpec:
    path = cfg.resolve(cfg.fabric.topology)
    if not os.path.isfile(path):
        raise ConfigError(cfg.source, "fabric.topology", f"{cfg.fabric.topology} does not exist ({path} is not a "
                          "file)", "a topology YAML file relative to this file")
    return load_topology(path).spec


def _spec_file(cfg: RunConfig, path_field: str, value: str, kind: str, bundled) -> str:
    """Return the file a model or GPU field names: a file relative to the run file, else a bundled name.

    Names match as :mod:`compute_sched.hardware` matches them (file stem or ``name``, case and ``_``
    insensitive), but only after the run file's folder: a relative path means the same file from any cwd.
    """
    path = cfg.resolve(value)
    if os.path.isfile(path):
        return path
    wanted = value.lower().replace("_", "-")
    names = bundled()  # in the order of the sorted spec files, as compute_sched lists them
    for spec, name in zip(sorted((SPECS_DIR / kind).glob("*.yaml")), names):
        if wanted in (spec.stem, name.lower()):
            return str(spec)
    noun = "model" if kind == "models" else "GPU"
    raise ConfigError(cfg.source, path_field, f"{value!r} is neither a file (no file {path}; paths are relative "
                      f"to this file) nor a bundled {noun}", ", ".join(names))


# One PoD of the cost model's RFabric (32 servers, examples/topology-2048gpu.yaml); below it the
# default cuts the cluster into equal PoDs, because Train and Gen are split in whole PoDs.
_FULL_POD_SERVERS = default_rfabric_spec(2048).servers_per_pod


def default_rfabric_for_run(gpus: int, link_gbps: float = 200, *, switch_radix: int = 64) -> FabricSpec:
    """Return the RFabric a run without ``fabric.topology`` simulates and prices.

    From one full PoD (256 GPUs) on, the cost model's :func:`fabric.cost.default_rfabric_spec`. A
    smaller cluster would be a single PoD there, which leaves no split in whole PoDs, so it is cut
    into the fewest equal PoDs (at least two; 64 GPUs: 2 PoDs of 4 servers, the shape of §6's
    testbed), each wired as the cost model wires a PoD of that size, with boundary fibres to
    OCS-Core as half its ToR uplinks.

    Raises
    ------
    ConfigError
        As :func:`fabric.cost.default_rfabric_spec` (not whole servers, or not whole PoDs above 256).

    Examples
    --------
    >>> s = default_rfabric_for_run(64)
    >>> s.pods, s.servers_per_pod, s.boundary_ports_per_pod
    (2, 4, 16)
    >>> default_rfabric_for_run(2048) == default_rfabric_spec(2048)
    True
    """
    spec = default_rfabric_spec(gpus, link_gbps, switch_radix=switch_radix)
    servers = spec.pods * spec.servers_per_pod
    if spec.pods > 1 or servers >= _FULL_POD_SERVERS or servers < 2:
        return spec
    pods = min(d for d in range(2, servers + 1) if servers % d == 0)
    return replace(default_rfabric_spec(gpus, link_gbps, switch_radix=switch_radix, servers_per_pod=servers // pods),
                   name=f"rfabric-{gpus}-default-{pods}pods", source="default_rfabric_for_run")


def no_split_error(cfg: RunConfig, unit_gpus: int, pod_gpus: int) -> ConfigError:
    """Return the error for a cluster with no Train/Gen split in whole PoDs, naming why and what to change.

    ``unit_gpus`` is the training layout's model-parallel unit (dense and expert groups both tile it)
    and ``pod_gpus`` the split's granularity (an RFabric PoD, else a server).
    """
    c, f, t = cfg.cluster, cfg.fabric, cfg.train
    if f.kind == "rfabric" and pod_gpus >= c.gpus:
        fixes = "set cluster.train_gpus (Train and Gen then share the PoD) or a fabric.topology of two or more PoDs"
        if f.topology is None:
            return ConfigError(cfg.source, "cluster.gpus", f"RFabric with {pod_gpus} GPUs per PoD makes the cluster "
                               "a single PoD; splits are whole PoDs", f"{2 * pod_gpus} or more GPUs in whole PoDs of "
                               f"{pod_gpus}; or {fixes}")
        return ConfigError(cfg.source, "fabric.topology", f"RFabric with {pod_gpus} GPUs per PoD makes the cluster "
                           "a single PoD; splits are whole PoDs", fixes)
    step = math.lcm(unit_gpus, pod_gpus, 8)
    granule = f"whole PoDs of {pod_gpus} GPUs" if f.kind == "rfabric" else "whole servers"
    return ConfigError(cfg.source, "cluster.gpus", f"the training layout's unit of {unit_gpus} GPUs "
                       f"(tp*cp*pp = {t.tp * t.cp * t.pp}, tp*ep*pp = {t.tp * t.ep * t.pp}) in {granule} needs "
                       f"{step} training GPUs, and {c.gpus} GPUs leave none to generate",
                       f"at least {step + pod_gpus} GPUs, or a smaller train.tp, cp, ep or pp")


def config_reference() -> str:
    """Return every field of a run file as a Markdown table: path, default, allowed values, help."""
    rows = ["| field | default | allowed | meaning |", "|---|---|---|---|"]
    top = RunConfig()
    for f in fields(RunConfig):
        if f.metadata.get("internal"):
            continue
        if _is_section(f):
            sec = getattr(top, f.name)
            for g in fields(sec):
                rows.append(_row(f"{f.name}.{g.name}", getattr(sec, g.name), g.metadata))
        else:
            rows.append(_row(f.name, getattr(top, f.name), f.metadata))
    return "\n".join(rows)


def _allowed(meta: Mapping[str, Any]) -> str:
    """Return what a field accepts, in words, from its metadata."""
    if "choices" in meta:
        return ", ".join(str(c) for c in meta["choices"])
    lo, hi = meta.get("min"), meta.get("max")
    if lo is None and hi is None:
        return ""
    return f">= {lo}" if hi is None else (f"<= {hi}" if lo is None else f"{lo} to {hi}")


def _row(path: str, default: Any, meta: Mapping[str, Any]) -> str:
    shown = "(omitted)" if default is None else f"`{default}`"
    return f"| `{path}` | {shown} | {_allowed(meta)} | {meta['help']} |"
