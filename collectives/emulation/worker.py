"""What one emulated rank runs: connect, then send or receive synthetic weights and check them.

``run_rank`` runs inside a :class:`~collectives.emulation.launch.RankGroup` process; ``python -m
collectives.emulation.worker JOB.pickle`` runs the same job as a plain process that exits the way a
trainer or engine process would (for exit-status checks).
"""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field

import torch

from orchestrl.collectives.codec import HEADER_BYTES, TORCH_DTYPES
from orchestrl.collectives.emulation.model import synthetic_local
from orchestrl.collectives.schedule import Schedule
from orchestrl.collectives.store import tcp_store

__all__ = ["RankJob", "run_rank", "main", "KEEP"]


#: WeightSync objects kept alive for the life of the process: rank 0 hosts the store, so it must
#: outlive the function that connected it, as in a real job.
KEEP: list = []


@dataclass(frozen=True)
class RankJob:
    """Everything a rank process needs (picklable)."""

    schedule: Schedule
    rank: int
    store_host: str
    store_port: int
    timeout_s: float = 30.0
    join_timeout_s: float = 120.0
    load_timeout_s: float = 120.0
    backend: str = "gloo"  # "gloo" | "nccl" (one GPU per rank) | "ucx" | "ipc" (colocated: CUDA IPC or shared memory)
    host_ip: str = ""  # this rank's address (UCX listener); default: store_host
    group: str = "orchestrl-weight-sync"
    check: bool = True  # compare every received slice with the synthetic model, bit for bit
    die_after_params: int = -1  # >= 0: SIGKILL this rank after loading that many parameters
    stop_after_params: int = -1  # >= 0: SIGSTOP this rank (a stalled peer) after that many
    raise_after_params: int = -1  # >= 0: load_weights raises after that many in the first round (an engine that refuses)
    load_delay_s: float = 0.0  # each load_weights call sleeps this long (a slow engine loader)
    seed: int = 0
    trace: bool = False  # record per-step timings
    death_note: str = ""  # file the rank writes its wall-clock time of death to before SIGKILL/SIGSTOP
    corrupt_first_send: bool = False  # flip one payload byte of this rank's first chunk after checksumming
    distribute: bool = False  # only rank 0 has the schedule; the others get it from the store
    send_async: bool = False  # trainers snapshot, then overwrite their tensors before the sync finishes
    into: bool = False  # generators receive in place into pre-allocated tensors
    into_dtype: str = ""  # ... of this dtype instead of the parameter's (to check it is refused)
    rounds: int = 1  # sync rounds to run; a failed round is reported and the next one attempted
    coords_of: int = -1  # >= 0: this trainer's framework says it is that trainer rank (a swapped rank mapping)
    partition_after_params: int = -1  # >= 0: run partition_cmd (cut this rank off the network) after that many
    partition_cmd: tuple = ()  # e.g. ("ip", "-n", FABRIC_NS, "link", "set", "h3", "down"): its cable, pulled
    kill_rank0_after_params: int = -1  # >= 0: SIGKILL schedule rank 0 (the store's host) after loading that many
    pid_file: str = ""  # rank 0 writes its process id here (for kill_rank0_after_params)
    rejoin: bool = False  # this process replaces a rank that died (WeightSync.connect(rejoin=True))
    torch_threads: int = 1
    extra_env: dict = field(default_factory=dict)


def _next_join_window_s(sync) -> float | None:
    """How long the next round will wait for every rank to join (longer right after a failed round); None where the
    store does not answer."""
    try:
        return sync._join_window_s(sync._round + 1)
    except Exception:  # noqa: BLE001 -- a diagnostic: a dead store must not turn a round's report into an error
        return None


