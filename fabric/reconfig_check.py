"""Check a non-blocking reconfiguration order (§5.4) by replaying it: the verifier of :mod:`fabric.reconfig_order`."""

from __future__ import annotations

from collections import Counter
from typing import Collection, Iterable

from orchestrl.fabric.reconfig_order import LinkCircuit, Pair, ReconfigStep, _checked

__all__ = ["check_connectivity_preserved"]


def check_connectivity_preserved(old: Iterable[LinkCircuit], new: Iterable[LinkCircuit],
                                 steps: Iterable[ReconfigStep], allowed_outages: Collection[Pair] = ()) -> list[str]:
    """Replay ``steps`` from ``old``; return every violation in words (empty list: the order is sound).

    Checked: adds use free ports and removes existing circuits; after every step (one kind of
    operation each, so this covers its partial application too) every pair both ``old`` and ``new``
    connect, bar ``allowed_outages``, has a circuit; the final state equals ``new``.

    Notes
    -----
    O(S + C) for S steps and C circuits moved.

    Examples
    --------
    >>> old, new = [LinkCircuit("d", 1, 2, "x", "y")], [LinkCircuit("d", 1, 3, "x", "y")]
    >>> check_connectivity_preserved(old, new, [ReconfigStep("add", tuple(new))])[0]
    'step 0: add d:1<->3 (x-y): port d:1 is still held by d:1<->2 (x-y)'
    >>> check_connectivity_preserved(old, new, [ReconfigStep("remove", tuple(old)), ReconfigStep("add", tuple(new))])
    ['after step 0: x-y has no circuit although both plans connect it (restored in step 1)']
    """
    old_set, new_set = _checked(old, "old"), _checked(new, "new")
    protected = {c.pair for c in old_set} & {c.pair for c in new_set}
    allowed = {tuple(sorted(p)) for p in allowed_outages}
    state = set(old_set)
    used = {p: c for c in state for p in c.ports()}
    up = Counter(c.pair for c in state)
    problems: list[str] = []
    down: dict[Pair, int] = {}
    for i, step in enumerate(steps):
        if step.action not in ("add", "remove"):
            problems.append(f"step {i}: action {step.action!r} is neither 'add' nor 'remove'")
            continue
        for c in step.circuits:
            if step.action == "add":
                clash = next((p for p in c.ports() if p in used), None)
                if clash is not None:
                    problems.append(f"step {i}: add {c}: port {clash.device}:{clash.port} is still held by "
                                    f"{used[clash]}")
                    continue
                state.add(c)
                used.update((p, c) for p in c.ports())
                up[c.pair] += 1
                if c.pair in down:
                    problems.append(f"after step {down.pop(c.pair)}: {c.pair[0]}-{c.pair[1]} has no circuit although "
                                    f"both plans connect it (restored in step {i})")
            elif c not in state:
                problems.append(f"step {i}: remove {c}: no such circuit is up")
            else:
                state.remove(c)
                for p in c.ports():
                    del used[p]
                up[c.pair] -= 1
                if up[c.pair] == 0 and c.pair in protected and c.pair not in allowed:
                    down[c.pair] = i
    problems += [f"after step {i}: {a}-{b} has no circuit although both plans connect it (never restored)"
                 for (a, b), i in sorted(down.items())]
    if state != new_set:
        missing, extra = sorted(new_set - state), sorted(state - new_set)
        problems.append(f"final state differs from the new plan: missing {', '.join(map(str, missing)) or '-'}; "
                        f"extra {', '.join(map(str, extra)) or '-'}")
    return problems
