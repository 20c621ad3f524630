"""The checkpoint-engine baseline: ``torch.distributed.broadcast`` of each bucket from the rank that owns it.

Every trainer rank owns a share of the model (the same balanced shares the planner uses, so no
gather is needed) and cuts it into buckets; for each owner there is one gloo group of that owner and
every generator rank, and each bucket is broadcast in it from the owner, the way checkpoint engines
push weights to inference workers. Buckets of different owners alternate, and ``window`` broadcasts
are in flight at once, so consecutive broadcasts start from different NICs. Generators receive
*whole* buckets (an engine's loader slices them), verified bit for bit after the clock stops.

It is a generous baseline: buckets are packed before the clock starts and nothing is checksummed
or unpacked inside the timed region, while the planned schedule does all of that while it runs.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, replace
from datetime import timedelta
from typing import Sequence

import torch

from orchestrl.collectives.baseline import owner_buckets
from orchestrl.collectives.codec import ParamBuffer
from orchestrl.collectives.emulation.launch import RankGroup
from orchestrl.collectives.emulation.model import synthetic_local, synthetic_region
from orchestrl.collectives.emulation.netns import Host
from orchestrl.collectives.emulation.runner import SyncRun, free_port
from orchestrl.collectives.layout import GeneratorLayout, ParamSpec, TrainerLayout
from orchestrl.collectives.slicing import Piece, trainer_runs
from orchestrl.collectives.store import tcp_store

__all__ = ["BroadcastJob", "run_broadcast_rank", "run_broadcast"]


@dataclass(frozen=True)
class BroadcastJob:
    """One rank of the broadcast baseline (picklable)."""

    params: tuple[ParamSpec, ...]
    trainer: TrainerLayout
    generator: GeneratorLayout
    rank: int
    store_host: str
    store_port: int
    bucket_bytes: int = 4 << 20
    window: int = 2  # broadcasts in flight at once
    timeout_s: float = 120.0
    seed: int = 0
    check: bool = True


def _payload(params: Sequence[ParamSpec], pieces: Sequence[Piece], buffers: dict[int, ParamBuffer]) -> torch.Tensor:
    parts = [buffers[pc.param].narrow(pc.start, pc.stop).contiguous().reshape(-1).view(torch.uint8) for pc in pieces]
    return torch.cat(parts)


def run_broadcast_rank(job: BroadcastJob) -> dict:
    """Run the baseline as schedule rank ``job.rank`` (trainers first); return timings and the check."""
    import torch.distributed as dist

    torch.set_num_threads(1)
    t, g = job.trainer.world_size, job.generator.world_size
    world = t + g
    store = tcp_store(job.store_host, job.store_port, is_master=job.rank == 0, timeout_s=job.timeout_s,
                      world_size=world)
    buckets = owner_buckets(job.params, job.trainer, job.bucket_bytes)
    by_owner: dict[int, list[int]] = {}
    for k, (owner, _) in enumerate(buckets):
        by_owner.setdefault(owner, []).append(k)
    order = [by_owner[o][i] for i in range(max(map(len, by_owner.values()))) for o in sorted(by_owner)
             if i < len(by_owner[o])]  # owners alternate
    ifname = os.environ.get("GLOO_SOCKET_IFNAME", "")
    device = (dist.ProcessGroupGloo.create_device(interface=ifname) if ifname
              else dist.ProcessGroupGloo.create_default_device())
    groups = {}
    for owner in sorted(by_owner):
        members = [owner] + list(range(t, world))
        if job.rank in members:
            opts = dist.ProcessGroupGloo._Options()
            opts._timeout = timedelta(seconds=job.timeout_s)
            opts._devices = [device]
            groups[owner] = dist.ProcessGroupGloo(dist.PrefixStore(f"bcast/{owner}/", store),
                                                  members.index(job.rank), len(members), opts)
    payloads: dict[int, torch.Tensor] = {}
    if job.rank < t:  # pack this owner's buckets before the clock starts
        buffers = {}
        for i, spec in enumerate(job.params):
            runs = trainer_runs(spec, job.trainer, job.rank)
            if runs is not None:
                buffers[i] = ParamBuffer(spec, runs, synthetic_local(spec, i, runs, seed=job.seed))
        for k in by_owner.get(job.rank, []):
            payloads[k] = _payload(job.params, buckets[k][1], buffers)
    else:
        for k, (_, pieces) in enumerate(buckets):
            payloads[k] = torch.empty(sum(pc.nbytes for pc in pieces), dtype=torch.uint8)
    if int(store.add("ready", 1)) == world:
        store.set("go", "1")
    store.wait(["go"])
    started, cpu = time.time(), time.process_time()
    pending: list = []
    for k in order:
        owner = buckets[k][0]
        if owner not in groups:
            continue
        opts = dist.BroadcastOptions()
        opts.rootRank = 0
        pending.append(groups[owner].broadcast([payloads[k]], opts))
        if len(pending) >= job.window:
            pending.pop(0).wait()
    for w in pending:
        w.wait()
    done, cpu = time.time(), time.process_time() - cpu  # CPU seconds of the transfers (all threads)
    mismatches = []
    if job.check and job.rank >= t:
        for k, (_, pieces) in enumerate(buckets):
            want = torch.cat([synthetic_region(job.params[pc.param], pc.param, pc.start, pc.stop, seed=job.seed)
                              .reshape(-1).view(torch.uint8) for pc in pieces])
            if not torch.equal(want, payloads[k]):
                mismatches.append(f"bucket {k}")
    if int(store.add("finished", 1)) == world:
        store.set("all-finished", "1")
    store.wait(["all-finished"])
    report = {"started_at": started, "data_done_at": done, "verified": not mismatches,
              "bytes_received": sum(p.numel() for p in payloads.values()) if job.rank >= t else 0}
    return {"report": report, "mismatches": mismatches, "cpu_s": cpu}


def run_broadcast(params: Sequence[ParamSpec], trainer: TrainerLayout, generator: GeneratorLayout, *,
                  hosts: Sequence[Host] | None = None, bucket_bytes: int = 4 << 20, window: int = 2,
                  timeout_s: float = 120.0, wait_s: float = 600.0, check: bool = True) -> SyncRun:
    """Run the broadcast baseline with one process per rank (on ``hosts`` when given, else loopback)."""
    n = trainer.world_size + generator.world_size
    if hosts is None:
        store_host, port, netns, env = "127.0.0.1", free_port(), [None] * n, [{"GLOO_SOCKET_IFNAME": "lo"}] * n
    else:
        store_host, port = hosts[0].ip, 29501
        netns, env = [h.netns for h in hosts], [{"GLOO_SOCKET_IFNAME": "eth0"}] * n
    base = BroadcastJob(tuple(params), trainer, generator, 0, store_host, port, bucket_bytes, window, timeout_s,
                        check=check)
    with RankGroup(run_broadcast_rank, [(replace(base, rank=r),) for r in range(n)], netns=netns, env=env) as grp:
        results = grp.join(wait_s)
    reports = [r.value["report"] for r in results if r.ok]
    elapsed = (max(x["data_done_at"] for x in reports) - min(x["started_at"] for x in reports)) if reports else 0.0
    return SyncRun(results, elapsed)