def run_rank(job: RankJob) -> dict:
    """Run ``job.rounds`` sync rounds as ``job.rank``; return reports, errors and content mismatches."""
    from orchestrl.collectives.weight_sync import WeightSync

    torch.set_num_threads(job.torch_threads)
    if job.rank == 0 and job.pid_file:
        with open(job.pid_file, "w") as f:
            f.write(str(os.getpid()))
    sync = _connect(job, WeightSync)
    KEEP.append(sync)  # rank 0 hosts the store: it must outlive this function, as in a real job
    sch = sync.schedule
    out: dict = {"pid": os.getpid(), "rounds": [], "report": None, "mismatches": [], "at": 0.0,
                 "join_timeout_s": sync.join_timeout_s}
    for n in range(job.rounds):
        try:
            report, mismatches = _one_round(job, sync, sch, first=n == 0)
            cpu = _CPU.pop("sync", 0.0)  # this process's CPU seconds inside send/receive (all its threads)
            rss = _CPU.pop("rss_growth", 0)  # a receiver's peak resident memory above its level at the call
            out["rounds"].append({"report": asdict(report), "mismatches": mismatches, "cpu_s": cpu,
                                  "rss_growth_bytes": rss, "next_join_window_s": _next_join_window_s(sync)})
            out["report"], out["mismatches"], out["cpu_s"], out["rss_growth_bytes"] = asdict(report), mismatches, cpu, rss
        except Exception as exc:  # noqa: BLE001 -- reported per round; the last one is re-raised
            out["rounds"].append({"error": f"{type(exc).__name__}: {exc}", "error_type": type(exc).__name__,
                                  "next_join_window_s": _next_join_window_s(sync)})
            if job.rounds == 1:
                raise
    out["at"] = time.time()
    if out["report"] is None and out["rounds"]:
        raise RuntimeError(out["rounds"][-1]["error"])
    return out


def _connect(job: RankJob, cls):
    sch = job.schedule
    if job.backend == "ucx":
        from orchestrl.collectives.transport.ucx import UcxTransport

        store = tcp_store(job.store_host, job.store_port, is_master=job.rank == 0, timeout_s=job.timeout_s,
                          world_size=sch.world_size)
        transport = UcxTransport(store, job.rank, sch.world_size, host_ip=job.host_ip or job.store_host,
                                 timeout_s=2 * job.timeout_s, group_name=job.group)
        return cls(sch, transport, timeout_s=job.timeout_s, join_timeout_s=job.join_timeout_s,
                   load_timeout_s=job.load_timeout_s, trace=job.trace)
    if job.backend == "nccl":
        torch.cuda.set_device(job.rank % torch.cuda.device_count())
    given = sch if (job.rank == 0 or not job.distribute) else None
    sync = cls.connect(given, job.store_host, job.store_port, job.rank, backend=job.backend, timeout_s=job.timeout_s,
                       join_timeout_s=job.join_timeout_s, load_timeout_s=job.load_timeout_s, group_name=job.group,
                       trace=job.trace, rejoin=job.rejoin)
    if job.corrupt_first_send:
        sync.transport = _CorruptingTransport(sync.transport)
    return sync


def _one_round(job: RankJob, sync, sch: Schedule, first: bool = True):
    device = sync.transport.device
    index = {p.name: i for i, p in enumerate(sch.params)}
    mismatches: list[str] = []
    if sch.is_trainer(job.rank):
        local = {}
        for i, spec in enumerate(sch.params):
            runs = sch.initial_runs(job.rank, i)
            if runs is not None:
                local[spec.source_name] = _synthetic(spec, i, runs, device, job.seed, spec.trainer_dtype).clone()
        # what the training framework would state: this process's own TP/PP/EP ranks
        coords = sch.trainer.coords(job.coords_of if job.coords_of >= 0 else job.rank)
        cpu = time.process_time()
        if job.send_async:
            handle = sync.send_async(local, coords=coords)
            for t in local.values():  # the optimizer steps while the sync runs
                t.view(torch.uint8).fill_(0xA5)
            report = handle.wait()
        else:
            report = sync.send(local, coords=coords)
        _CPU["sync"] = time.process_time() - cpu
        return report, mismatches
    got: list[tuple[int, torch.Tensor]] = []
    into = None
    if job.into:  # the engine's own tensors, the same ones every round (as a real engine's parameters)
        into = _INTO.setdefault(job.rank, {})
        for i, spec in enumerate(sch.params):
            shape = sch.local_shape(job.rank, i)
            if shape is not None and spec.name not in into:
                into[spec.name] = torch.zeros(shape, dtype=TORCH_DTYPES[job.into_dtype or spec.dtype], device=device)

    def load_weights(batch: list[tuple[str, torch.Tensor]]) -> None:
        name, tensor = batch[0]
        got.append((index[name], tensor))  # checked after the timed round
        if job.load_delay_s:
            time.sleep(job.load_delay_s)
        if first and len(got) == job.raise_after_params:
            raise RuntimeError("the engine refused the weights")
        for limit, sig in ((job.die_after_params, signal.SIGKILL), (job.stop_after_params, signal.SIGSTOP)):
            if len(got) == limit:
                _note(job)
                os.kill(os.getpid(), sig)
        if len(got) == job.partition_after_params:
            subprocess.run(list(job.partition_cmd), check=True)
            _note(job)
        if len(got) == job.kill_rank0_after_params:
            with open(job.pid_file) as f:
                pid = int(f.read())
            _note(job)
            os.kill(pid, signal.SIGKILL)

    cpu = time.process_time()
    with _PeakRss() as rss:
        report = sync.receive(load_weights, into=into)
    _CPU["sync"] = time.process_time() - cpu
    _CPU["rss_growth"] = rss.growth
    for i, tensor in got if job.check else ():
        want = _synthetic(sch.params[i], i, sch.runs(job.rank, i), device, job.seed)
        if not torch.equal(tensor.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8)):
            mismatches.append(sch.params[i].name)
    if job.check and len(got) != sum(sch.runs(job.rank, i) is not None for i in range(len(sch.params))):
        mismatches.append(f"loaded {len(got)} parameters")
    return report, mismatches


