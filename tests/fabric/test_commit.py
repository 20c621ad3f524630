"""Journalled commits: one fsync per commit, what a power cut leaves behind, one round trip per merged step."""

import shutil

import pytest

from orchestrl.fabric.runtime.commit import CommitError, apply_plan_diff, apply_plan_steps
from orchestrl.fabric.ocs.driver import Tl1Driver
from orchestrl.fabric.ocs.emulator_control import EmulatorControl, start_emulator_process, stop_emulator_process
from orchestrl.fabric.runtime.reconcile import reconcile
from orchestrl.fabric.runtime.store import FabricStore
from tests.fabric.ocs.tuning import port_tuning
from tests.fabric.fakes import Crasher, CrashingStore, SimulatedCrash, expected_tables, tables
from tests.fabric.test_reconcile import NEW, OLD, _devices, _plan

# OLD plus agg0 7<->8: an add-only first step, then the rest of NEW (removals, then additions)
MID = _plan(("agg0", 1, 2), ("agg0", 3, 4), ("agg0", 5, 6), ("agg0", 7, 8), ("core0", 1, 2), ("agg1", 1, 8),
            sig="mid")


@pytest.mark.parametrize("plans", [[NEW], [MID, NEW]], ids=["one step", "two steps"])
def test_a_commit_makes_exactly_one_durable_write_its_last(tmp_path, plans):
    devices = _devices()
    with FabricStore(tmp_path / "f.db") as store:
        apply_plan_diff(store, OLD, devices)
        before = store.durable_writes
        sql: list[str] = []
        store._conn.set_trace_callback(sql.append)
        reports = apply_plan_steps(store, plans, devices, scope="fab")
        store._conn.set_trace_callback(None)
        assert store.durable_writes - before == 1  # S + 1 journal writes, one fsync
        assert len(reports) == len(plans) and store.in_flight() == []
        # one read up front (the scope's head), then S + 1 transactions that read nothing back; only the
        # last runs at synchronous=FULL, and the connection is back at NORMAL afterwards
        assert sql[0].startswith("SELECT") and not any(q.startswith("SELECT") for q in sql[1:])
        control = [q for q in sql if q.startswith(("BEGIN", "COMMIT", "PRAGMA synchronous"))]
        assert control == (["BEGIN IMMEDIATE", "COMMIT"] * len(plans) +
                           ["PRAGMA synchronous=FULL", "BEGIN IMMEDIATE", "COMMIT", "PRAGMA synchronous=NORMAL"])
        assert store._conn.execute("PRAGMA synchronous").fetchone()[0] == 1
    assert tables(devices) == expected_tables(NEW, devices)
    with FabricStore(tmp_path / "f.db") as reopened:  # and every record of the chain is in the file
        assert reopened.last_committed_plan("fab") == NEW
        assert [r.plan for r in reopened.history("fab", limit=3)] == [NEW, *plans[:-1][::-1], OLD][:3]


def _points(split: bool = False) -> list[str]:
    """Crash points of a two-step OLD -> MID -> NEW chain."""
    crasher, devices = Crasher(), _devices(split=split)
    store = CrashingStore(":memory:", Crasher())
    apply_plan_diff(store, OLD, devices)
    store.crasher = crasher
    for d in devices.values():
        d.crasher = crasher
    apply_plan_steps(store, [MID, NEW], devices, scope="fab")
    return crasher.labels


UNACKNOWLEDGED = _points()[:-1]  # every point before the chain's final durable write returned
SPLIT_UNACKNOWLEDGED = _points(split=True)[:-1]  # the same, devices driven without threads


@pytest.mark.parametrize("split,k", [(False, k) for k in range(len(UNACKNOWLEDGED))] +
                         [(True, k) for k in range(len(SPLIT_UNACKNOWLEDGED))],
                         ids=UNACKNOWLEDGED + [f"split: {label}" for label in SPLIT_UNACKNOWLEDGED])
