"""RollArt's cross-cluster weight update moving real bytes between real processes (collectives relay, Mooncake)."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("torch", reason="the collectives relay needs torch (the comms extra)")

from orchestrl.agents.agentic.transfer import (CollectivesRelay, MooncakeRelay, WeightTransferError,  # noqa: E402
                                               mooncake_available)
from orchestrl.agents.agentic.weights import LinkSpec, WeightUpdater  # noqa: E402


async def _two_versions(updater: WeightUpdater) -> None:
    updater.publish(1)  # the trainer has version 1: the copy starts beside the rollouts
    await asyncio.sleep(0)
    await updater.update(1)  # the suspend point: wait for what is left, every generator confirms
    updater.publish(2)
    await updater.update(2)


def test_the_collectives_relay_moves_each_version_to_every_generator_process_intact():
    relay = CollectivesRelay(2 << 20, generators=2, timeout_s=60)
    updater = WeightUpdater(LinkSpec(relay.model_bytes), mover=relay)
    try:
        asyncio.run(_two_versions(updater))
        # two versions, each staged by both generator processes with the digest the trainer sent
        assert relay.bytes_moved == 2 * 2 * relay.model_bytes
        assert len(updater.waited_s) == 2 and updater.backend == "relay"
        with pytest.raises(WeightTransferError, match="version 9 was never pushed"):
            relay.fetch(9)
        relay._procs[1].kill()  # a generation process dies: the next confirmation names it, in bounded time
        relay._round[3], relay._sent[3] = 2, 0
        with pytest.raises(WeightTransferError, match="orchestrl-gen-2 died"):
            relay.fetch(3)
    finally:
        updater.close()


@pytest.mark.skipif(not mooncake_available()[0], reason=f"Mooncake: {mooncake_available()[1]}")
def test_mooncake_writes_each_version_into_the_relay_buffer_intact():
    mc = MooncakeRelay(1 << 20, timeout_s=30)
    updater = WeightUpdater(LinkSpec(mc.model_bytes), mover=mc)
    try:
        asyncio.run(_two_versions(updater))
        assert mc.bytes_moved == 2 * mc.model_bytes and updater.backend == "mooncake"
    finally:
        updater.close()
