"""JigsawRL §5.4, Figure 19: average MFU of veRL, JigsawRL-MuxServe and JigsawRL (Qwen3-4B GSM8K, 4 H100s).

Paper: JigsawRL's MFU 1.7x veRL's and 1.5x MuxServe's. MFU here: model FLOPs of the work done
(2N a rollout or reference token, 6N a training token) over the GPUs' bf16 peak and the run's length.

Run ``python -m orchestrl.sim.experiments.jigsaw_fig19 [--quick] [--json] [--workers N] [--out DIR]``.
"""

from __future__ import annotations

import sys

from orchestrl.sim.experiments.common import Row
from orchestrl.sim.experiments.jigsaw_common import Case, figure, grid_rows, tp_search

PAPER = {"jigsaw/verl": 1.7, "jigsaw/muxserve": 1.5}


def cases(is_quick: bool = False) -> list[Case]:
    return [Case("fig19", "Qwen3-4B/gsm8k/4gpu", "H100", 4, (("Qwen3-4B", "gsm8k", 1, 1.0),) * 2,
                 1 if is_quick else 3, ("verl", "muxserve", "jigsaw"), tps=tp_search(1, 4), sensitivity=True)]


def rows_of(results: list[dict]) -> list[Row]:
    r = results[0]
    return [Row("mfu/verl", None, r["verl_mfu"]), Row("mfu/verl-serial", None, r["verl_serial_mfu"]),
            Row("mfu/muxserve", None, r["muxserve_mfu"]), Row("mfu/jigsaw", None, r["jigsaw_mfu"]),
            Row("jigsaw/verl", PAPER["jigsaw/verl"], r["jigsaw_mfu"] / r["verl_mfu"]),
            Row("jigsaw/verl-serial", PAPER["jigsaw/verl"], r["jigsaw_mfu"] / r["verl_serial_mfu"]),
            Row("jigsaw/muxserve", PAPER["jigsaw/muxserve"], r["jigsaw_mfu"] / r["muxserve_mfu"])] + \
        grid_rows(results, "jigsaw/verl", lambda rs, t: rs[0][f"jigsaw_{t}_mfu"] / rs[0]["verl_mfu"])


NOTES = ("every system at its own rollout TP degree, searched (tp, 2 tp, 4 tp within a node): each baseline at whichever ran fastest, JigsawRL at the degree and layout its profile picks",
         "veRL: its better configuration (the pipelines in turn on the 4 GPUs, or 2 GPUs each), as every JigsawRL "
         "ratio here; verl-serial: the pipelines in turn, the paper's veRL (its 1.7x is against that)",
         "grid rows: JigsawRL's MFU with every slowdown's excess x0.75 / x1.25, on the modelled grid and with sharing "
         "free (x0), over veRL's")
FIGURE = figure("jigsaw-fig19", "JigsawRL Figure 19: average MFU", "MFU ratio", NOTES, cases, rows_of)
sweep, run, main = FIGURE.sweep, FIGURE.run, FIGURE.main

if __name__ == "__main__":
    sys.exit(main())
