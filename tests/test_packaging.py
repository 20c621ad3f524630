"""One import name: everything is ``orchestrl.*``, and orchestrl installs beside Fabric and the OpenAI Agents SDK.

Fabric (the SSH automation library, import name ``fabric``) and the OpenAI Agents SDK (import name
``agents``) are common in the environments orchestrl's users already have; a package that installed
bare ``fabric`` or ``agents`` would shadow them or be shadowed.
"""

from __future__ import annotations

import ast
import os
import re
import subprocess
import sys
import venv
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
BARE = ("fabric", "collectives", "compute_sched", "agents", "sim")
SOURCES = ("fabric", "collectives", "compute_sched", "agents", "sim", "tests", "bench", "examples", "orchestrl")
_BARE_LINE = re.compile(rf"^\s*(?:>>> )?(?:from|import) ({'|'.join(BARE)})(?:\.|\s|$)", re.M)


def _bare_imports_in_python(path: Path) -> list[str]:
    out = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        elif (isinstance(node, ast.Call) and getattr(node.func, "attr", None) in ("import_module", "find_spec")
              and node.args and isinstance(node.args[0], ast.Constant) and isinstance(node.args[0].value, str)):
            names = [node.args[0].value]
        out += [f"{path.relative_to(REPO)}:{node.lineno}: {n}" for n in names if n.split(".")[0] in BARE]
        if (isinstance(node, ast.Constant) and isinstance(node.value, str) and path.name != "test_packaging.py"
                and "import " in node.value):  # code handed to a subprocess (python -c) or exec
            out += [f"{path.relative_to(REPO)}:{node.lineno}: {m.group(0).strip()} (in a string)"
                    for m in _BARE_LINE.finditer(node.value)]
    return out


def test_no_source_file_imports_a_bare_package_name():
    bad = []
    for top in SOURCES:
        for path in sorted((REPO / top).rglob("*.py")):
            bad += _bare_imports_in_python(path)
            text = path.read_text(encoding="utf-8")  # docstring examples and code shown in comments
            bad += [f"{path.relative_to(REPO)}: {m.group(0).strip()}" for m in _BARE_LINE.finditer(text)
                    if not _inside_code(text, m.start())]
    assert not bad, "imports of bare package names (write orchestrl.<package>):\n" + "\n".join(sorted(set(bad)))


def _inside_code(text: str, pos: int) -> bool:
    """True when the line at ``pos`` is real code (already checked through the AST), not docstring text."""
    line = text[text.rfind("\n", 0, pos) + 1: text.find("\n", pos)]
    return not line.lstrip().startswith(">>>") and _is_code_line(text, pos)


def _is_code_line(text: str, pos: int) -> bool:
    lineno = text.count("\n", 0, pos) + 1
    try:
        tree = ast.parse(text)
    except SyntaxError:
        return False
    return any(getattr(n, "lineno", None) == lineno for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom)))


def test_docs_and_readme_show_orchestrl_imports_only():
    bad = []
    for path in [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]:
        text = path.read_text(encoding="utf-8")
        bad += [f"{path.name}: {m.group(0).strip()}" for m in _BARE_LINE.finditer(text)]
        bad += [f"{path.name}: {m.group(0)}" for m in re.finditer(rf"python3? -m ({'|'.join(BARE)})\.\S+", text)]
    assert not bad, "docs that import bare package names:\n" + "\n".join(bad)


def test_outside_the_checkout_only_orchestrl_imports(tmp_path):
    code = ("import importlib.util, orchestrl.fabric, orchestrl.collectives, orchestrl.agents.host_agent\n"
            "print(orchestrl.fabric.__file__)\n"
            "for bare in " + repr(BARE) + ":\n"
            "    spec = importlib.util.find_spec(bare)\n"
            "    print(bare, spec.origin if spec else None)\n")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert Path(lines[0]) == REPO / "fabric" / "__init__.py"
    for line in lines[1:]:
        name, origin = line.split(" ", 1)
        # None: not importable; anything else must be an unrelated package installed in this environment
        assert origin == "None" or not Path(origin).resolve().is_relative_to(REPO), \
            f"'import {name}' resolves to this checkout ({origin}) from outside it"


def test_one_module_object_per_file_from_the_root():
    """From the checkout's root (``python -m pytest``, ``python -m orchestrl.agents.cli``) nothing is loaded twice."""
    code = ("import sys, orchestrl.sim.run, orchestrl.collectives.weight_sync, orchestrl.agents.cli\n"
            f"print([m for m in sys.modules if m.split('.')[0] in {BARE!r}])")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", f"modules loaded under a bare name: {out.stdout}"


def test_the_wheel_holds_one_top_level_name(tmp_path):
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(REPO),
                            "-w", str(tmp_path)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-2000:]
    import zipfile
    (wheel,) = tmp_path.glob("orchestrl-*.whl")
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"orchestrl"}, tops
    assert "orchestrl/fabric/topology.py" in names and "orchestrl/compute_sched/specs/models/qwen2.5-14b.yaml" in names
    top_level = [n for n in names if n.endswith("top_level.txt")]
    assert not top_level or zipfile.ZipFile(wheel).read(top_level[0]).decode().split() == ["orchestrl"]


def _index_reachable() -> str | None:
    probe = subprocess.run([sys.executable, "-m", "pip", "index", "versions", "fabric"], capture_output=True,
                           text=True, timeout=60)
    if probe.returncode != 0:
        return "the package index cannot be reached: " + (probe.stderr.strip().splitlines() or ["?"])[-1]
    return None


@pytest.mark.network
def test_installs_beside_fabric_and_openai_agents(tmp_path):
    """A fresh venv with the built wheel, Fabric and openai-agents from the index: all three import as themselves."""
    reason = _index_reachable()
    if reason:
        pytest.skip(reason)
    wheels = tmp_path / "wheels"
    build = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", str(REPO),
                            "-w", str(wheels)], capture_output=True, text=True, timeout=300)
    assert build.returncode == 0, build.stderr[-2000:]
    (wheel,) = wheels.glob("orchestrl-*.whl")
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py = env_dir / "bin" / "python"
    # a checkout on PYTHONPATH would shadow the installed packages (and make pip think orchestrl is installed)
    clean = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    for order in ([str(wheel)], ["fabric", "openai-agents"]):  # orchestrl first, then the others on top of it
        inst = subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-compile", *order], capture_output=True, text=True,
                              timeout=900, env=clean)
        assert inst.returncode == 0, inst.stderr[-3000:]
    code = ("import fabric, agents, orchestrl.fabric, orchestrl.agents.host_agent, orchestrl.collectives\n"
            "from fabric import Connection\n"       # Fabric's own API
            "from agents import Agent, Runner\n"    # the OpenAI Agents SDK's own API
            "from orchestrl.fabric.topology import Topology\n"
            "from orchestrl.agents.host_agent import HostAgent\n"
            "print(fabric.__file__); print(agents.__file__); print(orchestrl.fabric.__file__)")
    out = subprocess.run([str(py), "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=300, env=clean)
    assert out.returncode == 0, out.stderr[-3000:]
    fab, ag, ours = out.stdout.split()
    assert "site-packages/fabric/" in fab and "site-packages/agents/" in ag
    assert "site-packages/orchestrl/fabric/" in ours
