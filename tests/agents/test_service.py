"""The control service in process, over in-memory devices: tenants sharing PoDs, ordered commits, faults."""

from __future__ import annotations

import pytest

from orchestrl.agents.service.jobs import JobRegistry
from orchestrl.agents.service.core import ControlService, scope_of
from orchestrl.fabric.plan import CrossConnect
from orchestrl.fabric.reconfig_order import order_plan_change
from orchestrl.fabric.runtime.store import FabricStore
from orchestrl.fabric.topology import FabricSpec, Topology, load_topology
from tests.agents.conftest import TOPOLOGY_64
from tests.fabric.fakes import FakeOcsDevice, expected_tables

OPERATOR = "operator-token-0123456789"


def _service(topology: Topology) -> tuple[ControlService, dict[str, FakeOcsDevice]]:
    devices = {d: FakeOcsDevice(d, dev.radix_ports) for d, dev in topology.devices.items()}
    service = ControlService(topology, devices, FabricStore(":memory:"), JobRegistry(topology, [OPERATOR]))
    service.recover()
    return service, devices


def _windows(service: ControlService, job: str, t: float = 0.0) -> float:
    """Report six train all-to-alls 50 ms apart; return the time of the last end."""
    events = []
    for k in range(6):
        events += [{"kind": "start", "t_s": t + 0.05 * k, "stage": "train", "primitive": "all-to-all",
                    "communicator": "ep"},
                   {"kind": "end", "t_s": t + 0.05 * k + 0.002, "stage": "train", "primitive": "all-to-all",
                    "communicator": "ep"}]
    service.report_events(job, events)
    return events[-1]["t_s"]


def _train(job: str, layout: dict) -> dict:
    return {"job": job, "stage": "train", "period": "fwd-bwd", "layout": layout, "collectives": [
        {"primitive": "all-to-all", "over": "ep", "bytes_per_rank": 2e9},
        {"primitive": "p2p", "over": "pp", "bytes_per_rank": 5e8}]}


def _pairs(plan) -> set[tuple[str, str]]:
    return {(c.a, c.b) for c in plan.circuits}


def test_a_change_is_committed_step_by_step_without_dropping_a_pair_both_plans_connect():
    service, devices = _service(load_topology(TOPOLOGY_64))
    service.register_job("rl", "0-31")
    t = _windows(service, "rl")
    first = service.announce_intent("rl", {**_train("rl", {"tp": 4, "ep": 4, "dp": 4, "pp": 2, "gpus": "0-31"}),
                                           "t_s": t})
    old = service.store.last_committed_plan(scope_of("rl"))
    second = service.announce_intent("rl", {**_train("rl", {"tp": 2, "ep": 8, "dp": 8, "pp": 2, "gpus": "0-31"}),
                                            "t_s": t})
    assert first.decision == second.decision == "commit", (first, second)
    new = service.store.last_committed_plan(scope_of("rl"))
    protected = _pairs(old) & _pairs(new)
    assert protected and second.steps >= 2  # the variants share ToR pairs: make-before-break needs steps
    allowed = {o.pair for o in order_plan_change(old, new).outages}
    steps = [r.plan for r in reversed(service.store.history(scope_of("rl"), limit=second.steps))]
    assert steps[-1].cross_connects() == new.cross_connects()
    for plan in steps:  # every journalled intermediate state keeps every protected pair up
        assert protected - _pairs(plan) <= allowed
    assert {d: dict(t) for d, t in ((n, dev.cross_connects()) for n, dev in devices.items())} == \
        expected_tables(new, devices)


def _shared_pod_fabric() -> Topology:
    # Two racks per PoD: jobs on different racks own different ToRs but share their PoDs' boundary.
    return Topology(FabricSpec(name="shared", link_bps=200e9, pods=2, servers_per_pod=4, servers_per_tor=2,
                               boundary_ports_per_pod=32, core_devices=1, agg_radix_ports=320, core_radix_ports=320))


def _weight_sync(job: str, train: str, gen: str) -> dict:
    return {"job": job, "stage": "weight-sync", "period": "broadcast", "collectives": [
        {"primitive": "weight-sync", "train_gpus": train, "gen_gpus": gen, "model_bytes": 1e10}]}


def _marker(service: ControlService, job: str, t: float) -> None:
    service.report_events(job, [{"kind": "weight-sync-begin", "t_s": t, "window_hint_s": 10.0}])


