"""The device audit: a switch that loses its table, keeps half a bulk command, is patched by hand or comes up late.

Real emulated switches and a real proxy subprocess with a short audit period; health, metrics and
the decision log are read over HTTP as an operator would.
"""

from __future__ import annotations

import time

import pytest

from orchestrl.agents.lab import EmulatedFabric
from orchestrl.fabric.ocs.errors import OcsTimeout
from tests.agents.conftest import TOPOLOGY_64, Api, intent, wanted_tables, warm_up

PERIOD_S = 0.2
# Parity (issue 29): the scenarios run over every adapter, each against its own emulator.
every_protocol = pytest.mark.parametrize("protocol", ["tl1", "netconf", "gnmi"])


def _lab_with_job(lab: EmulatedFabric, *extra: str) -> tuple[Api, Api, float]:
    lab.start_switches()
    lab.start_proxy("--audit-period", str(PERIOD_S), *extra)
    op = Api(lab.proxy.url, lab.operator_token)
    status, doc = op.call("POST", "/v1/jobs", {"job": "rl", "gpus": "0-63"})
    assert status == 201, doc
    api = Api(lab.proxy.url, doc["token"])
    t, _ = warm_up(api, "rl")
    status, doc = api.call("POST", "/v1/jobs/rl/intents", {**intent("train-fwd-bwd.yaml", job="rl"), "t_s": t})
    assert status == 200 and doc["decision"] == "commit", doc
    return op, api, t


def _until(check, timeout_s: float = 15.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.05)
    raise AssertionError(f"{what} not reached within {timeout_s} s")


def _journal_tables(lab: EmulatedFabric, api: Api) -> dict:
    return wanted_tables(api.call("GET", "/v1/plan")[1]["jobs"]["rl"]["plan"], lab.topology)


@every_protocol
def test_a_switch_that_loses_its_table_is_reported_and_repaired_in_the_jobs_next_safe_window(tmp_path, protocol):
    with EmulatedFabric(TOPOLOGY_64, tmp_path, profile="test", protocol=protocol) as lab:
        op, api, t = _lab_with_job(lab)
        wanted = _journal_tables(lab, api)
        assert lab.tables() == wanted
        lost_at = time.time()
        lab.control("pod0/agg0").restart(keep_table=False, down_ms=50)  # power cycle: the table is gone
        back_at = time.time()

        def logged():
            log = op.call("GET", "/v1/decisions?limit=100")[1]["decisions"]
            mine = {d["decision"]: d for d in log if d.get("device") == "pod0/agg0"}
            return mine if "drift" in mine and "repaired" in mine else None
        # The job is quiet (no collective in flight, no events): its next safe window is now, so the audit repairs.
        mine = _until(logged, what="drift and its repair in the decision log")
        assert "32 cross-connects the journal holds are missing" in mine["drift"]["reason"], mine["drift"]
        assert lost_at <= mine["drift"]["at"] <= back_at + 2 * PERIOD_S + 0.5, "drift not noticed within an audit"
        assert lab.tables() == wanted
        status, health = Api(lab.proxy.url).call("GET", "/healthz")
        assert status == 200 and health["status"] == "ok", health
        metrics = op.call("GET", "/metrics")[1]
        assert 'orchestrl_device_drift{device="pod0/agg0"} 0.0' in metrics
        assert 'orchestrl_drift_repairs_total{device="pod0/agg0",outcome="ok"} 1.0' in metrics
        # and the next identical intent is truly unchanged now
        status, doc = api.call("POST", "/v1/jobs/rl/intents", {**intent("train-fwd-bwd.yaml", job="rl"), "t_s": t})
        assert status == 200 and doc["decision"] == "unchanged", doc


def test_a_repair_waits_while_the_job_is_inside_a_collective(tmp_path):
    with EmulatedFabric(TOPOLOGY_64, tmp_path, profile="test") as lab:
        op, api, t = _lab_with_job(lab)
        wanted = _journal_tables(lab, api)
        # a collective starts and does not end: no safe window (the gate predicts none inside it)
        api.call("POST", "/v1/jobs/rl/events", {"events": [{"kind": "start", "t_s": t + 1, "stage": "train",
                                                            "primitive": "all-to-all", "communicator": "ep"}]})
        lab.control("pod0/agg0").clear("TABLE")
        health = _until(lambda: (h := Api(lab.proxy.url).call("GET", "/healthz")[1])["status"] == "degraded" and h,
                        what="drift reported")
        time.sleep(4 * PERIOD_S)
        assert not lab.tables()["pod0/agg0"], "repaired while the job was inside a collective"
        dev = next(d for d in Api(lab.proxy.url).call("GET", "/healthz")[1]["device_health"]
                   if d["device"] == "pod0/agg0")
        assert dev["state"] == "repairing" and "safe window" in dev["reason"], (dev, health)
        # the collective ends, and the window after it opens: the repair goes in
        status, doc = api.call("POST", "/v1/jobs/rl/events", {"events": [
            {"kind": "end", "t_s": t + 1.002, "stage": "train", "primitive": "all-to-all", "communicator": "ep"}]})
        assert status == 200, doc
        _until(lambda: lab.tables() == wanted, what="repair after the collective ended")


