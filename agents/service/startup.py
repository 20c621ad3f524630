"""Start-up of the control proxy: the state file's lock, the devices against the journal, adopt or reset.

Design note
-----------
A proxy must never change a running fabric because its state file is new, empty, old or copied
while another proxy wrote it. So at start-up every reachable device is read and compared with the
journal, and the differences are sorted in two:

* **explained** by the journal: cross-connects of a committed plan that a device lacks (it
  restarted and lost its table), and cross-connects of a commit the journal records as in flight
  (the proxy died mid-commit). Restoring the last committed plans from these is the journal's own
  crash recovery, and happens without asking.
* **unexplained**: cross-connects on a device that no committed or in-flight plan ever held. Only
  an operator may decide about those: without a flag the proxy refuses to start and prints the
  diff (:class:`StartupRefused`); ``--adopt`` takes the devices' circuits as they are into the
  journal (nothing on a device changes); ``--reset`` makes the devices match the journal.

Only one proxy may use a state file: an exclusive ``flock`` on ``<state>.lock``, which names the
holder's pid, refuses a second one before it reads anything (:class:`StateLock`).
"""

from __future__ import annotations

import fcntl
import os
from dataclasses import dataclass
from typing import Any, Mapping

from orchestrl.fabric.errors import OrchestrlError
from orchestrl.fabric.ocs.errors import OcsError
from orchestrl.fabric.ocs.fanout import each_device
from orchestrl.fabric.ocs.model import cross_connects_to_duplex, duplex_to_cross_connects
from orchestrl.fabric.plan import Circuit, CircuitPlan, CrossConnect, circuits_from
from orchestrl.fabric.runtime.reconcile import device_changes, wanted_by_device
from orchestrl.fabric.runtime.store import StoreError
from orchestrl.fabric.topology import PortRef, Topology

__all__ = ["StateLock", "StartupRefused", "StartupDiff", "STARTUP_MODES", "ADOPTED_SCOPE", "startup_diff",
           "adopted_plan", "attribute_circuits"]

STARTUP_MODES = ("check", "adopt", "reset")
ADOPTED_SCOPE = "fabric/adopted"  # journal scope of circuits taken over from the devices (--adopt)
_SHOWN = 6  # cross-connects named per device in a refusal


class StartupRefused(OrchestrlError):
    """The devices hold circuits the journal does not explain; ``diff`` says which, per device."""

    def __init__(self, state_path: str, diff: "StartupDiff") -> None:
        self.diff = diff
        lines = [f"the journal in {state_path} does not explain what the devices hold, so the proxy will not "
                 "change them:"]
        lines += ["  " + line for line in diff.describe()]
        lines.append("start with --adopt to take the devices' circuits as the committed plan (nothing on a device "
                     "changes), or with --reset to make the devices match the journal (the circuits above are "
                     "removed); docs/operations.md explains both")
        super().__init__("\n".join(lines))


@dataclass(frozen=True)
class StartupDiff:
    """Per device: what reconciling to the journal would remove, of it unexplained, and add."""

    tables: Mapping[str, dict[int, int]]  # what each reachable device holds
    unexplained: Mapping[str, tuple[tuple[int, int], ...]]  # would be removed; no plan ever held them
    explained_removals: Mapping[str, tuple[tuple[int, int], ...]]  # would be removed; an in-flight commit set them
    additions: Mapping[str, tuple[tuple[int, int], ...]]  # journalled, missing on the device
    unreachable: Mapping[str, str]  # device -> error

    @property
    def refuses(self) -> bool:
        return any(self.unexplained.values())

    def describe(self) -> list[str]:
        out = []
        for d in sorted(set(self.unexplained) | set(self.additions) | set(self.explained_removals)):
            gone, add = self.unexplained.get(d, ()), self.additions.get(d, ())
            if not gone and not add:
                continue
            shown = ", ".join(f"{i}->{e}" for i, e in gone[:_SHOWN]) + (" ..." if len(gone) > _SHOWN else "")
            out.append(f"{d}: {len(gone)} cross-connects not in the journal would be removed"
                       + (f" ({shown})" if gone else "") + f"; {len(add)} journalled ones would be added")
        out += [f"{d}: unreachable ({why}); checked when it comes up" for d, why in sorted(self.unreachable.items())]
        return out


