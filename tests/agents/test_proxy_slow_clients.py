"""Slow clients: half-sent request heads must not starve health, jobs or operators (issue 28.5).

A real proxy subprocess; the hostile client opens 300 connections from other loopback addresses
(127.0.0.2, ...) and sends each a request head it never finishes.
"""

from __future__ import annotations

import re
import socket
import time

import pytest

from orchestrl.agents.lab import EmulatedFabric
from tests.agents.conftest import TOPOLOGY_64, Api

HALF_HEAD = b"GET /v1/whoami HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer nothing-"


def _half_open(url: str, count: int, sources: list[str]) -> list[socket.socket]:
    host, port = re.match(r"https?://([^:/]+):(\d+)", url).groups()
    out = []
    for i in range(count):
        s = socket.socket()
        s.bind((sources[i % len(sources)], 0))
        s.settimeout(2)
        try:
            s.connect((host, int(port)))
            s.sendall(HALF_HEAD)
        except OSError:
            s.close()
            continue
        out.append(s)
    return out


def _timed(api: Api, path: str) -> tuple[int, float]:
    started = time.monotonic()
    status, _ = api.call("GET", path)
    return status, time.monotonic() - started


@pytest.mark.parametrize("sources", [1, 20])
def test_health_jobs_and_operators_stay_answerable_under_300_half_sent_heads(tmp_path, sources):
    with EmulatedFabric(TOPOLOGY_64, tmp_path, profile="test") as lab:
        lab.start_switches()
        proxy = lab.start_proxy("--admin-listen", "127.0.0.1:0")
        admin = next(m.group(1) for line in proxy.output if (m := re.search(r"operator listener on (\S+)", line)))
        op = Api(proxy.url, lab.operator_token)
        status, doc = op.call("POST", "/v1/jobs", {"job": "rl", "gpus": "0-63"})
        job = Api(proxy.url, doc["token"])
        held = _half_open(proxy.url, 300, [f"127.0.0.{2 + k}" for k in range(sources)])
        try:
            time.sleep(0.5)
            # One address: its connections are capped. Many: they fill --listen, and a request that arrives whole
            # takes the slot of the oldest stalled head (priority on the main listener). Either way health, the
            # job and the operator are served on --listen.
            for api, path in ((Api(proxy.url), "/healthz"), (job, "/v1/jobs/rl"), (op, "/v1/jobs")):
                status, took = _timed(api, path)
                assert status == 200 and took < 1.0, (path, status, took)
            # and on the operator listener
            status, took = _timed(Api(admin), "/healthz")
            assert status == 200 and took < 1.0, (status, took)
            status, took = _timed(Api(admin, lab.operator_token), "/v1/jobs")
            assert status == 200 and took < 1.0, (status, took)
        finally:
            for s in held:
                s.close()