def _synthetic(spec, index: int, runs, device, seed: int, dtype: str = "") -> torch.Tensor:
    """``synthetic_local``, computed once per process: every round of a job moves the same synthetic model, and
    generating it (a hash per element) costs more CPU than a loopback round itself."""
    key = (spec.name, index, repr(runs), str(device), seed, dtype)
    if key not in _SYNTHETIC:
        _SYNTHETIC[key] = synthetic_local(spec, index, runs, device=device, seed=seed, dtype=dtype)
    return _SYNTHETIC[key]


_SYNTHETIC: dict[tuple, torch.Tensor] = {}
_CPU: dict[str, float] = {}  # CPU seconds (and a receiver's RSS growth) of the last send/receive call


class _PeakRss:
    """Peak resident memory of this process while the block runs, above its level at the start (bytes).

    Linux keeps the peak (``VmHWM``); writing 5 to ``/proc/self/clear_refs`` resets it to the current
    RSS, so the measurement costs nothing while the block runs (no sampling thread competing with the
    transfer for the CPU).
    """

    def __init__(self) -> None:
        self.growth = 0

    @staticmethod
    def _status(key: str) -> int:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(key):
                    return int(line.split()[1]) * 1024
        return 0

    def __enter__(self) -> "_PeakRss":
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        self._start = self._status("VmRSS:")
        return self

    def __exit__(self, *exc) -> None:
        self.growth = max(0, self._status("VmHWM:") - self._start)


_INTO: dict[int, dict[str, torch.Tensor]] = {}  # rank -> its in-place targets, kept across rounds


def _note(job: RankJob) -> None:
    """Write the wall-clock time of the fault this rank injects to ``job.death_note``."""
    if job.death_note:
        with open(job.death_note, "w") as f:
            f.write(repr(time.time()))


class _CorruptingTransport:
    """The real transport, except that the first chunk sent has one payload byte flipped (bit rot)."""

    def __init__(self, inner) -> None:
        self._inner = inner
        self._done = False

    def __getattr__(self, name: str):
        return getattr(self._inner, name)

    def isend(self, buf: torch.Tensor, peer: int, tag: int):
        if not self._done and buf.numel() != HEADER_BYTES:  # the first payload (after its header)
            self._done = True
            buf = buf.clone()  # the payload may be the trainer's own tensor: corrupt what travels only
            buf[0] ^= 0xFF
        return self._inner.isend(buf, peer, tag)


def main(argv: list[str] | None = None) -> int:
    """Run the pickled :class:`RankJob` in ``argv[0]`` as a plain process; print one line; exit 0 or 1."""
    path = (argv if argv is not None else sys.argv[1:])[0]
    with open(path, "rb") as f:
        job: RankJob = pickle.load(f)
    os.environ.update(job.extra_env)
    try:
        result = run_rank(job)
        print(f"rank {job.rank}: ok, verified={result['report']['verified']}", flush=True)
        return 0
    except Exception as exc:  # noqa: BLE001 -- a real job logs the error and exits with a status
        print(f"rank {job.rank}: {type(exc).__name__}: {exc}", flush=True)
        return 1


if __name__ == "__main__":
    sys.exit(main())
