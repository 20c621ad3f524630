"""Journalled commits and reconciliation: crash at every step, idempotence, failed-port masking."""

from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from orchestrl.fabric.controller import FabricController
from orchestrl.fabric.intent import load_intent
from orchestrl.fabric.ocs.model import PortState
from orchestrl.fabric.plan import Circuit, CircuitPlan, CrossConnect, validate_plan
from orchestrl.fabric.runtime.commit import CommitError, CommitInFlightError, JournaledCommitter, apply_plan_diff
from orchestrl.fabric.runtime.reconcile import device_changes, reconcile, replan_after_failures, restore_controller
from orchestrl.fabric.runtime.store import FabricStore
from orchestrl.fabric.topology import load_topology
from tests.fabric.fakes import (Crasher, CrashingStore, FakeOcsDevice, SimulatedCrash, SplitFakeOcsDevice,
                                expected_tables, tables)

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
SIZES = {"agg0": 8, "agg1": 8, "core0": 6}


def _plan(*xcs: tuple[str, int, int], sig: str = "s") -> CircuitPlan:
    circuits = tuple(Circuit("agg", 0, f"{d}:{a}", f"{d}:{b}", CrossConnect(d, a, b)) for d, a, b in xcs)
    return CircuitPlan("fab", "train", sig, 1e11, circuits)


OLD = _plan(("agg0", 1, 2), ("agg0", 3, 4), ("agg0", 5, 6), ("core0", 1, 2), ("agg1", 1, 8), sig="old")
# keeps 1<->2 and agg1; reuses freed ports 3, 5 and core0 1, 2 in new combinations; adds 7<->8
NEW = _plan(("agg0", 1, 2), ("agg0", 3, 5), ("agg0", 7, 8), ("core0", 1, 3), ("core0", 2, 4), ("agg1", 1, 8),
            sig="new")
THIRD = _plan(("agg0", 4, 6), ("core0", 5, 6), sig="third")


def _devices(crasher: Crasher | None = None, split: bool = False) -> dict[str, FakeOcsDevice]:
    """The fake devices of the plans; ``split``: with the driver's split API (driven without threads)."""
    return {name: (SplitFakeOcsDevice if split else FakeOcsDevice)(name, n, crasher) for name, n in SIZES.items()}


def _crash_points(split: bool = False) -> list[str]:
    """Labels of every crash point of one OLD -> NEW commit."""
    crasher = Crasher()
    devices = _devices(split=split)
    store = CrashingStore(":memory:", Crasher())
    apply_plan_diff(store, OLD, devices)
    store.crasher = crasher
    for d in devices.values():
        d.crasher = crasher
    apply_plan_diff(store, NEW, devices)
    return crasher.labels


def test_commit_applies_the_plan_and_journals_each_step():
    devices = _devices()
    with FabricStore(":memory:") as store:
        first = apply_plan_diff(store, OLD, devices)
        assert tables(devices) == expected_tables(OLD, devices)
        report = apply_plan_diff(store, NEW, devices)
        assert tables(devices) == expected_tables(NEW, devices)
        assert (report.base_id, report.removed, report.added) == (first.commit_id, 3, 4)
        assert report.devices == ("agg0", "core0")  # agg1 is untouched
        steps = store.steps(report.commit_id)
        assert [(s.device, s.action) for s in steps] == [("agg0", "remove"), ("agg0", "add"),
                                                         ("core0", "remove"), ("core0", "add")]
        assert all(s.status == "ok" and s.confirmed == s.requested for s in steps)
        assert store.commit(report.commit_id).state == "committed" and store.in_flight() == []
    # removals precede additions on each device, so every port is freed before it is reused
    assert [c for c, _ in devices["agg0"].calls] == ["connect", "disconnect", "connect"]


