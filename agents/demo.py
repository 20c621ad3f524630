"""``orchestrl demo``: the main job, end to end on loopback.

Starts one emulated 3D-MEMS switch per OCS of the bundled 64-GPU fabric (subprocesses speaking
TL1 on ephemeral ports) and the control proxy in front of them, registers an RL job on all 64 GPUs
and replays RL iterations through the host agent a trainer would import: the boundary events of
each communication period (train forward/backward, gradient sync, weight sync, generation) and the
intent of the next period, which the trainer announces as soon as the previous period's last
collective has ended (so the plan can use the window before the period starts). Per period it
prints the template, circuits, predicted safe window, decision and device time. The first iteration fills the template cache (Phase 1 of §5.3) and
waits until the safe-window gate has seen enough slack; later iterations reuse the cache. At the
end every device's cross-connect table is read back over TL1 and compared with the committed plan.

Job time is simulated (events carry explicit timestamps), so the demo takes seconds, not minutes.

It ends with RLSim's view of the same 64-GPU cluster (``examples/sim/demo-64gpu.yaml``): two RL
iterations of Qwen2.5-14B simulated on FT, FT-OS and RFabric, with throughput, its ratio to FT and
throughput per dollar (:func:`sim_comparison`).
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import httpx
import yaml

__all__ = ["register", "run_demo", "sim_comparison", "EXAMPLES_DIR", "DEMO_PERIODS", "SIM_FABRICS"]

EXAMPLES_DIR = Path(__file__).resolve().parent.parent / "examples"
# One RL iteration, in the order its communication periods occur.
DEMO_PERIODS = ("train-fwd-bwd.yaml", "train-grad-sync.yaml", "weight-sync.yaml", "gen.yaml")
_JOB = "rl-job-1"
SIM_FABRICS = ("ft", "ft-os", "rfabric")  # the non-blocking reference, its cheap 3:1 version, and ours


def register(groups: argparse._SubParsersAction) -> None:
    demo = groups.add_parser("demo", help="run RL iterations against emulated switches through the proxy",
                             description="Start emulated OCS devices and the control proxy on loopback, replay RL "
                                         "iterations through the host agent, print each period's decision.")
    demo.add_argument("--examples", type=Path, default=EXAMPLES_DIR, metavar="DIR",
                      help="folder holding topology-64gpu-h800.yaml and intents/ (default: bundled examples)")
    demo.add_argument("--iterations", type=int, default=2, help="RL iterations to replay (default 2)")
    demo.add_argument("--protocol", default="tl1", choices=("tl1", "netconf", "gnmi"),
                      help="what the emulated switches speak and the proxy drives them with: Polatis TL1, NETCONF "
                           "(Polatis optical-switch YANG) or gNMI (SONiC OCS); default tl1")
    demo.set_defaults(func=lambda a: run_demo(a.examples, a.iterations, a.protocol))


def _get(url: str, path: str, token: str) -> dict:
    resp = httpx.get(url + path, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    resp.raise_for_status()
    return resp.json()


def _post(url: str, path: str, token: str, body: dict) -> dict:
    resp = httpx.post(url + path, json=body, headers={"Authorization": f"Bearer {token}"}, timeout=30)
    resp.raise_for_status()
    return resp.json()


# ------------------------------------------------------------------ the job's collectives (job clock)
# Each period's replay starts at ``t`` and returns (end of its last collective, start of the next
# period). The trainer knows which period comes next, so it announces that period's intent as soon
# as the current period's last collective has ended: inside the window the new plan must use.
def _collectives(agent, t: float, stage: str, comm: str, primitive: str, n: int, busy_s: float,
                 gap_s: float) -> tuple[float, float]:
    for _ in range(n):
        agent.collective_start(comm, stage, primitive, t_s=t)
        agent.collective_end(comm, stage, primitive, t_s=t + busy_s)
        t += busy_s + gap_s
    return t - gap_s, t


def _fwd_bwd(agent, t: float) -> tuple[float, float]:
    # 8 micro-batches: MoE all-to-all (4 ms), then 20 ms of expert and attention compute.
    return _collectives(agent, t, "train", "ep", "all-to-all", 8, 4e-3, 20e-3)


def _grad_sync(agent, t: float) -> tuple[float, float]:
    # 3 gradient buckets all-reduced back to back (2 ms apart), then the 30 ms optimizer step.
    last_end, _ = _collectives(agent, t, "train-dp", "dp", "all-reduce", 3, 15e-3, 2e-3)
    return last_end, last_end + 30e-3


def _weight_sync(agent, t: float) -> tuple[float, float]:
    # The runtime pauses 40 ms before the broadcast (staging buffers) and says so with the marker.
    agent.marker("weight-sync-begin", window_hint_s=40e-3, t_s=t)
    return _collectives(agent, t + 40e-3, "weight-sync", "ws", "weight-sync", 1, 0.3, 5e-3)


def _gen(agent, t: float) -> tuple[float, float]:
    # Engines redeploy with the new weights for 1.5 s, announced with the deployment boundary.
    agent.marker("deployment-boundary", window_hint_s=1.5, t_s=t)
    t += 1.5
    for _ in range(12):  # decode steps: TP all-reduce then MoE all-to-all, back to back
        _, t = _collectives(agent, t, "gen", "tp", "all-reduce", 1, 1e-3, 0.3e-3)
        last_end, t = _collectives(agent, t, "gen", "ep", "all-to-all", 1, 1e-3, 0.3e-3)
    return last_end, last_end + 0.1


_REPLAY = {"train-fwd-bwd.yaml": _fwd_bwd, "train-grad-sync.yaml": _grad_sync, "weight-sync.yaml": _weight_sync,
           "gen.yaml": _gen}


_ANNOUNCE_AFTER_S = 0.5e-3  # the trainer announces the next period this long after the last collective ends


def _announce(agent, doc: dict, t: float) -> dict:
    """Announce ``doc`` at job time ``t``; return the proxy's first decision on it."""
    agent.announce(doc, t_s=t)
    agent.flush()
    return agent.decisions[-1]


