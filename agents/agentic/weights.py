"""Asynchronous cross-cluster weight update (RollArt §5.2): publish without waiting, fetch at a suspend point.

The trainer calls :meth:`WeightUpdater.publish` as soon as a version exists; the copy to the
generation cluster's relay starts at once and runs beside the rollouts (the cross-cluster link, e.g.
200 Gb/s Ethernet). At its next suspend point the runtime calls :meth:`WeightUpdater.update`, which
waits only for what is left of that copy and then for the broadcast inside the generation cluster
(its fast links). veRL's synchronous path (``asynchronous=False``) starts the copy at the suspend
point, so the whole cross-cluster time lands on the step.

Without a mover the copy is timed from the bytes and link rates (RLSim, and runs that only want the
overlap). With a mover (:mod:`agents.agentic.transfer`) the bytes really move between processes,
behind the same two calls:

* ``relay``: :class:`~agents.agentic.transfer.CollectivesRelay`, this project's collectives
  (``WeightSync`` over gloo, the planner's relay and forwarding tree in the generation pod);
* ``mooncake``: :class:`~agents.agentic.transfer.MooncakeRelay`, Mooncake's transfer engine (the
  CPU wheel ``mooncake-transfer-engine-non-cuda``, TCP); :func:`mooncake_available` says why not
  where it does not import.

With a host agent (:class:`~agents.host_agent.HostAgent`, ``agent=``) each copy reaches the fabric
controller like any other job's weight sync: the ``weight-sync`` intent (the document format of
``examples/intents/weight-sync.yaml``) when the version is published, then, as the copy starts, the
``weight-sync-begin`` marker with the copy's setup time as the window hint (the proxy reconfigures a
weight-sync plan only right before its broadcast) and the copy itself as a ``weight-sync``
collective (start and end events), from which the proxy learns the period's timing.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

from orchestrl.agents.agentic.transfer import mooncake_available

__all__ = ["WeightUpdater", "LinkSpec", "mooncake_available", "weight_sync_intent"]


@dataclass(frozen=True)
class LinkSpec:
    model_bytes: float
    cross_cluster_bps: float = 200e9  # RollArt §7.1: 200 Gbps Ethernet between the clusters
    intra_cluster_bps: float = 400e9  # 400 Gbps InfiniBand inside one
    setup_s: float = 0.5


def weight_sync_intent(job: str, train_gpus: str, gen_gpus: str, model_bytes: float) -> dict:
    """The weight-sync intent document of one cross-cluster copy (fabric/intent.py's format)."""
    return {"job": job, "stage": "weight-sync", "period": "broadcast",
            "collectives": [{"primitive": "weight-sync", "train_gpus": train_gpus, "gen_gpus": gen_gpus,
                             "model_bytes": float(model_bytes)}]}


class WeightUpdater:
    """Publish versions from the trainer; bring them to the generation workers at suspend points."""

    def __init__(self, link: LinkSpec, *, asynchronous: bool = True, backend: str = "relay",
                 agent: Any = None, job: str = "agentic",
                 train_gpus: str = "0-7", gen_gpus: str = "8-15", mover: Any = None) -> None:
        if mover is not None:
            backend = mover.backend
        if backend not in ("relay", "mooncake"):
            raise ValueError(f"weights backend {backend!r}: use relay or mooncake")
        if backend == "mooncake":
            ok, why = mooncake_available()
            if not ok:
                raise RuntimeError(f"weights backend 'mooncake' does not import here ({why}); use 'relay'")
        self.link, self.asynchronous, self.backend = link, asynchronous, backend
        # a HostAgent (announce / marker / collective_start / collective_end); its owner closes it
        self.agent, self.job, self.train_gpus, self.gen_gpus = agent, job, train_gpus, gen_gpus
        self.mover = mover  # moves real bytes (agents.agentic.transfer); None: the copy is timed
        self._copies: dict[int, asyncio.Task] = {}
        self.waited_s: list[float] = []  # time each update blocked the rollout
        self.intents = 0

    def cross_s(self) -> float:
        return self.link.setup_s + 8.0 * self.link.model_bytes / self.link.cross_cluster_bps

    def intra_s(self) -> float:
        return 8.0 * self.link.model_bytes / self.link.intra_cluster_bps

    def publish(self, version: int) -> None:
        """The trainer has ``version``: start its copy to the relay now (asynchronous mode).

        On veRL's synchronous path (``asynchronous=False``) nothing starts here: :meth:`update` starts
        the copy at the suspend point, so each version is copied (and announced) once.
        """
        if self.asynchronous:
            self._start(version)

    def _start(self, version: int) -> None:
        if version in self._copies:
            return
        if self.agent is not None:
            self.agent.announce(weight_sync_intent(self.job, self.train_gpus, self.gen_gpus, self.link.model_bytes))
            self.intents += 1
        self._copies[version] = asyncio.get_running_loop().create_task(self._copy(version))

    async def _copy(self, version: int) -> None:
        agent = self.agent
        if agent is not None:  # the broadcast starts: the window the proxy may reconfigure in, then the collective
            agent.marker("weight-sync-begin", window_hint_s=self.link.setup_s)
            agent.collective_start("weight-sync", "weight-sync", "weight-sync")
        try:
            if self.mover is not None:
                await asyncio.to_thread(self.mover.push, version)
            else:
                await asyncio.sleep(self.cross_s())
        finally:
            if agent is not None:
                agent.collective_end("weight-sync", "weight-sync", "weight-sync")

    def close(self) -> None:
        """Cancel copies still in flight (a run that ends with a version nobody will fetch)."""
        for t in self._copies.values():
            t.cancel()
        self._copies.clear()
        if self.mover is not None:
            self.mover.close()

    async def update(self, version: int) -> None:
        """At a suspend point: wait for ``version`` at the relay, then broadcast it in the cluster."""
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        self._start(version)  # synchronous path, or a version nobody published: the copy starts now
        await self._copies.pop(version)
        if self.mover is not None:  # every generation process confirms the version's digest
            await asyncio.to_thread(self.mover.fetch, version)
        else:
            await asyncio.sleep(self.intra_s())
        self.waited_s.append(loop.time() - t0)
