"""Package layout: one import name, ``orchestrl``, over the folders at the repository root.

The design keeps ``fabric/``, ``collectives/``, ``compute_sched/``, ``agents/`` and ``sim/`` at the root
so the architecture shows at a glance; setuptools maps each to ``orchestrl.<folder>`` (``package-dir``),
so a wheel installs ``orchestrl/fabric/...`` and nothing under a bare name. Everything else about the
distribution is in pyproject.toml.
"""

from setuptools import find_packages, setup

FOLDERS = ("fabric", "collectives", "compute_sched", "agents", "sim")

packages = ["orchestrl"] + [f"orchestrl.{p}" for p in find_packages(include=[f"{f}*" for f in FOLDERS])]
setup(
    packages=packages,
    package_dir={"orchestrl": "orchestrl", **{f"orchestrl.{f}": f for f in FOLDERS}},
    package_data={"": ["*.yaml", "*.json", "**/*.yaml", "**/*.json", "data/**/*"]},
)
