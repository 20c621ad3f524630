"""Fixtures for the proxy tests: real emulator subprocesses, a real proxy subprocess, an HTTP client."""

from __future__ import annotations

import json
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from orchestrl.agents.lab import EmulatedFabric

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"
TOPOLOGY_64 = EXAMPLES / "topology-64gpu-h800.yaml"


class Api:
    """A tiny JSON client: ``call`` returns ``(status, body)`` and never raises on HTTP errors."""

    def __init__(self, url: str, token: str | None = None) -> None:
        self.url, self.token = url, token

    def call(self, method: str, path: str, body: Any = None, token: str | None = "default", raw: bytes | None = None,
             headers: dict[str, str] | None = None) -> tuple[int, Any]:
        token = self.token if token == "default" else token
        data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
        hdrs = {"Content-Type": "application/json", **(headers or {})}
        if token:
            hdrs["Authorization"] = f"Bearer {token}"
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=hdrs)
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                return resp.status, _decode(resp.read(), resp.headers.get_content_type())
        except urllib.error.HTTPError as exc:
            return exc.code, _decode(exc.read(), exc.headers.get_content_type())


def _decode(body: bytes, content_type: str) -> Any:
    return json.loads(body) if content_type == "application/json" and body else body.decode()


def intent(name: str, **changes: Any) -> dict:
    """Return a bundled example intent document, with ``changes`` applied."""
    doc = yaml.safe_load((EXAMPLES / "intents" / name).read_text())
    doc.update(changes)
    return doc


def warm_up(api: Api, job: str, t0: float = 100.0, windows: int = 6, gap_s: float = 0.5) -> tuple[float, list]:
    """Report ``windows`` train all-to-alls ``gap_s`` apart, so the train gate trusts its slack.

    The gap is on the job's clock, but the proxy counts its own wall time from a request's arrival (thread
    hand-off, other jobs' decisions, the commit) as gone from the window: 0.5 s holds that on a loaded 2-core
    CI host, where 50 ms windows made a fresh proxy's first intent defer.

    Returns the time of the last event and the decisions of plans the windows let through.
    """
    events, t = [], t0
    for _ in range(windows):
        events += [{"kind": "start", "t_s": t, "stage": "train", "primitive": "all-to-all", "communicator": "ep"},
                   {"kind": "end", "t_s": t + 0.002, "stage": "train", "primitive": "all-to-all", "communicator": "ep"}]
        t += 0.002 + gap_s
    status, doc = api.call("POST", f"/v1/jobs/{job}/events", {"events": events})
    assert status == 200 and doc["accepted"] == len(events), doc
    return events[-1]["t_s"], doc["decisions"]


def wanted_tables(plan_doc: dict | None, topology) -> dict[str, dict[int, int]]:
    """Return the cross-connect table every device must hold for a plan document of the API."""
    from orchestrl.fabric.ocs.model import duplex_to_cross_connects

    out: dict[str, dict[int, int]] = {d: {} for d in topology.devices}
    for c in (plan_doc or {}).get("circuits", []):
        n = topology.devices[c["device"]].radix_ports
        out[c["device"]].update(duplex_to_cross_connects(c["a_port"], c["b_port"], n))
    return out


def wait_settled(lab: EmulatedFabric, timeout_s: float = 30.0) -> None:
    """Wait until no port of any emulated device is tuning (mirrors at rest; the emulators' own counters say)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        busy = False
        for name in lab.switches:
            busy |= bool(lab.control(name).settings().get("TUNING"))
        if not busy:
            return
        time.sleep(0.1)
    raise AssertionError(f"emulated devices still tuning after {timeout_s} s")


@pytest.fixture
def lab(tmp_path):
    """Instant-switching emulators for the 64-GPU fabric and a proxy over them; all stopped afterwards."""
    with EmulatedFabric(TOPOLOGY_64, tmp_path, profile="test") as fabric:
        fabric.start_switches()
        fabric.start_proxy()
        yield fabric


@pytest.fixture
def operator(lab) -> Api:
    return Api(lab.proxy.url, lab.operator_token)
