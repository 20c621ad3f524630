"""Open the control service from files: lock the state file, load topology and devices, open the journal.

Kept apart from :mod:`agents.service.startup` (which :mod:`agents.service.core` imports) so that
building a service never forms an import circle with the service itself.
"""

from __future__ import annotations

import time

from orchestrl.agents.service.core import ControlService
from orchestrl.agents.service.jobs import JobRegistry
from orchestrl.agents.service.startup import StateLock
from orchestrl.fabric.ocs.devices import load_devices, open_device
from orchestrl.fabric.runtime.store import FabricStore
from orchestrl.fabric.safe_window import GateConfig
from orchestrl.fabric.topology import load_topology

__all__ = ["open_service"]


def open_service(topology_path: str, devices_path: str, state_path: str, operator_tokens: list[str],
                 gate_min_observations: int | None = None, *, audit_period_s: float | None = 1.0,
                 drift_policy: str = "repair") -> ControlService:
    """Build a service from files: lock the state file, load the topology, one TL1 driver per device, the journal.

    Raises
    ------
    StoreError
        When another proxy holds the state file, or the file is corrupt (naming the table or row).
    ConfigError
        For a malformed topology or devices file.
    """
    topology = load_topology(topology_path)
    configs = load_devices(devices_path, topology)
    lock = StateLock(state_path)
    store = registry = None
    try:
        store = FabricStore(state_path)
        registry = JobRegistry(topology, operator_tokens, state_path)
        gate = GateConfig(min_observations=gate_min_observations) if gate_min_observations else None
        drivers = {name: open_device(cfg) for name, cfg in configs.items()}
        readers = {name: open_device(cfg) for name, cfg in configs.items()}  # the audit's own sessions
        service = ControlService(topology, drivers, store, registry, gate_config=gate,
                                 switch_delay_s={n: c.switch_delay_s for n, c in configs.items()})
    except BaseException:
        if registry is not None:
            registry.close()
        if store is not None:
            store.close()
        lock.release()
        raise
    service.state_lock = lock
    # audit_period_s None: no audit thread (an in-process benchmark that times commits alone)
    service.audit_setup = {"clients": readers if audit_period_s is not None else None,
                           "period_s": audit_period_s or 1.0, "policy": drift_policy}
    service.opened_at = time.time()
    return service
