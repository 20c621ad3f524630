"""Weight sync with one real process per rank over gloo/TCP on loopback: content, integrity, liveness.

Each test starts every rank as its own OS process; they exchange real bytes over real sockets.
"""

from __future__ import annotations

import re

import pytest

pytest.importorskip("torch", reason="the collectives runtime needs torch (the comms extra)")

from collectives.baseline import plan_flat
from collectives.emulation.model import synthetic_model
from collectives.emulation.runner import run_sync
from collectives.layout import FabricLinks, GeneratorLayout, GeneratorRank, TrainerLayout
from collectives.plan import plan_weight_sync

TIMEOUT_S = 4.0  # liveness timeout the failure tests hold every survivor to
SLACK_S = 3.0  # polling, process scheduling on a loaded 2-core machine


def _mixed_tp_schedule(model_bytes: int = 2 << 20, chunk_bytes: int = 128 << 10):
    """Trainer TP=4 -> one TP=2 engine in PoD 1 and two TP=1 engines in PoD 2."""
    gen = GeneratorLayout((GeneratorRank(1, 2, 0), GeneratorRank(1, 2, 1), GeneratorRank(2, 1, 0),
                           GeneratorRank(2, 1, 0)))
    params = synthetic_model(model_bytes, hidden=64)
    return plan_weight_sync(params, TrainerLayout(tp=4), gen, FabricLinks(nic_bps=1e9), chunk_bytes=chunk_bytes)


def test_tp4_to_tp2_and_tp1_delivers_bit_identical_slices():
    sch = _mixed_tp_schedule()
    run = run_sync(sch, timeout_s=30)
    assert run.ok, run.errors()
    assert run.verified  # every checksum matched; every slice equals the trainer's bits
    for r in run.results[4:]:
        rep = r.value["report"]
        assert rep["params_loaded"] == len(sch.params)
        assert rep["chunks_verified"] > 0
    # TP=2 ranks received half of each sharded tensor, TP=1 ranks all of it (plus replicated norms).
    half, full = run.results[4].value["report"]["bytes_received"], run.results[6].value["report"]["bytes_received"]
    assert half < 0.6 * full


def test_flat_baseline_delivers_the_same_bits():
    gen = GeneratorLayout.uniform(pods=(1,), ranks_per_pod=2)
    sch = plan_flat(synthetic_model(1 << 20, hidden=64), TrainerLayout(tp=2), gen, FabricLinks(nic_bps=1e9),
                    chunk_bytes=128 << 10)
    run = run_sync(sch, timeout_s=30)
    assert run.ok and run.verified, run.errors()


def _assert_all_survivors_blame(run, dead: int, name: str, died_at: float, phase_word: str) -> None:
    survivors = [r for r in run.results if r.rank != dead]
    for r in survivors:
        assert not r.ok, f"rank {r.rank} succeeded although {name} died"
        assert r.error_type == "WeightSyncError", (r.rank, r.error)
        assert name in r.error, (r.rank, r.error)
        assert re.search(phase_word, r.error), (r.rank, r.error)
        assert r.finished_at - died_at <= TIMEOUT_S + SLACK_S, (r.rank, r.finished_at - died_at, r.error)


def test_killing_a_receiver_mid_transfer_fails_every_survivor_within_the_timeout(tmp_path):
    sch = _mixed_tp_schedule()
    dead = sch.generator_rank(1)  # interior of PoD 1's trees: its children wait for chunks it never sends
    note = tmp_path / "died_at"
    run = run_sync(sch, timeout_s=TIMEOUT_S, die_after={dead: 2}, death_note=str(note), wait_s=60)
    assert note.exists(), "the receiver was not killed mid-transfer"
    assert run.results[dead].error_type == "Died"
    died_at = float(note.read_text())
    _assert_all_survivors_blame(run, dead, sch.rank_name(dead), died_at, r"phase|while")


def test_a_stalled_receiver_is_named_with_its_phase(tmp_path):
    sch = _mixed_tp_schedule()
    stalled = sch.generator_rank(2)
    note = tmp_path / "stopped_at"
    run = run_sync(sch, timeout_s=TIMEOUT_S, stop_after={stalled: 3}, death_note=str(note), wait_s=60)
    assert note.exists()
    _assert_all_survivors_blame(run, stalled, sch.rank_name(stalled), float(note.read_text()),
                                r"stopped responding .* while|phase")


def test_a_corrupted_chunk_is_caught_by_its_checksum():
    sch = _mixed_tp_schedule()
    sender = sch.blocks[0].origin
    run = run_sync(sch, timeout_s=TIMEOUT_S, corrupt_rank=sender, wait_s=60)
    assert not any(r.ok for r in run.results)
    for r in run.results:
        assert "checksum mismatch" in r.error, (r.rank, r.error)
        assert sch.rank_name(sender) in r.error


def test_ranks_running_different_schedules_refuse_to_start():
    from collectives.emulation.launch import RankGroup
    from collectives.emulation.runner import free_port
    from collectives.emulation.worker import RankJob, run_rank

    a = _mixed_tp_schedule()
    b = _mixed_tp_schedule(chunk_bytes=64 << 10)  # same ranks, different plan
    port = free_port()
    jobs = [(RankJob(a if r else b, r, "127.0.0.1", port, timeout_s=TIMEOUT_S),) for r in range(a.world_size)]
    with RankGroup(run_rank, jobs, env=[{"GLOO_SOCKET_IFNAME": "lo"}] * a.world_size) as g:
        results = g.join(60)
    assert not any(r.ok for r in results)
    assert all("joined with schedule" in r.error for r in results), [r.error for r in results]
