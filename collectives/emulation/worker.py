"""What one emulated rank runs: build a transport, then send or receive synthetic weights and check them."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import asdict, dataclass

import torch

from collectives.codec import HEADER_BYTES
from collectives.emulation.model import synthetic_region
from collectives.schedule import Schedule
from collectives.transport.torch_dist import TorchTransport
from collectives.weight_sync import WeightSync

__all__ = ["RankJob", "run_rank"]


@dataclass(frozen=True)
class RankJob:
    """Everything a rank process needs (picklable)."""

    schedule: Schedule
    rank: int
    store_host: str
    store_port: int
    timeout_s: float = 30.0
    backend: str = "gloo"  # "gloo" | "nccl" (one GPU per rank) | "ucx"
    host_ip: str = ""  # this rank's address (UCX listener); default: store_host
    group: str = "orchestrl-weight-sync"
    check: bool = True  # compare every received slice with the synthetic model, bit for bit
    die_after_params: int = -1  # >= 0: SIGKILL this rank after loading that many parameters
    stop_after_params: int = -1  # >= 0: SIGSTOP this rank (a stalled peer) after that many
    seed: int = 0
    trace: bool = False  # record per-step timings
    death_note: str = ""  # file the rank writes its wall-clock time of death to before SIGKILL/SIGSTOP
    corrupt_first_send: bool = False  # flip one payload byte of this rank's first chunk after checksumming


def run_rank(job: RankJob) -> dict:
    """Run one sync round as ``job.rank``; return its report and any content mismatches."""
    torch.set_num_threads(1)
    sch = job.schedule
    transport = _transport(job)
    device = transport.device
    if job.corrupt_first_send:
        transport = _CorruptingTransport(transport)
    sync = WeightSync(sch, transport, timeout_s=job.timeout_s, trace=job.trace)
    index = {p.name: i for i, p in enumerate(sch.params)}
    mismatches: list[str] = []
    if sch.is_trainer(job.rank):
        local = {}
        for i, spec in enumerate(sch.params):
            region = sch.initial_region(job.rank, i)
            if region is not None:
                local[spec.name] = synthetic_region(spec, i, *region, device=device, seed=job.seed)
        report = sync.send(local)
    else:
        got: list[tuple[int, torch.Tensor]] = []

        def load_weights(batch: list[tuple[str, torch.Tensor]]) -> None:
            got.extend((index[name], tensor) for name, tensor in batch)  # checked after the timed round
            for limit, sig in ((job.die_after_params, signal.SIGKILL), (job.stop_after_params, signal.SIGSTOP)):
                if len(got) == limit:
                    if job.death_note:
                        with open(job.death_note, "w") as f:
                            f.write(repr(time.time()))
                    os.kill(os.getpid(), sig)

        report = sync.receive(load_weights)
        for i, tensor in got if job.check else ():
            want = synthetic_region(sch.params[i], i, *sch.region(job.rank, i), device=device, seed=job.seed)
            if not torch.equal(tensor.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)):
                mismatches.append(sch.params[i].name)
        if job.check and len(got) != sum(sch.region(job.rank, i) is not None for i in range(len(sch.params))):
            mismatches.append(f"loaded {len(got)} parameters")
    return {"report": asdict(report), "mismatches": mismatches, "pid": os.getpid(), "at": time.time()}


def _transport(job: RankJob):
    if job.backend == "ucx":
        from datetime import timedelta

        import torch.distributed as dist

        from collectives.transport.ucx import UcxTransport

        store = dist.TCPStore(job.store_host, job.store_port, job.schedule.world_size, job.rank == 0,
                              timeout=timedelta(seconds=job.timeout_s), wait_for_workers=False)
        return UcxTransport(store, job.rank, job.schedule.world_size, host_ip=job.host_ip or job.store_host,
                            timeout_s=2 * job.timeout_s, group_name=job.group)
    if job.backend == "nccl":
        torch.cuda.set_device(job.rank % torch.cuda.device_count())
    # Transfers time out later than liveness, so a dead peer is named by liveness, not by a follow-on stall.
    return TorchTransport.connect(job.store_host, job.store_port, job.rank, job.schedule.world_size,
                                  backend=job.backend, timeout_s=2 * job.timeout_s, group_name=job.group)


class _CorruptingTransport:
    """The real transport, except that the first chunk sent has one payload byte flipped (bit rot)."""

    def __init__(self, inner: TorchTransport) -> None:
        self._inner = inner
        self._done = False

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def isend(self, buf: torch.Tensor, peer: int, tag: int):
        if not self._done and buf.numel() > HEADER_BYTES:
            self._done = True
            buf[HEADER_BYTES] ^= 0xFF
        return self._inner.isend(buf, peer, tag)
