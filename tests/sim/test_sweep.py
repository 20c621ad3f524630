"""Sweeps give the same results on every backend."""

from __future__ import annotations

import pytest

from orchestrl.fabric.errors import ConfigError
from orchestrl.sim.sweep import NetCase, ray_available, run_net_case, run_sweep

CASES = [NetCase("ft", 64, 200, "all-to-all", 16, 1e8), NetCase("ft-os", 384, 100, "all-reduce", 8, 1e8, stride=48),
         NetCase("rfabric", 128, 400, "all-to-all", 32, 1e8)]


def test_the_process_pool_returns_what_a_serial_run_does_in_case_order():
    serial = run_sweep(run_net_case, CASES, backend="serial")
    pooled = run_sweep(run_net_case, CASES, backend="pool", workers=2)
    assert pooled == serial
    assert [r["fabric"] for r in pooled] == ["ft", "ft-os", "rfabric"]


@pytest.mark.skipif(not ray_available(), reason="ray is not installed (optional extra orchestrl[ray])")
def test_a_local_ray_instance_returns_the_same_results():
    assert run_sweep(run_net_case, CASES[:2], backend="ray", workers=2) == run_sweep(run_net_case, CASES[:2],
                                                                                    backend="serial")


def test_unknown_backend_is_refused():
    with pytest.raises(ConfigError, match="backend"):
        run_sweep(run_net_case, CASES, backend="mpi")
