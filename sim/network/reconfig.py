"""RFabric's circuits over time, driven by the real controller, safe-window gate and reconfiguration order.

Design note
-----------
A job announces an intent; :class:`fabric.controller.FabricController` materialises a plan
(Algorithm 2) under the fabric's masks; the plan is offered to the job's
:class:`fabric.safe_window.SafeWindowGate` of its stage family with the time the devices will
switch; the gate commits it now, defers it to a later window (Gen: only at a deployment boundary,
weight sync: only after ``weight-sync-begin``), or gives up. This is what the control service does
(``agents/service.py``): the same gate per (job, family), train and train-dp sharing one.

A committed change is applied as the steps of :func:`fabric.reconfig_order.order_plan_change`:
kept circuits stay up throughout; a *remove* step frees its ports at once; an *add* step's circuits
carry traffic only after the slowest device of the step has switched (Table 2 delay of the device's
technology, 25 ms for piezo; the same rule the service uses to size the safe window). A change that
commits while the devices are still busy with the previous one starts when that one ends. The
result is a timeline of circuit sets that :func:`sim.network.events.simulate` runs flows across.

Failed OCS ports go dark at once (ECMP routes around them); the controller masks them and, when
asked, re-plans the last intent under the remaining port budget (§5.4).

**Scopes.** A plan owns the PoDs its intent's GPUs sit in, not the whole fabric: Train's circuits
live in the training PoDs and Gen's in the generation PoDs, so in a one-step asynchronous run
Train(k) and Gen(k+1) reconfigure side by side, each with its own timeline and its own busy
devices, and the fabric's circuits at a time are the union over scopes. A plan whose PoDs overlap
another scope's (weight sync spans both clusters) claims them from its commit on: the other scope
keeps only its circuits that touch none of them. ToRs and boundary fibres belong to one PoD, so
scopes with disjoint PoDs never compete for a port. This is what the control service does per
tenant; within one RL job the stages play the tenants (the earlier single plan let a Gen commit
replace Train's circuits and wait for Train's switching, which slowed 57B generation at 2,048 GPUs).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Iterable

from orchestrl.fabric.controller import FabricController, FabricState, MaterializeResult, materialize
from orchestrl.fabric.intent import Intent
from orchestrl.fabric.plan import Circuit, CircuitPlan, same_cross_connects
from orchestrl.fabric.reconfig_order import ReconfigOrder, order_plan_change
from orchestrl.fabric.safe_window import CollectiveEvent, CommitDecision, GateConfig, SafeWindowGate
from orchestrl.fabric.templates.base import pod_of_endpoint
from orchestrl.fabric.topology import PortRef
from orchestrl.fabric.traffic import AggregateDemand
from orchestrl.sim.network.fabrics import Failures
from orchestrl.sim.network.rfabric import RFabricFabric
from orchestrl.sim.network.state import NetState

__all__ = ["GATE_FAMILY", "PlanChange", "DriverDecision", "RFabricDriver"]

#: Gate per stage family, as the control service keys them: train and train-dp share a gate (§5.2).
GATE_FAMILY = {"train": "train", "train-dp": "train", "gen": "gen", "weight-sync": "weight-sync"}


@dataclass(frozen=True)
class PlanChange:
    """A committed plan change in time: the circuit set in force after each step."""

    plan: CircuitPlan
    committed_s: float  # when the gate said commit
    start_s: float  # when the devices started (later if busy with the previous change)
    end_s: float  # when the last add step finished switching
    snapshots: tuple[tuple[float, tuple[Circuit, ...]], ...]  # (from time, circuits up)
    outages: tuple[str, ...]  # pairs that had to go dark briefly, in words

    @property
    def switching_s(self) -> float:
        return self.end_s - self.start_s


@dataclass(frozen=True)
class DriverDecision:
    """What happened to one materialised plan at one moment."""

    job: str
    stage: str
    action: str  # "commit" | "defer" | "reject" | "refused" (invalid plan) | "unchanged" (no device change)
    reason: str
    at_s: float
    result: MaterializeResult
    change: PlanChange | None = None


@dataclass
class _Pending:
    intent: Intent
    result: MaterializeResult
    plan_id: str


@dataclass
class _Scope:
    """The circuits of one set of PoDs over time (see the module note)."""

    pods: frozenset[int]
    active: CircuitPlan | None = None
    snapshots: list[tuple[float, tuple[Circuit, ...]]] = field(default_factory=list)
    busy_until: float = 0.0

    def circuits_at(self, t_s: float) -> tuple[Circuit, ...]:
        got: tuple[Circuit, ...] = ()
        for t, circuits in self.snapshots:
            if t > t_s:
                break
            got = circuits
        return got


_MEMO_SIZE = 16  # remembered materialisations (per intent object); a run repeats a handful of intents


def _circuit_pods(c: Circuit) -> tuple[int, ...]:
    """The PoDs whose ports circuit ``c`` uses: an Agg circuit's PoD, a Core circuit's two."""
    return (c.pod,) if c.tier == "agg" else (pod_of_endpoint(c.a), pod_of_endpoint(c.b))


def _touches(c: Circuit, pods: frozenset[int]) -> bool:
    """Whether circuit ``c`` uses a port of one of ``pods``."""
    return any(p in pods for p in _circuit_pods(c))


@dataclass
class RFabricDriver:
    """RFabric's control loop in simulated time: controller -> gate -> ordered steps -> circuit timeline.

    Parameters
    ----------
    fabric : RFabricFabric
    method : str
        Allocation procedure of the controller (``greedy`` as Algorithm 3, ``uniform`` as the
        Appendix I baseline, ...).
    gate_config : GateConfig, optional
        Safe-window settings (the service's defaults if omitted).
    switch_delay_s : float, optional
        One switching delay for every device (a sensitivity sweep); default: each device's Table 2
        technology.

    Examples
    --------
    >>> from orchestrl.sim.network.build import build_fabric
    >>> from orchestrl.fabric.intent import Collective, Intent
    >>> fab = build_fabric("rfabric", 64)
    >>> drv = RFabricDriver(fab)
    >>> i = Intent("train", "job", "ep", (Collective("all-to-all", groups=(tuple(range(0, 64, 4)),),
    ...                                             bytes_per_rank=1e9),))
    >>> d = drv.announce(i, now_s=0.0)  # no collective seen yet: slack unknown, so the gate waits
    >>> d.action, round(d.change.switching_s, 3)  # one add step on piezo OCS (Table 2: 25 ms)
    ('defer', 0.025)
    """

    fabric: RFabricFabric
    method: str = "greedy"
    gate_config: GateConfig | None = None
    switch_delay_s: float | None = None
    controller: FabricController = field(init=False)
    changes: list[PlanChange] = field(default_factory=list, init=False)
    decisions: list[DriverDecision] = field(default_factory=list, init=False)
    failures: Failures = field(default_factory=Failures, init=False)

    def __post_init__(self) -> None:
        self.controller = FabricController(self.fabric.topology, method=self.method)
        self._gates: dict[tuple[str, str], SafeWindowGate] = {}
        self._pending: dict[tuple[str, str], _Pending] = {}
        self._scopes: list[_Scope] = []
        self._plans = 0
        # Algorithm 2's plan depends on the intent, the demand, the topology and the template entry,
        # never on the plan in force (that only comes back when refused). A weight sync announces the
        # same intent object every iteration (2,048 GPUs: ~1.5 s of aggregation and allocation per
        # announce), so results are remembered per intent object; the intent is kept alive with its
        # result so its id cannot be reused by another object.
        self._memo: dict[tuple, tuple] = {}  # (intent, demand, topology, template cache, its entry, result)
        self._pods_memo: dict[int, tuple[Intent, frozenset[int]]] = {}

    # ------------------------------------------------------------------ gates and events
    def gate(self, job: str, stage: str) -> SafeWindowGate:
        """Return the job's gate for the stage's family (created on first use)."""
        key = (job, GATE_FAMILY[stage])
        if key not in self._gates:
            self._gates[key] = SafeWindowGate(self.gate_config)
        return self._gates[key]

    def observe(self, job: str, event: CollectiveEvent) -> list[DriverDecision]:
        """Feed one collective-boundary event of ``job``; return decisions on plans it let through."""
        family = GATE_FAMILY[event.stage]
        out = []
        for d in self.gate(job, event.stage).observe(event):
            pending = self._pending.pop((job, family), None)
            if pending is None:
                continue
            out.append(self._settle(job, pending, d))
        return out

    # ------------------------------------------------------------------ scopes
    def pods_of(self, intent: Intent) -> frozenset[int]:
        """The PoDs ``intent``'s GPUs sit in: the scope its plan owns."""
        got = self._pods_memo.get(id(intent))
        if got is not None and got[0] is intent:
            return got[1]
        topo = self.fabric.topology
        pods = frozenset(topo.pod_of_gpu(g) for g in intent.members)
        if len(self._pods_memo) >= _MEMO_SIZE:
            self._pods_memo.pop(next(iter(self._pods_memo)))
        self._pods_memo[id(intent)] = (intent, pods)
        return pods

    def in_force(self, pods: frozenset[int]) -> CircuitPlan | None:
        """The latest plan holding ``pods``' circuits (None: no plan has touched them yet).

        The plan of the scope that owns exactly ``pods``, or else the circuits of every scope that
        touch them, as one plan (what a new plan for ``pods`` changes from).
        """
        for sc in self._scopes:
            if sc.pods == pods and sc.active is not None:
                return sc.active
        parts = [sc for sc in self._scopes if sc.active is not None and sc.pods & pods]
        if not parts:
            return None
        circuits = tuple(c for sc in parts for c in sc.active.circuits if _touches(c, pods))
        return replace(parts[-1].active, circuits=circuits)

    def materialize(self, intent: Intent, demand: AggregateDemand | None = None) -> MaterializeResult:
        """Run Algorithm 2 for ``intent`` against the circuits in force in its PoDs."""
        ctl = self.controller
        ctl.last_intent = intent
        previous = self.in_force(self.pods_of(intent))
        key = (id(intent), id(demand), ctl.method)
        got = self._memo.get(key)
        if (got is not None and all(a is b for a, b in zip(got[:4], (intent, demand, ctl.topology, ctl.cache)))
                and ctl.cache.peek(got[5].signature) is got[4]):  # the same template entry, not a replaced one
            ctl.cache.hits += 1  # what materialize's own template lookup would have counted
            result = got[5]
            result = replace(result, cache_hit=True, solve_s=0.0,
                             plan=result.plan if result.accepted else previous)
        else:
            result = materialize(intent, FabricState(ctl.topology, previous), ctl.cache, demand=demand,
                                 method=ctl.method)
            if len(self._memo) >= _MEMO_SIZE:
                self._memo.pop(next(iter(self._memo)))
            self._memo[key] = (intent, demand, ctl.topology, ctl.cache, ctl.cache.peek(result.signature), result)
        ctl.history.append(result)
        del ctl.history[:-256]
        return result

    def _claim(self, pods: frozenset[int], t_s: float) -> _Scope:
        """Return the scope owning ``pods`` from ``t_s`` on; overlapping scopes give up those PoDs' circuits."""
        for sc in self._scopes:
            if sc.pods == pods:
                return sc
        carried: list[Circuit] = []
        busy = 0.0
        for sc in self._scopes:
            if not sc.pods & pods:
                continue
            carried += [c for c in sc.circuits_at(t_s) if _touches(c, pods)]
            keep = [(t, c) for t, c in sc.snapshots if t < t_s]
            keep.append((t_s, tuple(c for c in sc.circuits_at(t_s) if not _touches(c, pods))))
            keep += [(t, tuple(x for x in c if not _touches(x, pods))) for t, c in sc.snapshots if t > t_s]
            sc.snapshots = keep
            if sc.active is not None:
                sc.active = replace(sc.active, circuits=tuple(c for c in sc.active.circuits if not _touches(c, pods)))
            sc.pods = sc.pods - pods
            busy = max(busy, sc.busy_until)
        new = _Scope(pods, None, [(t_s, tuple(carried))], busy)
        self._scopes.append(new)  # emptied scopes stay: their snapshots are the fabric's past
        return new

    def _sync_active(self) -> None:
        """The controller's active plan is the union of every scope's (what the devices hold)."""
        plans = [sc.active for sc in self._scopes if sc.active is not None]
        if len(plans) == 1:
            self.controller.active = plans[0]
        elif plans:
            self.controller.active = replace(plans[-1], circuits=tuple(c for p in plans for c in p.circuits))

    # ------------------------------------------------------------------ plans
    def announce(self, intent: Intent, now_s: float, demand: AggregateDemand | None = None) -> DriverDecision:
        """Materialise ``intent`` and offer its plan to the job's gate at ``now_s``."""
        result = self.materialize(intent, demand)
        self._plans += 1
        plan_id = f"{intent.job}#{self._plans}"
        family = GATE_FAMILY[intent.stage]
        if not result.accepted:
            return self._log(DriverDecision(intent.job, intent.stage, "refused", "; ".join(result.violations[:3]),
                                            now_s, result))
        self._pending.pop((intent.job, family), None)
        gate = self.gate(intent.job, intent.stage)
        gate.withdraw(intent.job)
        old = self.in_force(self.pods_of(intent))
        if same_cross_connects(old, result.plan):
            return self._log(DriverDecision(intent.job, intent.stage, "unchanged", "no device change needed",
                                            now_s, result))
        order = order_plan_change(old, result.plan)
        delay = self.switching_time_s(order)
        d = gate.submit(intent.job, intent.stage, delay, now_s, plan_id)
        return self._settle(intent.job, _Pending(intent, result, plan_id), d, order)

    def _settle(self, job: str, pending: _Pending, d: CommitDecision, order: ReconfigOrder | None = None
                ) -> DriverDecision:
        stage = pending.intent.stage
        if d.action == "commit":
            change = self._commit(pending.result, d.at_s, order, self.pods_of(pending.intent))
            return self._log(DriverDecision(job, stage, "commit", d.reason, d.at_s, pending.result, change))
        if d.action == "defer":
            self._pending[(job, GATE_FAMILY[stage])] = pending
            # what the change would cost, so a caller can see why it waits
            old = self.in_force(self.pods_of(pending.intent))
            order = order or order_plan_change(old, pending.result.plan)
            preview = self._steps(old, pending.result.plan, order, d.at_s)
            return self._log(DriverDecision(job, stage, "defer", d.reason, d.at_s, pending.result, preview))
        return self._log(DriverDecision(job, stage, d.action, d.reason, d.at_s, pending.result))

    def _log(self, d: DriverDecision) -> DriverDecision:
        self.decisions.append(d)
        return d

    def switching_time_s(self, order: ReconfigOrder) -> float:
        """Return how long the devices switch for ``order``: per add step, its slowest device."""
        total = 0.0
        for step in order.steps:
            if step.action == "add":
                total += max(self._delay(c.device) for c in step.circuits)
        return total

    def _delay(self, device: str) -> float:
        if self.switch_delay_s is not None:
            return self.switch_delay_s
        return self.fabric.topology.devices[device].technology.switch_delay_s

    def _steps(self, old: CircuitPlan | None, new: CircuitPlan, order: ReconfigOrder, start: float) -> PlanChange:
        by_xc = {c.xc: c for c in (old.circuits if old else ())}
        by_xc.update((c.xc, c) for c in new.circuits)
        up = {c.xc for c in (old.circuits if old else ())}
        t = start
        snaps = []
        for step in order.steps:
            xcs = {c.xc for c in step.circuits}
            if step.action == "remove":
                up -= xcs  # ports freed at once: the circuits are dark from now
            else:
                t += max(self._delay(c.device) for c in step.circuits)
                up |= xcs
            snaps.append((t, tuple(by_xc[x] for x in sorted(up, key=lambda x: (x.device, x.a_port, x.b_port)))))
        if not snaps:
            snaps.append((t, tuple(new.circuits)))
        return PlanChange(new, start, start, t, tuple(snaps), tuple(o.reason for o in order.outages))

    def _plan_pods(self, plan: CircuitPlan) -> frozenset[int]:
        """The PoDs a plan's circuits touch; every PoD for an empty plan."""
        pods = frozenset(p for c in plan.circuits for p in _circuit_pods(c))
        return pods or frozenset(self.fabric.topology.pods)

    def _commit(self, result: MaterializeResult, at_s: float, order: ReconfigOrder | None,
                pods: frozenset[int] | None = None) -> PlanChange:
        pods = self._plan_pods(result.plan) if pods is None else pods
        old = self.in_force(pods)
        order = order or order_plan_change(old, result.plan)
        scope = self._claim(pods, at_s)
        start = max(at_s, scope.busy_until)
        change = replace(self._steps(old, result.plan, order, start), committed_s=at_s)
        scope.active = result.plan
        scope.busy_until = change.end_s
        # a later snapshot replaces every earlier one of the scope from the same time on
        scope.snapshots = [s for s in scope.snapshots if s[0] < start] + list(change.snapshots)
        self._sync_active()
        self.changes.append(change)
        return change

    def install(self, plan: CircuitPlan | MaterializeResult, at_s: float = 0.0,
                pods: frozenset[int] | None = None) -> PlanChange:
        """Put a plan in force at ``at_s`` at once, without gate or switching (the fabric as it stands).

        ``pods``: the PoDs the plan owns (default: those its circuits touch; every PoD for an empty plan).
        """
        result = plan if isinstance(plan, MaterializeResult) else MaterializeResult(plan, True, False, plan.template,
                                                                                      plan.signature)
        pods = self._plan_pods(result.plan) if pods is None else pods
        scope = self._claim(frozenset(pods), at_s)
        change = PlanChange(result.plan, at_s, at_s, at_s, ((at_s, tuple(result.plan.circuits)),), ())
        scope.snapshots = [s for s in scope.snapshots if s[0] < at_s] + list(change.snapshots)
        scope.active = result.plan
        scope.busy_until = max(scope.busy_until, at_s)
        self._sync_active()
        self.changes.append(change)
        return change

    # ------------------------------------------------------------------ failures
    def fail_ports(self, ports: Iterable[PortRef], now_s: float, replan: bool = True) -> DriverDecision | None:
        """Take OCS ports down at ``now_s``: their circuits go dark; mask them and re-plan the last intent."""
        ports = frozenset(ports)
        self.failures = replace(self.failures, ports=self.failures.ports | ports)
        self.controller.mask_ports([(p.device, p.port, "failed") for p in sorted(ports)])
        if replan and self.controller.last_intent is not None:
            return self.announce(self.controller.last_intent, now_s)
        return None

    def fail_nics(self, gpus: Iterable[int]) -> None:
        """Take NIC-EPS links down: those GPUs relay over NVLink to a healthy NIC of their server."""
        self.failures = replace(self.failures, nics=self.failures.nics | frozenset(gpus))

    # ------------------------------------------------------------------ timeline
    @property
    def active(self) -> CircuitPlan | None:
        return self.controller.active

    def circuits_at(self, t_s: float) -> tuple[Circuit, ...]:
        """Return the circuits carrying traffic at ``t_s`` (every scope's)."""
        parts = [sc.circuits_at(t_s) for sc in self._scopes]
        parts = [p for p in parts if p]
        return parts[0] if len(parts) == 1 else tuple(c for p in parts for c in p)

    def timeline(self, since_s: float = 0.0) -> list[tuple[float, NetState]]:
        """Return the fabric states in force from ``since_s`` on, for :func:`sim.network.events.simulate`."""
        out = [(since_s, self.fabric.with_circuits(self.circuits_at(since_s), self.failures))]
        for t in sorted({t for sc in self._scopes for t, _ in sc.snapshots if t > since_s}):
            out.append((t, self.fabric.with_circuits(self.circuits_at(t), self.failures)))
        return out