def test_alert_policy_only_reports_and_an_operator_reconciles_with_a_dry_run_first(tmp_path):
    with EmulatedFabric(TOPOLOGY_64, tmp_path, profile="test") as lab:
        op, api, _ = _lab_with_job(lab, "--drift-policy", "alert")
        wanted = _journal_tables(lab, api)
        with lab.driver("pod1/agg0") as drv:  # a hand-made patch the journal knows nothing of
            n = drv.ports
            free = next(p for p in range(1, n + 1) if p not in wanted["pod1/agg0"] and p + n not in
                        wanted["pod1/agg0"].values())
            drv.connect([(free, n + free)])
        _until(lambda: Api(lab.proxy.url).call("GET", "/healthz")[1]["status"] == "degraded", what="drift reported")
        time.sleep(4 * PERIOD_S)
        assert lab.tables()["pod1/agg0"].get(free) == n + free, "policy alert must not repair"
        status, dry = op.call("POST", "/v1/reconcile", {"dry_run": True})
        assert status == 200 and dry["dry_run"] and dry["changes"] == 1, dry
        assert lab.tables()["pod1/agg0"].get(free) == n + free, "a dry run changed a device"
        status, done = op.call("POST", "/v1/reconcile", {})
        assert status == 200 and done["ok"] and done["changes"] == 1, done
        assert lab.tables() == wanted
        _until(lambda: Api(lab.proxy.url).call("GET", "/healthz")[1]["status"] == "ok", what="health ok")
        job = Api(lab.proxy.url, api.token)
        assert job.call("POST", "/v1/reconcile", {})[0] == 403


@every_protocol
def test_a_half_applied_bulk_leaves_the_service_usable_and_consistent(tmp_path, protocol):
    with EmulatedFabric(TOPOLOGY_64, tmp_path, profile="test", protocol=protocol) as lab:
        op, api, t = _lab_with_job(lab)
        for name in lab.switches:
            lab.control(name).partial_bulk(2)  # each bulk connect applies 2 pairs, then stops
        api.call("POST", "/v1/jobs/rl/events", {"events": [{"kind": "weight-sync-begin", "t_s": t + 1,
                                                            "window_hint_s": 60.0}]})
        body = {**intent("weight-sync.yaml", job="rl"), "t_s": t + 1}
        status, doc = api.call("POST", "/v1/jobs/rl/intents", body)
        assert status == 503 and doc["error"] == "device-unavailable", (status, doc)
        assert "pod" in doc["reason"] or "core0" in doc["reason"], doc
        time.sleep(3 * PERIOD_S)  # an audit or two: health must say what the devices hold
        consistent = lab.tables() == _journal_tables(lab, api)
        status, health = Api(lab.proxy.url).call("GET", "/healthz")
        assert health["status"] == ("ok" if consistent else "degraded"), (consistent, health)
        for name in lab.switches:
            lab.control(name).partial_bulk(None)
        # the audit repairs the half circuits by itself; devices and journal agree again
        _until(lambda: lab.tables() == _journal_tables(lab, api), what="devices back at the journal")
        _until(lambda: Api(lab.proxy.url).call("GET", "/healthz")[1]["status"] == "ok", what="health ok")
        api.call("POST", "/v1/jobs/rl/events", {"events": [{"kind": "weight-sync-begin", "t_s": t + 2,
                                                            "window_hint_s": 60.0}]})
        status, doc = api.call("POST", "/v1/jobs/rl/intents", {**body, "t_s": t + 2})
        assert status == 200 and doc["decision"] == "commit", doc
        assert lab.tables() == _journal_tables(lab, api)


@every_protocol
def test_a_device_down_at_start_up_is_named_and_health_returns_to_ok_when_it_comes_up(tmp_path, protocol):
    with EmulatedFabric(TOPOLOGY_64, tmp_path, profile="test", protocol=protocol) as lab:
        lab.start_switches()
        try:
            # down while the proxy starts: 12 s, since a loaded runner can take 8 s to start it (it tries core0 at each phase)
            lab.control("core0").restart(keep_table=True, down_ms=12000, wait_s=0)
        except OcsTimeout:
            pass  # not back yet: that is the point
        lab.start_proxy("--audit-period", str(PERIOD_S))
        status, health = Api(lab.proxy.url).call("GET", "/healthz")
        assert status == 503 and health["status"] == "degraded", health
        assert any("core0" in r and "unreachable" in r for r in health["reasons"]), health
        _until(lambda: Api(lab.proxy.url).call("GET", "/healthz")[0] == 200, timeout_s=25.0,
               what="health ok once core0 is up")