def _line(d: dict) -> str:
    window = "unknown" if d["window_s"] is None else f"{d['window_s'] * 1e3:.1f} ms"
    change = (f"-{d['removed']} +{d['added']} circuits on {', '.join(d['devices'])} in {d['steps']} step(s)"
              if d["devices"] else "")
    return (f"    {d['decision'].upper():<9} attempt {d['attempt']}  window {window:<9}  {d['circuits']:>3} circuits  "
            f"device time {d['device_s'] * 1e3:6.2f} ms  {change}\n      why: {d['reason']}")


def run_demo(examples: Path = EXAMPLES_DIR, iterations: int = 2, protocol: str = "tl1") -> int:
    from orchestrl.agents.host_agent import HostAgent
    from orchestrl.agents.lab import EmulatedFabric
    from orchestrl.fabric.plan import format_plan_summary, plan_from_json
    from orchestrl.fabric.ocs.model import duplex_to_cross_connects

    started = time.perf_counter()
    intents = {name: yaml.safe_load((examples / "intents" / name).read_text()) for name in DEMO_PERIODS}
    with tempfile.TemporaryDirectory(prefix="orchestrl-demo-") as work, \
            EmulatedFabric(examples / "topology-64gpu-h800.yaml", work, protocol=protocol) as lab:
        topo = lab.topology
        s = topo.summary()
        print(f"fabric {s['name']}: {s['gpus']} GPUs, {s['pods']} PoDs, {s['tors']} ToRs, "
              f"{s['ocs_agg_devices']} OCS-Agg + {s['ocs_core_devices']} OCS-Core ({s['agg_technology']}), "
              f"{s['link_gbps']:.0f} Gbps links")
        lab.start_switches()
        proxy = lab.start_proxy()
        print(f"emulated switches: {', '.join(f'{n} on :{p.port}' for n, p in sorted(lab.switches.items()))}; "
              f"proxy at {proxy.url} (started in {time.perf_counter() - started:.1f} s)")
        job = _post(proxy.url, "/v1/jobs", lab.operator_token, {"job": _JOB, "gpus": "0-63"})
        print(f"registered job {_JOB}: {job['gpus']} GPUs on {len(job['tors'])} ToRs in PoDs {job['pods']}")
        agent = HostAgent(proxy.url, job["token"], job=_JOB)
        hits = misses = 0
        t = 1000.0  # job clock, seconds
        periods = [(it, name) for it in range(iterations) for name in DEMO_PERIODS]
        first = _announce(agent, intents[periods[0][1]], t)
        for k, (it, name) in enumerate(periods):
            if name == DEMO_PERIODS[0]:
                print(f"\n=== RL iteration {it + 1} ===")
            doc = intents[name]
            last_end, t = _REPLAY[name](agent, t)
            agent.flush()
            nxt = _announce(agent, intents[periods[k + 1][1]], last_end + _ANNOUNCE_AFTER_S) \
                if k + 1 < len(periods) else None
            cache = "cache hit" if first["cache_hit"] else "cache miss (filled)"
            hits, misses = hits + first["cache_hit"], misses + (not first["cache_hit"])
            print(f"\n--- period {doc['period']} (stage {doc['stage']}): template {first['template']}, {cache}, "
                  f"plan {first['plan_id']} materialised in {first['plan_s'] * 1e3:.2f} ms")
            rows = _get(proxy.url, f"/v1/decisions?job={_JOB}&limit=50", job["token"])["decisions"]
            mine = [d for d in reversed(rows) if d["plan_id"] == first["plan_id"]]
            for d in mine:
                print(_line(d))
            if it == 0 and any(d["decision"] == "commit" for d in mine):
                plan = _get(proxy.url, f"/v1/plan?job={_JOB}", job["token"])["jobs"][_JOB]["plan"]
                print(format_plan_summary(plan_from_json(plan), topo, max_rows=8))
            first = nxt
        agent.close()
        stats = agent.stats()
        print(f"\ntemplate cache: {misses} entries, {hits} hits, {misses} misses")
        print(f"host agent: {stats.sent_events} events and {stats.sent_intents} intents sent, "
              f"{stats.dropped_full + stats.dropped_unsent} dropped")
        plan = _get(proxy.url, f"/v1/plan?job={_JOB}", job["token"])["jobs"][_JOB]["plan"]
        wanted: dict[str, dict[int, int]] = {d: {} for d in topo.devices}
        for xc in plan_from_json(plan).cross_connects() if plan else ():
            wanted[xc.device].update(duplex_to_cross_connects(xc.a_port, xc.b_port, topo.devices[xc.device].radix_ports))
        held = lab.tables()
        same = all(held[d] == wanted[d] for d in topo.devices)
        print(f"devices read back over {protocol.upper() if protocol != 'netconf' else 'NETCONF'}: {sum(map(len, held.values()))} cross-connects; "
              f"{'exactly the committed plan' if same else 'DIFFERENT FROM THE COMMITTED PLAN'}")
    print(f"demo finished in {time.perf_counter() - started:.1f} s; switches and proxy stopped")
    print("\n" + sim_comparison(examples / "sim" / "demo-64gpu.yaml"))
    return 0 if same else 1


