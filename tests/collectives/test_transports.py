"""Transports other than gloo: UCX through ucxx, and NCCL across GPUs (each skips with its reason)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the collectives runtime needs torch (the comms extra)")

from orchestrl.collectives.emulation.model import synthetic_model
from orchestrl.collectives.emulation.runner import run_sync
from orchestrl.collectives.layout import FabricLinks, GeneratorLayout, TrainerLayout
from orchestrl.collectives.plan import plan_weight_sync
from orchestrl.collectives.transport.ucx import ucx_unavailable


def _small_schedule(trainers: int = 2, generators: int = 2):
    gen = GeneratorLayout.uniform(pods=(1,), ranks_per_pod=generators)
    return plan_weight_sync(synthetic_model(1 << 20, hidden=64), TrainerLayout(tp=trainers), gen,
                            FabricLinks(nic_bps=1e9), chunk_bytes=128 << 10)


@pytest.mark.skipif(ucx_unavailable() is not None, reason=str(ucx_unavailable()))
def test_ucx_transport_delivers_bit_identical_slices():
    run = run_sync(_small_schedule(), timeout_s=30, backend="ucx")
    assert run.ok and run.verified, run.errors()


@pytest.mark.skipif(torch.cuda.device_count() < 4, reason="NCCL needs one CUDA GPU per rank (4 here)")
def test_nccl_transport_delivers_bit_identical_slices():
    run = run_sync(_small_schedule(), timeout_s=60, backend="nccl")
    assert run.ok and run.verified, run.errors()
