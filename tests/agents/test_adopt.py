"""``--adopt`` after a restored backup, and with half circuits: the jobs keep their circuits, nothing on a switch moves.

In process, over faithful in-memory switches (:class:`tests.fabric.fakes.FakeOcsDevice`) that outlive one
service, as real switches outlive a proxy; the state file is a real SQLite file backed up online.
"""

from __future__ import annotations

import shutil

import pytest

from orchestrl.agents.service.core import ControlService, scope_of
from orchestrl.agents.service.jobs import JobRegistry
from orchestrl.agents.service.startup import ADOPTED_SCOPE, StartupRefused
from orchestrl.fabric.ocs.model import duplex_to_cross_connects
from orchestrl.fabric.runtime.store import FabricStore
from orchestrl.fabric.runtime.store_file import backup_state_file
from orchestrl.fabric.topology import load_topology
from tests.agents.conftest import TOPOLOGY_64
from tests.fabric.fakes import FakeOcsDevice, expected_tables, tables

OPERATOR = "operator-token-0123456789"


def _train(job: str, variant: int, gpus: str = "0-31") -> dict:
    layout = [{"tp": 4, "ep": 4, "dp": 4, "pp": 2}, {"tp": 2, "ep": 8, "dp": 8, "pp": 2}][variant]
    return {"job": job, "stage": "train", "period": "fwd-bwd", "layout": {**layout, "gpus": gpus}, "collectives": [
        {"primitive": "all-to-all", "over": "ep", "bytes_per_rank": 2e9},
        {"primitive": "p2p", "over": "pp", "bytes_per_rank": 5e8}]}


def _service(topo, devices, path) -> ControlService:
    return ControlService(topo, devices, FabricStore(path), JobRegistry(topo, [OPERATOR], str(path)))


def _warm(svc: ControlService, job: str) -> None:
    svc.report_events(job, [e for k in range(6) for e in (
        {"kind": "start", "t_s": 0.05 * k, "stage": "train", "primitive": "all-to-all", "communicator": "ep"},
        {"kind": "end", "t_s": 0.05 * k + 0.002, "stage": "train", "primitive": "all-to-all", "communicator": "ep"})])


def _journal(svc: ControlService) -> dict:
    merged: dict = {d: {} for d in svc.devices}
    for plan in svc.committed_plans().values():
        for d, t in expected_tables(plan, svc.devices).items():
            merged[d].update(t)
    return merged


