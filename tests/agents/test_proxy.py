"""The control proxy over real HTTP, in front of real emulated switches (subprocesses speaking TL1)."""

from __future__ import annotations

import subprocess
import sys

from tests.agents.conftest import REPO, TOPOLOGY_64, Api, intent, wanted_tables, warm_up


def _register(operator: Api, job: str, gpus: str) -> Api:
    status, doc = operator.call("POST", "/v1/jobs", {"job": job, "gpus": gpus})
    assert status == 201, doc
    return Api(operator.url, doc["token"])


def test_health_and_openapi_need_no_token_and_describe_every_route(lab):
    anon = Api(lab.proxy.url)
    status, health = anon.call("GET", "/healthz")
    assert status == 200 and health["status"] == "ok" and health["devices"] == 3
    status, spec = anon.call("GET", "/openapi.json")
    assert status == 200 and spec["openapi"].startswith("3.")
    assert {"/v1/jobs", "/v1/jobs/{job}/intents", "/v1/jobs/{job}/events", "/v1/plan", "/v1/decisions",
            "/v1/ports/mask", "/v1/topology", "/healthz", "/metrics"} <= set(spec["paths"])


def test_requests_without_a_valid_bearer_token_get_401_with_a_reason(lab):
    anon = Api(lab.proxy.url)
    for method, path in [("GET", "/v1/plan"), ("GET", "/v1/topology"), ("POST", "/v1/jobs"), ("GET", "/metrics"),
                         ("POST", "/v1/jobs/x/events"), ("POST", "/v1/ports/mask")]:
        status, doc = anon.call(method, path, {})
        assert status == 401 and "bearer token" in doc["reason"], (method, path, doc)
    assert anon.call("GET", "/v1/plan", token="not-a-token")[0] == 401
    status, doc = anon.call("GET", "/v1/plan", token=None, headers={"Authorization": "Basic abc"})
    assert status == 401 and "Bearer" in doc["reason"]


def test_two_tenants_cannot_reach_each_others_ports(lab, operator):
    a = _register(operator, "job-a", "0-31")  # PoD 0
    b = _register(operator, "job-b", "32-63")  # PoD 1
    status, doc = operator.call("POST", "/v1/jobs", {"job": "job-c", "gpus": "16-40"})
    assert status == 409 and "job-a" in doc["reason"]

    # A announcing for B's GPUs is refused, naming B's ToRs and PoD.
    status, doc = a.call("POST", "/v1/jobs/job-a/intents", intent("gen.yaml", job="job-a"))
    assert status == 403, doc
    assert "pod1/tor" in doc["reason"] and "PoD 1" in doc["reason"] and "job-b" in doc["reason"]
    # A's token cannot act for B, mask ports, read the topology, the metrics or B's plan.
    assert a.call("POST", "/v1/jobs/job-b/intents", intent("gen.yaml", job="job-b"))[0] == 403
    assert a.call("POST", "/v1/jobs/job-b/events", {"events": []})[0] == 403
    status, doc = a.call("POST", "/v1/ports/mask", {"ports": [{"device": "pod1/agg0", "port": 1}]})
    assert status == 403 and "operator" in doc["reason"]
    assert a.call("GET", "/v1/topology")[0] == 403
    assert a.call("GET", "/metrics")[0] == 403
    assert a.call("GET", "/v1/plan?job=job-b")[0] == 403

    # Each commits inside its own placement; the devices show it.
    t, _ = warm_up(a, "job-a")
    status, doc = a.call("POST", "/v1/jobs/job-a/intents", {**intent("train-fwd-bwd.yaml", job="job-a"), "t_s": t})
    assert status == 200 and doc["decision"] == "commit", doc
    gen_b = intent("gen.yaml", job="job-b")
    gen_b["collectives"] = [c for c in gen_b["collectives"] if c["primitive"] != "response-stream"]
    b.call("POST", "/v1/jobs/job-b/events", {"events": [{"kind": "deployment-boundary", "t_s": 1.0, "window_hint_s": 5}]})
    status, doc = b.call("POST", "/v1/jobs/job-b/intents", {**gen_b, "t_s": 1.0})
    assert status == 200 and doc["decision"] == "commit", doc
    tables = lab.tables()
    assert tables["pod0/agg0"] and tables["pod1/agg0"] and not tables["core0"]
    status, plans = a.call("GET", "/v1/plan")
    assert status == 200 and set(plans["jobs"]) == {"job-a"}
    status, plans = operator.call("GET", "/v1/plan")
    merged = {d: {} for d in tables}
    for j in ("job-a", "job-b"):
        for d, t in wanted_tables(plans["jobs"][j]["plan"], lab.topology).items():
            merged[d].update(t)
    assert tables == merged


