"""The docstring examples of the scheduler's modules run (``pytest`` collects doctests under tests/ only)."""

from __future__ import annotations

import doctest
import importlib

import pytest

MODULES = ("compute_sched.balancer", "compute_sched.calibration", "compute_sched.case_study", "compute_sched.estimate",
           "compute_sched.perf", "compute_sched.planner", "compute_sched.groups.optimal",
           "compute_sched.groups.workload")


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0 and result.failed == 0