def test_restore_then_adopt_gives_the_jobs_their_circuits_back_and_only_unexplained_ones_are_reserved(tmp_path):
    """Issue 28.1: after a restored backup, --adopt must not lock the fabric under fabric/adopted."""
    topo = load_topology(TOPOLOGY_64)
    devices = {d: FakeOcsDevice(d, dev.radix_ports) for d, dev in topo.devices.items()}
    state = tmp_path / "fabric.db"
    svc = _service(topo, devices, state)
    svc.recover()
    svc.register_job("rl", "0-31")
    _warm(svc, "rl")
    assert svc.announce_intent("rl", {**_train("rl", 0), "t_s": 0.252}).decision == "commit"
    backup_state_file(state, tmp_path / "backup.db")
    assert svc.announce_intent("rl", {**_train("rl", 1), "t_s": 0.252}).decision == "commit"  # after the backup
    newer = svc.store.last_committed_plan(scope_of("rl"))
    # a hand-made circuit between two ToRs no job owns (PoD 1): nobody can explain it
    n = devices["pod1/agg0"].ports
    a, b = [r.port for r, owner in topo.port_owner.items() if r.device == "pod1/agg0" and owner == "pod1/tor0"][:2]
    devices["pod1/agg0"].connect(duplex_to_cross_connects(a, b, n))
    held = tables(devices)
    svc.close()

    restored = tmp_path / "restored.db"
    shutil.copy(tmp_path / "backup.db", restored)
    svc = _service(topo, devices, restored)
    with pytest.raises(StartupRefused):
        svc.start("check")
    assert tables(devices) == held
    svc.close()
    svc = _service(topo, devices, restored)
    report = svc.start("adopt")
    assert tables(devices) == held, "--adopt changed a device"
    adopted = report["adopted"]
    assert adopted["reserved"] == 1 and adopted["given_back_to_jobs"] > 0, adopted
    # the job holds what it held before the restore, not 0 circuits
    mine = svc.store.last_committed_plan(scope_of("rl"))
    assert {c.xc for c in mine.circuits} == {c.xc for c in newer.circuits}
    assert _journal(svc) == held and svc.health()["status"] == "ok", svc.health()
    # its next intent commits as usual (it is not starved by its own circuits)
    _warm(svc, "rl")
    d = svc.announce_intent("rl", {**_train("rl", 0), "t_s": 0.252})
    assert d.decision == "commit" and d.circuits > 0, d
    assert tables(devices) == _journal(svc)
    # the circuit nobody explains: listed by a dry run, released by the operator route
    dry = svc.release_adopted(dry_run=True)
    assert dry["released"] == 0 and [(c["device"], c["a_port"], c["b_port"]) for c in dry["circuits"]] == [
        ("pod1/agg0", min(a, b), max(a, b))], dry
    assert devices["pod1/agg0"].cross_connects().get(a) == n + b, "a dry run changed a device"
    done = svc.release_adopted(dry_run=False)
    assert done["released"] == 1 and not svc.store.last_committed_plan(ADOPTED_SCOPE).circuits
    assert devices["pod1/agg0"].cross_connects().get(a) is None
    assert tables(devices) == _journal(svc)
    svc.close()


def test_adopt_changes_nothing_on_a_switch_not_even_a_half_circuit(tmp_path):
    """Issue 28.2: the half circuit stays for the audit to report (and, with policy repair, remove)."""
    topo = load_topology(TOPOLOGY_64)
    devices = {d: FakeOcsDevice(d, dev.radix_ports) for d, dev in topo.devices.items()}
    n = devices["pod0/agg0"].ports
    devices["pod0/agg0"].connect(duplex_to_cross_connects(1, 5, n))
    devices["pod0/agg0"].connect([(2, n + 6)])  # one direction only
    held = tables(devices)
    svc = _service(topo, devices, tmp_path / "new.db")
    report = svc.start("adopt")
    assert tables(devices) == held, "--adopt removed something"
    assert report["adopted"]["half_circuits"] == [f"pod0/agg0: 2->{n + 6} (one direction only)"], report
    assert report["changes"] == 0
    health = svc.health()
    assert health["status"] == "degraded" and any("pod0/agg0" in r for r in health["reasons"]), health
    svc.close()


def test_one_switch_reached_under_two_entries_is_refused_at_start_up_by_its_own_identity(tmp_path):
    """Issue 28.4: a relay or a second address the devices file cannot see through: the switch's SID tells."""
    from orchestrl.agents.service.operator import DuplicateDevice
    from orchestrl.fabric.ocs.driver import Tl1Driver
    from orchestrl.fabric.ocs.emulator_control import start_emulator_process, stop_emulator_process

    topo = load_topology(TOPOLOGY_64)
    emu = start_emulator_process(topo.devices["core0"].radix_ports, "test", extra_args=["--sid", "core0"])
    try:
        one = {d: Tl1Driver(emu.host, emu.port, name=d, user="admin", password="admin", timeout_s=5)
               for d in ("core0", "pod0/agg0")}
        devices = {**one, "pod1/agg0": FakeOcsDevice("pod1/agg0", topo.devices["pod1/agg0"].radix_ports)}
        svc = _service(topo, devices, tmp_path / "fabric.db")
        with pytest.raises(DuplicateDevice, match=r"'core0' and 'pod0/agg0' are one switch \(serial CORE0\)"):
            svc.start("check")
        assert not one["core0"].cross_connects(), "a refused start changed the switch"
        svc.close()
    finally:
        stop_emulator_process(emu.process)
