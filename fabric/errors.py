"""Exceptions shared by the planning core.

Every error a user can cause names *where* (file or input), *which field*, *what was wrong* and
*what is allowed*, so the message alone is enough to fix the input.
"""

from __future__ import annotations

__all__ = ["OrchestrlError", "ConfigError", "InfeasiblePlanError", "PlanValidationError"]


class OrchestrlError(Exception):
    """Base class of every error orchestrl raises on purpose."""


class ConfigError(OrchestrlError, ValueError):
    """A configuration file or input document is malformed.

    Parameters
    ----------
    source : str
        The file path or a short name of the input (``"<stdin>"``, ``"allocate input"``).
    field : str
        Dotted path of the offending field (``"ocs_agg.devices_per_pod"``, ``"demand[3].bytes"``).
    problem : str
        What was wrong with the value.
    allowed : str, optional
        What is accepted instead; this is the fix the user needs.
    """

    def __init__(self, source: str, field: str, problem: str, allowed: str = "") -> None:
        self.source = source
        self.field = field
        self.problem = problem
        self.allowed = allowed
        msg = f"{source}: field '{field}': {problem}"
        if allowed:
            msg += f" (allowed: {allowed})"
        super().__init__(msg)


class InfeasiblePlanError(OrchestrlError):
    """A plan cannot be built under the current fabric state (ports, masks, template)."""


class PlanValidationError(OrchestrlError):
    """A circuit plan violates a hard constraint; ``violations`` lists each one in words."""

    def __init__(self, violations: list[str]) -> None:
        self.violations = list(violations)
        head = "; ".join(self.violations[:5])
        more = f" (+{len(self.violations) - 5} more)" if len(self.violations) > 5 else ""
        super().__init__(f"plan is invalid: {head}{more}")
