"""Byte movers for the asynchronous cross-cluster weight update: real bytes, between real processes.

:class:`~agents.agentic.weights.WeightUpdater` times a copy from bytes and link rates (what RLSim and
the single-process runtime use). Given a mover, it moves the bytes instead: ``publish`` starts
:meth:`push` on a thread beside the rollouts; ``update`` (at the suspend point) waits for it and for
:meth:`fetch`, which returns only once every generation process has the version and its digest
matches what the trainer sent. Two movers, one interface:

* :class:`CollectivesRelay` -- this project's ``orchestrl.collectives.WeightSync`` over gloo: the
  trainer (this process, rank 0) sends its shards to the generation pod (ranks 1..n, separate
  processes); the planner (:func:`collectives.plan.plan_weight_sync`) gives the cross-cluster link to
  one rank of the pod, the relay, and a forwarding tree inside the pod to the others. Each generator
  stages what it received (checksummed per chunk by the executor) and reports a digest per version.
* :class:`MooncakeRelay` -- Mooncake's transfer engine (``mooncake.engine.TransferEngine``, the
  ``mooncake-transfer-engine-non-cuda`` wheel on CPU, TCP transport, P2P handshake, no etcd), as
  RollArt uses it: the trainer writes its flattened weights into a buffer the relay process
  registered; the relay then checks the digest. Only the cross-cluster hop; its broadcast inside the
  generation cluster is the collectives relay's job.

Every wait has a timeout; a generator that dies or reports a wrong digest fails the update with a
:class:`WeightTransferError` naming it.
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import threading
import time
import zlib
from typing import Mapping

from orchestrl.fabric.errors import OrchestrlError

__all__ = ["WeightTransferError", "CollectivesRelay", "MooncakeRelay", "mooncake_available", "digest"]


class WeightTransferError(OrchestrlError):
    """A version did not reach a generation process intact and in time (the message names which)."""


def mooncake_available() -> tuple[bool, str]:
    """Whether Mooncake's transfer engine imports here, and if not, why (and what to install)."""
    try:
        from mooncake.engine import TransferEngine  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure is the answer
        return False, (f"{type(exc).__name__}: {exc} (on CPU install mooncake-transfer-engine-non-cuda and "
                       "libibverbs1; the CUDA wheel needs libcudart and a driver)")
    return True, "mooncake.engine.TransferEngine imports"


def digest(named: Mapping[str, "object"]) -> int:
    """An order-independent digest of named tensors: sum of CRC32(name, bytes) mod 2**32."""
    import torch
    total = 0
    for name, t in named.items():
        raw = t.detach().contiguous().view(torch.uint8).numpy().tobytes() if t.numel() else b""
        total = (total + zlib.crc32(raw, zlib.crc32(name.encode()))) & 0xFFFFFFFF
    return total