def test_crash_points_cover_journal_device_and_partial_bulk_steps():
    labels = _crash_points()
    assert labels[0] == "store begin_commit: before" and labels[-1] == "store finish_commit: after"
    assert "agg0 connect: half applied" in labels and "core0 disconnect: after" in labels
    # 2 per journal write (2: the intent before any device; the confirmations with the outcome after),
    # per device command (4) and per half-applied add (2)
    assert len(labels) == N_POINTS == 14
    # driven without threads, each device also has a point between its commands and reading their replies
    split = _crash_points(split=True)
    assert sorted(split) == sorted(labels + ["agg0 collect: before", "core0 collect: before"])
    assert split.index("core0 disconnect: before") < split.index("agg0 collect: before")  # all sent, then read


N_POINTS = len(_crash_points())
SPLIT_POINTS = len(_crash_points(split=True))


@pytest.mark.parametrize("split,k", [(False, k) for k in range(N_POINTS)] + [(True, k) for k in range(SPLIT_POINTS)],
                         ids=[f"threads-{k}" for k in range(N_POINTS)] + [f"split-{k}" for k in range(SPLIT_POINTS)])
def test_crash_at_any_step_then_reconcile_restores_the_committed_plan(tmp_path, split, k):
    path = tmp_path / "fabric.db"
    devices = _devices(split=split)
    with FabricStore(path) as store:
        apply_plan_diff(store, OLD, devices)
    crasher = Crasher(at=k)
    for d in devices.values():
        d.crasher = crasher
    store = CrashingStore(path, crasher)
    with pytest.raises(SimulatedCrash):
        apply_plan_diff(store, NEW, devices)
    store.close()  # the process is gone; the devices keep whatever they were told
    for d in devices.values():
        d.crasher = None

    with FabricStore(path) as restarted:  # restart: the journal is all that is left
        committed = crasher.crashed_at == "store finish_commit: after"
        target = NEW if committed else OLD
        assert restarted.last_committed_plan("fab").cross_connects() == target.cross_connects()
        assert len(restarted.in_flight()) == (0 if committed or k == 0 else 1)
        if restarted.in_flight():  # no new commit on a half-changed fabric
            with pytest.raises(CommitInFlightError, match="run reconcile"):
                apply_plan_diff(restarted, THIRD, devices)
        report = reconcile(restarted, devices)
        assert report.ok and tables(devices) == expected_tables(target, devices)
        assert restarted.in_flight() == [] and not report.failed_ports
        journal = len(restarted.history(limit=1000))
        again = reconcile(restarted, devices)  # idempotent: nothing to do, nothing journalled
        assert again.changes == 0 and again.ok and len(restarted.history(limit=1000)) == journal
        apply_plan_diff(restarted, THIRD, devices)  # and the fabric commits normally again
        assert tables(devices) == expected_tables(THIRD, devices)


def test_interrupted_commit_is_closed_as_aborted_with_a_reason(tmp_path):
    devices = _devices()
    store = FabricStore(tmp_path / "f.db")
    apply_plan_diff(store, OLD, devices)
    cid = store.begin_commit("fab", NEW)  # intent journalled, crash before any device step
    devices["agg0"].state.disconnect([3])  # a device fault meanwhile: half circuit 3->4 remains
    report = reconcile(store, devices)
    assert report.resolved_commits == (cid,) and store.commit(cid).state == "aborted"
    assert "reconciled to commit" in store.commit(cid).note
    assert report.changes == 1 and tables(devices) == expected_tables(OLD, devices)
    assert store.last_committed("fab").kind == "reconcile"
    assert store.last_committed_plan("fab").cross_connects() == OLD.cross_connects()


def test_stale_duplicate_and_half_cross_connects_are_repaired_ports_freed_first():
    dev = FakeOcsDevice("agg0", 8)
    # wanted 1<->2 = {1: 10, 2: 9}; 3<->4 = {3: 12, 4: 11}
    dev.state.connect([(1, 12), (3, 10), (2, 9), (4, 11), (6, 15)], mode="stop")  # crossed, half, stale
    report = reconcile(_plan(("agg0", 1, 2), ("agg0", 3, 4)), {"agg0": dev})
    assert report.ok and dev.cross_connects() == {1: 10, 2: 9, 3: 12, 4: 11}
    assert dev.calls == [("disconnect", [1, 3, 6]), ("connect", [(1, 10), (3, 12)])]
    assert reconcile(_plan(("agg0", 1, 2), ("agg0", 3, 4)), {"agg0": dev}).changes == 0


