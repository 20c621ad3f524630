"""Every example in a docstring runs, on the module as users import it (``orchestrl.<package>...``).

pytest's ``--doctest-modules`` would import the folders at the root under their bare names
(``fabric.topology``) and so make second copies of every module; this file runs the same doctests
on the ``orchestrl.*`` modules instead, one test per module that has examples.
"""

from __future__ import annotations

import doctest
import importlib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("fabric", "collectives", "compute_sched", "agents", "sim")


def _modules_with_examples() -> list[str]:
    out = []
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            if ">>>" not in path.read_text(encoding="utf-8"):
                continue
            rel = path.relative_to(REPO).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            out.append("orchestrl." + ".".join(parts))
    return out


MODULES = _modules_with_examples()


def test_the_walk_found_the_examples():
    assert len(MODULES) > 20


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples(name):
    module = importlib.import_module(name)
    finder = doctest.DocTestFinder(exclude_empty=True)
    runner = doctest.DocTestRunner(optionflags=doctest.NORMALIZE_WHITESPACE | doctest.ELLIPSIS)
    tests = [t for t in finder.find(module, name) if t.examples]
    failures = []
    for test in tests:
        out: list[str] = []
        result = runner.run(test, out=out.append)
        if result.failed:
            failures.append("".join(out))
    assert not failures, "\n".join(failures)[-4000:]
