"""Circuit allocation (OrchestrRL Appendix D): the one import site for callers.

The problem and result types, the greedy (Algorithm 3) and the uniform baseline are in
:mod:`fabric.allocation`; the greedy with a local-search repair in :mod:`fabric.allocation_ls`; the
CP-SAT reference in :mod:`fabric.allocator_exact` and the JSON contract in
:mod:`fabric.allocator_json`.  Those modules import :mod:`fabric.allocation` only, so this facade
imports all four and none imports it back.
"""

from __future__ import annotations

from typing import Any

from orchestrl.fabric.allocation import (METHODS, Allocation, AllocationProblem, AllocationSolverError, allocate_greedy,
                               allocate_uniform, pair_time_s)
from orchestrl.fabric.allocation_ls import allocate_greedy_ls
from orchestrl.fabric.allocator_exact import allocate_optimal
from orchestrl.fabric.allocator_json import allocation_to_json, problem_from_json
from orchestrl.fabric.errors import ConfigError

__all__ = ["METHODS", "AllocationProblem", "Allocation", "AllocationSolverError", "pair_time_s", "allocate_greedy",
           "allocate_greedy_ls", "allocate_uniform", "allocate_optimal", "allocate", "problem_from_json",
           "allocation_to_json"]


def allocate(problem: AllocationProblem, method: str = "greedy", **kw: Any) -> Allocation:
    """Return the allocation of ``problem`` by the named method (``METHODS``).

    Parameters
    ----------
    problem : AllocationProblem
    method : {"greedy", "greedy+ls", "uniform", "optimal"}
    **kw
        Options of the method; only ``optimal`` takes one (``time_limit_s``).

    Raises
    ------
    ConfigError
        For an unknown method or an option the method does not take.

    Notes
    -----
    Dispatch only; the complexity is that of the chosen method.

    Examples
    --------
    >>> p = AllocationProblem(8e9, {"a": 1, "b": 1}, {("a", "b"): 1e9})
    >>> allocate(p, "uniform").circuits
    {('a', 'b'): 1}
    """
    funcs = {"greedy": allocate_greedy, "greedy+ls": allocate_greedy_ls, "uniform": allocate_uniform,
             "optimal": allocate_optimal}
    if method not in funcs:
        raise ConfigError("allocate", "method", f"unknown method {method!r}", ", ".join(METHODS))
    accepted = {"optimal": {"time_limit_s"}}.get(method, set())
    for name in kw:
        if name not in accepted:
            allowed = ", ".join(sorted(accepted)) or "no options"
            raise ConfigError("allocate", name, f"not an option of method {method!r}", allowed)
    return funcs[method](problem, **kw)
