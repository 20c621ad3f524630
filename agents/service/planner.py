"""The planning side of the control service: a job's intent document in, its plan and change out.

Design note
-----------
Everything here is a pure function of its inputs: parse the document, derive the fabric view the
job may use (other jobs' circuits in its reach reserved), run Algorithm 2, check the plan stays
inside the job's placement, and order the change from the plan in force (§5.4). An RL job repeats
the same few periods every iteration, so each of these is remembered by its inputs
(:mod:`agents.service.memo`): in the steady state a commit costs the journal and the devices, not the
planning. :class:`agents.service.core.ControlService` owns one planner and calls it under its lock.
"""

from __future__ import annotations

import time
from dataclasses import replace
from typing import Any, Callable, Mapping

from orchestrl.agents.service.memo import IdentityMemo, IntentMemo, PlanMemo
from orchestrl.agents.service.metrics import MetricsRegistry
from orchestrl.agents.service.ordered_commit import PlannedChange, plan_change
from orchestrl.agents.service.checks import check_intent_inside, plan_outside_placement, reserved_ports
from orchestrl.fabric.controller import FabricController, FabricState, MaterializeResult, materialize
from orchestrl.fabric.intent import Intent
from orchestrl.fabric.plan import CircuitPlan
from orchestrl.fabric.runtime.store import FabricStore, StoreWriteError
from orchestrl.fabric.topology import PortRef, Topology

__all__ = ["JobPlanner"]


class JobPlanner:
    """Plan jobs' intents on one fabric, remembering every pure result across iterations.

    Parameters
    ----------
    controller : FabricController
        The topology (with masks), the template cache and the allocation method.
    store : FabricStore
        Where a template cache that gained an entry is saved.
    metrics : MetricsRegistry
        Receives ``orchestrl_plan_seconds``.
    """

    def __init__(self, controller: FabricController, store: FabricStore, metrics: MetricsRegistry,
                 on_store_error: Callable[[StoreWriteError], object] | None = None) -> None:
        self.controller = controller
        self.store = store
        self.metrics = metrics
        self.on_store_error = on_store_error  # a template cache that cannot be saved is saved with the next miss
        self._views: dict[tuple[int, frozenset], tuple[Topology, Topology]] = {}  # -> (base, view)
        self.clear()

    def clear(self) -> None:
        """Forget remembered parses, plans, changes and placement checks (as after a restart)."""
        self._intents, self._plans = IntentMemo(), PlanMemo()
        self._changes: IdentityMemo[PlannedChange] = IdentityMemo()
        self._inside: IdentityMemo[list[str]] = IdentityMemo()
        self._allowed: IdentityMemo[bool] = IdentityMemo()

    def parse(self, doc: Mapping[str, Any]) -> Intent:
        """Return the intent of ``doc`` on the current topology (raises :class:`ConfigError` naming the field)."""
        return self._intents.parse(doc, "intent", self.controller.topology)

    def view(self, pods: frozenset[int], others: Mapping[str, CircuitPlan],
             everywhere: frozenset[PortRef] = frozenset()) -> Topology:
        """Return the topology as a job on ``pods`` may use it: ``others``' circuits in its reach reserved.

        ``everywhere``: ports reserved wherever they are (adopted circuits, ports beyond a fair share).
        """
        base = self.controller.topology
        foreign = (reserved_ports(base, pods, others) if others else frozenset()) | everywhere
        if not foreign:
            return base
        got = self._views.get((id(base), foreign))
        if got is None or got[0] is not base:  # the base is held, so its id is never another topology's
            self._views = {} if len(self._views) > 64 else self._views
            got = self._views[(id(base), foreign)] = (base, base.with_masked(
                [(p.device, p.port, "reserved") for p in sorted(foreign)]))
        return got[1]

    def materialize(self, intent: Intent, view: Topology, active: CircuitPlan | None) -> MaterializeResult:
        """Return Algorithm 2's result for ``intent`` on ``view`` (``active``: the plan in force).

        A remembered result reports the look-up's time as ``solve_s`` and counts a template-cache hit.
        """
        started = time.perf_counter()
        ctl, signature = self.controller, intent.signature()
        misses = ctl.cache.misses

        def template() -> tuple[str, str] | None:
            entry = ctl.cache.peek(signature)
            return (entry.template, entry.method) if entry else None
        result, remembered = self._plans.materialize(
            intent, view, template, lambda: materialize(intent, FabricState(view, active), ctl.cache, method=ctl.method))
        if remembered:
            ctl.cache.get_or_create(signature, intent.stage, intent.period, intent.template, ctl.method)
            result = replace(result, solve_s=time.perf_counter() - started)
        self.metrics.observe("orchestrl_plan_seconds", result.solve_s)
        if ctl.cache.misses != misses:
            try:
                self.store.save_template_cache(ctl.cache)
            except StoreWriteError as exc:
                if self.on_store_error is None:
                    raise
                self.on_store_error(exc)
        return result

    def change(self, old: CircuitPlan | None, new: CircuitPlan) -> PlannedChange:
        """Return how ``old -> new`` is applied: its non-blocking order and intermediate plans."""
        return self._changes.get((old, new), lambda: plan_change(old, new))

    def check_inside(self, intent: Intent, job: Any, registry: Any) -> None:
        """Refuse (403) an intent touching GPUs outside ``job``'s placement (an accepted one is remembered)."""
        topology = self.controller.topology
        self._allowed.get((intent, job.placement, topology),
                          lambda: check_intent_inside(intent, job, topology, registry) or True)

    def outside(self, plan: CircuitPlan, job: Any) -> list[str]:
        """Return every circuit of ``plan`` outside ``job``'s placement, in words (empty: none)."""
        topology = self.controller.topology
        return self._inside.get((plan, job.placement, topology), lambda: plan_outside_placement(plan, job, topology))