def test_jobs_sharing_pods_never_share_a_port():
    service, devices = _service(_shared_pod_fabric())
    service.register_job("a", "0-15,32-47")  # rack 0 of both PoDs
    service.register_job("b", "16-31,48-63")  # rack 1 of both PoDs
    for job, train, gen in (("a", "0-15", "32-47"), ("b", "16-31", "48-63")):
        _marker(service, job, 1.0)
        d = service.announce_intent(job, {**_weight_sync(job, train, gen), "t_s": 1.0})
        assert d.decision == "commit" and d.circuits > 0, d
    a = service.store.last_committed_plan(scope_of("a"))
    b = service.store.last_committed_plan(scope_of("b"))
    ports_a = {r for c in a.circuits for r in c.xc.ports()}
    ports_b = {r for c in b.circuits for r in c.xc.ports()}
    assert ports_a and ports_b and not ports_a & ports_b
    assert any(c.tier == "core" for c in a.circuits) and any(c.tier == "core" for c in b.circuits)
    merged = expected_tables(a, devices)
    for name, table in expected_tables(b, devices).items():
        merged[name].update(table)
    assert {n: dev.cross_connects() for n, dev in devices.items()} == merged


def test_a_window_must_cover_the_slowest_device_of_each_step_not_the_sum_of_all_devices():
    service, _ = _service(_shared_pod_fabric())  # 3D MEMS everywhere: 10 ms per device
    service.register_job("a", "0-15,32-47")
    _marker(service, "a", 1.0)
    d = service.announce_intent("a", {**_weight_sync("a", "0-15", "32-47"), "t_s": 1.0})
    assert d.decision == "commit" and len(d.devices) == 3 and d.steps == 1, d
    assert d.switch_delay_s == pytest.approx(0.010)  # the three devices switch at once: 10 ms, not 30 ms


def test_switching_time_is_per_add_step_the_slowest_device_of_that_step():
    from orchestrl.agents.service.ordered_commit import plan_change
    from orchestrl.fabric.plan import Circuit, CircuitPlan

    def plan(*xcs):
        return CircuitPlan("f", "train", "s", 1e9, tuple(Circuit("agg", 0, a, b, CrossConnect(d, p, q))
                                                         for d, p, q, a, b in xcs))
    old = plan(("fast", 1, 2, "t1", "t2"), ("slow", 1, 2, "t3", "t4"))
    new = plan(("fast", 1, 3, "t1", "t2"), ("slow", 1, 3, "t3", "t4"))  # both pairs move: remove, then add
    change = plan_change(old, new)
    adds = [s for s in change.order.steps if s.action == "add"]
    # remove then add: one commit, since each device removes its old circuit before it adds the new one
    assert [s.action for s in change.order.steps] == ["remove", "add"] and len(adds) == 1 and change.steps == 1
    assert change.switching_time_s({"fast": 0.001, "slow": 0.025}) == pytest.approx(0.025)


def test_a_failed_commit_of_one_job_leaves_the_other_jobs_circuits_in_place():
    topology = _shared_pod_fabric()
    service, devices = _service(topology)
    service.register_job("a", "0-15,32-47")
    service.register_job("b", "16-31,48-63")
    _marker(service, "a", 1.0)
    assert service.announce_intent("a", {**_weight_sync("a", "0-15", "32-47"), "t_s": 1.0}).decision == "commit"
    a = service.store.last_committed_plan(scope_of("a"))
    b_tors = sorted({topology.tor_of_gpu(g) for g in range(16, 32)})
    for tor in b_tors:  # every first uplink of B's ToRs in PoD 0 fails on the device shared with A
        ref = topology.tors[tor].uplinks[0]
        devices[ref.device].fail_port(ref.port)
    _marker(service, "b", 2.0)
    d = service.announce_intent("b", {**_weight_sync("b", "16-31", "48-63"), "t_s": 2.0})
    assert d.decision == "commit" and "failed, masked and re-planned" in d.reason, d
    for c in a.circuits:  # A never lost a circuit, even on the devices B's rollback touched
        ingress, egress = next(iter(expected_tables_for(c.xc, devices).items()))
        assert devices[c.xc.device].cross_connects().get(ingress) == egress
    b = service.store.last_committed_plan(scope_of("b"))
    failed = {topology.tors[t].uplinks[0] for t in b_tors}
    assert not failed & {r for c in b.circuits for r in c.xc.ports()}


def expected_tables_for(xc: CrossConnect, devices: dict[str, FakeOcsDevice]) -> dict[int, int]:
    from orchestrl.fabric.ocs.model import duplex_to_cross_connects

    return dict(duplex_to_cross_connects(xc.a_port, xc.b_port, devices[xc.device].ports))


