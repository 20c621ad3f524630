"""GPU profiler of JigsawRL's slowdown grid: sub-stages of a small transformer alone and in pairs.

Run it where ``torch.cuda.is_available()``; anywhere else it says so and exits 0. It needs PyTorch
with CUDA and, for SM partitions, NVIDIA's ``cuda-python`` driver bindings (``cuda.bindings``), which
create CUDA green contexts the way FlashInfer's ``green_ctx.split_device_green_ctx`` does: the SMs are
split with ``cuDevSmResourceSplitByCount`` into a group of the requested size and the rest, a green
context is made on each, and PyTorch launches on a stream of each (``torch.cuda.get_stream_from_external``).
Two sub-stages then run at once on disjoint SMs and share only memory bandwidth and L2, as JigsawRL
§4.2 intends. Without the bindings it falls back to two unpartitioned streams and says so in the file.

Sub-stages (two decoder layers of a Llama-3-8B shape, bf16, random weights):

* ``train``: forward and backward of a micro-batch of 1,024-token sequences (compute-bound);
* ``prefill``: forward of one 4,096-token sequence (compute-bound);
* ``decode_large``: one decode step of 256 sequences at 2,048 tokens of context (memory-bound);
* ``decode_small``: one decode step of 8 sequences at 2,048 tokens (memory-bound, few CTAs).

Decode steps replay CUDA graphs (captured once on an ordinary stream) so launch overhead stays out.

The grid (``--out DIR/slowdown_grid_measured.json``) holds, for every point, the sub-stage ``a``,
its co-runner ``b`` (null when alone), ``sm_a_pct`` (its share of SMs, as created), ``mem_a_pct``,
the time per iteration alone on the whole GPU, the time measured, and ``slowdown`` = measured /
alone-whole-GPU (per token for the memory points). ``source`` names the GPU and the date.

Memory levels: JigsawRL's Mem_A limits what a sub-stage can hold. Here it scales the decode batch
(KV pool) and the training micro-batch linearly from their 80% value; the slowdown is the time per
token (per sequence) relative to the 80% point, measured on the whole GPU.

Budget: about 1-2 minutes on one H100 (the issue allows 5).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

HIDDEN, Q_HEADS, KV_HEADS, HEAD_DIM, FFN, LAYERS = 4096, 32, 8, 128, 14336, 2
KINDS = ("train", "prefill", "decode_large", "decode_small")
SM_PCTS = (25, 50, 75)
MEM_PCTS = (20, 40, 60, 80)
TRAIN_SEQ, TRAIN_MB80 = 1024, 4
PREFILL_TOKENS = 4096
DECODE_CTX, DECODE_LARGE_B80, DECODE_SMALL_B = 2048, 256, 8


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="out/gpu_slowdown", help="folder for the grid file (default %(default)s)")
    p.add_argument("--window-s", type=float, default=0.25, help="GPU time per measurement (default %(default)s s)")
    p.add_argument("--quick", action="store_true", help="the 50%% split only, for a smoke run")
    p.add_argument("--decode", choices=("stream-graph", "eager", "graph"), default="stream-graph",
                   help="decode steps as CUDA graphs captured on the stream that replays them (default), launched "
                        "eagerly (CPU-bound for small batches), or graphs captured on an ordinary stream and replayed "
                        "on the green-context streams (on an H100 with torch 2.11 those ignored the SM split)")
    return p.parse_args(argv)


class _Stack:
    """Two decoder layers with random weights; forward for prefill/train, graph-captured decode steps."""

    def __init__(self, torch):
        self.torch = torch
        dt = torch.bfloat16
        mk = lambda *s: (torch.randn(*s, device="cuda", dtype=dt) * 0.02).requires_grad_(True)  # noqa: E731
        self.layers = [dict(qkv=mk((Q_HEADS + 2 * KV_HEADS) * HEAD_DIM, HIDDEN), o=mk(HIDDEN, Q_HEADS * HEAD_DIM),
                            up=mk(2 * FFN, HIDDEN), down=mk(HIDDEN, FFN)) for _ in range(LAYERS)]
        self.eager = {}  # graph replay -> the same step launched eagerly

    def _attn_block(self, w, x, kv=None):
        F = self.torch.nn.functional
        b, t, _ = x.shape
        h = F.rms_norm(x, (HIDDEN,))
        q, k, v = F.linear(h, w["qkv"]).split([Q_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM, KV_HEADS * HEAD_DIM], -1)
        q = q.view(b, t, Q_HEADS, HEAD_DIM).transpose(1, 2)
        k = k.view(b, t, KV_HEADS, HEAD_DIM).transpose(1, 2)
        v = v.view(b, t, KV_HEADS, HEAD_DIM).transpose(1, 2)
        if kv is None:
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            kc, vc = kv
            kc[:, :, -1:] = k
            vc[:, :, -1:] = v
            a = F.scaled_dot_product_attention(q, kc, vc, enable_gqa=True)
        x = x + F.linear(a.transpose(1, 2).reshape(b, t, -1), w["o"])
        g, u = F.linear(F.rms_norm(x, (HIDDEN,)), w["up"]).chunk(2, -1)
        return x + F.linear(F.silu(g) * u, w["down"])

    def forward(self, x, kvs=None):
        for i, w in enumerate(self.layers):
            x = self._attn_block(w, x, None if kvs is None else kvs[i])
        return x

    def train_step(self, mb: int):
        x = self.torch.randn(mb, TRAIN_SEQ, HIDDEN, device="cuda", dtype=self.torch.bfloat16)
        return lambda: self.forward(x).float().square().mean().backward()

    def prefill(self):
        x = self.torch.randn(1, PREFILL_TOKENS, HIDDEN, device="cuda", dtype=self.torch.bfloat16)

        def run():
            with self.torch.no_grad():
                self.forward(x)
        return run

    def decode_graph(self, batch: int, stream=None):
        torch = self.torch
        x = torch.randn(batch, 1, HIDDEN, device="cuda", dtype=torch.bfloat16)
        kvs = [(torch.randn(batch, KV_HEADS, DECODE_CTX, HEAD_DIM, device="cuda", dtype=torch.bfloat16),
                torch.randn(batch, KV_HEADS, DECODE_CTX, HEAD_DIM, device="cuda", dtype=torch.bfloat16))
               for _ in range(LAYERS)]
        s = stream if stream is not None else torch.cuda.Stream()
        with torch.no_grad(), torch.cuda.stream(s):
            for _ in range(2):
                self.forward(x, kvs)
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.no_grad(), torch.cuda.graph(g, stream=s):
            self.forward(x, kvs)
        self._keep = getattr(self, "_keep", []) + [(x, kvs, g)]

        def eager():  # for a stream a graph cannot be replayed on
            with torch.no_grad():
                self.forward(x, kvs)
        self.eager[g.replay] = eager
        return g.replay


def _green_streams(torch, sm_count: int, log: list):
    """[(stream of `sm_count` SMs, its SMs), (stream of the rest, their SMs)] via CUDA green contexts, or None."""
    try:
        from cuda.bindings import driver
    except ImportError as exc:
        log.append(f"cuda.bindings unavailable ({exc}); no SM partition")
        return None

    def ok(res):
        if int(res[0]) != 0:
            raise RuntimeError(f"CUDA driver error {res[0]}")
        return res[1:] if len(res) > 2 else (res[1] if len(res) == 2 else None)

    try:
        dev = ok(driver.cuDeviceGet(torch.cuda.current_device()))
        whole = ok(driver.cuDeviceGetDevResource(dev, driver.CUdevResourceType.CU_DEV_RESOURCE_TYPE_SM))
        groups, _, rest = ok(driver.cuDevSmResourceSplitByCount(1, whole, 0, sm_count))
        out = []
        for res in (groups[0], rest):
            desc = ok(driver.cuDevResourceGenerateDesc([res], 1))
            ctx = ok(driver.cuGreenCtxCreate(desc, dev, driver.CUgreenCtxCreate_flags.CU_GREEN_CTX_DEFAULT_STREAM))
            stream = ok(driver.cuGreenCtxStreamCreate(ctx, driver.CUstream_flags.CU_STREAM_NON_BLOCKING, 0))
            wrap = getattr(torch.cuda, "get_stream_from_external", None) or torch.cuda.ExternalStream
            out.append((wrap(int(stream)), int(res.sm.smCount)))
        return out
    except Exception as exc:  # report and fall back: the grid says which mechanism produced it
        log.append(f"green contexts failed for {sm_count} SMs: {type(exc).__name__}: {exc}")
        return None


def _run_together(torch, jobs, window_s: float) -> list[float]:
    """Per-iteration ms of each (fn, stream, alone_ms) job while all run at once (only iterations that end
    before the first job runs out count, so no job is timed running alone)."""
    start = torch.cuda.Event(enable_timing=True)
    gate = torch.cuda.current_stream()
    torch.cuda._sleep(int(60e6))  # ~30 ms: the CPU queues everything before the GPU starts
    start.record(gate)
    ends = [[] for _ in jobs]
    queued = [0.0] * len(jobs)
    for _, stream, _ in jobs:
        stream.wait_event(start)
    while min(queued) < window_s * 1e3:
        i = min(range(len(jobs)), key=lambda j: queued[j])
        fn, stream, alone_ms = jobs[i]
        with torch.cuda.stream(stream):
            fn()
            ev = torch.cuda.Event(enable_timing=True)
            ev.record(stream)
        ends[i].append(ev)
        queued[i] += alone_ms
    torch.cuda.synchronize()
    times = [[start.elapsed_time(e) for e in es] for es in ends]
    horizon = min(ts[-1] for ts in times)
    out = []
    for ts in times:
        inside = [t for t in ts if t <= horizon + 1e-6]
        out.append(inside[-1] / len(inside))
    return out


def _alone_ms(torch, fn, stream, reps: int = 5) -> float:
    with torch.cuda.stream(stream):
        for _ in range(2):
            fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(stream):
            s.record(stream)
            fn()
            e.record(stream)
        torch.cuda.synchronize()
        times.append(s.elapsed_time(e))
    return statistics.median(times)


def main(argv=None) -> int:
    args = _parse(argv)
    try:
        import torch
    except ImportError:
        print("gpu_slowdown_profile: skipped, PyTorch is not installed here")
        return 0
    if not torch.cuda.is_available():
        print("gpu_slowdown_profile: skipped, no CUDA GPU here (torch.cuda.is_available() is False); "
              "run it on a GPU machine: python bench/gpu_slowdown_profile.py --out DIR")
        return 0
    os.makedirs(args.out, exist_ok=True)
    t0 = time.perf_counter()
    props = torch.cuda.get_device_properties(0)
    n_sm = props.multi_processor_count
    source = f"measured: {props.name}, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}, bench/gpu_slowdown_profile.py"
    log: list[str] = []
    torch.manual_seed(0)
    stack = _Stack(torch)
    whole = torch.cuda.Stream()
    fns = {"train": stack.train_step(TRAIN_MB80), "prefill": stack.prefill(),
           "decode_large": stack.decode_graph(DECODE_LARGE_B80), "decode_small": stack.decode_graph(DECODE_SMALL_B)}
    decode = (lambda f: stack.eager[f]) if args.decode == "eager" else (lambda f: f)
    fns = {k: (decode(f) if k.startswith("decode") else f) for k, f in fns.items()}
    base = {k: _alone_ms(torch, f, whole) for k, f in fns.items()}
    print(f"gpu_slowdown_profile on {props.name} ({n_sm} SMs); alone on the whole GPU: "
          + ", ".join(f"{k} {v:.2f} ms" for k, v in base.items()), flush=True)
    points = [dict(a=k, b=None, sm_a_pct=100, sm_a=n_sm, mem_a_pct=80, alone_ms=base[k], measured_ms=base[k],
                   slowdown=1.0, source=source) for k in KINDS]

    # memory levels, whole GPU: time per sequence relative to the 80% point
    for kind, make, full in (("train", stack.train_step, TRAIN_MB80),
                             ("decode_large", lambda n: decode(stack.decode_graph(n)), DECODE_LARGE_B80)):
        for mem in MEM_PCTS[:-1]:
            n = max(1, round(full * mem / 80))
            ms = _alone_ms(torch, make(n), whole)
            per = (ms / n) / (base[kind] / full)
            points.append(dict(a=kind, b=None, sm_a_pct=100, sm_a=n_sm, mem_a_pct=mem, alone_ms=base[kind],
                               measured_ms=ms, units=n, slowdown=per, source=source))
    print(f"  memory points done ({time.perf_counter() - t0:.0f} s)", flush=True)

    partition = "green-context"
    path = os.path.join(args.out, "slowdown_grid_measured.json")


    def save():
        doc = {"format": "orchestrl slowdown grid v1", "gpu": props.name, "sm_count": n_sm, "torch": torch.__version__,
               "host": platform.node(), "partition": partition, "decode_launch": args.decode, "log": log,
               "workloads": {"layers": LAYERS, "hidden": HIDDEN, "ffn": FFN, "train_seq": TRAIN_SEQ,
                             "train_microbatch_at_80": TRAIN_MB80, "prefill_tokens": PREFILL_TOKENS,
                             "decode_context": DECODE_CTX, "decode_large_batch_at_80": DECODE_LARGE_B80,
                             "decode_small_batch": DECODE_SMALL_B},
               "wall_s": time.perf_counter() - t0, "points": points}
        with open(path, "w") as f:  # after every split, so a run cut short still leaves its points
            json.dump(doc, f, indent=1)

    save()
    for pct in ((50,) if args.quick else SM_PCTS):
        want = max(8, int(n_sm * pct / 100) // 8 * 8)
        streams = _green_streams(torch, want, log)
        if streams is None:
            partition = "none (two unpartitioned streams)"
            streams = [(torch.cuda.Stream(), n_sm), (torch.cuda.Stream(), n_sm)]
        (sa, na), (sb, nb) = streams
        run_a, run_b = dict(fns), dict(fns)
        if args.decode == "stream-graph":  # graphs captured on the green streams themselves
            try:
                for run, st in ((run_a, sa), (run_b, sb)):
                    run["decode_large"] = stack.decode_graph(DECODE_LARGE_B80, st)
                    run["decode_small"] = stack.decode_graph(DECODE_SMALL_B, st)
            except Exception as exc:  # noqa: BLE001 -- recorded; decode then launches eagerly on these streams
                log.append(f"graph capture on a green stream failed ({type(exc).__name__}: {exc}); decode eager")
                run_a = run_b = {k: stack.eager.get(f, f) for k, f in fns.items()}
        try:
            for kind in KINDS:  # alone on the partition
                ms = _alone_ms(torch, run_a[kind], sa)
                points.append(dict(a=kind, b=None, sm_a_pct=round(100 * na / n_sm), sm_a=na, mem_a_pct=80,
                                   alone_ms=base[kind], measured_ms=ms, slowdown=ms / base[kind], source=source))
            for ka in KINDS:  # pairs: a on the partition, b on the rest
                for kb in KINDS:
                    ta, tb = _run_together(torch, [(run_a[ka], sa, base[ka]), (run_b[kb], sb, base[kb])],
                                           args.window_s)
                    points.append(dict(a=ka, b=kb, sm_a_pct=round(100 * na / n_sm), sm_a=na, sm_b=nb, mem_a_pct=80,
                                       alone_ms=base[ka], measured_ms=ta, slowdown=ta / base[ka], b_measured_ms=tb,
                                       b_slowdown=tb / base[kb], source=source))
        except Exception as exc:  # noqa: BLE001 -- keep what was measured, say what failed
            log.append(f"split {na}/{nb} SMs failed: {type(exc).__name__}: {exc}")
        save()
        print(f"  split {na}/{nb} SMs done ({time.perf_counter() - t0:.0f} s)", flush=True)

    print(f"wrote {path}: {len(points)} points, partition {partition}, {time.perf_counter() - t0:.0f} s")
    for p in points:
        if p["b"] is not None or p["sm_a_pct"] < 100:
            print(f"  {p['a']:12s} sm {p['sm_a_pct']:3d}% with {str(p['b']):12s}: {p['slowdown']:.2f}x")
    for line in log:
        print("  note:", line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
