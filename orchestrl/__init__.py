"""orchestrl: control plane and communication library for disaggregated LLM RL on hybrid EPS/OCS fabrics.

One import name, one package per job (the folders at the repository root)::

    orchestrl.fabric         RFabric planning core, runtime (journal, commits) and OCS device layer
    orchestrl.collectives    weight sync trainers import (plan, execute, transports, framework adapters)
    orchestrl.compute_sched  generation compute scheduler, RollMux groups, agentic and multiplexing policies
    orchestrl.agents         the ``orchestrl`` command, the control proxy, host agent, phase runtime
    orchestrl.sim            RLSim, the cluster-scale simulator

How the folders become ``orchestrl.<package>``: a built wheel copies ``fabric/`` to
``orchestrl/fabric/`` and so on (``package-dir`` in ``setup.py``). In a source checkout (an editable
install, ``python -m pytest`` from the root, or ``PYTHONPATH=<checkout>``) this package's search
path also holds the checkout's root, so ``orchestrl.fabric`` is the folder ``fabric/`` there, under
that one name; the bare name ``fabric`` is never installed.
"""

from __future__ import annotations

from pathlib import Path as _Path

__version__ = "0.1.0"
__all__ = ["__version__"]

_checkout = _Path(__file__).resolve().parent.parent
if (_checkout / "pyproject.toml").is_file() and (_checkout / "fabric" / "__init__.py").is_file():
    __path__.append(str(_checkout))  # noqa: F821 -- a package's __path__; the wheel has the folders inside
