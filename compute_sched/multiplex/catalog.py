"""Which slowdown grid a GPU gets by default: the measured one where a GPU has measured it, else the model.

The measured grid (``compute_sched/data/slowdown/h100-green-context-2026-11-27.json``) was profiled on
one H100 with CUDA green contexts; the H800 is the same chip (132 SMs, HBM3 at 3.35 TB/s) with its
NVLink cut, which the single-GPU grid never touches, so it answers for both. Every other GPU type
(A100, H20) gets the modelled grid (:func:`~compute_sched.multiplex.interference.modelled_grid`) for
its own roofline. docs/jigsaw.md gives the comparison behind this choice.
"""

from __future__ import annotations

from functools import lru_cache

from orchestrl.compute_sched.hardware import load_gpu
from orchestrl.compute_sched.multiplex.grid import DATA_DIR, SlowdownGrid, SlowdownModel, load_grid
from orchestrl.compute_sched.multiplex.interference import modelled_grid
from orchestrl.fabric.errors import ConfigError

__all__ = ["MEASURED", "GRID_CHOICES", "grid_for", "model_for"]

#: GPU type -> measured grid file (under compute_sched/data/slowdown/).
MEASURED = {"H100": "h100-green-context-2026-11-27.json", "H800": "h100-green-context-2026-11-27.json"}
GRID_CHOICES = ("default", "measured", "modelled")


def grid_for(gpu: str, model: str = "Qwen3-4B", choice: str = "default", tp: int = 1) -> SlowdownGrid:
    """Return the grid for ``gpu``: ``measured`` (where one exists), ``modelled``, or ``default`` (measured if any).

    >>> grid_for("H100").name, grid_for("A100").name
    ('h100-green-context-2026-11-27', 'modelled-qwen3-4b-a100')
    """
    if choice not in GRID_CHOICES:
        raise ConfigError("slowdown grid", "choice", f"{choice!r}", ", ".join(GRID_CHOICES))
    return _grid_for(_gpu_name(gpu), model, choice, tp)


@lru_cache(maxsize=None)
def _gpu_name(gpu: str) -> str:
    """The bundled GPU's name whatever the spelling (``"h100"`` -> ``"H100"``), as :func:`load_gpu` accepts it."""
    return load_gpu(gpu).name


@lru_cache(maxsize=None)
def _grid_for(gpu: str, model: str, choice: str, tp: int) -> SlowdownGrid:
    if choice == "measured" or (choice == "default" and gpu in MEASURED):
        if gpu not in MEASURED:
            raise ConfigError("slowdown grid", "choice", f"no measured grid for {gpu}",
                              f"'modelled', or a GPU with a measured grid: {', '.join(sorted(MEASURED))}")
        return load_grid(DATA_DIR / MEASURED[gpu])
    return modelled_grid(model, gpu, tp)


def model_for(gpu: str, model: str = "Qwen3-4B", choice: str = "default", scale: float = 1.0,
              tp: int = 1) -> SlowdownModel:
    """Return the interpolated slowdown model of :func:`grid_for`, its excess scaled by ``scale``."""
    return SlowdownModel(grid_for(gpu, model, choice, tp), scale)