def test_bad_requests_are_refused_with_the_field_named_and_never_500(lab, operator):
    a = _register(operator, "job-a", "0-31")
    status, doc = a.call("POST", "/v1/jobs/job-a/events", raw=b"{not json")
    assert status == 400 and doc["field"] == "body"
    assert a.call("POST", "/v1/jobs/job-a/events", [1, 2])[0] == 400
    status, doc = a.call("POST", "/v1/jobs/job-a/events", {"events": [{"kind": "stop", "t_s": 1}]})
    assert status == 422 and doc["field"] == "events[0].kind"
    status, doc = a.call("POST", "/v1/jobs/job-a/events", {"events": [{"kind": "start", "t_s": "soon"}]})
    assert status == 422 and doc["field"] == "events[0].t_s"
    status, doc = a.call("POST", "/v1/jobs/job-a/intents", {"stage": "train"})
    assert status == 422 and doc["field"] == "collectives", doc
    status, doc = a.call("POST", "/v1/jobs/job-a/intents", {"stage": "train", "collectives": [
        {"primitive": "all-reduce", "groups": [[0, 999]], "bytes_per_rank": 1e6}]})
    assert status == 422 and "999" in doc["reason"], doc
    assert operator.call("POST", "/v1/jobs/nobody/intents", intent("gen.yaml"))[0] == 404
    status, doc = operator.call("POST", "/v1/ports/mask", {"ports": [{"device": "pod9/agg0", "port": 1}]})
    assert status == 422 and doc["field"] == "ports[0].device"
    status, doc = operator.call("POST", "/v1/jobs", {"job": "a/b", "gpus": [0]})
    assert status == 422 and doc["field"] == "job"
    assert operator.call("GET", "/v1/decisions?limit=0")[1]["field"] == "limit"
    status, doc = operator.call("POST", "/v1/jobs/job-a/events", raw=b"x", headers={"Content-Length": str(64 << 20)})
    assert status == 413
    status, doc = operator.call("DELETE", "/v1/plan")
    assert status == 405 and "GET" in doc["reason"]
    assert Api(lab.proxy.url).call("GET", "/healthz")[0] == 200  # still serving


def test_a_commit_reaches_the_devices_the_decision_log_and_the_metrics(lab, operator):
    a = _register(operator, "job-a", "0-31")
    status, doc = a.call("POST", "/v1/jobs/job-a/intents", intent("train-fwd-bwd.yaml", job="job-a"))
    assert doc["decision"] == "defer" and "unknown" in doc["reason"]  # no slack seen yet: not safe
    _, decisions = warm_up(a, "job-a")  # the window after the 5th all-to-all is trusted: commit there
    assert [d["decision"] for d in decisions] == ["defer"] * 5 + ["commit"], decisions
    committed = decisions[-1]
    assert committed["added"] == committed["circuits"] > 0 and committed["devices"] == ["pod0/agg0"]
    plan = a.call("GET", "/v1/plan")[1]["jobs"]["job-a"]["plan"]
    assert lab.tables() == wanted_tables(plan, lab.topology)
    log = a.call("GET", "/v1/decisions?limit=10")[1]["decisions"]
    assert [d["decision"] for d in log[:3]] == ["commit", "defer", "defer"]
    metrics = operator.call("GET", "/metrics")[1]
    assert "orchestrl_commit_latency_seconds_count 1" in metrics
    assert 'orchestrl_decisions_total{decision="defer"}' in metrics
    assert f'orchestrl_circuits{{job="job-a"}} {committed["circuits"]}' in metrics


def test_a_failed_port_is_masked_and_the_plan_reallocated(lab, operator):
    a = _register(operator, "job-a", "0-31")
    lab.control("pod0/agg0").fail_ports([1], alarm="LOS")  # ingress of duplex port 1: pod0/tor0's uplink
    t, _ = warm_up(a, "job-a")
    status, doc = a.call("POST", "/v1/jobs/job-a/intents", {**intent("train-fwd-bwd.yaml", job="job-a"), "t_s": t})
    assert status == 200 and doc["decision"] == "commit", doc
    assert "pod0/agg0:1 failed, masked and re-planned" in doc["reason"]
    masked = operator.call("GET", "/v1/topology")[1]["masked_ports"]
    assert {"device": "pod0/agg0", "port": 1, "reason": "failed"} in masked
    plan = a.call("GET", "/v1/plan")[1]["jobs"]["job-a"]["plan"]
    tables = lab.tables()
    assert tables == wanted_tables(plan, lab.topology) and 1 not in tables["pod0/agg0"]
    status, doc = operator.call("POST", "/v1/ports/mask", {"ports": [{"device": "pod0/agg0", "port": 2}]})
    assert status == 200 and [d["job"] for d in doc["replanned"]] == ["job-a"], doc


def test_serve_refuses_a_bad_listen_address():
    out = subprocess.run([sys.executable, "-m", "orchestrl.agents.cli", "proxy", "serve", "--topology", str(TOPOLOGY_64),
                          "--devices", "nowhere.yaml", "--listen", "localhost"], cwd=REPO, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 2 and "--listen" in out.stderr and "Traceback" not in out.stderr


def test_the_proxy_serves_https_with_uvicorns_tls_options(tmp_path):
    import shutil
    import ssl

    import httpx
    import pytest

    from orchestrl.agents.lab import EmulatedFabric

    if shutil.which("openssl") is None:
        pytest.skip("openssl is needed to make a test certificate")
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                   check=True, capture_output=True, timeout=60)
    with EmulatedFabric(TOPOLOGY_64, tmp_path / "lab", profile="test") as lab:
        lab.start_switches()
        proxy = lab.start_proxy("--tls-cert", str(cert), "--tls-key", str(key))
        assert proxy.url.startswith("https://")
        r = httpx.get(proxy.url + "/healthz", verify=ssl.create_default_context(cafile=str(cert)), timeout=10)
        assert r.status_code == 200 and r.json()["status"] == "ok"
        with pytest.raises(httpx.HTTPError):  # plain HTTP on the TLS port gets no answer
            httpx.get(proxy.url.replace("https://", "http://") + "/healthz", timeout=5)
    out = subprocess.run([sys.executable, "-m", "orchestrl.agents.cli", "proxy", "serve", "--topology", str(TOPOLOGY_64),
                          "--devices", "d.yaml", "--tls-cert", str(cert)], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    assert out.returncode == 2 and "--tls-key" in out.stderr and "Traceback" not in out.stderr
