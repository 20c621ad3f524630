"""Faults outside the proxy's control: a full disk (507) and a device that stops answering (503).

The disk is real: a 2 MiB tmpfs holds the state file and a filler file takes its free space (the
test is skipped where mounting is not allowed). The same guarantee is also checked in process with
SQLite's own full-database condition (``PRAGMA max_page_count``), which runs everywhere.
"""

from __future__ import annotations

import os
import subprocess
import time
import uuid

import pytest

from orchestrl.agents.lab import EmulatedFabric
from orchestrl.agents.service.checks import StorageUnavailable
from orchestrl.agents.service.core import ControlService, scope_of
from orchestrl.agents.service.jobs import JobRegistry
from orchestrl.fabric.runtime.store import FabricStore
from orchestrl.fabric.topology import load_topology
from tests.agents.conftest import TOPOLOGY_64, Api, intent, wanted_tables, warm_up
from tests.fabric.fakes import FakeOcsDevice, expected_tables, tables

OPERATOR = "operator-token-0123456789"


@pytest.fixture
def small_disk(tmp_path):
    mount = tmp_path / "disk"
    mount.mkdir()
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(mount)], capture_output=True)
    if done.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({done.stderr.decode().strip()}); the in-process test covers it")
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def _fill(path) -> None:
    """Write zeros until the filesystem refuses (ENOSPC)."""
    with open(path, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
                os.fsync(f.fileno())
        except OSError:
            pass


def test_a_full_disk_answers_507_degrades_health_and_never_splits_journal_from_devices(tmp_path, small_disk):
    with EmulatedFabric(TOPOLOGY_64, tmp_path / "lab", profile="test") as lab:
        lab.start_switches()
        lab.start_proxy("--state", str(small_disk / "fabric.db"), "--audit-period", "0.2")
        op = Api(lab.proxy.url, lab.operator_token)
        status, doc = op.call("POST", "/v1/jobs", {"job": "rl", "gpus": "0-63"})
        api = Api(lab.proxy.url, doc["token"])
        t, _ = warm_up(api, "rl")
        filler = small_disk / "filler"
        _fill(filler)
        answers = []
        bodies = [intent("train-fwd-bwd.yaml", job="rl"), intent("train-grad-sync.yaml", job="rl")]
        for k in range(12):  # alternate two plans until the journal must grow
            status, doc = api.call("POST", "/v1/jobs/rl/intents", {**bodies[k % 2], "t_s": t})
            answers.append(status)
            assert status in (200, 507), (status, doc)  # never "500: this is a bug"
            plan = api.call("GET", "/v1/plan")[1]["jobs"]["rl"]["plan"]
            assert lab.tables() == wanted_tables(plan, lab.topology), f"devices and journal disagree after {status}"
            if status == 507:
                assert doc["error"] == "storage-unavailable" and "full" in doc["reason"], doc
                break
        assert 507 in answers, answers
        status, health = op.call("GET", "/healthz")
        assert status == 503 and any(r.startswith("storage:") for r in health["reasons"]), health
        filler.unlink()  # space again: the proxy notices by itself
        deadline = time.monotonic() + 10
        while op.call("GET", "/healthz")[0] != 200:
            assert time.monotonic() < deadline, op.call("GET", "/healthz")[1]
            time.sleep(0.1)
        status, doc = api.call("POST", "/v1/jobs/rl/intents", {**bodies[len(answers) % 2], "t_s": t})
        assert status == 200 and doc["decision"] in ("commit", "unchanged"), doc
        plan = api.call("GET", "/v1/plan")[1]["jobs"]["rl"]["plan"]
        assert lab.tables() == wanted_tables(plan, lab.topology)
        lab.proxy.kill()  # and after a restart on the same file, the journal still explains the devices
        lab.start_proxy("--state", str(small_disk / "fabric.db"))
        assert lab.tables() == wanted_tables(plan, lab.topology)


def _train(job: str, variant: int) -> dict:
    layout = [{"tp": 4, "ep": 4, "dp": 4, "pp": 2, "gpus": "0-31"}, {"tp": 2, "ep": 8, "dp": 8, "pp": 2, "gpus": "0-31"}]
    return {"job": job, "stage": "train", "period": "fwd-bwd", "layout": layout[variant], "collectives": [
        {"primitive": "all-to-all", "over": "ep", "bytes_per_rank": 2e9},
        {"primitive": "p2p", "over": "pp", "bytes_per_rank": 5e8}]}


def test_sqlite_full_mid_commit_leaves_devices_at_the_journal_and_answers_507(tmp_path):
    topology = load_topology(TOPOLOGY_64)
    devices = {d: FakeOcsDevice(d, dev.radix_ports) for d, dev in topology.devices.items()}
    store = FabricStore(tmp_path / f"{uuid.uuid4().hex}.db")
    service = ControlService(topology, devices, store, JobRegistry(topology, [OPERATOR]))
    service.recover()
    service.register_job("rl", "0-31")
    events = [e for k in range(6) for e in (
        {"kind": "start", "t_s": 0.05 * k, "stage": "train", "primitive": "all-to-all", "communicator": "ep"},
        {"kind": "end", "t_s": 0.05 * k + 0.002, "stage": "train", "primitive": "all-to-all", "communicator": "ep"})]
    service.report_events("rl", events)
    assert service.announce_intent("rl", {**_train("rl", 0), "t_s": 0.252}).decision == "commit"
    before = store.last_committed_plan(scope_of("rl"))
    pages = store._conn.execute("PRAGMA page_count").fetchone()[0]
    store._conn.execute(f"PRAGMA max_page_count = {pages}")  # SQLite itself: "database or disk is full"
    refused = 0
    for k in range(6):  # the WAL absorbs a few writes; keep changing the plan until the file must grow
        try:
            service.announce_intent("rl", {**_train("rl", (k + 1) % 2), "t_s": 0.252})
        except StorageUnavailable as exc:
            assert "full" in exc.reason
            refused += 1
        held = store.last_committed_plan(scope_of("rl"))
        assert tables(devices) == expected_tables(held, devices), "devices disagree with the journal"
        if refused:
            break
    assert refused, "the store never filled up"
    assert service.health()["status"] == "degraded"
    store._conn.execute("PRAGMA max_page_count = 1073741823")
    service.storage_probe()
    assert service.health()["storage"]["state"] == "ok"
    d = service.announce_intent("rl", {**_train("rl", 0 if held is before else 1), "t_s": 0.252})
    assert d.decision in ("commit", "unchanged")
    assert tables(devices) == expected_tables(store.last_committed_plan(scope_of("rl")), devices)
    service.close()


def test_a_device_that_stops_answering_gets_503_naming_it_and_health_names_it(tmp_path):
    with EmulatedFabric(TOPOLOGY_64, tmp_path, profile="test") as lab:
        lab.start_switches()
        lab.start_proxy("--audit-period", "0.2")
        op = Api(lab.proxy.url, lab.operator_token)
        status, doc = op.call("POST", "/v1/jobs", {"job": "rl", "gpus": "0-31"})
        api = Api(lab.proxy.url, doc["token"])
        t, _ = warm_up(api, "rl")
        lab.switches["pod0/agg0"].process.kill()
        lab.switches["pod0/agg0"].process.wait(10)
        status, doc = api.call("POST", "/v1/jobs/rl/intents", {**intent("train-fwd-bwd.yaml", job="rl"), "t_s": t})
        assert status == 503 and "pod0/agg0" in doc["reason"], (status, doc)
        deadline = time.monotonic() + 10
        while True:
            status, health = op.call("GET", "/healthz")
            if any("pod0/agg0" in r and "unreachable" in r for r in health["reasons"]):
                break
            assert time.monotonic() < deadline, health
            time.sleep(0.1)
        assert status == 503 and health["status"] == "degraded"
        del lab.switches["pod0/agg0"]
