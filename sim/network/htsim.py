"""Cross-check a flow-level case against packets: write it for htsim, run htsim, read its completions back.

Design note
-----------
The flow-level simulator is a fluid model: max-min fair rates over fluid ECMP, no queues, no
losses. `htsim <https://github.com/Broadcom/csg-htsim>`_ (Broadcom, BSD licence; the simulator of
the NDP and EQDS papers) moves packets through queues. For the cases where a researcher needs to
know how far the fluid answer is from packets, :func:`run_htsim` writes the same case in htsim's
formats -- a ``.topo`` file for a two-tier Clos (leaves of ``d`` hosts with ``u`` uplinks, spines
joined to every leaf by equal bundles) and a connection matrix (``src->dst id k start 0 size B``) --
runs an htsim binary built outside this project, and parses each flow's completion from its
output. It is optional: :func:`find_htsim` returns None where no binary is installed, and the CLI
(``orchestrl sim net --engine htsim``) then says how to build one.

Which packet-level settings the fluid model corresponds to (:data:`HTSIM_SETTINGS`): NDP with
per-packet spraying over every path (``-strat perm``, the packet behaviour closest to fluid ECMP
with fair sharing), queues of 200 packets (1.8 MB per port at 9,000 B; with 35-50 packets trimming
makes permutations 5-11% slower than the fluid model on 128-1,024 hosts), an initial window of 60
packets (above the ~33-packet bandwidth-delay product at 200 Gb/s; NDP's default 15 halves every
flow's rate). htsim hosts have one NIC each, so the flow-level side must route same-server pairs
through the NICs too (``SimConfig(intra_server="network")``). RoCE/PFC behaviour (pause storms,
head-of-line blocking) is outside both this comparison and the fluid model.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
import time
from collections import Counter
from dataclasses import dataclass

import numpy as np

from orchestrl.fabric.errors import ConfigError
from orchestrl.sim.network.events import FlowSet

__all__ = ["HTSIM_SETTINGS", "HtsimRun", "find_htsim", "htsim_topology", "connection_matrix", "run_htsim",
           "HTSIM_ENV"]

#: htsim's command-line settings the fluid model is compared under (see the module note).
HTSIM_SETTINGS = {"strat": "perm", "q": 200, "cwnd": 60, "mtu": 9000}
#: Environment variable naming the htsim binary (else ``htsim_ndp`` on the PATH).
HTSIM_ENV = "ORCHESTRL_HTSIM"
_FINISH = re.compile(r"(?:flow_id|flowId) (\d+) .*?finished at ([0-9.e+-]+)")
_BUILD = ("build htsim outside this project: git clone https://github.com/Broadcom/csg-htsim && "
          "cd csg-htsim/sim && make && cd datacenter && make htsim_ndp; then pass --htsim "
          f"csg-htsim/sim/datacenter/htsim_ndp or set {HTSIM_ENV}")


@dataclass(frozen=True)
class HtsimRun:
    """What htsim reported: each flow's completion time (s, NaN if it did not finish) and its cost."""

    finish_s: np.ndarray
    wall_s: float
    cpu_s: float
    command: tuple[str, ...]

    @property
    def makespan_s(self) -> float:
        return float(np.max(self.finish_s)) if len(self.finish_s) and np.all(np.isfinite(self.finish_s)) else np.inf


def find_htsim(path: str | None = None) -> str | None:
    """Return an executable htsim binary: ``path``, ``$ORCHESTRL_HTSIM``, or ``htsim_ndp`` on the PATH; else None."""
    for cand in (path, os.environ.get(HTSIM_ENV), shutil.which("htsim_ndp")):
        if cand and os.path.isfile(cand) and os.access(cand, os.X_OK):
            return cand
    return None


