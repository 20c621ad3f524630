"""Run one weight-sync round with a process per rank, on loopback or on an emulated cluster."""

from __future__ import annotations

import socket
import time
from dataclasses import dataclass, replace
from typing import Mapping, Sequence

from orchestrl.collectives.emulation.launch import RankGroup, RankResult
from orchestrl.collectives.emulation.netns import Host
from orchestrl.collectives.emulation.ports import free_port
from orchestrl.collectives.emulation.worker import KEEP, RankJob, run_rank
from orchestrl.collectives.schedule import Schedule

__all__ = ["SyncRun", "run_sync", "exchange", "measure_goodput", "free_port", "KEEP"]

@dataclass(frozen=True)
class SyncRun:
    """The outcome of one round over all ranks."""

    results: list[RankResult]
    elapsed_s: float  # last rank's data done - first rank's start (after everyone joined)

    @property
    def ok(self) -> bool:
        return all(r.ok for r in self.results)

    @property
    def verified(self) -> bool:
        """Every rank finished, every checksum matched and every slice equals what was sent, bit for bit."""
        return self.ok and all(r.value["report"]["verified"] and not r.value["mismatches"] for r in self.results)

    def errors(self) -> list[str]:
        return [f"rank {r.rank}: {r.error}" for r in self.results if not r.ok]


def run_sync(schedule: Schedule, *, hosts: Sequence[Host] | None = None, timeout_s: float = 30.0,
             wait_s: float = 120.0, die_after: Mapping[int, int] | None = None,
             stop_after: Mapping[int, int] | None = None, group: str = "orchestrl-weight-sync",
             corrupt_rank: int = -1, per_rank: Mapping[int, Mapping[str, object]] | None = None,
             **job: object) -> SyncRun:
    """Run ``schedule`` with one process per rank and return every rank's result.

    ``hosts`` maps schedule ranks to emulated servers (trainers first, as schedule ranks are
    numbered); None runs every rank on loopback. ``die_after`` / ``stop_after`` map a generator
    rank to the number of parameters after which it SIGKILLs / SIGSTOPs itself (writing the time
    to ``death_note`` first); ``corrupt_rank`` flips a byte in that rank's first chunk on the wire.
    ``per_rank`` overrides :class:`RankJob` fields for single ranks; other keywords set
    :class:`RankJob` fields for every rank. ``wait_s`` bounds the whole run.
    """
    n = schedule.world_size
    if hosts is None:
        store_host, port = "127.0.0.1", free_port()
        netns: list[str | None] = [None] * n
        env = [{"GLOO_SOCKET_IFNAME": "lo"}] * n
    else:
        if len(hosts) != n:
            raise ValueError(f"{len(hosts)} hosts for {n} schedule ranks")
        store_host, port = hosts[0].ip, 29500  # ports are private to each namespace
        netns = [h.netns for h in hosts]
        env = [{"GLOO_SOCKET_IFNAME": "eth0"}] * n
    base = RankJob(schedule, 0, store_host, port, timeout_s=timeout_s, group=group, **job)  # type: ignore[arg-type]
    jobs = [(replace(base, rank=r, host_ip=hosts[r].ip if hosts else "127.0.0.1",
                     die_after_params=(die_after or {}).get(r, -1), stop_after_params=(stop_after or {}).get(r, -1),
                     corrupt_first_send=r == corrupt_rank, **dict((per_rank or {}).get(r, {}))),) for r in range(n)]
    with RankGroup(run_rank, jobs, netns=netns, env=env) as g:
        results = g.join(wait_s, ignore=sorted(stop_after or {}))
    reports = [r.value["report"] for r in results if r.ok and r.value["report"]]
    elapsed = (max(x["data_done_at"] for x in reports) - min(x["started_at"] for x in reports)) if reports else 0.0
    return SyncRun(results, elapsed)