def sim_comparison(config: Path, fabrics: tuple[str, ...] = SIM_FABRICS, iterations: int = 2) -> str:
    """Return a table of the run ``config`` simulated on each of ``fabrics``: throughput, x FT, per dollar.

    Each fabric runs the same RL iterations (same traces, split and stage models, one-step
    asynchronous); the first fabric is the reference of the ratio column.
    """
    from dataclasses import replace

    from orchestrl.sim.config import load_run_config
    from orchestrl.sim.run import simulate

    started = time.perf_counter()
    cfg = load_run_config(config)
    cfg = replace(cfg, loop=replace(cfg.loop, iterations=iterations))
    results = [(f, simulate(cfg.with_fabric(f))) for f in fabrics]
    base = results[0][1].throughput.samples_per_s
    lines = [f"RLSim: {cfg.model} on {cfg.cluster.gpus} GPUs ({cfg.cluster.train_gpus} train), {iterations} "
             f"{cfg.loop.mode} iterations per fabric ({config.name})",
             f"{'fabric':<8} {'samples/s':>9} {'x ' + fabrics[0]:>6} {'samples/$':>9} {'network $':>10} "
             f"{'gen s':>6} {'train s':>7} {'sync s':>6}"]
    for f, r in results:
        st = r.stage_means_s()
        lines.append(f"{f:<8} {r.throughput.samples_per_s:9.3f} {r.throughput.samples_per_s / base:6.3f} "
                     f"{r.samples_per_usd:9.2f} {r.cost.network_usd:10,.0f} {st['gen']:6.1f} {st['train']:7.2f} "
                     f"{st['weight-sync']:6.3f}")
    lines.append(f"(simulated in {time.perf_counter() - started:.1f} s; `orchestrl sim run {config.name} --fabric F` "
                 "for one run, docs/sim-loop.md for the model)")
    return "\n".join(lines)
