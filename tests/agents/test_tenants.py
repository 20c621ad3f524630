"""Tenants sharing OCS-Core, removing a job, unmasking a repaired port."""

from __future__ import annotations

import time

from orchestrl.agents.lab import EmulatedFabric
from orchestrl.agents.service.core import ControlService
from orchestrl.agents.service.fairness import max_min_fair
from orchestrl.agents.service.jobs import JobRegistry
from orchestrl.fabric.runtime.store import FabricStore
from orchestrl.fabric.topology import load_topology
from tests.agents.conftest import TOPOLOGY_64, Api, intent, wanted_tables, warm_up
from tests.fabric.fakes import FakeOcsDevice, expected_tables, tables


def _weight_sync(job: str, train: list[int], gen: list[int]) -> dict:
    return {"job": job, "stage": "weight-sync", "period": "broadcast", "collectives": [
        {"primitive": "weight-sync", "train_gpus": train, "gen_gpus": gen, "model_bytes": 2.9e10}]}


def test_two_tenants_share_ocs_core_max_min_fair_and_the_one_kept_short_is_reported_starved():
    topo = load_topology(TOPOLOGY_64)
    devices = {d: FakeOcsDevice(d, dev.radix_ports) for d, dev in topo.devices.items()}
    svc = ControlService(topo, devices, FabricStore(":memory:"), JobRegistry(topo, ["operator-token-0123456789"]))
    svc.recover()

    def gpus(tors: range, pod: int) -> list[int]:
        return sorted(g for g in range(topo.gpu_count) if topo.tor_of_gpu(g) in {f"pod{pod}/tor{t}" for t in tors})
    a0, a1, b0, b1 = gpus(range(4), 0), gpus(range(4), 1), gpus(range(4, 8), 0), gpus(range(4, 8), 1)
    svc.register_job("a", a0 + a1)  # both jobs span both PoDs: they share every boundary fibre
    svc.register_job("b", b0 + b1)
    for job in "ab":
        svc.report_events(job, [{"kind": "weight-sync-begin", "t_s": 1.0, "window_hint_s": 60.0}])
    fibres = len(topo.boundary[0])

    first = svc.announce_intent("a", {**_weight_sync("a", a0, a1), "t_s": 1.0})
    assert first.decision == "commit" and first.core_granted == first.core_asked == fibres, first
    second = svc.announce_intent("b", {**_weight_sync("b", b0, b1), "t_s": 1.0})
    # b asked for the whole core and a holds it: b is told it is starved, with what it asked for and got ...
    assert second.decision == "starved" and second.core_asked == fibres and second.core_granted == 0, second
    assert f"asked for {fibres} OCS-Core circuits and got 0" in second.reason
    # ... a is re-planned to its fair share in its window, and b then gets the fibres a freed.
    core = {j: sum(c.tier == "core" for c in svc._tenants[j].active.circuits) for j in "ab"}
    assert core == {"a": fibres // 2, "b": fibres // 2}, core
    log = [(r["job"], r["decision"], r.get("core_granted")) for r in reversed(svc.decisions(None, 10))]
    assert log[-2:] == [("a", "commit", fibres // 2), ("b", "commit", fibres // 2)], log
    merged = {}
    for j in "ab":
        for d, t in expected_tables(svc._tenants[j].active, devices).items():
            merged.setdefault(d, {}).update(t)
    assert tables(devices) == merged


def test_max_min_fair_gives_small_asks_in_full_and_splits_the_rest():
    assert max_min_fair(16, {"a": 4, "b": 16, "c": 16}) == {"a": 4, "b": 6, "c": 6}
    assert max_min_fair(16, {"a": 0, "b": 16}) == {"a": 0, "b": 16}
    assert sum(max_min_fair(7, {"a": 9, "b": 9, "c": 9}).values()) == 7


def test_a_removed_job_frees_its_circuits_and_its_token_and_a_repaired_port_can_be_unmasked(tmp_path):
    with EmulatedFabric(TOPOLOGY_64, tmp_path, profile="test") as lab:
        lab.start_switches()
        lab.start_proxy("--audit-period", "0.2")
        op = Api(lab.proxy.url, lab.operator_token)
        jobs = {}
        for job, gpus in (("keep", "0-31"), ("gone", "32-63")):
            status, doc = op.call("POST", "/v1/jobs", {"job": job, "gpus": gpus})
            jobs[job] = Api(lab.proxy.url, doc["token"])
        t, _ = warm_up(jobs["keep"], "keep")
        status, doc = jobs["keep"].call("POST", "/v1/jobs/keep/intents",
                                        {**intent("train-fwd-bwd.yaml", job="keep"), "t_s": t})
        assert doc["decision"] == "commit", doc
        gen = intent("gen.yaml", job="gone")
        gen["collectives"] = [c for c in gen["collectives"] if c["primitive"] != "response-stream"]
        jobs["gone"].call("POST", "/v1/jobs/gone/events",
                          {"events": [{"kind": "deployment-boundary", "t_s": 1.0, "window_hint_s": 5}]})
        status, doc = jobs["gone"].call("POST", "/v1/jobs/gone/intents", {**gen, "t_s": 1.0})
        assert doc["decision"] == "commit" and lab.tables()["pod1/agg0"], doc

        assert jobs["gone"].call("DELETE", "/v1/jobs/gone")[0] == 403  # operator only
        status, doc = op.call("DELETE", "/v1/jobs/gone")
        assert status == 200 and doc["removed"] and doc["circuits_freed"] > 0, doc
        assert not lab.tables()["pod1/agg0"]  # its circuits are gone, the other job's stay
        keep_plan = jobs["keep"].call("GET", "/v1/plan")[1]["jobs"]["keep"]["plan"]
        assert lab.tables() == wanted_tables(keep_plan, lab.topology)
        assert jobs["gone"].call("GET", "/v1/jobs/gone")[0] == 401  # the token no longer works
        assert [j["job"] for j in op.call("GET", "/v1/jobs")[1]["jobs"]] == ["keep"]
        assert op.call("DELETE", "/v1/jobs/gone")[0] == 404

        # a port masked after a fault comes back once repaired; one the device still reports failed does not
        status, doc = op.call("POST", "/v1/ports/mask", {"ports": [{"device": "pod1/agg0", "port": 3},
                                                                   {"device": "pod1/agg0", "port": 4}]})
        assert status == 200
        lab.control("pod1/agg0").fail_ports([4])
        status, doc = op.call("POST", "/v1/ports/unmask", {"ports": [{"device": "pod1/agg0", "port": 3},
                                                                     {"device": "pod1/agg0", "port": 4},
                                                                     {"device": "pod1/agg0", "port": 5}]})
        assert status == 200, doc
        assert doc["unmasked"] == [{"device": "pod1/agg0", "port": 3}]
        assert doc["refused"][0]["port"] == 4 and "failed" in doc["refused"][0]["reason"]
        assert doc["not_masked"] == [{"device": "pod1/agg0", "port": 5}]
        masked = op.call("GET", "/v1/topology")[1]["masked_ports"]
        assert {"device": "pod1/agg0", "port": 3, "reason": "failed"} not in masked
        assert any(m["port"] == 4 and m["device"] == "pod1/agg0" for m in masked)


def _local_train(job: str, gpus: list[int]) -> dict:
    """A train period on one PoD's GPUs of the job (no OCS-Core demand)."""
    return {"job": job, "stage": "train", "period": "fwd-bwd",
            "layout": {"tp": 2, "ep": 2, "dp": len(gpus) // 4, "pp": 2, "gpus": ",".join(map(str, gpus))},
            "collectives": [{"primitive": "all-to-all", "over": "ep", "bytes_per_rank": 2e9}]}


def test_two_tenants_that_both_need_the_whole_core_get_half_in_every_period_over_time():
    """Issue 28.6: 16 / 0 per period, and 1 of 3 weight-sync periods with core for one job, must not happen.

    Each job syncs weights (the whole core wanted), then trains PoD-locally; the other job's sync comes while
    the first is inside a train collective, so nothing held can be taken back in that period.
    """
    topo = load_topology(TOPOLOGY_64)
    devices = {d: FakeOcsDevice(d, dev.radix_ports) for d, dev in topo.devices.items()}
    svc = ControlService(topo, devices, FabricStore(":memory:"), JobRegistry(topo, ["operator-token-0123456789"]))
    svc.recover()

    def gpus(tors: range, pod: int) -> list[int]:
        return sorted(g for g in range(topo.gpu_count) if topo.tor_of_gpu(g) in {f"pod{pod}/tor{t}" for t in tors})
    place = {"a": (gpus(range(4), 0), gpus(range(4), 1)), "b": (gpus(range(4, 8), 0), gpus(range(4, 8), 1))}
    for job, (p0, p1) in place.items():
        svc.register_job(job, p0 + p1)
    fibres = len(topo.boundary[0])
    got: dict[str, list[tuple[str, int, int]]] = {"a": [], "b": []}
    t = 0.0
    for period in range(3):
        t += 10.0
        for job in "ab":
            svc.report_events(job, [{"kind": "weight-sync-begin", "t_s": t, "window_hint_s": 0.5}])
            d = svc.announce_intent(job, {**_weight_sync(job, *place[job]), "t_s": t})
            assert isinstance(d.core_asked, int) and isinstance(d.core_granted, int), d  # numbers, never None
            assert "None" not in d.reason, d.reason
            got[job].append((d.decision, d.core_asked, d.core_granted))
            # the job moves on to training: inside a collective, then a PoD-local train intent
            svc.report_events(job, [{"kind": "start", "t_s": t + 0.6, "stage": "train", "primitive": "all-to-all",
                                     "communicator": "ep"}])
        for job in "ab":
            svc.report_events(job, [{"kind": "end", "t_s": t + 0.7, "stage": "train", "primitive": "all-to-all",
                                     "communicator": "ep"}])
            svc.announce_intent(job, {**_local_train(job, place[job][0]), "t_s": t + 0.8})
    for r in svc.decisions(None, 200):
        assert "None" not in r.get("reason", ""), r
    # b's first sync finds a holding the whole core inside its window: reported starved, with numbers
    assert got["b"][0] == ("starved", fibres, 0), got
    # from then on, each job gets half the core in every one of its own sync periods, at once
    for job in "ab":
        assert [g[2] for g in got[job][1:]] == [fibres // 2] * 2, got


def test_a_removed_jobs_token_stops_working_at_once_except_to_report_the_events_that_free_its_circuits():
    """Issue 28.8: one behaviour, as documented: revoked at once but for events, until its circuits are freed."""
    import warnings

    from orchestrl.agents.http.app import create_app

    with warnings.catch_warnings():  # starlette suggests httpx2, which this project does not use
        warnings.simplefilter("ignore")
        from starlette.testclient import TestClient

    topo = load_topology(TOPOLOGY_64)
    devices = {d: FakeOcsDevice(d, dev.radix_ports) for d, dev in topo.devices.items()}
    op_token = "operator-token-0123456789"
    svc = ControlService(topo, devices, FabricStore(":memory:"), JobRegistry(topo, [op_token]))
    svc.recover()
    http = TestClient(create_app(svc))
    op = {"Authorization": f"Bearer {op_token}"}
    token = http.post("/v1/jobs", json={"job": "gone", "gpus": "0-31"}, headers=op).json()["token"]
    me = {"Authorization": f"Bearer {token}"}
    events = [e for k in range(6) for e in (  # 0.5 s windows: the HTTP hand-off is counted in them
        {"kind": "start", "t_s": 0.5 * k, "stage": "train", "primitive": "all-to-all", "communicator": "ep"},
        {"kind": "end", "t_s": 0.5 * k + 0.002, "stage": "train", "primitive": "all-to-all", "communicator": "ep"})]
    assert http.post("/v1/jobs/gone/events", json={"events": events}, headers=me).status_code == 200
    r = http.post("/v1/jobs/gone/intents", json={**intent("train-fwd-bwd.yaml", job="gone"), "t_s": 2.502},
                  headers=me)
    assert r.status_code == 200 and r.json()["decision"] == "commit", r.json()
    inside = {"kind": "start", "t_s": 3.0, "stage": "train", "primitive": "all-to-all", "communicator": "ep"}
    assert http.post("/v1/jobs/gone/events", json={"events": [inside]}, headers=me).status_code == 200
    r = http.delete("/v1/jobs/gone", headers=op)
    assert r.status_code == 200 and r.json()["pending_removal"], r.json()  # inside a collective: freed later
    # revoked at once for everything but events
    for method, path, body in (("GET", "/v1/jobs/gone", None), ("GET", "/v1/plan", None),
                               ("POST", "/v1/jobs/gone/intents", {**intent("train-fwd-bwd.yaml", job="gone"),
                                                                  "t_s": 3.0})):
        r = http.request(method, path, json=body, headers=me)
        assert r.status_code == 401 and "removed" in r.json()["reason"], (path, r.status_code, r.json())
    assert any(v for v in tables(devices).values()), "circuits freed while the job is inside a collective"
    outside = {**inside, "kind": "end", "t_s": 3.002}
    r = http.post("/v1/jobs/gone/events", json={"events": [outside]}, headers=me)
    assert r.status_code == 200, r.json()
    assert not any(tables(devices).values()), "the collective ended: its circuits must be freed"
    r = http.post("/v1/jobs/gone/events", json={"events": [{**inside, "t_s": 4.0}]}, headers=me)
    assert r.status_code == 401, r.json()  # circuits freed: the token is gone entirely
    svc.close()


def test_a_removal_waiting_for_its_window_survives_a_restart_token_still_revoked_circuits_still_freed(tmp_path):
    """Issue 28.8: the revocation is kept in the state file, not only in memory (a restart must not undo it)."""
    topo = load_topology(TOPOLOGY_64)
    devices = {d: FakeOcsDevice(d, dev.radix_ports) for d, dev in topo.devices.items()}
    op_token, state = "operator-token-0123456789", str(tmp_path / "fabric.db")

    def service() -> ControlService:
        svc = ControlService(topo, devices, FabricStore(state), JobRegistry(topo, [op_token], state))
        svc.recover()
        return svc

    svc = service()
    _, token = svc.register_job("gone", "0-31")
    svc.report_events("gone", [e for k in range(6) for e in (
        {"kind": "start", "t_s": 0.05 * k, "stage": "train", "primitive": "all-to-all", "communicator": "ep"},
        {"kind": "end", "t_s": 0.05 * k + 0.002, "stage": "train", "primitive": "all-to-all", "communicator": "ep"})])
    assert svc.announce_intent("gone", {**intent("train-fwd-bwd.yaml", job="gone"), "t_s": 0.252}).decision == "commit"
    inside = {"kind": "start", "t_s": 1.0, "stage": "train", "primitive": "all-to-all", "communicator": "ep"}
    svc.report_events("gone", [inside])
    assert svc.remove_job("gone")["pending_removal"]
    svc.close()

    svc = service()  # restarted while the removal waits for the job's window
    principal = svc.registry.authenticate(token)
    assert principal is not None and principal.events_only, "a restart gave the removed job's token back its rights"
    assert any(v for v in tables(devices).values())
    # the restarted gate never saw the start, so this end is refused, and not an error; the job is then quiet
    doc = svc.report_events("gone", [{**inside, "kind": "end", "t_s": 1.002}])
    assert doc["accepted"] == 0 and "no open start" in doc["rejected"][0]["reason"], doc
    time.sleep(1.05)  # quiet for one audit period (1 s without an auditor): its safe window
    svc.retry_removals()
    assert not any(tables(devices).values()), "the removal was forgotten across the restart"
    assert svc.registry.authenticate(token) is None
    svc.close()
    svc = service()
    assert svc.registry.get("gone") is None and not svc.registry.is_removing("gone")
    svc.close()