def test_a_power_cut_that_loses_the_unsynced_records_still_reconciles_to_the_last_durable_commit(tmp_path, split, k):
    path = tmp_path / "fabric.db"
    devices = _devices(split=split)
    with FabricStore(path) as store:
        apply_plan_diff(store, OLD, devices)  # durable: its fsync returned
    synced = tmp_path / "synced"
    synced.mkdir()
    for f in tmp_path.glob("fabric.db*"):  # the files as the last fsync left them
        shutil.copy(f, synced / f.name)
    crasher = Crasher(at=k)
    for d in devices.values():
        d.crasher = crasher
    store = CrashingStore(path, crasher)
    with pytest.raises(SimulatedCrash):
        apply_plan_steps(store, [MID, NEW], devices, scope="fab")
    store.close()
    for d in devices.values():
        d.crasher = None
    for f in tmp_path.glob("fabric.db*"):  # power cut: every write since the last fsync is lost
        f.unlink()
    for f in synced.iterdir():
        shutil.copy(f, tmp_path / f.name)

    with FabricStore(path) as restarted:
        # the journal has forgotten the change (no intent, no step): it says OLD, the devices may not
        assert restarted.last_committed_plan("fab") == OLD and restarted.in_flight() == []
        report = reconcile(restarted, devices)  # what every controller does at start-up
        assert report.ok and tables(devices) == expected_tables(OLD, devices)
        apply_plan_diff(restarted, NEW, devices)  # and the fabric commits normally again
        assert tables(devices) == expected_tables(NEW, devices)


def _rotor_emulator():
    emu = start_emulator_process(16, "rotor")
    try:
        yield emu
    finally:
        stop_emulator_process(emu.process)


def _driver(emu, name: str, timeout_s: float):
    """A TL1 driver of ``emu`` named like the plans' device; its table and faults cleared around the test."""
    control = EmulatorControl(emu.host, emu.port)
    control.clear("ALL")
    with Tl1Driver(emu.host, emu.port, name=name, password="admin", timeout_s=timeout_s) as drv:
        yield drv.open()
    control.switch_delay(0)
    control.clear("ALL")


@pytest.fixture(scope="module")
def emulator():
    """A real emulated switch (rotor profile, 0.01 ms switching) speaking TL1 over TCP."""
    yield from _rotor_emulator()


@pytest.fixture
def agg0(emulator):
    """A driver of the emulator as device agg0."""
    yield from _driver(emulator, "agg0", 10.0)


def test_a_merged_step_is_one_round_trip_per_device(tmp_path, agg0):
    first, second = _plan(("agg0", 1, 2), ("agg0", 3, 4)), _plan(("agg0", 1, 3), ("agg0", 2, 4))
    with FabricStore(tmp_path / "f.db") as store:
        apply_plan_diff(store, first, {"agg0": agg0})
        writes: list[list[str]] = []
        write = agg0._write
        agg0._write = lambda cmds: writes.append([c.verb for c in cmds]) or write(cmds)
        report = apply_plan_diff(store, second, {"agg0": agg0})  # removes both circuits, re-pairs their ports
        assert writes == [["DLT-PATCH", "ENT-PATCH"]]
        assert (report.removed, report.added) == (2, 2) and store.last_committed_plan("fab") == second
        assert [(s.action, s.status) for s in store.steps(report.commit_id)] == [("remove", "ok"), ("add", "ok")]
    assert agg0.cross_connects() == {1: 19, 3: 17, 2: 20, 4: 18}


def test_a_refused_removal_fails_the_step_and_the_connect_sent_with_it_is_journalled_and_rolled_back(
        tmp_path, emulator, agg0):
    before, after = _plan(("agg0", 1, 2)), _plan(("agg0", 5, 6))  # the add needs no port the removal frees
    control = EmulatorControl(emulator.host, emulator.port)
    with FabricStore(tmp_path / "f.db") as store:
        apply_plan_diff(store, before, {"agg0": agg0})
        # another client re-makes 1 -> 18 with slow mirrors: the removal of 1<->2 is refused (tuning)
        other = Tl1Driver(emulator.host, emulator.port, password="admin", timeout_s=20.0)
        other.disconnect([1])
        with port_tuning(control, other, agg0, (1, 18)), \
                pytest.raises(CommitError, match="refused remove.*SNVS") as info:
            apply_plan_diff(store, after, {"agg0": agg0})
        other.close()
        cid = info.value.commit_id
        assert store.commit(cid).state == "failed" and store.last_committed_plan("fab") == before
        steps = {s.action: s for s in store.steps(cid)}
        assert steps["remove"].status == "failed" and steps["remove"].confirmed == ()
        assert "SNVS" in steps["remove"].detail
        assert steps["add"].status == "ok" and steps["add"].confirmed == ((5, 22), (6, 21))  # the device applied it
        assert info.value.rolled_back and agg0.cross_connects() == {1: 18, 2: 17}  # and the rollback removed it


