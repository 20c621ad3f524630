"""Every module imports on its own and every benchmark starts, each in a fresh interpreter.

A circular import only shows when the module that closes the circle is imported first, and a test
that imports a benchmark before running it has already paid the import in the right order; so both
checks run in new processes, the way `make bench` and a user's first ``import`` do.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("fabric", "collectives", "compute_sched", "agents", "sim")  # folders; imported as orchestrl.<folder>
BENCHES = sorted(p.name for p in (REPO / "bench").glob("*.py"))
# The slowest quick runs are split over two test files, so `make test`'s two workers (one file each) run them side
# by side: tests/test_bench_quick_runs.py takes these, this file the rest.
SECOND_FILE = ("proxy.py", "sim_rl.py", "weight_sync.py", "jigsaw.py", "forecast.py", "sim_net.py", "gpu_step_check.py")

# One interpreter for all modules, but each import starts from a sys.modules with no project module
# in it: third-party imports stay cached (fast), while the project's import order is the module's own.
_IMPORT_EACH_ALONE = """
import importlib, sys, traceback
failed = []
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m.startswith('orchestrl.')]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception:
        failed.append(name + ': ' + traceback.format_exc().strip().splitlines()[-1])
print('\\n'.join(failed))
sys.exit(1 if failed else 0)
"""


def _modules() -> list[str]:
    names = []
    for pkg in PACKAGES:
        for path in sorted((REPO / pkg).rglob("*.py")):
            rel = path.relative_to(REPO).with_suffix("")
            parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
            names.append("orchestrl." + ".".join(parts))
    return names


def _path(mod: str) -> Path:
    """The file of module ``orchestrl.<folder>...`` in the checkout."""
    rel = mod.removeprefix("orchestrl.").replace(".", "/")
    path = REPO / (rel + ".py")
    return path if path.exists() else REPO / rel / "__init__.py"


def _import_graph() -> nx.DiGraph:
    """Project module -> project modules it imports anywhere (nested, TYPE_CHECKING and importlib included)."""
    modules = set(_modules())

    def owner(name: str) -> str | None:
        while name and name not in modules:
            name = name.rpartition(".")[0]
        return name or None

    graph = nx.DiGraph()
    for mod in modules:
        path = _path(mod)
        graph.add_node(mod)
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets = [a.name for a in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                targets = [f"{node.module}.{a.name}" for a in node.names]
            elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) == "import_module" and node.args
                  and isinstance(node.args[0], ast.Constant)):
                targets = [node.args[0].value]
            else:
                continue
            for target in filter(None, map(owner, targets)):
                if target != mod and not mod.startswith(target + "."):  # a package's own __init__ is not a circle
                    graph.add_edge(mod, target)
    return graph


def test_no_import_circles_and_imports_point_down():
    graph = _import_graph()
    circles = list(nx.simple_cycles(graph))
    assert not circles, f"import circles (break them; a lazy importlib re-export is still one): {circles}"
    # ARCHITECTURE.md: fabric imports none of the others, collectives and compute_sched only fabric,
    # agents and sim anything.
    level = {"fabric": 0, "collectives": 1, "compute_sched": 1, "agents": 2, "sim": 2}
    pkg = lambda m: m.split(".")[1]  # noqa: E731 -- orchestrl.<package>.<module>
    upward = [(a, b) for a, b in graph.edges if pkg(a) != pkg(b)
              and (level[pkg(b)] > level[pkg(a)] or level[pkg(a)] == 1 == level[pkg(b)])]
    assert not upward, f"imports that point up or sideways between packages: {upward}"


def test_every_module_imports_on_its_own():
    modules = _modules()
    assert len(modules) > 50  # the walk found the packages
    proc = subprocess.run([sys.executable, "-c", _IMPORT_EACH_ALONE, *modules],
                          cwd=REPO, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, "modules that fail to import on their own:\n" + proc.stdout + proc.stderr[-2000:]


def quick_run(bench: str) -> None:
    """Run ``bench/<bench> --quick`` in a fresh interpreter; it must exit 0 and print something."""
    proc = subprocess.run([sys.executable, f"bench/{bench}", "--quick"], cwd=REPO, capture_output=True, text=True,
                          timeout=280)
    assert proc.returncode == 0, f"bench/{bench} --quick exited {proc.returncode}:\n{proc.stderr[-3000:]}"
    assert proc.stdout.strip(), f"bench/{bench} --quick printed nothing"


@pytest.mark.parametrize("bench", [b for b in BENCHES if b not in SECOND_FILE])
def test_benchmark_starts_and_finishes_quick_run(bench):
    quick_run(bench)