class StateLock:
    """An exclusive lock on a state file, held for the life of the process (``<state>.lock`` names the pid).

    Raises
    ------
    StoreError
        When another process holds it, naming that process's pid.
    """

    def __init__(self, state_path: str) -> None:
        self.path = os.fspath(state_path) + ".lock"
        try:
            os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
            self._fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise StoreError(os.fspath(state_path), f"cannot create its lock file {self.path} ({exc.strerror})",
                             "choose a writable location for the state file") from None
        try:
            fcntl.flock(self._fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            holder = os.pread(self._fd, 64, 0).decode("ascii", "replace").strip() or "unknown"
            os.close(self._fd)
            raise StoreError(os.fspath(state_path), f"is in use by another orchestrl proxy (pid {holder})",
                             f"stop that proxy (kill {holder}) or give this one another --state file") from None
        os.ftruncate(self._fd, 0)
        os.pwrite(self._fd, f"{os.getpid()}\n".encode(), 0)

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing releases the flock
            self._fd = -1


def _simplex(xcs: list[CrossConnect], n: int) -> set[tuple[int, int]]:
    return {p for xc in xcs for p in duplex_to_cross_connects(xc.a_port, xc.b_port, n)}


def startup_diff(store: Any, devices: Mapping[str, Any], masked: Mapping[str, frozenset[int]]) -> StartupDiff:
    """Read every device and sort what reconciling to the journal would change into explained and not."""
    committed = [r.plan for s in store.scopes() if (r := store.last_committed(s)) is not None]
    in_flight = [r.plan for r in store.in_flight()]
    wanted, told = wanted_by_device(committed), wanted_by_device(in_flight)

    def read(client: Any) -> Any:
        try:
            return client.cross_connects()
        except (OcsError, OSError) as exc:
            return exc
    tables = each_device({d: (lambda c=c: read(c)) for d, c in devices.items()})
    unexplained, explained, additions, unreachable, held = {}, {}, {}, {}, {}
    for d, table in sorted(tables.items()):
        if isinstance(table, BaseException):
            unreachable[d] = f"{type(table).__name__}: {table}"
            continue
        held[d] = table
        n = devices[d].ports
        ch = device_changes(wanted.get(d, []), table, n, masked.get(d, frozenset()))
        known = _simplex(told.get(d, []), n)
        unexplained[d] = tuple(p for p in ch.remove if p not in known)
        explained[d] = tuple(p for p in ch.remove if p in known)
        additions[d] = ch.add
    return StartupDiff(held, unexplained, explained, additions, unreachable)


def adopted_plan(topology: Topology, tables: Mapping[str, dict[int, int]], kept: Mapping[str, set[CrossConnect]],
                 ports: Mapping[str, int]) -> tuple[CircuitPlan, list[str]]:
    """The devices' full-duplex circuits that no kept journal circuit covers, as one plan; and the half circuits.

    ``ports`` is each device's N (ports per side), which numbers its egress ports.
    """
    circuits, halves = [], []
    for d, table in sorted(tables.items()):
        dev = topology.devices[d]
        duplex = cross_connects_to_duplex(table, ports[d])
        for a, b in duplex.circuits:
            xc = CrossConnect(d, a, b)
            if xc in kept.get(d, set()):
                continue
            ends = sorted(topology.port_owner.get(PortRef(d, p), f"{d}:{p}") for p in (a, b))
            circuits.append(Circuit(dev.tier, dev.pod if dev.tier == "agg" else None, ends[0], ends[-1], xc))
        halves += [f"{d}: {i}->{e} (one direction only)" for i, e in duplex.half_circuits]
    plan = CircuitPlan(topology.name, "adopted", "adopted", topology.spec.link_bps, circuits_from(circuits),
                       notes=("circuits found on the devices and adopted at start-up (--adopt)",))
    return plan, halves


def attribute_circuits(topology: Topology, circuits: list[Circuit], placements: Mapping[str, Any],
                       known: Mapping[str, set[CrossConnect]]) -> dict[str | None, list[Circuit]]:
    """Sort adopted circuits by the job they belong to (key None: no job can be named).

    A circuit belongs to a job when a plan the journal holds for that job (``known``: every
    cross-connect of its journalled plans) has it and no other job's does; otherwise when its ports
    name one job: a ToR uplink belongs to the job owning the ToR (ToRs are exclusive), a boundary fibre
    to the jobs with GPUs in its PoD, and the circuit to the one job every end allows. So after a
    restored backup, the circuits jobs made since the backup go back to those jobs, and only circuits
    no job can explain (patched by hand, or on ToRs nobody owns) stay reserved under
    :data:`ADOPTED_SCOPE`, for an operator to release (``POST /v1/adopted/release``).

    ``placements`` maps job id -> :class:`agents.service.jobs.Placement`. O(C x J) for C circuits, J jobs.
    """
    owner_of_tor = {tor: j for j, p in placements.items() for tor in p.tors}
    out: dict[str | None, list[Circuit]] = {}
    for c in circuits:
        by_history = [j for j, xcs in known.items() if c.xc in xcs]
        if len(by_history) == 1:
            out.setdefault(by_history[0], []).append(c)
            continue
        candidates: set[str] | None = None
        for ref in c.xc.ports():
            fibre = topology.fibre_by_agg.get(ref) or topology.fibre_by_core.get(ref)
            if fibre is not None:
                allowed = {j for j, p in placements.items() if fibre.pod in p.pods}
            else:
                owner = owner_of_tor.get(topology.port_owner.get(ref, ""))
                allowed = {owner} if owner is not None else set()
            candidates = allowed if candidates is None else candidates & allowed
        named = sorted(candidates or ())
        out.setdefault(named[0] if len(named) == 1 else None, []).append(c)
    return out
