"""The durable store: commit journal, template cache, masked ports, decision log, file errors."""

import shutil
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from orchestrl.fabric.plan import Circuit, CircuitPlan, CrossConnect
from orchestrl.fabric.runtime.store import (SCHEMA_VERSION, FabricStore, StoreCorruptError, StoreError, StoreVersionError,
                          default_store_path)
from orchestrl.fabric.runtime.store_checkpoint import SAFETY_FRAMES
from orchestrl.fabric.templates.cache import TemplateCache

ROOT = Path(__file__).resolve().parents[2]


def _plan(*xcs: tuple[str, int, int], template: str = "train") -> CircuitPlan:
    circuits = tuple(Circuit("agg", 0, f"t{a}", f"t{b}", CrossConnect(d, a, b)) for d, a, b in xcs)
    return CircuitPlan("fab", template, "sig", 1e11, circuits, notes=("hand-made",))


def test_commit_lifecycle_and_queries():
    with FabricStore(":memory:") as store:
        assert store.last_committed_plan("fab") is None and store.in_flight() == []
        first = _plan(("agg0", 1, 2))
        c1 = store.begin_commit("fab", first)
        assert [r.id for r in store.in_flight()] == [c1] and store.last_committed("fab") is None
        store.record_step(c1, "agg0", "add", [(1, 10), (2, 9)], [(1, 10), (2, 9)], "ok")
        store.finish_commit(c1, "committed")
        assert store.last_committed_plan("fab") == first  # plan survives the JSON round trip
        c2 = store.begin_commit("fab", _plan(("agg0", 3, 4)), base_id=c1)
        store.finish_commit(c2, "failed", "agg0 refused")
        assert store.last_committed("fab").id == c1  # a failed commit never becomes the truth
        assert store.commit(c2).state == "failed" and store.commit(c2).note == "agg0 refused"
        assert store.commit(c2).base_id == c1
        steps = store.steps(c1)
        assert len(steps) == 1 and steps[0].confirmed == ((1, 10), (2, 9)) and steps[0].status == "ok"
        assert store.scopes() == ["fab"] and [r.id for r in store.history()] == [c2, c1]


def test_finished_commits_cannot_be_changed():
    with FabricStore(":memory:") as store:
        cid = store.begin_commit("fab", _plan())
        with pytest.raises(ValueError, match="state 'done'"):
            store.finish_commit(cid, "done")
        store.finish_commit(cid, "committed")
        with pytest.raises(ValueError, match="already committed"):
            store.finish_commit(cid, "aborted")
        with pytest.raises(ValueError, match="already committed"):
            store.record_step(cid, "agg0", "add", [], [], "ok")
        with pytest.raises(KeyError, match="no commit with id 999"):
            store.commit(999)


def test_scopes_are_independent():
    with FabricStore(":memory:") as store:
        for scope, port in (("pod0", 1), ("pod1", 3)):
            store.finish_commit(store.begin_commit(scope, _plan(("agg0", port, port + 1))), "committed")
        store.begin_commit("pod1", _plan())
        assert store.last_committed_plan("pod0").circuits[0].xc.a_port == 1
        assert [r.scope for r in store.in_flight()] == ["pod1"] and store.in_flight("pod0") == []


def test_commit_retention_keeps_last_committed_and_unfinished():
    with FabricStore(":memory:", commit_retention=3) as store:
        good = store.begin_commit("fab", _plan(("agg0", 1, 2)))
        store.finish_commit(good, "committed")
        open_one = store.begin_commit("fab", _plan(("agg0", 5, 6)))
        for _ in range(6):
            store.finish_commit(store.begin_commit("fab", _plan()), "failed", "refused")
        ids = {r.id for r in store.history(limit=100)}
        assert good in ids and open_one in ids and len(ids) == 5  # 3 newest finished + both protected


def test_a_chain_of_steps_closes_one_and_opens_the_next_in_one_write(tmp_path):
    from orchestrl.fabric.runtime.store import DeviceStep

    first, second, third = _plan(("agg0", 1, 2)), _plan(("agg0", 1, 2), ("agg0", 3, 4)), _plan(("agg0", 3, 4))
    add = DeviceStep("agg0", "add", ((3, 12), (4, 11)), ((3, 12), (4, 11)), "ok")
    remove = DeviceStep("agg0", "remove", ((1, 10), (2, 9)), ((1, 10), (2, 9)), "ok")
    with FabricStore(tmp_path / "f.db") as store:
        base = store.begin_commit("fab", first)
        store.finish_commit(base, "committed")
        c1 = store.begin_commit("fab", second, base_id=base)
        c2 = store.advance_commit(c1, [add], third)
        # step 1 is committed and step 2 in flight, together: a crash now leaves exactly this
        assert store.last_committed("fab").id == c1 and [r.id for r in store.in_flight()] == [c2]
        assert store.commit(c2).base_id == c1 and store.commit(c2).plan == third
        store.finish_commit(c2, "committed", steps=[remove])
        assert store.last_committed_plan("fab") == third and store.in_flight() == []
        assert [(s.action, s.confirmed) for s in store.steps(c1)] == [("add", add.confirmed)]
        assert [(s.action, s.status) for s in store.steps(c2)] == [("remove", "ok")]
        with pytest.raises(ValueError, match="already committed"):
            store.advance_commit(c2, [], first)


