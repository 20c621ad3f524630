"""Fixtures for the collectives tests: emulated clusters that are always torn down."""

from __future__ import annotations

import pytest


@pytest.fixture
def emulated_cluster():
    """Factory: build an :class:`EmulatedCluster` that is torn down even if the test fails.

    Skips the test (with the reason) where namespaces cannot be built: not root, no iproute2.
    """
    from orchestrl.collectives.emulation.netns import EmulatedCluster, remove_stale, unavailable_reason

    reason = unavailable_reason()
    if reason:
        pytest.skip(f"emulated cluster {reason}")
    remove_stale()  # namespaces of earlier runs that were killed before they could clean up
    made: list[EmulatedCluster] = []

    def build(spec):
        cluster = EmulatedCluster(spec)
        made.append(cluster)
        return cluster.up()

    yield build
    for cluster in made:
        cluster.down()
