"""Crash and restart: a switch that lost its table or a port while the proxy was down.

SIGKILL in the middle of a commit, then a restart on the same state file, runs over every adapter in
test_proxy_parity.py.
"""

from __future__ import annotations

import pytest

from orchestrl.agents.lab import EmulatedFabric
from tests.agents.conftest import TOPOLOGY_64, Api, intent, wanted_tables, warm_up


def _start(lab: EmulatedFabric, job: str = "rl") -> Api:
    lab.start_switches()
    lab.start_proxy()
    op = Api(lab.proxy.url, lab.operator_token)
    status, doc = op.call("POST", "/v1/jobs", {"job": job, "gpus": "0-63"})
    assert status == 201, doc
    return Api(lab.proxy.url, doc["token"])


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
