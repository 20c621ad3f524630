"""The planning core imports no storage, no device layer and no sockets of its own.

The simulator reuses :mod:`fabric`'s planning modules as they are; the journal (SQLite), commits
and reconciliation live in :mod:`fabric.runtime` and the device drivers in :mod:`fabric.ocs`. Both
checks run in a fresh interpreter, so what an earlier test imported cannot hide an import.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PLANNING_CORE = tuple(f"orchestrl.fabric.{m}" for m in (
    "topology", "intent", "traffic", "allocator", "plan", "controller", "safe_window", "reconfig_order", "cost",
    "templates"))
# Modules of the effectful runtime (ours) and the stdlib modules that open files as databases or sockets.
EFFECTFUL_OURS = ("orchestrl.fabric.runtime", "orchestrl.fabric.ocs", "orchestrl.agents")
EFFECTFUL_STDLIB = ("sqlite3", "socket", "ssl", "http", "urllib.request", "asyncio", "selectors", "socketserver")


def _project_closure() -> dict[str, set[str]]:
    """Planning-core module -> every module (project and stdlib) its project-internal import closure names."""
    def path_of(mod: str) -> Path:  # orchestrl.fabric.x lives in the folder fabric/ at the root
        rel = mod.removeprefix("orchestrl.").replace(".", "/")
        p = REPO / (rel + ".py")
        return p if p.exists() else REPO / rel / "__init__.py"

    def imports(mod: str) -> set[str]:
        out = set()
        for node in ast.walk(ast.parse(path_of(mod).read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                out |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                out.add(node.module)
                out |= {f"{node.module}.{a.name}" for a in node.names if path_of(f"{node.module}.{a.name}").exists()}
        return out

    closure = {}
    for root in PLANNING_CORE:
        seen, todo = set(), [root]
        while todo:
            mod = todo.pop()
            if mod in seen:
                continue
            seen.add(mod)
            if mod.startswith("orchestrl.fabric.") and path_of(mod).exists():
                todo += sorted(imports(mod))
        closure[root] = seen
    return closure


def test_planning_core_names_no_runtime_device_or_socket_module():
    for root, names in _project_closure().items():
        bad = sorted(n for n in names if any(n == e or n.startswith(e + ".") for e in EFFECTFUL_OURS + EFFECTFUL_STDLIB))
        assert not bad, f"{root} imports (directly or through fabric modules) {bad}; move that code to fabric.runtime"


def test_importing_the_planning_core_loads_no_sqlite_and_no_runtime():
    code = ("import importlib, json, sys\n"
            f"for m in {list(PLANNING_CORE)!r}: importlib.import_module(m)\n"
            "print(json.dumps(sorted(sys.modules)))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    loaded = json.loads(out.stdout)
    # networkx itself pulls in the socket module through the stdlib (email -> ...) without opening one, so the
    # process-level check is for storage and our own effectful packages; the AST check above covers sockets.
    bad = [m for m in loaded if m == "sqlite3" or any(m == e or m.startswith(e + ".") for e in EFFECTFUL_OURS)]
    assert not bad, f"importing the planning core loaded {bad}"


def test_every_module_at_fabrics_top_level_is_effect_free():
    """Effects live in subpackages (runtime/, ocs/): a module next to the planning core imports no storage or sockets."""
    offenders = {}
    for path in sorted((REPO / "fabric").glob("*.py")):
        names = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                names |= {a.name for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
        bad = sorted(n for n in names if any(n == e or n.startswith(e + ".") for e in EFFECTFUL_OURS + EFFECTFUL_STDLIB))
        if bad:
            offenders[path.name] = bad
    assert not offenders, f"fabric/ modules with effects (move them to fabric/runtime/): {offenders}"
