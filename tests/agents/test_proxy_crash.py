"""Crash and restart: the proxy is killed with SIGKILL mid-commit and restarted on the same state file."""

from __future__ import annotations

import sqlite3
import threading
import time

import pytest

from orchestrl.agents.lab import EmulatedFabric
from orchestrl.fabric.runtime.store import FabricStore
from tests.agents.conftest import TOPOLOGY_64, Api, intent, wait_settled, wanted_tables, warm_up

SLOW_MS = 2000  # each device's bulk command (its switching, then its reply) takes this long


def _in_flight(state: str) -> int | None:
    """Return the id of the open commit (None while no commit is open)."""
    with sqlite3.connect(f"file:{state}?mode=ro", uri=True, timeout=5) as db:
        row = db.execute("SELECT id FROM commits WHERE state = 'intent' ORDER BY id LIMIT 1").fetchone()
        return None if row is None else row[0]


def _last_committed(lab: EmulatedFabric, job: str):
    with FabricStore(lab.state_path) as store:
        return store.last_committed_plan(f"job/{job}")


def _start(lab: EmulatedFabric, job: str = "rl") -> Api:
    lab.start_switches()
    lab.start_proxy()
    op = Api(lab.proxy.url, lab.operator_token)
    status, doc = op.call("POST", "/v1/jobs", {"job": job, "gpus": "0-63"})
    assert status == 201, doc
    return Api(lab.proxy.url, doc["token"])


def test_kill_during_a_commit_then_restart_leaves_devices_exactly_at_the_last_committed_plan(tmp_path):
    with EmulatedFabric(TOPOLOGY_64, tmp_path) as lab:  # 3D MEMS profile: real switching delays
        api = _start(lab)
        t, _ = warm_up(api, "rl")
        status, doc = api.call("POST", "/v1/jobs/rl/intents", {**intent("train-fwd-bwd.yaml", job="rl"), "t_s": t})
        assert doc["decision"] == "commit", doc
        before = api.call("GET", "/v1/plan")[1]["jobs"]["rl"]["plan"]

        # The weight-sync plan changes all three devices (at once); each applies a command at once,
        # then takes 2 s to switch and 2 s more to reply.
        for name in lab.switches:
            lab.control(name).switch_delay(SLOW_MS)
            lab.control(name).delay_replies(SLOW_MS)
        api.call("POST", "/v1/jobs/rl/events", {"events": [{"kind": "weight-sync-begin", "t_s": t + 1,
                                                            "window_hint_s": 60.0}]})
        body = {**intent("weight-sync.yaml", job="rl"), "t_s": t + 1}
        answer: list = []

        def post() -> None:  # the connection dies with the proxy: that error is the expected outcome
            try:
                answer.append(api.call("POST", "/v1/jobs/rl/intents", body))
            except OSError as exc:
                answer.append(exc)

        poster = threading.Thread(target=post, daemon=True)
        poster.start()
        deadline = time.monotonic() + 60
        # Kill while the first step is in flight: the devices have applied their commands, their
        # replies are on the way, and the journal holds the intent and nothing else of the change.
        while _in_flight(str(lab.state_path)) is None:
            assert time.monotonic() < deadline and poster.is_alive(), f"commit never went in flight: {answer}"
            time.sleep(0.02)
        time.sleep(0.5)
        lab.proxy.kill()
        poster.join(60)
        for name in lab.switches:
            lab.control(name).switch_delay(0)
            lab.control(name).delay_replies(0)
        wait_settled(lab)
        assert lab.tables() != wanted_tables(before, lab.topology), "the crash should leave devices half-changed"

        lab.start_proxy()  # same state file: reconcile at start-up
        api = Api(lab.proxy.url, api.token)  # the job and its token survive the restart
        committed = _last_committed(lab, "rl")
        assert committed is not None and committed.template == "train"
        assert lab.tables() == wanted_tables(api.call("GET", "/v1/plan")[1]["jobs"]["rl"]["plan"], lab.topology)
        assert lab.tables() == wanted_tables(before, lab.topology)
        assert api.call("GET", "/healthz")[1]["status"] == "ok"
        metrics = Api(lab.proxy.url, lab.operator_token).call("GET", "/metrics")[1]
        assert 'orchestrl_reconciliations_total{outcome="ok"} 1' in metrics

        # And the fabric keeps working: the same intent commits now.
        api.call("POST", "/v1/jobs/rl/events", {"events": [{"kind": "weight-sync-begin", "t_s": t + 2,
                                                            "window_hint_s": 60.0}]})
        status, doc = api.call("POST", "/v1/jobs/rl/intents", {**body, "t_s": t + 2})
        assert status == 200 and doc["decision"] == "commit", doc
        assert lab.tables() == wanted_tables(api.call("GET", "/v1/plan")[1]["jobs"]["rl"]["plan"], lab.topology)


@pytest.mark.parametrize("keep_table", [False, True])
def test_restart_restores_a_device_that_lost_its_table_and_masks_a_failed_port(tmp_path, keep_table):
    with EmulatedFabric(TOPOLOGY_64, tmp_path, profile="test") as lab:
        api = _start(lab)
        t, _ = warm_up(api, "rl")
        status, doc = api.call("POST", "/v1/jobs/rl/intents", {**intent("train-fwd-bwd.yaml", job="rl"), "t_s": t})
        assert doc["decision"] == "commit", doc
        plan = api.call("GET", "/v1/plan")[1]["jobs"]["rl"]["plan"]
        victim = next(c for c in plan["circuits"] if c["device"] == "pod0/agg0")
        lab.proxy.kill()
        control = lab.control("pod0/agg0")
        control.restart(keep_table=keep_table)
        control.fail_ports([victim["a_port"]])

        lab.start_proxy()
        api, op = Api(lab.proxy.url, api.token), Api(lab.proxy.url, lab.operator_token)
        masked = op.call("GET", "/v1/topology")[1]["masked_ports"]
        assert {"device": "pod0/agg0", "port": victim["a_port"], "reason": "failed"} in masked
        after = api.call("GET", "/v1/plan")[1]["jobs"]["rl"]["plan"]
        assert len(after["circuits"]) == len(plan["circuits"]) - 1  # the failed circuit is dropped, the rest kept
        assert lab.tables() == wanted_tables(after, lab.topology)
        log = api.call("GET", "/v1/decisions?limit=5")[1]["decisions"]
        assert log[0]["decision"] == "defer"  # re-planned around the port; waits for a window after restart
