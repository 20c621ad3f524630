"""Circuit plans: allocator multiplicities placed on concrete OCS ports, validated, and diffed.

Design note
-----------
The allocator (Appendix D) works on endpoints with port *counts*; devices work on *ports*. This
module bridges the two. A circuit is a full-duplex cross-connect between two duplex ports of one
device, so a ToR-to-ToR circuit needs both ToRs to have a free uplink on the *same* OCS-Agg device,
and a PoD-to-PoD circuit needs both PoDs to have a free boundary fibre on the same OCS-Core device.
Placement is greedy and picks, per circuit, the device with the most free ports at the scarcer end,
which keeps the striped port pools balanced; a circuit that finds no common device is dropped and
reported in the plan's notes rather than silently lost.

The tiers are coupled (Appendix D): a Core circuit between PoDs p and q lands on one boundary fibre
in each PoD, and it carries traffic only if that fibre's Agg port is cross-connected down to a ToR
of the same PoD (a lift/drop circuit labelled ``pod{p}/up:pod{q}``). :func:`validate_plan` checks
this both ways, together with port budgets, masks and template eligibility.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Mapping

from orchestrl.fabric.plan_types import (Circuit, CircuitPlan, CrossConnect, PlanDiff, _uplink_peer, _xc, circuits_from,
                               diff_plans, is_uplink_endpoint, same_cross_connects)
from orchestrl.fabric.templates.base import TemplateScope, pod_of_endpoint
from orchestrl.fabric.topology import BoundaryFibre, PortRef, Topology

__all__ = [
    "CrossConnect", "Circuit", "CircuitPlan", "PlanDiff", "place_core", "place_agg", "validate_plan",
    "diff_plans", "plan_to_json", "plan_from_json", "format_plan_summary", "is_uplink_endpoint", "circuits_from",
    "same_cross_connects",
]


# --------------------------------------------------------------------------------------------
# placement
# --------------------------------------------------------------------------------------------

def _round_robin(counts: Mapping[tuple[str, str], int]) -> list[tuple[str, str]]:
    """Circuit requests interleaved across pairs, so no pair drains a shared device pool first."""
    remaining = {k: v for k, v in sorted(counts.items()) if v > 0}
    order: list[tuple[str, str]] = []
    while remaining:
        for k in list(remaining):
            order.append(k)
            remaining[k] -= 1
            if remaining[k] == 0:
                del remaining[k]
    return order


def place_core(topology: Topology, counts: Mapping[tuple[str, str], int], used: set[PortRef] | None = None
               ) -> tuple[list[Circuit], dict[tuple[int, int], list[BoundaryFibre]], list[str]]:
    """Place PoD-pair multiplicities on OCS-Core ports.

    Returns the circuits, for each ordered ``(pod, peer)`` the boundary fibres of ``pod`` that now
    carry a Core circuit to ``peer`` (the ports OCS-Agg must lift/drop to), and notes on circuits
    that could not be placed.

    Notes
    -----
    O(K * Dc) for K circuits and Dc Core devices.
    """
    used = used if used is not None else set()
    free: dict[int, dict[str, list[BoundaryFibre]]] = defaultdict(lambda: defaultdict(list))
    for pod in sorted({pod_of_endpoint(e) for pair, n in counts.items() if n > 0 for e in pair}):  # PoDs in play only
        for f in topology.usable_boundary(pod):
            if f.core not in used and f.agg not in used:
                free[pod][f.core.device].append(f)
    circuits: list[Circuit] = []
    fibres: dict[tuple[int, int], list[BoundaryFibre]] = defaultdict(list)
    notes: list[str] = []
    for a, b in _round_robin(counts):
        p, q = pod_of_endpoint(a), pod_of_endpoint(b)
        best = max(topology.core_devices(), key=lambda d: (min(len(free[p][d]), len(free[q][d])), d), default=None)
        if best is None or not free[p][best] or not free[q][best]:
            notes.append(f"core circuit {a}-{b} not placed: no OCS-Core device has a free boundary port of both")
            continue
        fp, fq = free[p][best].pop(0), free[q][best].pop(0)
        used.update((fp.core, fq.core))
        circuits.append(Circuit("core", None, a, b, _xc(fp.core, fq.core)))
        fibres[(p, q)].append(fp)
        fibres[(q, p)].append(fq)
    return circuits, dict(fibres), notes


def place_agg(topology: Topology, pod: int, counts: Mapping[tuple[str, str], int],
              uplink_fibres: Mapping[str, list[BoundaryFibre]], used: set[PortRef] | None = None
              ) -> tuple[list[Circuit], list[str]]:
    """Place one PoD's OCS-Agg multiplicities (ToR-ToR and ToR-uplink) on device ports.

    ``uplink_fibres`` maps each uplink endpoint to the boundary fibres that carry a Core circuit
    toward its peer PoD (from :func:`place_core`); lift/drop circuits are placed onto exactly those.

    Notes
    -----
    O(K * Da) for K circuits and Da Agg devices in the PoD.
    """
    used = used if used is not None else set()
    free: dict[str, dict[str, list[PortRef]]] = defaultdict(lambda: defaultdict(list))
    for tor in topology.tors_by_pod[pod]:
        for ref in topology.usable_uplinks(tor):
            if ref not in used:
                free[tor][ref.device].append(ref)
    spare = {ep: [f for f in fs if f.agg not in used and not topology.is_masked(f.agg)] for ep, fs in uplink_fibres.items()}
    circuits: list[Circuit] = []
    notes: list[str] = []
    lift = {k: v for k, v in counts.items() if is_uplink_endpoint(k[0]) or is_uplink_endpoint(k[1])}
    tor_tor = {k: v for k, v in counts.items() if k not in lift}
    # Lift/drop first: each must land on one specific fibre's device, ToR-ToR pairs can use any.
    for a, b in _round_robin(lift):
        up, tor = (a, b) if is_uplink_endpoint(a) else (b, a)
        options = [f for f in spare.get(up, []) if free[tor][f.agg.device]]
        if not options:
            notes.append(f"agg circuit {tor}-{up} not placed: no free ToR uplink on the device of a spare boundary port")
            continue
        fibre = max(options, key=lambda f: (len(free[tor][f.agg.device]), -f.index))
        spare[up].remove(fibre)
        port = free[tor][fibre.agg.device].pop(0)
        used.update((port, fibre.agg))
        circuits.append(Circuit("agg", pod, min(a, b), max(a, b), _xc(port, fibre.agg)))
    devices = topology.agg_devices(pod)
    for a, b in _round_robin(tor_tor):
        best = max(devices, key=lambda d: (min(len(free[a][d]), len(free[b][d])), d))
        if not free[a][best] or not free[b][best]:
            notes.append(f"agg circuit {a}-{b} not placed: no OCS-Agg device has a free uplink of both ToRs")
            continue
        pa, pb = free[a][best].pop(0), free[b][best].pop(0)
        used.update((pa, pb))
        circuits.append(Circuit("agg", pod, a, b, _xc(pa, pb)))
    return circuits, notes


# --------------------------------------------------------------------------------------------
# validation
# --------------------------------------------------------------------------------------------

def validate_plan(plan: CircuitPlan, topology: Topology, scope: TemplateScope | None = None) -> list[str]:
    """Return every hard-constraint violation of ``plan`` on ``topology`` (empty list: valid).

    Checks: devices and ports exist; no masked port; each port in at most one cross-connect (port
    budgets); each circuit's ports belong to the endpoints it claims to serve; template
    eligibility and boundary-port reservations (when ``scope`` is given); and the Core-Agg
    coupling of Appendix D in both directions.

    Notes
    -----
    O(K) for K circuits.
    """
    v: list[str] = []
    seen: dict[PortRef, CrossConnect] = {}
    boundary_by_agg, boundary_by_core = topology.fibre_by_agg, topology.fibre_by_core
    core_fibre_peer: dict[PortRef, int] = {}  # agg end of a fibre carrying Core -> peer PoD
    lift_fibres: dict[PortRef, tuple[int, int]] = {}  # agg end of fibre with lift/drop -> (pod, peer)
    core_per_pod: dict[int, int] = defaultdict(int)
    devices, masked, port_owner = topology.devices, topology.masked, topology.port_owner
    for c in plan.circuits:
        dev = devices.get(c.xc.device)
        if dev is None:
            v.append(f"{c.xc}: unknown device {c.xc.device!r}")
            continue
        if c.xc.a_port == c.xc.b_port:
            v.append(f"{c.xc}: a cross-connect needs two different ports")
        refs = c.xc.ports()
        for ref in refs:
            if not 1 <= ref.port <= dev.radix_ports:
                v.append(f"{c.xc}: port {ref.port} outside 1..{dev.radix_ports}")
            if ref in masked:
                v.append(f"{c.xc}: uses masked port {ref} ({masked[ref]})")
            if ref in seen:
                v.append(f"{c.xc}: port {ref} already used by {seen[ref]} (port budget exceeded)")
            seen[ref] = c.xc
        if c.tier == "core":
            if dev.tier != "core":
                v.append(f"{c.xc}: core circuit {c.a}-{c.b} placed on {dev.tier} device")
                continue
            fa, fb = (boundary_by_core.get(r) for r in refs)
            if fa is None or fb is None:
                v.append(f"{c.xc}: core circuit {c.a}-{c.b} uses a port that is not a boundary fibre")
                continue
            if {fa.pod, fb.pod} != {pod_of_endpoint(c.a), pod_of_endpoint(c.b)} or fa.pod == fb.pod:
                v.append(f"{c.xc}: ports belong to pods {fa.pod},{fb.pod}, circuit claims {c.a}-{c.b}")
                continue
            core_fibre_peer[fa.agg] = fb.pod
            core_fibre_peer[fb.agg] = fa.pod
            core_per_pod[fa.pod] += 1
            core_per_pod[fb.pod] += 1
            if scope is not None and not scope.core_eligible(c.a, c.b):
                v.append(f"{c.xc}: PoD pair {c.a}-{c.b} is not eligible under template {scope.template!r}")
        else:
            if dev.tier != "agg" or dev.pod != c.pod:
                v.append(f"{c.xc}: agg circuit of pod {c.pod} placed on device {dev.id}")
                continue
            owners = [port_owner.get(r) for r in refs]
            ends = {c.a, c.b}
            tors = {e for e in ends if not is_uplink_endpoint(e)}
            ups = ends - tors
            port_tors = {o for o in owners if o is not None and not o.startswith("boundary:")}
            port_fibres = [f for f in (boundary_by_agg.get(r) for r in refs) if f is not None]
            if port_tors != tors or len(port_fibres) != len(ups):
                v.append(f"{c.xc}: ports belong to {sorted(o or '?' for o in owners)}, circuit claims {c.a}-{c.b}")
                continue
            for t in tors:
                if topology.tors[t].pod != c.pod:
                    v.append(f"{c.xc}: ToR {t} is not in pod {c.pod}")
            if ups:
                up = next(iter(ups))
                fibre = port_fibres[0]
                if fibre.pod != c.pod or not up.startswith(f"pod{c.pod}/"):
                    v.append(f"{c.xc}: uplink {up} does not belong to pod {c.pod}")
                lift_fibres[fibre.agg] = (c.pod, _uplink_peer(up))
                if scope is not None and not scope.agg_lift_drop:
                    v.append(f"{c.xc}: lift/drop circuits are not eligible under template {scope.template!r}")
            elif scope is not None and not scope.agg_tor_tor:
                v.append(f"{c.xc}: ToR-ToR circuits are not eligible under template {scope.template!r}")
    if scope is not None:
        for pod, cap in scope.core_port_cap.items():
            if core_per_pod.get(pod, 0) > cap:
                v.append(f"pod {pod}: {core_per_pod[pod]} core circuits exceed the template's reservation of {cap}")
    # Core-Agg coupling, both ways.
    for agg_port, peer in sorted(core_fibre_peer.items()):
        got = lift_fibres.get(agg_port)
        fibre = boundary_by_agg[agg_port]
        if got is None:
            v.append(f"core circuit pod{fibre.pod}-pod{peer} on boundary fibre {fibre.index} of pod {fibre.pod} "
                     f"has no lift/drop access circuit (Core-Agg coupling)")
        elif got != (fibre.pod, peer):
            v.append(f"boundary fibre {fibre.index} of pod {fibre.pod} lifts toward pod {got[1]} "
                     f"but its core circuit goes to pod {peer}")
    for agg_port, (pod, peer) in sorted(lift_fibres.items()):
        if agg_port not in core_fibre_peer:
            v.append(f"lift/drop circuit in pod {pod} toward pod {peer} lands on boundary fibre "
                     f"{boundary_by_agg[agg_port].index} that carries no core circuit")
    return v


# --------------------------------------------------------------------------------------------
# serialisation and reporting
# --------------------------------------------------------------------------------------------

def _demand_rows(demand: Mapping[tuple[str, str], float]) -> list[dict]:
    return [{"src": a, "dst": b, "bytes": x} for (a, b), x in sorted(demand.items())]


def plan_to_json(plan: CircuitPlan, *, derived: bool = True) -> dict:
    """Return the full plan as a JSON-serialisable document (inverse: :func:`plan_from_json`).

    ``derived=False`` leaves out the per-pair times, which are recomputed from circuits and demand
    on load; the durable store journals that slimmer form on every commit.
    """
    doc = {
        "fabric": plan.fabric, "template": plan.template, "signature": plan.signature,
        "method": plan.method, "link_bps": plan.link_bps,
        "circuits": [{"tier": c.tier, "pod": c.pod, "a": c.a, "b": c.b, "device": c.xc.device,
                      "a_port": c.xc.a_port, "b_port": c.xc.b_port} for c in plan.circuits],
        "core_demand": _demand_rows(plan.core_demand),
        "agg_demand": {str(p): _demand_rows(d) for p, d in sorted(plan.agg_demand.items())},
        "notes": list(plan.notes),
    }
    if derived:
        doc["pair_times"] = [{**r, "time_s": None if r["time_s"] == float("inf") else r["time_s"]}
                             for r in plan.pair_times()]
        doc["max_pair_time_s"] = plan.max_pair_time_s()
    return doc


def plan_from_json(doc: Mapping) -> CircuitPlan:
    """Rebuild a :class:`CircuitPlan` from :func:`plan_to_json` output (used by the durable store)."""
    circuits = tuple(Circuit(c["tier"], c["pod"], c["a"], c["b"], CrossConnect(c["device"], c["a_port"], c["b_port"]))
                     for c in doc["circuits"])
    core = {(r["src"], r["dst"]): float(r["bytes"]) for r in doc.get("core_demand", [])}
    agg = {int(p): {(r["src"], r["dst"]): float(r["bytes"]) for r in rows}
           for p, rows in doc.get("agg_demand", {}).items()}
    return CircuitPlan(doc["fabric"], doc["template"], doc["signature"], float(doc["link_bps"]), circuits, core, agg,
                       tuple(doc.get("notes", ())), doc.get("method", "greedy"))


def _fmt_time(t: float) -> str:
    if t == float("inf"):
        return "inf (unserved)"
    if t >= 1:
        return f"{t:.3f} s"
    return f"{t * 1e3:.3f} ms"


def _fmt_bytes(x: float) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if x >= scale:
            return f"{x / scale:.2f} {unit}"
    return f"{x:.0f} B"


def format_plan_summary(plan: CircuitPlan, topology: Topology, max_rows: int = 24) -> str:
    """Return a readable summary: circuits per pair, bottleneck times, port use per device."""
    lines = [f"plan for template {plan.template!r} on fabric {plan.fabric!r} (signature {plan.signature[:12]}, "
             f"method {plan.method})",
             f"  circuits: {len(plan.circuits)} "
             f"(core {sum(c.tier == 'core' for c in plan.circuits)}, agg {sum(c.tier == 'agg' for c in plan.circuits)});"
             f" max pair time {_fmt_time(plan.max_pair_time_s())}"]
    every = plan.pair_times()
    rows = sorted((r for r in every if r["circuits"]), key=lambda r: -r["time_s"])
    unserved = [r for r in every if not r["circuits"]]
    if rows:
        lines.append(f"  {'tier':<5} {'pair':<40} {'circuits':>8} {'bytes a->b':>11} {'bytes b->a':>11} {'time':>14}")
        for r in rows[:max_rows]:
            pair = f"{r['a']} - {r['b']}"
            lines.append(f"  {r['tier']:<5} {pair:<40} {r['circuits']:>8} {_fmt_bytes(r['bytes_ab']):>11} "
                         f"{_fmt_bytes(r['bytes_ba']):>11} {_fmt_time(r['time_s']):>14}")
        if len(rows) > max_rows:
            lines.append(f"  ... {len(rows) - max_rows} more pairs (use --json for all)")
    if unserved:
        gbytes = sum(max(r["bytes_ab"], r["bytes_ba"]) for r in unserved)
        shown = ", ".join(f"{r['a']}-{r['b']}" for r in unserved[:4])
        lines.append(f"  unserved (no circuit, time inf): {len(unserved)} pairs, {_fmt_bytes(gbytes)} in their larger "
                     f"direction: {shown}{' ...' if len(unserved) > 4 else ''}")
    by_dev = plan.by_device()
    lines.append("  port use per device (used / cabled-usable / radix):")
    for dev_id, dev in topology.devices.items():
        used = 2 * len(by_dev.get(dev_id, []))
        cabled = sum(1 for p in topology.port_owner if p.device == dev_id and not topology.is_masked(p))
        if used or len(topology.devices) <= 16:
            lines.append(f"    {dev_id:<14} {used:>5} / {cabled:>5} / {dev.radix_ports}")
    for n in plan.notes:
        lines.append(f"  note: {n}")
    return "\n".join(lines)