def test_reconcile_to_nothing_clears_devices_and_reports_missing_ones():
    devices = _devices()
    apply_plan_diff(FabricStore(":memory:"), OLD, devices)
    report = reconcile(None, {"agg0": devices["agg0"]})
    assert devices["agg0"].cross_connects() == {} and report.ok
    report = reconcile(OLD, {"agg0": devices["agg0"]})
    assert report.missing_devices == ("agg1", "core0") and not report.ok


@st.composite
def _device_case(draw, n=6):
    egress = draw(st.permutations(range(n + 1, 2 * n + 1)))
    table = {i: e for i, e in zip(range(1, n + 1), egress) if draw(st.booleans())}
    ports = draw(st.permutations(range(1, n + 1)))
    k = draw(st.integers(0, n // 2))
    wanted = [CrossConnect("d", *sorted(ports[2 * j:2 * j + 2])) for j in range(k)]
    failed = draw(st.sets(st.integers(1, 2 * n), max_size=2))
    return table, wanted, failed


@settings(max_examples=150, deadline=None)
@given(_device_case())
def test_any_table_reconciles_to_the_wanted_circuits_and_stays(case):
    table, wanted, failed = case
    dev = FakeOcsDevice("d", 6)
    dev.state.connect(sorted(table.items()), mode="stop")
    for p in failed:
        dev.fail_port(p)
    report = reconcile(_plan(*((x.device, x.a_port, x.b_port) for x in wanted)), {"d": dev})
    bad = {(p - 1) % 6 + 1 for p in failed}
    served = [x for x in wanted if not {x.a_port, x.b_port} & bad]
    assert report.ok and dev.cross_connects() == expected_tables(_plan(*((x.device, x.a_port, x.b_port)
                                                                          for x in served)), {"d": dev})["d"]
    assert {p for _, p, _ in report.failed_ports} == bad
    assert sorted(report.unserved) == sorted(set(wanted) - set(served))
    assert device_changes(served, dev.cross_connects(), 6).empty
    assert reconcile(_plan(*((x.device, x.a_port, x.b_port) for x in wanted)), {"d": dev}).changes == 0


def test_failed_port_is_masked_and_dropped_from_the_committed_plan():
    devices = _devices()
    store = FabricStore(":memory:")
    apply_plan_diff(store, OLD, devices)
    devices["agg0"].fail_port(8 + 4)  # egress side of duplex port 4: circuit 3<->4 is dead
    report = reconcile(store, devices)
    assert report.failed_ports == [("agg0", 4, "failed")] and report.ok
    assert report.unserved == [CrossConnect("agg0", 3, 4)]
    assert [(m.device, m.port, m.reason) for m in store.masked_ports()] == [("agg0", 4, "failed")]
    effective = store.last_committed_plan("fab")
    assert effective.cross_connects() == OLD.cross_connects() - {CrossConnect("agg0", 3, 4)}
    assert any("dropped by reconciliation" in n for n in effective.notes)
    assert tables(devices) == expected_tables(effective, devices)
    journal = len(store.history(limit=100))
    assert reconcile(store, devices).changes == 0 and len(store.history(limit=100)) == journal


def test_commit_onto_a_failed_port_rolls_back_and_lists_the_port():
    devices = _devices()
    store = FabricStore(":memory:")
    apply_plan_diff(store, OLD, devices)
    devices["agg0"].fail_port(7)  # NEW adds 7<->8 on agg0
    with pytest.raises(CommitError, match="agg0:7") as err:
        apply_plan_diff(store, NEW, devices)
    assert err.value.rolled_back and ("agg0", 7, "failed") in err.value.failed_ports
    assert store.commit(err.value.commit_id).state == "failed" and store.in_flight() == []
    assert tables(devices) == expected_tables(OLD, devices)
    assert ("agg0", 7) in {(m.device, m.port) for m in store.masked_ports()}
    steps = store.steps(err.value.commit_id)
    assert steps[-1].status in ("partial", "failed") and "SWFA" in steps[-1].detail


def test_force_blocked_port_counts_as_unusable():
    dev = FakeOcsDevice("agg0", 8)
    dev.fail_port(2, PortState.FORCE_BLOCKED)
    report = reconcile(_plan(("agg0", 1, 2), ("agg0", 3, 4)), {"agg0": dev})
    assert report.failed_ports == [("agg0", 2, "force-blocked")] and dev.cross_connects() == {3: 12, 4: 11}


def _controller_rig():
    topo = load_topology(EXAMPLES / "topology-64gpu-h800.yaml")
    intent = load_intent(EXAMPLES / "intents" / "train-dp-cross-pod.yaml", topo)
    devices = {d: FakeOcsDevice(d, dev.radix_ports) for d, dev in topo.devices.items()}
    return topo, intent, devices


def test_failed_port_is_replanned_under_the_remaining_budget():
    topo, intent, devices = _controller_rig()
    store = FabricStore(":memory:")
    committer = JournaledCommitter(store, devices, scope=topo.name)
    controller = FabricController(topo, committer=committer)
    first = controller.materialize(intent)
    controller.apply(first)
    assert tables(devices) == expected_tables(first.plan, devices)
    victim = first.plan.circuits[0].xc  # a Core circuit: its Agg lift/drop must be re-planned too
    devices[victim.device].fail_port(victim.a_port)
    report = committer.recover()
    assert report.failed_ports == [(victim.device, victim.a_port, "failed")]
    result = replan_after_failures(controller, report.failed_ports, intent, store=store)
    assert result.accepted and controller.active is result.plan
    assert victim.a_port not in {p for c in result.plan.circuits if c.xc.device == victim.device
                                 for p in (c.xc.a_port, c.xc.b_port)}
    assert validate_plan(result.plan, controller.topology) == []
    core = [sum(c.tier == "core" for c in p.circuits) for p in (first.plan, result.plan)]
    assert core[1] == core[0] - 1 > 0  # one boundary port less: bandwidth reduced, connectivity kept
    assert tables(devices) == expected_tables(result.plan, devices)
    assert committer.recover().changes == 0


def test_restore_controller_after_restart(tmp_path):
    topo, intent, devices = _controller_rig()
    with FabricStore(tmp_path / "f.db") as store:
        controller = FabricController(topo, committer=JournaledCommitter(store, devices))
        controller.apply(controller.materialize(intent))
        store.save_template_cache(controller.cache)
        store.mask_ports([("core0", 300, "operator")])
        active = controller.active
    with FabricStore(tmp_path / "f.db") as store:
        fresh = FabricController(load_topology(EXAMPLES / "topology-64gpu-h800.yaml"),
                                 committer=JournaledCommitter(store, devices))
        restore_controller(fresh, store)
        assert fresh.active.cross_connects() == active.cross_connects()
        assert fresh.topology.is_masked(next(p for p in fresh.topology.masked if p.port == 300))
        again = fresh.materialize(intent)
        assert again.cache_hit and again.plan.cross_connects() == active.cross_connects()
        fresh.apply(again)  # an unchanged plan commits with no device commands
        assert tables(devices) == expected_tables(active, devices)


def test_unreachable_device_leaves_the_commit_in_flight_until_it_answers():
    devices = _devices()
    store = FabricStore(":memory:")
    apply_plan_diff(store, OLD, devices)
    devices["core0"].down_after = 1  # answers the removal, then the link drops
    with pytest.raises(CommitError, match="may be half-changed") as err:
        apply_plan_diff(store, NEW, devices)
    assert not err.value.rolled_back and [r.id for r in store.in_flight()] == [err.value.commit_id]
    report = reconcile(store, devices)
    assert not report.ok and report.resolved_commits == ()
    assert "connection refused" in next(d for d in report.devices if d.device == "core0").errors[-1]
    devices["core0"].down_after = None  # the device is back
    report = reconcile(store, devices)
    assert report.ok and report.resolved_commits == (err.value.commit_id,)
    assert tables(devices) == expected_tables(OLD, devices)
    apply_plan_diff(store, NEW, devices)
    assert tables(devices) == expected_tables(NEW, devices)


def test_crash_during_reconciliation_is_recovered_by_the_next_one(tmp_path):
    j = 0
    while True:  # crash the reconciliation itself at its j-th point, for every j
        path = tmp_path / f"r{j}.db"
        devices = _devices()
        with FabricStore(path) as store:
            apply_plan_diff(store, OLD, devices)
        first = Crasher(at=N_POINTS // 2)  # leave the fabric half-changed
        for d in devices.values():
            d.crasher = first
        with pytest.raises(SimulatedCrash), CrashingStore(path, first) as store:
            apply_plan_diff(store, NEW, devices)
        second = Crasher(at=j)
        for d in devices.values():
            d.crasher = second
        with CrashingStore(path, second) as store:
            try:
                reconcile(store, devices)
                finished = True
            except SimulatedCrash:
                finished = False
        for d in devices.values():
            d.crasher = None
        with FabricStore(path) as store:
            report = reconcile(store, devices)
            assert report.ok and tables(devices) == expected_tables(OLD, devices) and store.in_flight() == []
            assert reconcile(store, devices).changes == 0
        if finished:
            assert j > 4
            break
        j += 1


class _TableWatch:
    """Stands in for a crasher: at every point of every device command, checks a device's table."""

    def __init__(self, device: FakeOcsDevice, must_hold: dict[int, int]) -> None:
        self.device, self.must_hold, self.points, self.violations = device, must_hold, 0, []

    def point(self, label: str) -> None:
        self.points += 1
        table = self.device.state.cross_connects()
        lost = {i: e for i, e in self.must_hold.items() if table.get(i) != e}
        if lost:
            self.violations.append(f"{label}: {lost} missing")


def test_failed_commit_rolls_back_without_touching_another_scopes_circuits_on_a_shared_device():
    devices = _devices()
    store = FabricStore(":memory:")
    b_plan = _plan(("agg0", 5, 6), ("agg1", 3, 4), sig="b")
    apply_plan_diff(store, b_plan, devices, scope="job/b")
    a_old = _plan(("agg0", 1, 2), ("core0", 1, 2), sig="a-old")
    apply_plan_diff(store, a_old, devices, scope="job/a")
    # A moves to agg0 3<->4 (whose port 4 has failed) and core0 3<->4; both devices are shared or busy
    a_new = _plan(("agg0", 3, 4), ("core0", 3, 4), sig="a-new")
    devices["agg0"].fail_port(4)
    watch = _TableWatch(devices["agg0"], expected_tables(b_plan, devices)["agg0"])
    for d in devices.values():
        d.crasher = watch  # called before, during and after every connect and disconnect
    with pytest.raises(CommitError, match="agg0:4") as err:
        apply_plan_diff(store, a_new, devices, scope="job/a")
    assert watch.points > 4 and watch.violations == []  # B's cross-connects held at every step
    assert err.value.rolled_back and store.in_flight() == []
    assert store.last_committed_plan("job/a").cross_connects() == a_old.cross_connects()
    assert store.last_committed_plan("job/b").cross_connects() == b_plan.cross_connects()
    held = expected_tables(a_old, devices)
    for name, table in expected_tables(b_plan, devices).items():
        held[name].update(table)
    assert tables(devices) == held  # A back at its last commit, B untouched
    assert [r.scope for r in store.history(limit=10) if r.kind == "reconcile"] == ["job/a"]  # B needed nothing