def exchange(schedule: Schedule, sources: Mapping[int, Mapping[str, "object"]], *, timeout_s: float = 30.0,
             wait_s: float = 120.0, into_dtype: str | None = None, send_async: bool = False) -> list[RankResult]:
    """Run one round on loopback with given tensors; return every rank's result.

    ``sources[r]`` is what trainer rank ``r`` passes to ``send`` (its names, its local shards);
    each generator's value is ``{"received": {name: tensor}, "report": ...}`` with every name
    ``load_weights`` was called with. With ``into_dtype`` generators receive in place into tensors of
    that dtype instead (to check that a wrong one is refused). Only rank 0 is given the schedule;
    the others receive it from the store, as :meth:`WeightSync.connect` distributes it.
    """
    port = free_port()
    n = schedule.world_size
    jobs = [(schedule if r == 0 else None, r, port, dict(sources.get(r, {})), timeout_s, into_dtype, send_async)
            for r in range(n)]
    with RankGroup(_exchange_rank, jobs, env=[{"GLOO_SOCKET_IFNAME": "lo"}] * n) as g:
        return g.join(wait_s)


def _exchange_rank(schedule, rank: int, port: int, source: dict, timeout_s: float, into_dtype: str | None,
                   send_async: bool) -> dict:
    from dataclasses import asdict

    import torch

    from orchestrl.collectives.codec import TORCH_DTYPES
    from orchestrl.collectives.weight_sync import WeightSync

    torch.set_num_threads(1)
    sync = WeightSync.connect(schedule, "127.0.0.1", port, rank, timeout_s=timeout_s, join_timeout_s=60)
    KEEP.append(sync)  # rank 0 hosts the store: it must outlive this function, as in a real job
    sch = sync.schedule
    if sch.is_trainer(rank):
        coords = sch.trainer.coords(rank)  # what the training framework would state
        if send_async:
            handle = sync.send_async(source, coords=coords)
            for t in source.values():  # the optimizer steps while the sync runs
                t.view(torch.uint8).fill_(0x5A)
            return {"report": asdict(handle.wait())}
        return {"report": asdict(sync.send(source, coords=coords))}
    received: dict = {}
    into = None
    if into_dtype is not None:
        into = {p.name: torch.zeros(sch.local_shape(rank, i), dtype=TORCH_DTYPES[into_dtype])
                for i, p in enumerate(sch.params) if sch.local_shape(rank, i) is not None}
    report = sync.receive(lambda batch: received.update(batch), into=into)
    return {"report": asdict(report), "received": received}


def _sink(port: int, nbytes: int) -> float:
    with socket.create_server(("0.0.0.0", port)) as srv:
        conn, _ = srv.accept()
        with conn:
            got, first = 0, time.perf_counter()
            while got < nbytes:
                chunk = conn.recv(1 << 20)
                if not chunk:
                    break
                got += len(chunk)
            return 8.0 * got / (time.perf_counter() - first)


def _source(ip: str, port: int, nbytes: int) -> None:
    for _ in range(200):  # the sink may not be listening yet
        try:
            conn = socket.create_connection((ip, port), timeout=5)
            break
        except OSError:
            time.sleep(0.02)
    else:
        raise ConnectionError(f"no listener at {ip}:{port}")
    with conn:
        block = b"\0" * (1 << 20)
        sent = 0
        while sent < nbytes:
            conn.sendall(block[:min(len(block), nbytes - sent)])
            sent += min(len(block), nbytes - sent)


def measure_goodput(src: Host, dst: Host, nbytes: int, port: int = 29499) -> float:
    """Return the TCP payload rate (bit/s) of one bulk flow from ``src`` to ``dst``."""
    with RankGroup(_sink, [(port, nbytes)], netns=[dst.netns]) as sink:
        with RankGroup(_source, [(dst.ip, port, nbytes)], netns=[src.netns]) as source:
            source.join(120.0)
        (res,) = sink.join(120.0)
    if not res.ok:
        raise RuntimeError(f"goodput probe {src.name} -> {dst.name} failed: {res.error}")
    return float(res.value)
