"""Colocated transport: ranks on one host exchange memory handles, not socket bytes (real processes)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the collectives runtime needs torch (the comms extra)")

from orchestrl.collectives.emulation.model import synthetic_model
from orchestrl.collectives.emulation.runner import run_sync
from orchestrl.collectives.layout import FabricLinks, GeneratorLayout, TrainerLayout
from orchestrl.collectives.plan import plan_weight_sync
from orchestrl.collectives.store import tcp_store
from orchestrl.collectives.transport.colocated import ColocatedTransport, TransportClosed


def _schedule(trainers: int = 2, generators: int = 2, tp: int = 1):
    gen = GeneratorLayout.uniform(pods=(1,), ranks_per_pod=generators, tp=tp)
    return plan_weight_sync(synthetic_model(1 << 20, hidden=64), TrainerLayout(tp=trainers), gen,
                            FabricLinks(nic_bps=1e9), chunk_bytes=128 << 10)


def test_weight_sync_over_shared_memory_is_bit_identical():
    run = run_sync(_schedule(), timeout_s=30, backend="ipc")
    assert run.ok and run.verified, run.errors()
    assert all(not r.value["mismatches"] for r in run.results if r.ok)


def test_weight_sync_over_shared_memory_resharding_and_in_place():
    run = run_sync(_schedule(trainers=4, generators=4, tp=2), timeout_s=30, backend="ipc", into=True, rounds=2)
    assert run.ok and run.verified, run.errors()


def _store():
    # an IPv4 listener (collectives/store.py): a dual-stack one makes the server look up every new client's name, and
    # a slow resolver then stalls every store call for seconds (a reset once took 4.9 s here under load)
    return tcp_store("127.0.0.1", 0, is_master=True, timeout_s=60)


def test_a_silent_peer_fails_the_transfer_within_its_timeout():
    store = _store()
    t = ColocatedTransport(store, 0, 2, timeout_s=0.3)
    t.prepare({1: 1})
    buf = torch.zeros(16, dtype=torch.uint8)
    import time
    start = time.monotonic()
    with pytest.raises(TimeoutError, match=r"no answer within 0\.3 s while receiving tag 7 from rank 1"):
        t.irecv(buf, 1, 7).wait()
    # the 0.3 s timeout, with slack for a loaded 2-core machine: suite runs there have stalled single store calls for
    # ~5 s (2026-11-29; before and after that day's changes); without the timeout the wait never ends
    assert time.monotonic() - start < 10.0
    t.close()


def test_reset_ends_a_pending_wait_at_once():
    import threading
    import time
    store = _store()
    t = ColocatedTransport(store, 0, 2, timeout_s=30)
    t.prepare({1: 1})
    pending = t.isend(torch.ones(8, dtype=torch.uint8), 1, 3)
    box = {}

    def wait():
        try:
            pending.wait()
        except Exception as exc:  # noqa: BLE001 -- the test inspects it
            box["exc"] = exc
    th = threading.Thread(target=wait)
    th.start()
    time.sleep(0.1)
    start = time.monotonic()
    t.reset()
    th.join(5)
    assert isinstance(box.get("exc"), TransportClosed)
    assert time.monotonic() - start < 10.0  # the reset, not the transport's 30 s timeout (slack: see above)
    assert t.generation == 2


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA IPC needs a CUDA GPU (trainer and engine share it)")
def test_weight_sync_over_cuda_ipc_between_two_processes_on_one_gpu():
    run = run_sync(_schedule(trainers=1, generators=1), timeout_s=60, backend="ipc")
    assert run.ok and run.verified, run.errors()
    run = run_sync(_schedule(trainers=2, generators=2, tp=2), timeout_s=60, backend="ipc", into=True)
    assert run.ok and run.verified, run.errors()
