"""Training layouts of the Table 3 models (OrchestrRL Appendix C), data parallelism scaled to the GPUs.

* Qwen2.5-72B: TP8 PP2 CP3 (Appendix C), so the GPU count must be a multiple of 48.
* Qwen2-57B-A14B: TP4 EP16 (Appendix C); experts keep Megatron's default expert TP = TP.
* Qwen3-235B-A22B: the paper does not say. TP4 EP16 PP2 (expert TP = TP, Megatron's default), no
  activation recomputation; GPUs in multiples of 128 (expert TP x EP x PP). This is the layout of
  ``examples/sim/fig17-qwen235b-2048.yaml`` (Figures 17 and 22) -- one choice, documented once.
  Why not NVIDIA NeMo RL's GRPO recipe for this model
  (``examples/configs/recipes/llm/performance/grpo-qwen3-235b-16n8g.yaml``: TP2 CP2 PP8 EP16,
  expert TP1, recomputation): it is sized for 16 nodes, where weights, gradients and Adam state
  (~16 bytes per parameter, 3.8 TB) must fit 128 GPUs; the paper trains on 1,024, where the
  distributed optimizer shards that state 8x thinner, so neither deep pipelining nor recomputation
  is needed, and TP4 x EP16 keeps each expert group (64 GPUs) inside one PoD.
* Qwen2.5-14B: TP8 PP2, the testbed layout of §2; Qwen2.5-32B: the same (the paper gives none).
"""

from __future__ import annotations

import math

from orchestrl.fabric.errors import ConfigError
from orchestrl.fabric.layout import ParallelLayout

__all__ = ["APPENDIX_C", "train_layout"]

#: Model parallel sizes per model; data parallelism fills the GPUs.
APPENDIX_C: dict[str, dict[str, int]] = {
    "Qwen2.5-14B": {"tp": 8, "pp": 2},
    "Qwen2.5-32B": {"tp": 8, "pp": 2},
    "Qwen2.5-72B": {"tp": 8, "pp": 2, "cp": 3},
    "Qwen2-57B-A14B": {"tp": 4, "ep": 16},
    "Qwen3-235B-A22B": {"tp": 4, "ep": 16, "pp": 2},
}


def train_layout(model: str, gpus: int) -> ParallelLayout:
    """Return the training layout of ``model`` on ``gpus`` GPUs (data parallelism scaled).

    Raises
    ------
    ConfigError
        For a model without a layout, or a GPU count the model-parallel sizes do not divide.

    Examples
    --------
    >>> train_layout("Qwen2.5-72B", 96)
    ParallelLayout(tp=8, cp=3, ep=1, dp=2, pp=2, order='tp-cp-ep-dp-pp', expert_tp=None)
    >>> train_layout("Qwen3-235B-A22B", 1024).dp
    128
    """
    if model not in APPENDIX_C:
        raise ConfigError("train_layout", "model", f"no training layout for {model!r}", ", ".join(APPENDIX_C))
    sizes = dict(APPENDIX_C[model])
    unit = sizes.get("tp", 1) * sizes.get("cp", 1) * sizes.get("pp", 1)
    expert_unit = sizes.get("expert_tp", sizes.get("tp", 1)) * sizes.get("ep", 1) * sizes.get("pp", 1)
    step = math.lcm(unit, expert_unit)
    if gpus < step or gpus % step:
        raise ConfigError("train_layout", "gpus", f"{gpus} GPUs do not fit {model}'s layout {sizes}",
                          f"a multiple of {step} (model-parallel group sizes)")
    return ParallelLayout(dp=gpus // unit, **sizes)

