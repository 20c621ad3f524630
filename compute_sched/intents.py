"""Generation-intent announcement: when a layout changes, tell the fabric what the new one will send.

The announcement is the intent *document* of :mod:`fabric.intent` (the mapping
``intent_from_mapping`` reads), so anything that accepts intents takes it: the host agent
(:class:`agents.host_agent.HostAgent` ``.announce``), or the controller in-process through
:class:`ControllerSink`. Each instance contributes its dominant collective (Table 1, Gen stage):
TP instances an all-reduce inside their GPUs (TP-local, served by NVLink), EP instances an all-to-all
over their GPUs, AFD instances the per-layer M2N exchange from attention to FFN GPUs. Byte volumes
are per rank over the announced period, from the performance model at the expected batch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Protocol, Sequence

from orchestrl.compute_sched.hardware import DTYPE_BYTES
from orchestrl.compute_sched.layout import Layout
from orchestrl.compute_sched.perf import PerfModel
from orchestrl.fabric.errors import ConfigError

__all__ = ["IntentSink", "RecordingSink", "ControllerSink", "generation_intent"]


class IntentSink(Protocol):
    """Anything that takes a generation intent document (the host agent, the controller, a recorder)."""

    def announce(self, intent: Mapping[str, Any], t_s: float | None = None) -> None: ...


@dataclass
class RecordingSink:
    """Keeps every announcement (simulation, tests, the replay report)."""

    announced: list[tuple[float | None, dict[str, Any]]] = field(default_factory=list)

    def announce(self, intent: Mapping[str, Any], t_s: float | None = None) -> None:
        self.announced.append((t_s, dict(intent)))


@dataclass
class ControllerSink:
    """Hands intents to an in-process :class:`fabric.controller.FabricController` (Algorithm 2)."""

    controller: Any  # fabric.controller.FabricController
    results: list[Any] = field(default_factory=list)

    def announce(self, intent: Mapping[str, Any], t_s: float | None = None) -> None:
        from orchestrl.fabric.intent import intent_from_mapping

        parsed = intent_from_mapping(intent, f"<gen intent of {intent.get('job')}>", self.controller.topology)
        result = self.controller.materialize(parsed)
        self.controller.apply(result)
        self.results.append(result)


def generation_intent(layout: Layout, perf: PerfModel, *, job: str, global_gpus: Sequence[int],
                      batch_per_instance: float, context_tokens: float, period_s: float,
                      train_gpus: Sequence[int] = (), response_bytes_per_gpu: float = 0.0) -> dict[str, Any]:
    """Return the intent document for decoding under ``layout`` for ``period_s`` seconds.

    Parameters
    ----------
    global_gpus : sequence of int
        Fabric-wide GPU index of each cluster-local GPU (``global_gpus[g]`` for local ``g``).
    batch_per_instance, context_tokens : float
        Expected decode batch and its total context per instance, to size the volumes.
    train_gpus : sequence of int
        When given, finished responses stream to these GPUs (``response-stream``).

    Examples
    --------
    >>> from orchestrl.compute_sched.hardware import load_gpu, load_model
    >>> from orchestrl.compute_sched.layout import InstanceConfig, homogeneous
    >>> pm = PerfModel(load_model("Qwen2.5-14B"), load_gpu("H800"))
    >>> doc = generation_intent(homogeneous(InstanceConfig("tp", tp=8), 16), pm, job="j",
    ...                         global_gpus=range(32, 48), batch_per_instance=64, context_tokens=64 * 4000,
    ...                         period_s=10.0)
    >>> doc["collectives"][0]["primitive"], doc["collectives"][0]["groups"][1]
    ('all-reduce', [40, 41, 42, 43, 44, 45, 46, 47])
    """
    gmap = list(global_gpus)
    if len(gmap) < layout.total_gpus:
        raise ConfigError("generation_intent", "global_gpus", f"{len(gmap)} GPUs for a {layout.total_gpus}-GPU cluster",
                          "one fabric GPU per cluster GPU")
    m = perf.model
    tp_groups, tp_bytes, ep_groups, ep_bytes, m2n = [], 0.0, [], 0.0, []
    for inst in layout.instances:
        cfg = inst.config
        steps = period_s / max(1e-6, perf.decode_step_s(cfg, batch_per_instance, context_tokens))
        act = batch_per_instance * m.d_model * DTYPE_BYTES
        gpus = [gmap[g] for g in inst.gpu_ids]
        if cfg.kind == "tp":
            tp_groups.append(gpus)
            tp_bytes = max(tp_bytes, 2 * m.layers * act * steps)
        elif cfg.kind == "ep":
            ep_groups.append(gpus)
            ep_bytes = max(ep_bytes, 2 * m.layers * act / cfg.ep * max(1, m.experts_per_token) * steps)
        else:
            attn, ffn = gpus[:cfg.attn_gpus], gpus[cfg.attn_gpus:]
            fan = min(m.experts_per_token, cfg.ffn_gpus) if m.is_moe else 1
            m2n.append({"primitive": "m2n", "src_gpus": attn, "dst_gpus": ffn,
                        "bytes_per_rank": m.layers * act / cfg.attn_gpus * fan * steps, "label": "afd"})
    collectives: list[dict[str, Any]] = []
    if tp_groups:
        collectives.append({"primitive": "all-reduce", "groups": tp_groups, "bytes_per_rank": tp_bytes,
                            "label": "tp"})
    if ep_groups:
        collectives.append({"primitive": "all-to-all", "groups": ep_groups, "bytes_per_rank": ep_bytes,
                            "label": "ep"})
    collectives += m2n
    if train_gpus:
        used = sorted(gmap[g] for i in layout.instances for g in i.gpu_ids)
        collectives.append({"primitive": "response-stream", "gen_gpus": used, "train_gpus": list(train_gpus),
                            "bytes_per_rank": response_bytes_per_gpu})
    return {"job": job, "stage": "gen", "period": "decode-" + layout.describe().replace(" ", ""),
            "collectives": collectives}
