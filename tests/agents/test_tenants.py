"""Tenants sharing OCS-Core, removing a job, unmasking a repaired port."""

from __future__ import annotations

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