def test_decision_rows_written_without_their_own_fsync_are_kept(tmp_path):
    with FabricStore(tmp_path / "f.db") as store:
        before = store.durable_writes
        store.log_decision("pod0", "deferred", {"reason": "window too short"})
        assert store.durable_writes == before  # no fsync of its own
    with FabricStore(tmp_path / "f.db") as store:
        assert [r.detail["reason"] for r in store.decisions()] == ["window too short"]


def test_template_cache_round_trip():
    cache = TemplateCache()
    cache.get_or_create("sig-a", "train", "fwd", None, "greedy")
    cache.get_or_create("sig-b", "gen", "decode", None, "uniform")
    with FabricStore(":memory:") as store:
        store.save_template_cache(cache)
        store.save_template_cache(cache)  # upsert, no duplicates
        loaded = store.load_template_cache()
    assert sorted(e.signature for e in loaded.entries()) == ["sig-a", "sig-b"]
    assert {e.signature: e for e in loaded.entries()} == {e.signature: e for e in cache.entries()}


def test_masked_ports_keep_first_time_and_take_new_reason():
    with FabricStore(":memory:") as store:
        fresh = store.mask_ports([("agg0", 3, "failed"), ("core0", 7, "operator")])
        assert [(m.device, m.port) for m in fresh] == [("agg0", 3), ("core0", 7)]
        first_time = store.masked_ports()[0].masked_at
        assert store.mask_ports([("agg0", 3, "force-blocked")]) == []
        again = store.masked_ports()[0]
        assert again.reason == "force-blocked" and again.masked_at == first_time
        assert store.unmask_port("agg0", 3) and not store.unmask_port("agg0", 3)
        assert [(m.device, m.port) for m in store.masked_ports()] == [("core0", 7)]


def test_decision_log_is_bounded():
    with FabricStore(":memory:", decision_retention=5) as store:
        for i in range(12):
            store.log_decision("pod0" if i % 2 else "pod1", "deferred", {"i": i, "reason": "window too short"})
        rows = store.decisions(limit=100)
        assert [r.detail["i"] for r in rows] == [11, 10, 9, 8, 7]
        assert [r.detail["i"] for r in store.decisions("pod0")] == [11, 9, 7]


def test_file_store_uses_wal_and_full_sync_for_its_durable_writes(tmp_path):
    path = tmp_path / "sub" / "fabric.db"
    with FabricStore(path) as store:
        sql: list[str] = []
        store._conn.set_trace_callback(sql.append)
        store.finish_commit(store.begin_commit("fab", _plan(("agg0", 1, 2))), "committed")
        store.mask_ports([("agg0", 3, "failed")])
        # every durable write (the commit's close, a mask) commits at FULL; the intent before it at NORMAL
        control = [q for q in sql if q.startswith(("BEGIN", "COMMIT", "PRAGMA synchronous"))]
        assert control == ["BEGIN IMMEDIATE", "COMMIT"] + ["PRAGMA synchronous=FULL", "BEGIN IMMEDIATE", "COMMIT",
                                                           "PRAGMA synchronous=NORMAL"] * 2
        assert store.durable_writes == 2
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    conn.close()
    with FabricStore(path) as store:
        assert store.last_committed_plan("fab").circuits[0].xc == CrossConnect("agg0", 1, 2)


def test_the_wal_is_checkpointed_into_the_database_file_in_the_background(tmp_path):
    path = tmp_path / "fabric.db"
    with FabricStore(path) as store:
        every = store._checkpointer.every
        plans = [_plan(("agg0", i, i + 1)) for i in range(1, 2 * every + 1, 2)]
        for plan in plans:  # every-th durable write asks for a checkpoint
            store.finish_commit(store.begin_commit("fab", plan), "committed")
        assert store._checkpointer.wait_idle(10) and store._checkpointer.checkpoints >= 1
        # a commit checkpoints only past SAFETY_FRAMES (4x SQLite's 1,000), far more than these commits write
        assert store._conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == SAFETY_FRAMES
        shutil.copy(path, tmp_path / "main-file-only.db")  # the database file alone, without its WAL
    with FabricStore(tmp_path / "main-file-only.db") as copy:
        assert copy.last_committed_plan("fab") == plans[-1]


