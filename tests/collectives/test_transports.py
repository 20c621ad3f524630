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


def test_aborting_a_peers_connection_never_shuts_down_a_socket_that_reused_its_descriptor():
    """gloo closes a failed pair's descriptor, and the number goes to the next socket the process opens.

    Seen in the retry test (2026-11-29): over 80 runs the abort found 14 recorded descriptors referring to other
    sockets; before this check a rank lost its store connection ("Broken pipe" while joining the retry round)."""
    import socket

    import torch.distributed as dist

    from orchestrl.collectives.transport.torch_dist import TorchTransport, _target

    store = dist.TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
    transport = TorchTransport(store, 0, 2)

    class Group:
        def abort(self):
            pass

    old_a, old_b = socket.socketpair()
    fd, what = old_a.fileno(), _target(old_a.fileno())
    old_a.close()  # gloo closed its end of the failed pair
    new_a, new_b = socket.socketpair()  # the next socket gets the lowest free number: the closed one's
    assert new_a.fileno() == fd
    transport._groups[1], transport._sockets[1] = ((0, 0), Group()), [(fd, what)]
    transport._abort(1)
    new_a.sendall(b"still connected")
    assert new_b.recv(64) == b"still connected"
    for s in (old_b, new_a, new_b):
        s.close()
