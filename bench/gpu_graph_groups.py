"""GPU check of JigsawRL's per-step SM budget: a step replayed from graphs captured per green context.

For a compute-bound step (a chain of 4096 x 4096 bf16 GEMMs, like training or prefill) and a
memory-bound one (a batch-8 GEMV chain over 1 GiB of weights, like small-batch decode), it captures
:class:`~compute_sched.multiplex.graph_groups.SmBudgetGraphs` at 25/50/75/100% of the SMs and times
each replay against the whole GPU measured in the same run. The budget binds if the compute-bound
step slows roughly as the SM share shrinks and the memory-bound one much less (the paper's Fig. 7).
Without a GPU (or NVIDIA's ``cuda.bindings``) it says why and exits 0. Under a minute on an H100.

Usage: ``python bench/gpu_graph_groups.py [--quick] [--json] [--out DIR]``
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _time_ms(torch, fn, reps: int) -> float:
    fn()
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(reps):
        s = fn()
    (s or torch.cuda.current_stream()).synchronize()
    torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - t0) / reps


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="fewer repetitions")
    ap.add_argument("--json", action="store_true", help="also print one JSON document")
    ap.add_argument("--out", default="", help="write graph_groups.json into this folder")
    args = ap.parse_args(argv)
    from orchestrl.compute_sched.multiplex.graph_groups import SmBudgetGraphs
    from orchestrl.fabric.errors import ConfigError
    try:
        import torch
    except ImportError:
        print("skipped: PyTorch is not installed")
        return 0
    if not torch.cuda.is_available():
        print("skipped: no CUDA GPU here (the check needs one)")
        return 0
    dev = torch.device("cuda")
    a = torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16)
    ws = [torch.randn(4096, 4096, device=dev, dtype=torch.bfloat16) for _ in range(4)]
    out_c = torch.empty_like(a)

    def compute_step():
        x = a
        for w in ws:
            x = torch.mm(x, w)
        out_c.copy_(x)

    big = [torch.randn(8192, 8192, device=dev, dtype=torch.bfloat16) for _ in range(8)]  # 1 GiB of weights
    v = torch.randn(8, 8192, device=dev, dtype=torch.bfloat16)
    out_m = torch.empty(8, 8192, device=dev, dtype=torch.bfloat16)

    def memory_step():
        x = v
        for w in big:
            x = torch.mm(x, w) * 1e-2
        out_m.copy_(x)

    reps = 20 if args.quick else 100
    doc = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": []}
    t0 = time.perf_counter()
    try:
        for name, step in (("compute_bound", compute_step), ("memory_bound", memory_step)):
            g = SmBudgetGraphs(step, (25, 50, 75, 100))
            whole = _time_ms(torch, lambda: g.replay(100), reps)
            for pct in (25, 50, 75, 100):
                ms = _time_ms(torch, lambda p=pct: g.replay(p), reps)
                row = {"step": name, "budget_pct": pct, "sms": g.sms[pct], "ms": ms, "vs_whole_gpu": ms / whole}
                doc["rows"].append(row)
                print(f"  {name:<14} {pct:>3}% ({g.sms[pct]:>3} SMs): {ms:7.3f} ms = {ms / whole:.2f}x the whole GPU",
                      flush=True)
    except ConfigError as exc:
        print(f"skipped: {exc}")
        return 0
    doc["wall_s"] = time.perf_counter() - t0
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "graph_groups.json"), "w") as f:
            json.dump(doc, f, indent=1)
    if args.json:
        print(json.dumps(doc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