def test_default_path_follows_xdg_state_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert default_store_path() == tmp_path / "orchestrl" / "fabric.db"
    monkeypatch.delenv("XDG_STATE_HOME")
    assert default_store_path() == Path.home() / ".local" / "state" / "orchestrl" / "fabric.db"


def test_newer_schema_is_refused_with_the_file_name(tmp_path):
    path = tmp_path / "fabric.db"
    FabricStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version={SCHEMA_VERSION + 1}")
    conn.close()
    with pytest.raises(StoreVersionError, match=rf"{path}.*newer than this orchestrl supports.*upgrade orchestrl"):
        FabricStore(path)



def test_plans_are_journalled_compressed_and_a_schema_1_file_is_read_and_upgraded(tmp_path):
    import json
    import zlib

    from orchestrl.fabric.plan import plan_to_json

    path, plan = tmp_path / "fabric.db", _plan(("agg0", 1, 2), ("agg0", 3, 4))
    with FabricStore(path) as store:
        store.finish_commit(store.begin_commit("fab", plan), "committed")
    conn = sqlite3.connect(path)
    doc = conn.execute("SELECT plan_json FROM commits").fetchone()[0]
    assert json.loads(zlib.decompress(doc)) == plan_to_json(plan, derived=False)
    # a file written by schema 1 holds the JSON text: it is still read, and the file is upgraded in place
    conn.execute("UPDATE commits SET plan_json = ?", (json.dumps(plan_to_json(plan, derived=False)),))
    conn.execute("PRAGMA user_version=1")
    conn.commit()
    conn.close()
    with FabricStore(path) as store:
        assert store.last_committed_plan("fab").cross_connects() == plan.cross_connects()
        store.finish_commit(store.begin_commit("fab", plan), "committed")
        assert len(store.history("fab")) == 2
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 2
    conn.close()


def test_corrupt_file_names_the_file_and_the_fix(tmp_path):
    path = tmp_path / "fabric.db"
    path.write_bytes(b"this is not a database" * 100)
    with pytest.raises(StoreCorruptError, match=rf"{path}.*fix: restore the file from a backup, or move it aside"):
        FabricStore(path)


def test_foreign_sqlite_database_is_refused(tmp_path):
    path = tmp_path / "other.db"
    conn = sqlite3.connect(path)
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    with pytest.raises(StoreError, match="not an orchestrl store"):
        FabricStore(path)


def test_unwritable_location_is_a_store_error(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("x")
    with pytest.raises(StoreError, match="cannot create its directory"):
        FabricStore(blocker / "sub" / "fabric.db")


_WRITER = textwrap.dedent("""
    import os, sys, threading
    from orchestrl.fabric.plan import Circuit, CircuitPlan, CrossConnect
    from orchestrl.fabric.runtime.store import FabricStore

    path, mode = sys.argv[1], sys.argv[2]
    store = FabricStore(path, commit_retention=10**6)  # keep every record, so each can be checked
    if mode == "timer":  # die at an arbitrary moment, possibly inside a transaction
        threading.Timer(float(sys.argv[3]), lambda: os._exit(9)).start()
    i = 0
    while True:
        i += 1
        plan = CircuitPlan("fab", "train", f"sig{i}", 1e11,
                           (Circuit("agg", 0, "a", "b", CrossConnect("agg0", i % 50 + 1, i % 50 + 60)),))
        cid = store.begin_commit("fab", plan)
        store.record_step(cid, "agg0", "add", [(1, 2)], [(1, 2)], "ok")
        if mode == "step" and i == 5:
            os._exit(9)  # mid-journal: intent and one confirmation written, never finished
        store.finish_commit(cid, "committed")
        print(cid, flush=True)
""")


@pytest.mark.parametrize("mode", ["step", "timer"])
def test_no_committed_record_is_lost_when_the_writer_dies(tmp_path, mode):
    path = tmp_path / "fabric.db"
    args = [sys.executable, "-c", _WRITER, str(path), mode] + (["0.4"] if mode == "timer" else [])
    proc = subprocess.run(args, cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 9, proc.stderr
    acknowledged = [int(x) for x in proc.stdout.split()]
    assert acknowledged, "the writer died before committing anything"
    with FabricStore(path) as store:
        for cid in acknowledged:  # every commit the writer saw finish is on disk, committed
            assert store.commit(cid).state == "committed"
        last = store.last_committed("fab")
        assert last.id >= acknowledged[-1] and last.plan.signature == f"sig{last.id}"
        pending = store.in_flight()
        assert len(pending) <= 1 and all(r.id > last.id for r in pending)
        if mode == "step":
            assert [r.id for r in pending] == [5] and len(store.steps(5)) == 1