def test_bad_events_refuse_the_whole_batch_and_out_of_order_events_are_listed():
    from orchestrl.agents.service.checks import Unprocessable

    service, _ = _service(load_topology(TOPOLOGY_64))
    service.register_job("rl", "0-31")
    with pytest.raises(Unprocessable) as err:
        service.report_events("rl", [{"kind": "start", "t_s": 1.0, "stage": "train", "primitive": "a2a",
                                      "communicator": "ep"}, {"kind": "end", "t_s": "late"}])
    assert err.value.field == "events[1].t_s"
    assert service.controller.topology is not None and service.report_events("rl", [])["accepted"] == 0
    out = service.report_events("rl", [{"kind": "end", "t_s": 2.0, "stage": "train", "primitive": "a2a",
                                        "communicator": "ep"}])
    assert out["accepted"] == 0 and "no open start" in out["rejected"][0]["reason"]


def test_a_request_that_waited_past_its_window_is_deferred_not_applied_late():
    """The time from a request's arrival (HTTP: when it reached the application) to its decision is gone from
    the window it asks in: the same intent commits when it is decided at once and is deferred, naming the
    wait, when it arrived a second earlier (behind other jobs' decisions, a busy event loop)."""
    import time

    for waited_s, want in ((0.0, "commit"), (1.0, "defer")):
        service, devices = _service(load_topology(TOPOLOGY_64))
        service.register_job("rl", "0-31")
        t = _windows(service, "rl")
        d = service.announce_intent("rl", {**_train("rl", {"tp": 4, "ep": 4, "dp": 4, "pp": 2, "gpus": "0-31"}),
                                           "t_s": t}, arrived=time.monotonic() - waited_s)
        assert d.decision == want, d
        if want == "defer":
            assert "after the request arrived" in d.reason and d.to_json()["queued_s"] >= 1.0
            assert all(not dev.cross_connects() for dev in devices.values())  # nothing applied late


def test_a_window_must_hold_the_commit_itself_not_only_the_switching_time():
    """Commits that have taken 40 ms lately make a 48 ms window with 10 ms of switching too short: the plan is
    deferred (the answer names both parts), where the switching time alone would fit."""
    service, devices = _service(load_topology(TOPOLOGY_64))
    service.register_job("rl", "0-31")
    t = _windows(service, "rl")
    for _ in range(5):
        service.commit_times.add(0.040)
    assert service.commit_times.estimate() == pytest.approx(0.040)
    d = service.announce_intent("rl", {**_train("rl", {"tp": 4, "ep": 4, "dp": 4, "pp": 2, "gpus": "0-31"}),
                                       "t_s": t})
    assert d.decision == "defer" and d.commit_estimate_s == pytest.approx(0.040), d
    assert "switching 10 ms + this proxy's recent commits' 40 ms" in d.reason
    assert all(not dev.cross_connects() for dev in devices.values())
    service.commit_times = type(service.commit_times)()  # no recent commits: only the switching time counts
    d = service.announce_intent("rl", {**_train("rl", {"tp": 4, "ep": 4, "dp": 4, "pp": 2, "gpus": "0-31"}),
                                       "t_s": t})
    assert d.decision == "commit" and d.commit_estimate_s == 0.0, d


def test_a_commit_that_overruns_its_window_is_reported_late_and_teaches_the_gate():
    """A switch that answers 100 ms late makes a commit the gate let into a 48 ms window finish after it: the
    decision says by how much (``late_s``, realised, not predicted) and the counter counts it; once five such
    commits are on record the same window is too short and the plan is deferred instead of applied late."""
    import time

    service, devices = _service(load_topology(TOPOLOGY_64))
    for dev in devices.values():
        connect = dev.connect

        def slow(pairs, *, mode="stop", _connect=connect):
            time.sleep(0.1)
            return _connect(pairs, mode=mode)
        dev.connect = slow
    service.register_job("rl", "0-31")
    t = _windows(service, "rl")
    layouts = [{"tp": 4, "ep": 4, "dp": 4, "pp": 2, "gpus": "0-31"}, {"tp": 2, "ep": 8, "dp": 8, "pp": 2, "gpus": "0-31"}]
    d = service.announce_intent("rl", {**_train("rl", layouts[0]), "t_s": t})
    assert d.decision == "commit" and d.late_s is not None and d.late_s > 0.04, d
    assert d.to_json()["late_s"] == d.late_s
    assert 'orchestrl_commits_after_window_total{job="rl"} 1.0' in service.metrics.render()
    for k in range(4):  # four more slow commits, each in a fresh window
        t = _windows(service, "rl", t + 1.0)
        assert service.announce_intent("rl", {**_train("rl", layouts[(k + 1) % 2]), "t_s": t}).decision == "commit"
    t = _windows(service, "rl", t + 1.0)
    d = service.announce_intent("rl", {**_train("rl", layouts[1]), "t_s": t})
    assert d.decision == "defer" and d.commit_estimate_s >= 0.09 and "recent commits'" in d.reason, d