@pytest.fixture(scope="module")
def emulator_b():
    """A second emulated switch, so that one step drives two devices at once."""
    yield from _rotor_emulator()


@pytest.fixture
def agg1(emulator_b):
    """A driver of the second emulator as device agg1, with a short timeout."""
    yield from _driver(emulator_b, "agg1", 0.5)


# one circuit on each device, then each re-paired: every device of the step removes and adds
BOTH, BOTH_NEXT = _plan(("agg0", 1, 2), ("agg1", 1, 2)), _plan(("agg0", 1, 3), ("agg1", 1, 3))


def test_a_step_writes_to_every_device_before_reading_a_reply(tmp_path, agg0, agg1):
    events: list[tuple[str, str]] = []
    for drv in (agg0, agg1):
        write, replies = drv._write, drv._replies
        drv._write = lambda cmds, drv=drv, write=write: events.append(("write", drv.name)) or write(cmds)
        drv._replies = lambda pending, drv=drv, replies=replies: events.append(("read", drv.name)) or replies(pending)
    with FabricStore(tmp_path / "f.db") as store:
        apply_plan_diff(store, BOTH, {"agg0": agg0, "agg1": agg1})
        assert events == [("write", "agg0"), ("write", "agg1"), ("read", "agg0"), ("read", "agg1")]
        report = apply_plan_diff(store, BOTH_NEXT, {"agg0": agg0, "agg1": agg1})
        assert report.devices == ("agg0", "agg1") and store.last_committed_plan("fab") == BOTH_NEXT
    assert agg0.cross_connects() == agg1.cross_connects() == {1: 19, 3: 17}
    assert agg0.sessions == agg1.sessions == 1


def test_a_refusal_on_one_device_journals_what_each_device_confirmed_and_reads_every_reply(
        tmp_path, emulator_b, agg0, agg1):
    with FabricStore(tmp_path / "f.db") as store:
        apply_plan_diff(store, BOTH, {"agg0": agg0, "agg1": agg1})
        EmulatorControl(emulator_b.host, emulator_b.port).fail_ports([3])  # agg1 refuses 3 -> 17 (SWFA)
        with pytest.raises(CommitError, match="agg1 refused add.*SWFA") as info:
            apply_plan_diff(store, BOTH_NEXT, {"agg0": agg0, "agg1": agg1})
        steps = {(s.device, s.action): s for s in store.steps(info.value.commit_id)}
        assert {k: s.status for k, s in steps.items()} == {("agg0", "remove"): "ok", ("agg0", "add"): "ok",
                                                           ("agg1", "remove"): "ok", ("agg1", "add"): "failed"}
        assert steps[("agg0", "add")].confirmed == ((1, 19), (3, 17)) and steps[("agg1", "add")].confirmed == ()
        assert info.value.rolled_back and ("agg1", 3, "failed") in info.value.failed_ports
    assert agg0.cross_connects() == agg1.cross_connects() == {1: 18, 2: 17}  # both back at BOTH
    assert agg0.sessions == agg1.sessions == 1  # every reply was read: no session had to be dropped


def test_a_device_whose_replies_are_lost_fails_the_step_with_what_it_really_holds(tmp_path, emulator_b, agg0, agg1):
    with FabricStore(tmp_path / "f.db") as store:
        apply_plan_diff(store, BOTH, {"agg0": agg0, "agg1": agg1})
        EmulatorControl(emulator_b.host, emulator_b.port).drop_replies(next_n=2)  # agg1 applies both, answers none
        with pytest.raises(CommitError, match="agg1 refused remove.*no reply within 0.5 s") as info:
            apply_plan_diff(store, BOTH_NEXT, {"agg0": agg0, "agg1": agg1})
        steps = {(s.device, s.action): s for s in store.steps(info.value.commit_id)}
        assert steps[("agg0", "remove")].status == steps[("agg0", "add")].status == "ok"
        # read back after the timeout: agg1 did apply both commands, which its confirmations say
        assert steps[("agg1", "remove")].confirmed == steps[("agg1", "remove")].requested
        assert steps[("agg1", "add")].confirmed == ((1, 19), (3, 17)) and steps[("agg1", "add")].status == "ok"
        assert "no reply within 0.5 s" in steps[("agg1", "remove")].detail and info.value.rolled_back
    assert agg0.cross_connects() == agg1.cross_connects() == {1: 18, 2: 17}
    assert agg0.sessions == 1 and agg1.sessions == 2  # only the silent device's session was dropped and reopened
