"""Commits whose outcome is unknown or half-applied: the answer, health and the journal say what is true.

Real emulated switches and a real proxy subprocess (issue 28.3 and 28.7).
"""

from __future__ import annotations

import time

from orchestrl.agents.lab import EmulatedFabric
from tests.agents.conftest import TOPOLOGY_64, Api, intent, wanted_tables, warm_up

PERIOD_S = 0.2
TIMEOUT_S = 1.0  # the devices file's reply timeout


def _until(check, timeout_s: float = 20.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"{what} not reached within {timeout_s} s")


def _job(lab: EmulatedFabric) -> tuple[Api, Api, float]:
    lab.start_switches()
    lab.start_proxy("--audit-period", str(PERIOD_S))
    op = Api(lab.proxy.url, lab.operator_token)
    status, doc = op.call("POST", "/v1/jobs", {"job": "rl", "gpus": "0-63"})
    assert status == 201, doc
    api = Api(lab.proxy.url, doc["token"])
    t, _ = warm_up(api, "rl")
    status, doc = api.call("POST", "/v1/jobs/rl/intents", {**intent("train-fwd-bwd.yaml", job="rl"), "t_s": t})
    assert status == 200 and doc["decision"] == "commit", doc
    return op, api, t


def _journal(lab: EmulatedFabric, api: Api) -> dict:
    return wanted_tables(api.call("GET", "/v1/plan")[1]["jobs"]["rl"]["plan"], lab.topology)


def test_a_switch_slower_than_its_timeout_mid_commit_is_answered_in_bounded_time_as_in_doubt_and_settled(tmp_path):
    with EmulatedFabric(TOPOLOGY_64, tmp_path, profile="test", timeout_s=TIMEOUT_S) as lab:
        op, api, t = _job(lab)
        lab.control("pod0/agg0").delay_replies(1500)  # it applies every command, and answers after the timeout
        api.call("POST", "/v1/jobs/rl/events", {"events": [{"kind": "weight-sync-begin", "t_s": t + 1,
                                                            "window_hint_s": 60.0}]})
        body = {**intent("weight-sync.yaml", job="rl"), "t_s": t + 1}
        started = time.monotonic()
        status, doc = api.call("POST", "/v1/jobs/rl/intents", body)
        took = time.monotonic() - started
        health_status, health = Api(lab.proxy.url).call("GET", "/healthz")  # at once
        assert status == 503 and "in doubt" in doc["reason"], (status, doc)
        assert "keeps its last committed circuits" not in doc["reason"], doc
        # the stated bound: (steps + 1) device round trips of timeout_s + switching (0 here); a weight-sync change
        # is at most 3 steps, so 4 s; the request also waits for the journal and the HTTP round trip
        assert took < 4 * TIMEOUT_S + 1.0, f"answered after {took:.1f} s"
        assert health_status == 503 and any("in doubt" in r for r in health["reasons"]), health
        lab.control("pod0/agg0").delay_replies(0)
        # the next read-back settles it: journal and switches agree, health is ok again
        _until(lambda: lab.tables() == _journal(lab, api), what="journal and switches agree")
        _until(lambda: Api(lab.proxy.url).call("GET", "/healthz")[0] == 200, what="health ok")
        log = op.call("GET", "/v1/decisions?limit=50")[1]["decisions"]
        assert any(r.get("decision") == "settled" for r in log), log
        api.call("POST", "/v1/jobs/rl/events", {"events": [{"kind": "weight-sync-begin", "t_s": t + 2,
                                                            "window_hint_s": 60.0}]})
        status, doc = api.call("POST", "/v1/jobs/rl/intents", {**body, "t_s": t + 2})
        assert status == 200 and doc["decision"] in ("commit", "unchanged"), doc
        assert lab.tables() == _journal(lab, api)


def test_a_partial_failure_says_the_devices_may_be_half_changed_when_they_are(tmp_path):
    with EmulatedFabric(TOPOLOGY_64, tmp_path, profile="test") as lab:
        op, api, t = _job(lab)
        for name in lab.switches:
            lab.control(name).partial_bulk(2)  # every bulk connect applies 2 pairs, then stops (also the rollback's)
        api.call("POST", "/v1/jobs/rl/events", {"events": [{"kind": "weight-sync-begin", "t_s": t + 1,
                                                            "window_hint_s": 60.0}]})
        status, doc = api.call("POST", "/v1/jobs/rl/intents", {**intent("weight-sync.yaml", job="rl"), "t_s": t + 1})
        held, journal = lab.tables(), _journal(lab, api)
        health_status, health = Api(lab.proxy.url).call("GET", "/healthz")
        assert status == 503 and doc["error"] == "device-unavailable", (status, doc)
        if held != journal:
            assert "may be half-changed" in doc["reason"] and "agree" not in doc["reason"], doc
            assert health_status == 503, health  # at once, not after the next audit
        else:
            assert "agree" in doc["reason"], doc
        for name in lab.switches:
            lab.control(name).partial_bulk(None)
        _until(lambda: lab.tables() == _journal(lab, api), what="the audit repairs once the fault is gone")
