"""The device audit: a switch that loses its table, keeps half a bulk command, is patched by hand or comes up late.

Real emulated switches and a real proxy subprocess with a short audit period; health, metrics and
the decision log are read over HTTP as an operator would.
"""

from __future__ import annotations

import time

from orchestrl.agents.lab import EmulatedFabric
from tests.agents.conftest import TOPOLOGY_64, Api, intent, wanted_tables, warm_up

PERIOD_S = 0.2
# Table loss, a half-applied bulk and a switch down at start-up run over every adapter in test_proxy_parity.py.


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
