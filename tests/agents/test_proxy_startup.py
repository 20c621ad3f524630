"""Start-up against switches that hold circuits: new, empty, copied, corrupt or shared state files; adopt, reset, backup.

Every proxy here is a real ``orchestrl proxy serve`` subprocess over real emulated switches; a
refused start must leave every device exactly as it was and print no traceback.
"""

from __future__ import annotations

import shutil
import sqlite3
import subprocess
import sys

import pytest

from orchestrl.agents.lab import EmulatedFabric
from tests.agents.conftest import REPO, TOPOLOGY_64, Api, intent, warm_up


def _fabric_with_circuits(lab: EmulatedFabric) -> tuple[Api, dict]:
    """Switches, a proxy, one job committed on PoD 0 and 1; return the job's client and the device tables."""
    lab.start_switches()
    lab.start_proxy()
    op = Api(lab.proxy.url, lab.operator_token)
    status, doc = op.call("POST", "/v1/jobs", {"job": "rl", "gpus": "0-63"})
    assert status == 201, doc
    api = Api(lab.proxy.url, doc["token"])
    t, _ = warm_up(api, "rl")
    status, doc = api.call("POST", "/v1/jobs/rl/intents", {**intent("train-fwd-bwd.yaml", job="rl"), "t_s": t})
    assert status == 200 and doc["decision"] == "commit", doc
    held = lab.tables()
    assert sum(map(len, held.values())) > 0
    return api, held


def _refused(lab: EmulatedFabric, *args: str) -> str:
    with pytest.raises(RuntimeError) as err:
        lab.start_proxy(*args, timeout_s=60)
    text = str(err.value)
    assert "Traceback" not in text, text
    return text


def test_a_new_empty_or_copied_state_file_never_wipes_switches_that_hold_circuits(tmp_path):
    with EmulatedFabric(TOPOLOGY_64, tmp_path / "lab", profile="test") as lab:
        _, held = _fabric_with_circuits(lab)
        copied = tmp_path / "copied.db"
        shutil.copy(lab.state_path, copied)  # `cp fabric.db` while the proxy runs: the commits are still in the WAL
        with sqlite3.connect(f"file:{copied}?mode=ro", uri=True) as db:  # the copy lacks what the WAL held
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
            assert "commits" not in tables or not db.execute(
                "SELECT count(*) FROM commits WHERE state = 'committed'").fetchone()[0]
        lab.proxy.kill()
        empty = tmp_path / "empty.db"
        empty.touch()
        for state in (tmp_path / "new.db", empty, copied):
            text = _refused(lab, "--state", str(state))
            assert "does not explain what the devices hold" in text and "--adopt" in text and "--reset" in text
            assert "pod0/agg0:" in text and "would be removed" in text, text
            assert lab.tables() == held, f"a refused start with {state.name} changed the devices"

        # --adopt: the devices' circuits become the committed plan; nothing on a device changes.
        lab.start_proxy("--state", str(tmp_path / "new.db"), "--adopt")
        op = Api(lab.proxy.url, lab.operator_token)
        assert lab.tables() == held
        status, health = op.call("GET", "/healthz")
        assert status == 200 and health["status"] == "ok", health
        lab.proxy.stop()
        lab.start_proxy("--state", str(tmp_path / "new.db"))  # adopted: the journal explains the devices now
        assert lab.tables() == held
        lab.proxy.stop()

        # --reset: the devices are made to match the (empty) journal.
        lab.start_proxy("--state", str(tmp_path / "other.db"), "--reset")
        assert not any(lab.tables().values())


def test_a_second_proxy_on_the_same_state_file_is_refused_naming_the_first_ones_pid_until_it_stops(tmp_path):
    with EmulatedFabric(TOPOLOGY_64, tmp_path, profile="test") as lab:
        lab.start_switches()
        first = lab.start_proxy()
        text = _refused(lab)
        assert f"in use by another orchestrl proxy (pid {first.process.pid})" in text, text
        assert first.process.poll() is None
        first.stop()  # SIGTERM: a clean exit that closes the state file and releases the lock
        assert first.process.returncode == 0, "\n".join(first.output)
        lab.start_proxy()


def test_an_online_backup_taken_while_serving_restores_the_fabric_exactly(tmp_path):
    with EmulatedFabric(TOPOLOGY_64, tmp_path / "lab", profile="test") as lab:
        api, held = _fabric_with_circuits(lab)
        plan = api.call("GET", "/v1/plan")[1]["jobs"]["rl"]["plan"]
        out = subprocess.run([sys.executable, "-m", "orchestrl.agents.cli", "proxy", "backup", "--state", str(lab.state_path),
                              str(tmp_path / "backup.db")], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0 and "committed records" in out.stdout, out.stderr
        lab.proxy.kill()
        restored = tmp_path / "restored.db"
        shutil.copy(tmp_path / "backup.db", restored)  # restore = put the backup in place while no proxy runs
        lab.start_proxy("--state", str(restored))
        api = Api(lab.proxy.url, api.token)  # the job and its token are in the backup too
        assert api.call("GET", "/v1/plan")[1]["jobs"]["rl"]["plan"]["circuits"] == plan["circuits"]
        assert lab.tables() == held
        again = subprocess.run([sys.executable, "-m", "orchestrl.agents.cli", "proxy", "backup", "--state", str(lab.state_path),
                                str(tmp_path / "backup.db")], cwd=REPO, capture_output=True, text=True, timeout=60)
        assert again.returncode == 2 and "already exists" in again.stderr and "Traceback" not in again.stderr


@pytest.mark.parametrize("damage", ["missing table", "garbled plan", "garbled job"])
def test_a_corrupt_state_file_is_refused_cleanly_and_the_devices_are_left_alone(tmp_path, damage):
    with EmulatedFabric(TOPOLOGY_64, tmp_path, profile="test") as lab:
        _, held = _fabric_with_circuits(lab)
        lab.proxy.stop()
        with sqlite3.connect(lab.state_path) as db:
            if damage == "missing table":
                db.execute("DROP TABLE commit_steps")
            elif damage == "garbled plan":
                db.execute("UPDATE commits SET plan_json = x'789cdeadbeef' WHERE state = 'committed'")
            else:
                db.execute("UPDATE service_jobs SET gpus_json = '[\"zero\"]'")
        text = _refused(lab)
        expect = {"missing table": "table commit_steps is missing", "garbled plan": "holds an unreadable plan",
                  "garbled job": "service_jobs holds an unreadable job"}[damage]
        assert expect in text and "backup" in text, text
        assert lab.tables() == held
