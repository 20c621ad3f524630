"""GPU check of the measured step model: time one Qwen2.5-14B-shaped decoder layer on this GPU.

Run it where ``torch.cuda.is_available()``; anywhere else it says so and exits 0 (``make bench``
runs every script in bench/). It needs PyTorch with CUDA and nothing else (no vLLM, no download):
the layer is built from random bf16 weights with the shapes of Qwen2.5-14B (hidden 5120, 40 query
and 8 KV heads of 128, FFN 13824, QKV bias), and every timed region is captured once in a CUDA
graph and replayed, so launch overhead stays out of the kernels' times as in a serving engine.

What it writes (``--out DIR``), in the format of Vidur's profiling data (microsoft/vidur,
``data/profiling/compute/<gpu>/<model>/``) so the measured step model reads it like the bundled
data:

* ``mlp.csv``: per-operator medians in ms (``time_stats.<op>.median`` for ``attn_pre_proj``,
  ``attn_rope``, ``attn_post_proj``, ``mlp_up_proj``, ``mlp_act``, ``mlp_down_proj``,
  ``input_layernorm``, ``post_attention_layernorm``, ``add``) by ``num_tokens`` and
  ``num_tensor_parallel_workers`` (1, 2, 4, 8: the operator shapes one GPU of a TP group runs;
  the all-reduce between them is not in these files, as in Vidur's);
* ``attention.csv``: ``time_stats.attn_decode.median`` by ``batch_size`` x ``kv_cache_size`` and
  ``time_stats.attn_prefill.median`` by ``prefill_chunk_size`` (PyTorch SDPA with GQA, whichever
  fused kernel it picks; vLLM's paged kernels are not available here);
* ``layer_steps.csv`` (ours): one whole decoder layer per decode step (batch x context) and per
  prefill (tokens), captured as one graph, beside the sum of its operators;
* ``meta.json``: GPU, PyTorch, SM count, the measured copy bandwidth and bf16 matmul rate.

Then, if the measured step model is importable, it compares the files with it and prints the
errors (``--compare-only DIR`` repeats that on this machine with no GPU).

Budget: about 2 minutes on one H100 (the issue allows 5).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import sys
import time

# Qwen2.5-14B (config.json of Qwen/Qwen2.5-14B)
HIDDEN, Q_HEADS, KV_HEADS, HEAD_DIM, FFN = 5120, 40, 8, 128, 13824
MODEL_NAME = "Qwen/Qwen2.5-14B"
TP_DEGREES = (1, 2, 4, 8)
MLP_TOKENS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
DECODE_BATCH = (1, 4, 16, 64, 128, 256, 512)
DECODE_CONTEXT = (256, 1024, 4096, 16384)
PREFILL_CHUNK = (128, 256, 512, 1024, 2048, 4096, 8192)
LAYER_DECODE = [(b, c) for b in (1, 8, 32, 128, 256, 512) for c in (512, 2048, 8192)]
LAYER_PREFILL = (256, 1024, 4096, 8192)
MAX_KV_TOKENS = 4 * 1024 * 1024  # batch x context cap per point: 4M tokens of K and V, 16 GiB at TP=1
MLP_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
           "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default="out/gpu_step_check", help="folder for the CSV files (default %(default)s)")
    p.add_argument("--quick", action="store_true", help="a third of the grid, for a smoke run")
    p.add_argument("--replays", type=int, default=20, help="graph replays per point; the median is kept")
    p.add_argument("--compare-only", metavar="DIR", help="compare files written earlier with the step model; no GPU")
    return p.parse_args(argv)


class _Timer:
    """Median time of a captured CUDA graph, replayed ``replays`` times after a warm-up."""

    def __init__(self, torch, replays: int):
        self.torch = torch
        self.replays = replays
        self.stream = torch.cuda.Stream()

    def graph_ms(self, fn, inner: int = 1) -> float:
        torch = self.torch
        with torch.cuda.stream(self.stream):  # warm-up outside the graph: cuBLAS picks its kernels
            for _ in range(2):
                fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g, stream=self.stream):
            for _ in range(inner):
                fn()
        start = [torch.cuda.Event(enable_timing=True) for _ in range(self.replays)]
        end = [torch.cuda.Event(enable_timing=True) for _ in range(self.replays)]
        g.replay()
        torch.cuda.synchronize()
        for s, e in zip(start, end):
            s.record()
            g.replay()
            e.record()
        torch.cuda.synchronize()
        times = [s.elapsed_time(e) / inner for s, e in zip(start, end)]
        del g
        return statistics.median(times)


def _ceilings(torch) -> dict:
    """Measured copy bandwidth (bytes read + written) and bf16 matmul rate of this GPU."""
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    a.random_(0, 255)
    for _ in range(3):
        b.copy_(a)
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        b.copy_(a)
    torch.cuda.synchronize()
    copy_bps = 2 * n * 10 / (time.perf_counter() - t0)
    del a, b
    m = 8192
    x = torch.randn(m, m, dtype=torch.bfloat16, device="cuda")
    y = torch.randn(m, m, dtype=torch.bfloat16, device="cuda")
    for _ in range(3):
        x @ y
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    for _ in range(10):
        x @ y
    torch.cuda.synchronize()
    flops = 2 * m ** 3 * 10 / (time.perf_counter() - t0)
    return {"copy_bytes_per_s": copy_bps, "bf16_matmul_flops": flops}


class _Layer:
    """Random-weight decoder layer of one GPU of a TP group (heads and FFN columns divided by ``tp``)."""

    def __init__(self, torch, tp: int):
        self.torch = torch
        dev, dt = "cuda", torch.bfloat16
        self.tp = tp
        self.hq, self.hkv = Q_HEADS // tp, max(1, KV_HEADS // tp)
        self.qkv_out = (self.hq + 2 * self.hkv) * HEAD_DIM
        self.w_qkv = torch.randn(self.qkv_out, HIDDEN, device=dev, dtype=dt) * 0.02
        self.b_qkv = torch.randn(self.qkv_out, device=dev, dtype=dt) * 0.02
        self.w_o = torch.randn(HIDDEN, self.hq * HEAD_DIM, device=dev, dtype=dt) * 0.02
        self.w_up = torch.randn(2 * FFN // tp, HIDDEN, device=dev, dtype=dt) * 0.02
        self.w_down = torch.randn(HIDDEN, FFN // tp, device=dev, dtype=dt) * 0.02
        self.norm_w = torch.ones(HIDDEN, device=dev, dtype=dt)

    def rms(self, x):
        torch = self.torch
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * torch.rsqrt(var + 1e-6)).to(x.dtype) * self.norm_w

    def rope(self, q, k, cos, sin):
        def rot(t):
            h = t.shape[-1] // 2
            return self.torch.cat((-t[..., h:], t[..., :h]), dim=-1)
        return q * cos + rot(q) * sin, k * cos + rot(k) * sin

    def qkv(self, x):
        return self.torch.nn.functional.linear(x, self.w_qkv, self.b_qkv)

    def split(self, qkv, tokens):
        q, k, v = qkv.split([self.hq * HEAD_DIM, self.hkv * HEAD_DIM, self.hkv * HEAD_DIM], dim=-1)
        return (q.view(tokens, self.hq, HEAD_DIM), k.view(tokens, self.hkv, HEAD_DIM),
                v.view(tokens, self.hkv, HEAD_DIM))

    def mlp(self, x):
        F = self.torch.nn.functional
        gu = F.linear(x, self.w_up)
        g, u = gu.chunk(2, dim=-1)
        return F.linear(F.silu(g) * u, self.w_down)


def _mlp_rows(torch, timer, tokens_list, tp_list) -> list[dict]:
    F = torch.nn.functional
    rows = []
    for tp in tp_list:
        layer = _Layer(torch, tp)
        for n in tokens_list:
            x = torch.randn(n, HIDDEN, device="cuda", dtype=torch.bfloat16)
            qkv = layer.qkv(x)
            q, k, _ = layer.split(qkv, n)
            cos = torch.randn(n, 1, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
            sin = torch.randn_like(cos)
            attn = torch.randn(n, layer.hq * HEAD_DIM, device="cuda", dtype=torch.bfloat16)
            gu = F.linear(x, layer.w_up)
            act = torch.randn(n, FFN // tp, device="cuda", dtype=torch.bfloat16)
            ops = {
                "input_layernorm": lambda: layer.rms(x),
                "attn_pre_proj": lambda: layer.qkv(x),
                "attn_rope": lambda: layer.rope(q, k, cos, sin),
                "attn_post_proj": lambda: F.linear(attn, layer.w_o),
                "post_attention_layernorm": lambda: layer.rms(x),
                "mlp_up_proj": lambda: F.linear(x, layer.w_up),
                "mlp_act": lambda: (lambda g, u: F.silu(g) * u)(*gu.chunk(2, dim=-1)),
                "mlp_down_proj": lambda: F.linear(act, layer.w_down),
                "add": lambda: x + x,
            }
            inner = 10 if n <= 256 else 3
            row = {f"time_stats.{name}.median": timer.graph_ms(fn, inner) for name, fn in ops.items()}
            row.update(n_head=Q_HEADS, n_kv_head=KV_HEADS, n_embd=HIDDEN, n_expanded_embd=FFN, vocab_size=152064,
                       use_gated_mlp=True, num_tokens=n, num_tensor_parallel_workers=tp)
            rows.append(row)
            del x, qkv, q, k, cos, sin, attn, gu, act
        del layer
        torch.cuda.empty_cache()
    return rows


def _attention_rows(torch, timer, tp_list, batches, contexts, chunks) -> list[dict]:
    F = torch.nn.functional
    rows = []
    base = dict(n_embd=HIDDEN, n_q_head=Q_HEADS, n_kv_head=KV_HEADS, block_size=16, max_model_len=max(contexts))
    for tp in tp_list:
        hq, hkv = Q_HEADS // tp, max(1, KV_HEADS // tp)
        for b in batches:
            for c in contexts:
                if b * c > MAX_KV_TOKENS:
                    continue
                q = torch.randn(b, hq, 1, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
                k = torch.randn(b, hkv, c, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
                v = torch.randn_like(k)
                ms = timer.graph_ms(lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=True), 3)
                rows.append(dict(base, **{"time_stats.attn_decode.median": ms, "time_stats.attn_prefill.median": "",
                                          "num_tensor_parallel_workers": tp, "batch_size": b,
                                          "prefill_chunk_size": 0, "kv_cache_size": c, "is_prefill": False}))
                del q, k, v
                torch.cuda.empty_cache()
        for n in chunks:
            q = torch.randn(1, hq, n, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
            k = torch.randn(1, hkv, n, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
            v = torch.randn_like(k)
            ms = timer.graph_ms(lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True), 3)
            rows.append(dict(base, **{"time_stats.attn_decode.median": "", "time_stats.attn_prefill.median": ms,
                                      "num_tensor_parallel_workers": tp, "batch_size": 1,
                                      "prefill_chunk_size": n, "kv_cache_size": 0, "is_prefill": True}))
            del q, k, v
    return rows


def _layer_rows(torch, timer, decode_points, prefill_points) -> list[dict]:
    """Whole-layer steps at TP=1: x -> norm -> qkv -> rope -> cache write -> attention -> o -> add -> norm -> mlp -> add."""
    F = torch.nn.functional
    layer = _Layer(torch, 1)
    rows = []

    def step(x, k_cache, v_cache, pos, cos, sin, causal):
        tokens = x.shape[0]
        h = layer.rms(x)
        q, k, v = layer.split(layer.qkv(h), tokens)
        q, k = layer.rope(q, k, cos, sin)
        if causal:  # prefill of one sequence: attention over its own tokens
            a = F.scaled_dot_product_attention(q.transpose(0, 1)[None], k.transpose(0, 1)[None],
                                               v.transpose(0, 1)[None], is_causal=True, enable_gqa=True)
            a = a[0].transpose(0, 1).reshape(tokens, -1)
        else:  # decode: one new token per sequence, written at position pos of its cache
            k_cache[:, :, pos] = k
            v_cache[:, :, pos] = v
            a = F.scaled_dot_product_attention(q[:, :, None], k_cache, v_cache, enable_gqa=True)
            a = a.reshape(tokens, -1)
        x = x + F.linear(a, layer.w_o)
        return x + layer.mlp(layer.rms(x))

    for b, c in decode_points:
        if b * c > MAX_KV_TOKENS:
            continue
        x = torch.randn(b, HIDDEN, device="cuda", dtype=torch.bfloat16)
        kc = torch.randn(b, KV_HEADS, c, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        vc = torch.randn_like(kc)
        cos = torch.randn(b, 1, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        sin = torch.randn_like(cos)
        ms = timer.graph_ms(lambda: step(x, kc, vc, c - 1, cos, sin, False), 1)
        rows.append({"phase": "decode", "tp": 1, "batch_size": b, "context_tokens": c, "tokens": b, "layer_ms": ms})
        del x, kc, vc, cos, sin
        torch.cuda.empty_cache()
    for n in prefill_points:
        x = torch.randn(n, HIDDEN, device="cuda", dtype=torch.bfloat16)
        cos = torch.randn(n, 1, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
        sin = torch.randn_like(cos)
        ms = timer.graph_ms(lambda: step(x, None, None, 0, cos, sin, True), 1)
        rows.append({"phase": "prefill", "tp": 1, "batch_size": 1, "context_tokens": n, "tokens": n, "layer_ms": ms})
    return rows


def _write_csv(path: str, rows: list[dict]) -> None:
    if not rows:
        return
    fields = list(rows[0])
    for r in rows[1:]:
        fields += [k for k in r if k not in fields]
    with open(path, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)


def _compare(out: str) -> int:
    try:
        from orchestrl.compute_sched.step_check import compare_gpu_check  # the measured step model, when present
    except ImportError as exc:
        print(f"comparison skipped: the measured step model is not importable here ({exc})")
        return 0
    report = compare_gpu_check(out)
    print(report.table())
    with open(os.path.join(out, "comparison.json"), "w") as f:
        json.dump(report.to_json(), f, indent=1)
    return 0


def main(argv=None) -> int:
    args = _parse(argv)
    if args.compare_only:
        return _compare(args.compare_only)
    try:
        import torch
    except ImportError:
        print("gpu_step_check: skipped, PyTorch is not installed here")
        return 0
    if not torch.cuda.is_available():
        print("gpu_step_check: skipped, no CUDA GPU here (torch.cuda.is_available() is False); "
              "run it on a GPU machine: python bench/gpu_step_check.py --out DIR")
        return 0
    os.makedirs(args.out, exist_ok=True)
    t_start = time.perf_counter()
    props = torch.cuda.get_device_properties(0)
    meta = {"gpu": props.name, "sm_count": props.multi_processor_count, "memory_bytes": props.total_memory,
            "torch": torch.__version__, "cuda": torch.version.cuda, "host": platform.node(),
            "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "model_shape": MODEL_NAME, "dtype": "bfloat16",
            "method": "CUDA graph per point, median of --replays replays, CUDA events"}
    print(f"gpu_step_check on {props.name} ({props.multi_processor_count} SMs), torch {torch.__version__}",
          flush=True)
    torch.manual_seed(0)
    timer = _Timer(torch, args.replays)
    meta.update(_ceilings(torch))
    print(f"  copy {meta['copy_bytes_per_s'] / 1e12:.2f} TB/s, bf16 matmul {meta['bf16_matmul_flops'] / 1e12:.0f} "
          f"TFLOP/s ({time.perf_counter() - t_start:.0f} s)", flush=True)
    pick = (lambda xs: xs[::3] if args.quick else xs)
    mlp = _mlp_rows(torch, timer, pick(MLP_TOKENS), TP_DEGREES)
    _write_csv(os.path.join(args.out, "mlp.csv"), mlp)
    print(f"  mlp.csv: {len(mlp)} rows ({time.perf_counter() - t_start:.0f} s)", flush=True)
    att = _attention_rows(torch, timer, TP_DEGREES, pick(DECODE_BATCH), DECODE_CONTEXT, pick(PREFILL_CHUNK))
    _write_csv(os.path.join(args.out, "attention.csv"), att)
    print(f"  attention.csv: {len(att)} rows ({time.perf_counter() - t_start:.0f} s)", flush=True)
    layers = _layer_rows(torch, timer, pick(LAYER_DECODE), pick(LAYER_PREFILL))
    _write_csv(os.path.join(args.out, "layer_steps.csv"), layers)
    print(f"  layer_steps.csv: {len(layers)} rows ({time.perf_counter() - t_start:.0f} s)", flush=True)
    meta["wall_s"] = time.perf_counter() - t_start
    with open(os.path.join(args.out, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    for r in layers:
        print(f"  layer {r['phase']:7s} b={r['batch_size']:4d} ctx={r['context_tokens']:6d}: {r['layer_ms']:.3f} ms")
    return _compare(args.out)


if __name__ == "__main__":
    sys.exit(main())
