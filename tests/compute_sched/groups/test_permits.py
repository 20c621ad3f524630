"""The permit table behind the phase runtime: round-robin turns, timeouts, tail migration."""

import pytest

from orchestrl.compute_sched.groups.permits import PermitRevoked, PermitTable


def _table(order="abc", nodes=None, **kw):
    nodes = nodes or {j: [0] for j in order}
    return PermitTable(list(order), nodes, permit_timeout_s=kw.pop("permit_timeout_s", 10.0), **kw)


def _cycle(t, order, now=0.0):
    for job in order:
        for phase in ("rollout", "train"):
            p = t.request(job, phase, now)
            assert p is not None, (job, phase)
            t.release(p.permit_id, now)


def test_phases_are_granted_in_round_robin_order_whatever_order_jobs_ask_in():
    t = _table()
    assert t.request("c", "rollout", 0.0) is None and t.request("b", "rollout", 0.0) is None
    pa = t.request("a", "rollout", 0.0)
    t.release(pa.permit_id, 1.0)  # b is next on the node, though c asked first
    assert [p.job_id for p in t.permits.values()] == ["b"]
    pa_train = t.request("a", "train", 1.0)
    assert pa_train is not None  # training pool runs a while the rollout node runs b
    assert t.grants == [("a", "rollout"), ("b", "rollout"), ("a", "train")]


def test_separate_rollout_nodes_run_in_parallel_but_training_stays_in_order():
    t = _table("ab", {"a": [0], "b": [1]})
    pa, pb = t.request("a", "rollout", 0), t.request("b", "rollout", 0)
    assert pa and pb
    t.release(pb.permit_id, 1)
    assert t.request("b", "train", 1) is None  # a trains first in the meta-iteration
    t.release(pa.permit_id, 2)
    assert t.request("a", "train", 2) is not None


def test_a_permit_that_outlives_its_timeout_fails_its_job_and_the_group_goes_on():
    t = _table(permit_timeout_s=5.0)
    pa = t.request("a", "rollout", 0.0)
    assert t.request("b", "rollout", 1.0) is None
    t.tick(5.0)
    assert "a" in t.failed and "expired" in t.failed["a"]
    assert t.request("b", "rollout", 5.0) is not None
    with pytest.raises(PermitRevoked):
        t.release(pa.permit_id, 6.0)
    with pytest.raises(PermitRevoked):
        t.request("a", "train", 6.0)


def test_a_job_absent_on_its_turn_is_failed_after_the_turn_timeout():
    t = _table(permit_timeout_s=100.0, turn_timeout_s=3.0)
    _cycle(t, "abc")
    assert t.request("b", "rollout", 1.0) is None  # a's turn; a never asks again (it died between phases)
    t.tick(2.0)
    assert not t.failed
    t.tick(3.5)
    assert list(t.failed) == ["a"] and t.request("b", "rollout", 3.5) is not None


def test_a_busy_job_is_never_failed_for_missing_its_turn():
    t = _table("ab", permit_timeout_s=100.0, turn_timeout_s=1.0)
    pa = t.request("a", "rollout", 0.0)
    t.release(pa.permit_id, 0.0)
    pa_train = t.request("a", "train", 0.0)
    pb = t.request("b", "rollout", 0.0)
    t.release(pb.permit_id, 0.5)
    assert t.request("b", "train", 0.5) is None  # a still trains
    t.tick(50.0)
    assert not t.failed  # a holds the training pool: late, not absent
    t.release(pa_train.permit_id, 50.0)
    assert t.request("b", "train", 50.0) is not None


def test_long_tail_migration_starts_the_next_rollout_while_the_tail_finishes():
    t = _table("ab", tail_threshold=0.8)
    pa = t.request("a", "rollout", 0.0)
    assert not t.progress(pa.permit_id, 0.9, 1.0)  # nobody waits: keep the batch together
    assert t.request("b", "rollout", 1.0) is None
    assert not t.progress(pa.permit_id, 0.5, 2.0)
    assert t.progress(pa.permit_id, 0.85, 3.0)
    pb = [p for p in t.permits.values() if p.job_id == "b"]
    assert pb and pa.tail  # b runs on the freed GPUs while a's tail drains
    t.release(pa.permit_id, 4.0)
    assert t.request("a", "train", 4.0) is not None


def test_finished_jobs_leave_the_rotation():
    t = _table("ab")
    _cycle(t, "ab")
    t.finish("a", 1.0)
    _cycle(t, "b", 1.0)
    _cycle(t, "b", 2.0)
    with pytest.raises(PermitRevoked, match="finished"):
        t.request("a", "rollout", 3.0)
