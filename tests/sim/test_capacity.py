"""Capacity accounting: relayed traffic charged at both NVLink ends, and invariants checked in every run."""

from __future__ import annotations

import numpy as np
import pytest

from orchestrl.sim.network.build import build_fabric
from orchestrl.sim.network.events import FlowSet, SimulationInvariantError, _check_capacity, simulate
from orchestrl.sim.network.netsim import NetworkSim


def test_pxn_relay_shares_the_relay_gpus_nvlink_ingress():
    """GPU0 -> GPU1 over NVLink, and GPUs 0/2/3 -> rail 1 of other servers relayed through GPU1 (PXN)."""
    net = NetworkSim("ro", gpus=32)
    src = [0, 0, 2, 3]
    dst = [1, 9, 17, 25]  # rail 1 of servers 1, 2, 3: each relays through GPU1's NIC
    rates = net.rates(src, dst)
    nvlink = net.fabric.config.nvlink_bps
    assert rates[1:].sum() == pytest.approx(net.fabric.config.link_bps, rel=1e-6)  # GPU1's NIC is shared
    # GPU1's NVLink-in carries the direct flow and the relayed ones: never more than its capacity
    assert rates.sum() <= nvlink * (1 + 1e-9)
    assert rates[0] == pytest.approx(nvlink - net.fabric.config.link_bps, rel=1e-6)


@pytest.mark.parametrize("fabric", ["ft", "ro", "topoopt", "mixnet", "rfabric"])
def test_every_fabric_keeps_nvlink_balanced_and_under_capacity(fabric):
    """The checks run inside simulate(): a random all-to-all on every fabric passes them."""
    rng = np.random.default_rng(3)
    n = 64
    src = rng.integers(0, n, 400)
    dst = (src + rng.integers(1, n, 400)) % n
    net = NetworkSim(fabric, gpus=n)
    res = net.time_flows(FlowSet(src, dst, np.full(400, 1e7), np.zeros(400)))
    assert np.isfinite(res.makespan_s) and res.makespan_s > 0


class _Prob:
    def __init__(self, load):
        self._load = np.asarray(load, dtype=float)

    def load(self, rate):
        return self._load


def test_the_check_fails_loudly_on_an_overloaded_bundle_or_one_sided_nvlink():
    state = build_fabric("ft", 16).state()
    cap = state.capacity_bps
    g = 16
    over = np.zeros_like(cap)
    over[2 * g + 3] = cap[2 * g + 3] * 1.2  # nic-up of GPU 3 at 1.2x
    with pytest.raises(SimulationInvariantError, match=r"nic-up gpu3 .*1\.200x"):
        _check_capacity(_Prob(over), None, state, 0.5)
    one_sided = np.zeros_like(cap)
    one_sided[0] = 1e9  # GPU0 sends over NVLink, nobody receives
    with pytest.raises(SimulationInvariantError, match="charged at one end"):
        _check_capacity(_Prob(one_sided), None, state, 0.0)


def test_conservation_is_checked_at_the_end_of_every_run():
    st = build_fabric("ft", 16).state()
    r = simulate(FlowSet([0, 1], [8, 9], [1e6, 0.0], [0.0, 0.0]), st)
    assert np.all(np.isfinite(r.finish_s))