def _context():
    """Processes from a forkserver that has torch and the collectives imported once (as the collectives'
    own launcher does): a generation process then starts in well under a second instead of re-importing."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "orchestrl.collectives.weight_sync"])
    return ctx


def _state(params, version: int) -> dict:
    """The trainer's weights of ``version``: the synthetic model's values, different for every version."""
    from orchestrl.collectives.emulation.model import synthetic_region
    return {p.name: synthetic_region(p, i, 0, p.split_extent, seed=version) for i, p in enumerate(params)}


# -- the collectives relay ----------------------------------------------------------------------------
def _generator(rank: int, port: int, acks, stop, timeout_s: float) -> None:
    """A generation process: receive each round, stage it, report (rank, round, digest, bytes)."""
    import torch  # noqa: F401 - the collectives runtime

    from orchestrl.collectives.weight_sync import WeightSync
    sync = WeightSync.connect(None, "127.0.0.1", port, rank, timeout_s=timeout_s, join_timeout_s=timeout_s)
    rounds = 0
    while not stop.is_set():
        staged: dict = {}

        def load(items, staged=staged) -> None:
            for name, t in items:
                staged[name] = t.clone()
        try:
            rep = sync.receive(load_weights=load)
        except Exception as exc:  # noqa: BLE001 - reported to the trainer, which names this rank
            acks.put((rank, rounds, None, f"{type(exc).__name__}: {exc}"))
            return
        acks.put((rank, rounds, digest(staged), sum(t.numel() * t.element_size() for t in staged.values())))
        rounds += 1
        del rep


class CollectivesRelay:
    """Trainer -> relay -> generation workers through ``orchestrl.collectives`` over gloo (see the module note).

    Parameters
    ----------
    model_bytes : int
        Size of the (synthetic, transformer-shaped) weights moved each version.
    generators : int
        Generation processes in the pod (the first the planner picks is the relay).
    cross_bps, intra_bps : float
        Link rates the planner plans with (cross-cluster NIC, inside the generation cluster).
    timeout_s : float
        Bound on every wait: connecting, one round, an acknowledgement.
    """

    backend = "relay"

    def __init__(self, model_bytes: int, *, generators: int = 2, cross_bps: float = 25e9, intra_bps: float = 50e9,
                 timeout_s: float = 60.0, chunk_bytes: int = 1 << 20) -> None:
        from orchestrl.collectives.emulation.model import synthetic_model
        from orchestrl.collectives.emulation.runner import free_port
        from orchestrl.collectives.layout import FabricLinks, GeneratorLayout, TrainerLayout
        from orchestrl.collectives.plan import plan_weight_sync
        from orchestrl.collectives.weight_sync import WeightSync

        if generators < 1:
            raise ValueError(f"generators={generators}: at least one generation process")
        self.params = synthetic_model(int(model_bytes), hidden=64)
        self.model_bytes = sum(p.nbytes for p in self.params)
        self.schedule = plan_weight_sync(self.params, TrainerLayout(), GeneratorLayout.uniform(
            pods=(1,), ranks_per_pod=generators), FabricLinks(nic_bps=intra_bps, cross_bps=cross_bps),
            chunk_bytes=chunk_bytes)
        self.timeout_s = timeout_s
        ctx = _context()
        self._acks, self._stop = ctx.Queue(), ctx.Event()
        port = free_port()
        self._procs = [ctx.Process(target=_generator, args=(r, port, self._acks, self._stop, timeout_s), daemon=True,
                                   name=f"orchestrl-gen-{r}") for r in range(1, generators + 1)]
        for p in self._procs:
            p.start()
        self._sync = WeightSync.connect(self.schedule, "127.0.0.1", port, 0, timeout_s=timeout_s,
                                        join_timeout_s=timeout_s)
        self._sent: dict[int, int] = {}  # version -> digest the trainer sent
        self._round: dict[int, int] = {}  # version -> collectives round
        self._acked: dict[int, dict[int, tuple]] = {}
        self._lock = threading.Lock()
        self.bytes_moved = 0.0

    def push(self, version: int) -> float:
        """Send ``version`` from the trainer through the relay to every generator; returns the bytes sent."""
        state = _state(self.params, version)
        with self._lock:
            self._round[version] = len(self._round)
            self._sent[version] = digest(state)
        rep = self._sync.send(state)
        if not rep.verified:
            raise WeightTransferError(f"weights version {version}: the collectives round did not verify")
        return float(self.model_bytes)

    def fetch(self, version: int) -> float:
        """Wait until every generator staged ``version`` with the trainer's digest; returns bytes received."""
        want = self._round.get(version)
        if want is None:
            raise WeightTransferError(f"weights version {version} was never pushed")
        got = self._acked.setdefault(want, {})
        deadline = time.monotonic() + self.timeout_s
        while len(got) < len(self._procs):
            left = deadline - time.monotonic()
            if left <= 0:
                missing = sorted(set(range(1, len(self._procs) + 1)) - set(got))
                raise WeightTransferError(f"weights version {version}: generator ranks {missing} did not confirm "
                                          f"within {self.timeout_s:.0f} s")
            try:
                rank, rnd, dg, nbytes = self._acks.get(timeout=min(left, 1.0))
            except queue.Empty:
                dead = [p.name for p in self._procs if not p.is_alive()]
                if dead:
                    raise WeightTransferError(f"weights version {version}: {', '.join(dead)} died") from None
                continue
            if dg is None:
                raise WeightTransferError(f"weights version {version}: generator rank {rank} failed: {nbytes}")
            self._acked.setdefault(rnd, {})[rank] = (dg, nbytes)
        bad = [r for r, (dg, _) in got.items() if dg != self._sent[version]]
        if bad:
            raise WeightTransferError(f"weights version {version}: generator ranks {bad} hold other bytes "
                                      "than the trainer sent (digest mismatch)")
        moved = float(sum(n for _, n in got.values()))
        self.bytes_moved += moved
        return moved

    def close(self) -> None:
        """End the generator processes (they wait for a next round that will not come) and the transport."""
        self._stop.set()
        self._sync.close()
        for p in self._procs:
            p.join(timeout=0.5)
            if p.is_alive():
                p.terminate()
                p.join(timeout=5)