def htsim_topology(fabric, link_gbps: float, *, link_latency_ns: float = 1000, switch_latency_ns: float = 800) -> str:
    """Return the htsim ``.topo`` text of a two-tier Clos fabric (FT or FT-OS wiring of the cost model).

    Raises
    ------
    ConfigError
        For a fabric htsim's two-tier fat-tree cannot express (not a Clos of equal leaves, a third
        tier, or unequal leaf-spine bundles), naming what to change.
    """
    src = "htsim"
    w = getattr(fabric, "wiring", None)
    if w is None or fabric.name not in ("ft", "ft-os"):
        raise ConfigError(src, "--fabric", f"{fabric.name} is not a Clos fabric htsim's fat-tree can express",
                          "ft or ft-os")
    leaves = sorted(set(fabric.leaf_of_gpu.tolist()))
    per_leaf = Counter(fabric.leaf_of_gpu.tolist())
    down = set(per_leaf.values())
    hosts = fabric.gpus
    if len(down) != 1:
        raise ConfigError(src, "--gpus", f"leaves hold {sorted(down)} hosts; htsim needs equal leaves",
                          "a host count that fills whole leaves (FT: 32 per leaf, FT-OS: 48, at radix 64)")
    d = next(iter(down))
    blocks = fabric.leaf_of_gpu.reshape(-1, d)
    if np.any(blocks != blocks[:, :1]) or len(set(blocks[:, 0].tolist())) != len(blocks):
        raise ConfigError(src, "--gpus", "hosts are not numbered leaf by leaf", "whole leaves")
    bundles: Counter = Counter()
    for u, v, c in zip(w.u, w.v, w.count):
        bundles[(min(u, v), max(u, v))] = int(c)
    spines = sorted({x for pair in bundles for x in pair} - set(leaves))
    sizes = set(bundles.values())
    if not spines:
        raise ConfigError(src, "--gpus", "a single switch: nothing for htsim to compare", "two leaves or more")
    if len(sizes) != 1 or len(bundles) != len(leaves) * len(spines):
        raise ConfigError(src, "--gpus", "leaves reach spines with unequal bundles (a partial last leaf, or a third "
                          "tier); htsim's two-tier fat-tree cannot express it",
                          "FT: 128, 256, 1,024 hosts; FT-OS: 192, 384, 768 (radix 64)")
    bundle = next(iter(sizes))
    up = bundle * len(spines)
    over = d // up
    if over * up != d:
        raise ConfigError(src, "--gpus", f"{d} down / {up} up is not an integer oversubscription", "whole leaves")
    return (f"Nodes {hosts}\nTiers 2\nPodsize {hosts}\n\nTier 0\nDownlink_speed_Gbps {link_gbps:g}\nRadix_Down {d}\n"
            f"Radix_Up {up}\nDownlink_Latency_ns {link_latency_ns:g}\nSwitch_Latency_ns {switch_latency_ns:g}\n"
            + (f"Oversubscribed {over}\n" if over > 1 else "")
            + f"\nTier 1\nDownlink_speed_Gbps {link_gbps:g}\nRadix_Down {len(leaves) * bundle}\n"
              f"Downlink_Latency_ns {link_latency_ns:g}\nSwitch_Latency_ns {switch_latency_ns:g}\nBundle {bundle}\n")


def connection_matrix(flows: FlowSet, hosts: int) -> str:
    """Return htsim's connection-matrix text for the flows (ids 1..F in flow order).

    Raises
    ------
    ConfigError
        For flows that do not all start at 0 (the comparison's connection matrices start every flow
        at once) or an empty flow.
    """
    if np.any(flows.start_s != 0):
        raise ConfigError("htsim", "flows[].start_s", "htsim's connection matrix starts every flow at 0 here",
                          "start_s 0 for every flow of an htsim cross-check")
    if np.any(flows.size_bytes <= 0):
        raise ConfigError("htsim", "flows[].bytes", "an empty flow never completes in htsim", "bytes > 0")
    lines = [f"Nodes {hosts}", f"Connections {len(flows)}"]
    lines += [f"{a}->{b} id {k} start 0 size {int(s)}"
              for k, (a, b, s) in enumerate(zip(flows.src, flows.dst, flows.size_bytes), 1)]
    return "\n".join(lines) + "\n"


def run_htsim(binary: str, fabric, flows: FlowSet, link_gbps: float, workdir: str, *,
              settings: dict | None = None, end_us: float | None = None, timeout_s: float = 3600) -> HtsimRun:
    """Write the case into ``workdir``, run ``binary`` on it, and return each flow's completion time.

    ``end_us`` bounds simulated time (default: 20x the time the bytes of the busiest host take at
    line rate, plus 10 ms). CPU time (user + system of the child) is reported beside wall time:
    on a shared machine it is the steadier cost.

    Raises
    ------
    ConfigError
        When the fabric or flows cannot be written for htsim.
    RuntimeError
        When htsim exits with an error (its last output is in the message).
    """
    s = {**HTSIM_SETTINGS, **(settings or {})}
    hosts = fabric.gpus
    os.makedirs(workdir, exist_ok=True)
    tp, cm = os.path.join(workdir, "net.topo"), os.path.join(workdir, "flows.cm")
    with open(tp, "w") as f:
        f.write(htsim_topology(fabric, link_gbps))
    with open(cm, "w") as f:
        f.write(connection_matrix(flows, hosts))
    if end_us is None:
        per_host = np.bincount(flows.src, weights=flows.size_bytes, minlength=hosts).max()
        end_us = 20 * per_host * 8 / (link_gbps * 1e9) * 1e6 + 10_000
    cmd = (binary, "-topo", tp, "-nodes", str(hosts), "-tm", cm, "-linkspeed", str(int(link_gbps * 1000)),
           "-end", str(int(end_us)), "-o", os.path.join(workdir, "log.dat"), "-strat", str(s["strat"]),
           "-q", str(s["q"]), "-cwnd", str(s["cwnd"]), "-mtu", str(s["mtu"]))
    r0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, timeout=timeout_s)
    wall = time.perf_counter() - t0
    r1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise RuntimeError(f"htsim failed ({proc.returncode}): {proc.stderr[-500:] or proc.stdout[-500:]}")
    fct = np.full(len(flows), np.nan)
    for m in _FINISH.finditer(proc.stdout):
        fct[int(m.group(1)) - 1] = float(m.group(2)) * 1e-6
    cpu = (r1.ru_utime - r0.ru_utime) + (r1.ru_stime - r0.ru_stime)
    return HtsimRun(fct, wall, cpu, cmd)


def missing_htsim_message(given: str | None) -> str:
    """Why no htsim binary is usable, and how to build one."""
    why = "no htsim binary found" if not given else f"{given} is not an executable file"
    return f"{why}; {_BUILD}"