# -- Mooncake -------------------------------------------------------------------------------------
def _mooncake_relay(nbytes: int, info, cmds, answers) -> None:
    """The relay process: a registered buffer the trainer writes into; on request, the buffer's CRC32."""
    import numpy as np
    from mooncake.engine import TransferEngine
    eng = TransferEngine()
    if eng.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
        info.put(None)
        return
    buf = np.zeros(nbytes, dtype=np.uint8)
    if eng.register_memory(buf.ctypes.data, buf.nbytes) != 0:
        info.put(None)
        return
    info.put((f"127.0.0.1:{eng.get_rpc_port()}", buf.ctypes.data))
    while True:
        cmd = cmds.get()
        if cmd is None:
            return
        answers.put((cmd, zlib.crc32(buf.tobytes())))


class MooncakeRelay:
    """The trainer writes each version into the relay's registered buffer with Mooncake's transfer engine."""

    backend = "mooncake"

    def __init__(self, model_bytes: int, *, timeout_s: float = 60.0) -> None:
        ok, why = mooncake_available()
        if not ok:
            raise WeightTransferError(f"weights backend 'mooncake' does not import here: {why}")
        import numpy as np
        from mooncake.engine import TransferEngine
        self.model_bytes = int(model_bytes)
        self.timeout_s = timeout_s
        ctx = _context()
        info, self._cmds, self._answers = ctx.Queue(), ctx.Queue(), ctx.Queue()
        self._proc = ctx.Process(target=_mooncake_relay, args=(self.model_bytes, info, self._cmds, self._answers),
                                 daemon=True, name="orchestrl-mooncake-relay")
        self._proc.start()
        try:
            peer = info.get(timeout=timeout_s)
        except queue.Empty:
            self.close()
            raise WeightTransferError(f"the Mooncake relay process did not start within {timeout_s:.0f} s") from None
        if peer is None:
            self.close()
            raise WeightTransferError("the Mooncake relay could not initialise its engine or register its buffer")
        self._session, self._remote = peer
        self._eng = TransferEngine()
        if self._eng.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
            self.close()
            raise WeightTransferError("Mooncake's transfer engine did not initialise (tcp, P2P handshake)")
        self._src = np.zeros(self.model_bytes, dtype=np.uint8)
        self._eng.register_memory(self._src.ctypes.data, self._src.nbytes)
        self._sent: dict[int, int] = {}
        self.bytes_moved = 0.0

    def push(self, version: int) -> float:
        import numpy as np
        rng = np.random.default_rng(version)  # every version's bytes differ
        self._src[:] = rng.integers(0, 256, self.model_bytes, dtype=np.uint8)
        self._sent[version] = zlib.crc32(self._src.tobytes())
        rc = self._eng.transfer_sync_write(self._session, self._src.ctypes.data, self._remote, self.model_bytes)
        if rc != 0:
            raise WeightTransferError(f"weights version {version}: Mooncake transfer_sync_write returned {rc}")
        return float(self.model_bytes)

    def fetch(self, version: int) -> float:
        if version not in self._sent:
            raise WeightTransferError(f"weights version {version} was never pushed")
        self._cmds.put(version)
        try:
            v, crc = self._answers.get(timeout=self.timeout_s)
        except queue.Empty:
            raise WeightTransferError(f"weights version {version}: the Mooncake relay did not answer within "
                                      f"{self.timeout_s:.0f} s") from None
        if v != version or crc != self._sent[version]:
            raise WeightTransferError(f"weights version {version}: the relay holds other bytes than were written")
        self.bytes_moved += self.model_bytes
        return float(self.model_bytes)

    def close(self) -> None:
        if self._proc.is_alive():
            self._cmds.put(None)
            self._proc.join(timeout=5)
        if self._proc.is_alive():
            self._proc.terminate()
            self._proc.join(timeout=5)
