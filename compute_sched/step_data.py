"""Measured operator times the step model is built from: Vidur's public profiles and our own GPU check.

Design note
-----------
Vidur (microsoft/vidur, MIT licence, MLSys'24) publishes per-operator times profiled on real A100
and H100 GPUs for several models at tensor-parallel degrees 1/2/4/8 (``mlp.csv``: the four linear
layers of a decoder block, its norms, rotary embedding, activation and residual add, by token
count, as one GPU of the TP group runs them) and NCCL all-reduce and send/recv times by message size
on DGX nodes. The subset this project uses is bundled in ``compute_sched/data/vidur/`` (medians only,
rows unchanged, with the licence and the commit it came from; :func:`bundle_vidur` rewrites it from
a Vidur checkout), so the tests and the simulator run without a network. Vidur's attention profiles
are Git LFS objects that its repository does not serve, and its CPU-overhead profiles are not in the
repository at all; the only measured attention times here are the ones ``bench/gpu_step_check.py``
took on a lent H100 (``data/measured/``: produced by this project, labelled so wherever they are used).

This module only reads files into plain arrays (:class:`OperatorTable`, :class:`CollectiveTable`,
:class:`AttentionTable`); :mod:`compute_sched.step_ops` turns them into predictors.
"""

from __future__ import annotations

import csv
import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from orchestrl.fabric.errors import ConfigError

__all__ = ["OperatorTable", "CollectiveTable", "AttentionTable", "LINEAR_OPS", "SMALL_OPS", "VIDUR_DIR",
           "MEASURED_DIR", "VIDUR_COMMIT", "operator_tables", "collective_table", "attention_table",
           "read_operator_csv", "read_attention_csv", "bundle_vidur", "measured_gpus"]

DATA_DIR = Path(__file__).resolve().parent / "data"
VIDUR_DIR = DATA_DIR / "vidur"
MEASURED_DIR = DATA_DIR / "measured"
#: The Vidur commit the bundled files were copied from (github.com/microsoft/vidur).
VIDUR_COMMIT = "7d47513363ec447a741ac5e47241580b47724fbf"
#: The four GEMMs of a decoder block, as Vidur names them.
LINEAR_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")
#: The element-wise operators of a block (fused kernels in Vidur's profiles).
SMALL_OPS = ("input_layernorm", "post_attention_layernorm", "attn_rope", "mlp_act", "add")
_SHAPE_COLS = ("n_head", "n_kv_head", "n_embd", "n_expanded_embd", "vocab_size", "use_gated_mlp")
# GPU name -> the Vidur network profile of its DGX node (the NVSwitch all-to-all node every TP group uses).
_NETWORK_OF = {"h100": "h100_dgx", "a100": "a100_dgx"}


@dataclass(frozen=True)
class OperatorTable:
    """One model's measured block operators on one GPU type: median ms by (operator, TP, tokens)."""

    gpu: str  # "h100", "a100"
    model: str  # Vidur's name, e.g. "meta-llama/Llama-2-70b-hf"
    n_embd: int
    n_head: int
    n_kv_head: int
    n_expanded_embd: int
    gated: bool  # gate and up projections fused (SwiGLU): the up projection is 2 x n_expanded_embd wide
    source: str  # file it was read from
    tokens: dict[int, np.ndarray] = field(repr=False)  # TP -> sorted token counts
    times_ms: dict[tuple[str, int], np.ndarray] = field(repr=False)  # (operator, TP) -> median ms per token count

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head  # Vidur's convention; all its models have head_dim = n_embd / n_head

    @property
    def tps(self) -> tuple[int, ...]:
        return tuple(sorted(self.tokens))

    def gemm_shapes(self, tp: int) -> dict[str, tuple[int, int]]:
        """(K, N) of each linear operator on one GPU of a TP=``tp`` group (column- then row-parallel)."""
        hd, up = self.head_dim, (2 if self.gated else 1) * self.n_expanded_embd
        return {"attn_pre_proj": (self.n_embd, (self.n_head + 2 * self.n_kv_head) * hd // tp),
                "attn_post_proj": (self.n_head * hd // tp, self.n_embd),
                "mlp_up_proj": (self.n_embd, up // tp),
                "mlp_down_proj": (self.n_expanded_embd // tp, self.n_embd)}

    def small_elements(self, tp: int) -> dict[str, float]:
        """Elements per token each element-wise operator touches on one GPU (what its time scales with)."""
        hd = self.head_dim
        return {"input_layernorm": float(self.n_embd), "post_attention_layernorm": float(self.n_embd),
                "attn_rope": float((self.n_head + self.n_kv_head) * hd / tp),
                "mlp_act": float((2 if self.gated else 1) * self.n_expanded_embd / tp), "add": float(self.n_embd)}


@dataclass(frozen=True)
class CollectiveTable:
    """Measured NCCL collective times on one node type: median seconds by (workers, bytes)."""

    network: str  # "h100_dgx"
    collective: str  # "all_reduce", "send_recv"
    source: str
    # all_reduce: keyed by the group's GPUs (all in one node); send_recv: by GPUs per node of the
    # pair (1: the two GPUs in different nodes, 2: in one node)
    sizes: dict[int, np.ndarray] = field(repr=False)  # key -> sorted message sizes in bytes
    times_s: dict[int, np.ndarray] = field(repr=False)  # key -> median seconds per size


@dataclass(frozen=True)
class AttentionTable:
    """Measured attention kernels of one model shape (``attention.csv`` in Vidur's columns)."""

    source: str
    n_q_head: int
    n_kv_head: int
    head_dim: int
    decode: np.ndarray = field(repr=False)  # rows (tp, batch, kv_cache_size, seconds)
    prefill: np.ndarray = field(repr=False)  # rows (tp, chunk tokens, seconds)
    produced_by: str = ""  # who measured it (from the folder's README / meta.json)


def _rows(path: Path) -> list[dict[str, str]]:
    try:
        with open(path, newline="", encoding="utf-8") as fh:
            return list(csv.DictReader(fh))
    except OSError as exc:
        raise ConfigError(str(path), "<file>", f"cannot be read ({exc.strerror})",
                          "a CSV in Vidur's profiling format") from None


def _column(path: Path, rows: list[dict[str, str]], key: str) -> np.ndarray:
    """One column as floats; a missing column or a bad value is refused naming the file, column and line."""
    if key not in rows[0]:
        raise ConfigError(str(path), key, "column missing", "Vidur's profiling columns")
    try:
        out = np.array([r[key] for r in rows], dtype=float)
    except ValueError:
        for i, r in enumerate(rows, start=2):
            _num(path, r, key, i)  # raises for the first bad value
        raise
    bad = np.flatnonzero(~np.isfinite(out) | (out < 0))
    if len(bad):
        raise ConfigError(str(path), f"{key} (line {bad[0] + 2})", f"{out[bad[0]]}", "a finite number >= 0")
    return out


def _num(path: Path, row: dict[str, str], key: str, line: int) -> float:
    try:
        value = float(row[key])
    except KeyError:
        raise ConfigError(str(path), key, "column missing", "Vidur's profiling columns") from None
    except ValueError:
        raise ConfigError(str(path), f"{key} (line {line})", f"{row[key]!r} is not a number", "a number") from None
    if not np.isfinite(value) or value < 0:
        raise ConfigError(str(path), f"{key} (line {line})", f"{value}", "a finite number >= 0")
    return value


def read_operator_csv(path: str | os.PathLike[str], gpu: str, model: str) -> OperatorTable:
    """Return the operator table in one ``mlp.csv`` (Vidur's columns; extra columns are ignored).

    Raises
    ------
    ConfigError
        Naming the file, column and line of a missing or malformed value, or a file mixing model shapes.
    """
    p = Path(path)
    rows = _rows(p)
    if not rows:
        raise ConfigError(str(p), "<rows>", "no rows", "one row per (num_tokens, num_tensor_parallel_workers)")
    shape = {k: rows[0].get(k) for k in _SHAPE_COLS}
    for i, r in enumerate(rows, start=2):
        if any(r.get(k) != v for k, v in shape.items()):
            raise ConfigError(str(p), f"line {i}", "model shape differs from the first row's", "one model per file")
    tps = _column(p, rows, "num_tensor_parallel_workers").astype(int)
    ns = _column(p, rows, "num_tokens").astype(int)
    cols = {op: (np.zeros(len(rows)) if op in SMALL_OPS and f"time_stats.{op}.median" not in rows[0]
                 # a block without the operator (phi-2 has one norm per block) has no column: it costs nothing
                 else _column(p, rows, f"time_stats.{op}.median")) for op in LINEAR_OPS + SMALL_OPS}
    tokens: dict[int, np.ndarray] = {}
    times: dict[tuple[str, int], np.ndarray] = {}
    for tp in sorted(set(tps.tolist())):
        sel = tps == tp
        uniq, inv = np.unique(ns[sel], return_inverse=True)
        tokens[tp] = uniq.astype(float)
        counts = np.bincount(inv, minlength=len(uniq))
        first = np.full(len(uniq), -1)
        first[inv[::-1]] = np.arange(len(inv))[::-1]  # the first row of each token count
        twice = np.flatnonzero(counts > 1)  # a few counts were profiled twice: their median
        for op, col in cols.items():
            vals = col[sel]
            t = vals[first].copy()
            for k in twice:
                t[k] = float(np.median(vals[inv == k]))
            times[op, tp] = t
    try:
        ints = {k: int(float(shape[k] or "")) for k in ("n_head", "n_kv_head", "n_embd", "n_expanded_embd")}
    except ValueError:
        raise ConfigError(str(p), "n_head/n_kv_head/n_embd/n_expanded_embd", "not integers", "the model's shape") from None
    return OperatorTable(gpu=gpu, model=model, gated=str(shape["use_gated_mlp"]).lower() == "true", source=str(p),
                         tokens=tokens, times_ms=times, **ints)


def _vidur_name(path: Path) -> str:
    return path.stem.replace("__", "/")  # bundled as <org>__<model>.csv


@lru_cache(maxsize=None)
def operator_tables(gpu: str, root: str | None = None) -> tuple[OperatorTable, ...]:
    """Return every bundled operator table of ``gpu`` ("h100", "a100"), one per model.

    >>> [t.model for t in operator_tables("h100")][:2]
    ['Qwen/Qwen-72B', 'codellama/CodeLlama-34b-Instruct-hf']
    """
    base = Path(root) if root else VIDUR_DIR
    folder = base / "compute" / gpu.lower()
    files = sorted(folder.glob("*.csv"))
    if not files:
        raise ConfigError(str(folder), "<folder>", "holds no operator profiles",
                          f"one of: {', '.join(measured_gpus(root))}")
    return tuple(read_operator_csv(f, gpu.lower(), _vidur_name(f)) for f in files)


def measured_gpus(root: str | None = None) -> tuple[str, ...]:
    """GPU types with bundled operator profiles."""
    base = Path(root) if root else VIDUR_DIR
    return tuple(sorted(p.name for p in (base / "compute").iterdir() if p.is_dir()))


@lru_cache(maxsize=None)
def collective_table(gpu: str, collective: str = "all_reduce", root: str | None = None) -> CollectiveTable:
    """Return the bundled NCCL ``collective`` times of ``gpu``'s DGX node (every GPU of a group in one node).

    >>> t = collective_table("h100")
    >>> sorted(t.sizes), int(t.sizes[8][0]), int(t.sizes[8][-1])
    ([2, 4, 8], 2048, 67108864)
    """
    net = _NETWORK_OF.get(gpu.lower())
    if net is None:
        raise ConfigError("collective_table", "gpu", f"{gpu!r} has no measured collectives", ", ".join(_NETWORK_OF))
    p = (Path(root) if root else VIDUR_DIR) / "network" / net / f"{collective}.csv"
    acc: dict[tuple[int, float], list[float]] = {}
    for i, r in enumerate(_rows(p), start=2):
        workers, per_node = int(_num(p, r, "num_workers", i)), int(_num(p, r, "devices_per_node", i))
        if collective == "all_reduce" and workers != per_node:
            continue  # groups spanning nodes: TP groups never do
        key = workers if collective == "all_reduce" else per_node  # send/recv: 1 across nodes, 2 inside one
        acc.setdefault((key, _num(p, r, "size", i)), []).append(_num(p, r, f"time_stats.{collective}.median", i))
    sizes: dict[int, np.ndarray] = {}
    times: dict[int, np.ndarray] = {}
    for w in sorted({k[0] for k in acc}):
        s = np.array(sorted(k[1] for k in acc if k[0] == w))
        sizes[w] = s
        times[w] = np.array([float(np.median(acc[w, x])) * 1e-3 for x in s])
    return CollectiveTable(net, collective, str(p), sizes, times)


def read_attention_csv(path: str | os.PathLike[str]) -> AttentionTable:
    """Return the attention table in an ``attention.csv`` (Vidur's columns: decode and prefill rows)."""
    p = Path(path)
    rows = _rows(p)
    if not rows:
        raise ConfigError(str(p), "<rows>", "no rows", "decode and prefill rows")
    dec, pre = [], []
    for i, r in enumerate(rows, start=2):
        tp = _num(p, r, "num_tensor_parallel_workers", i)
        if str(r.get("is_prefill", "")).lower() == "true":
            pre.append((tp, _num(p, r, "prefill_chunk_size", i), _num(p, r, "time_stats.attn_prefill.median", i) * 1e-3))
        else:
            dec.append((tp, _num(p, r, "batch_size", i), _num(p, r, "kv_cache_size", i),
                        _num(p, r, "time_stats.attn_decode.median", i) * 1e-3))
    first = rows[0]
    n_embd, nq, nkv = (int(_num(p, first, k, 2)) for k in ("n_embd", "n_q_head", "n_kv_head"))
    meta = p.parent / "meta.json"
    who = ""
    if meta.exists():
        info = json.loads(meta.read_text(encoding="utf-8"))
        who = f"{info.get('gpu', '?')}, {info.get('date', '?')}, bench/gpu_step_check.py (this project)"
    return AttentionTable(str(p), nq, nkv, n_embd // nq, np.array(dec), np.array(pre), who)


@lru_cache(maxsize=None)
def attention_table(gpu: str = "h100") -> AttentionTable:
    """Return the measured attention of ``gpu``: our own H100 run (the only attention times available here)."""
    if gpu.lower() != "h100":
        raise ConfigError("attention_table", "gpu", f"no measured attention for {gpu!r}",
                          "h100 (other GPUs are derived from it by their datasheet ratios)")
    folders = sorted(MEASURED_DIR.glob("h100-*"))
    return read_attention_csv(folders[-1] / "attention.csv")


def bundle_vidur(checkout: str | os.PathLike[str], dest: str | os.PathLike[str] = VIDUR_DIR,
                 gpus: tuple[str, ...] = ("h100", "a100")) -> list[Path]:
    """Copy the subset of a Vidur checkout this project uses into ``dest``; return the files written.

    ``checkout`` is a Vidur working tree or a bare git directory (read with ``git show``). From each
    ``data/profiling/compute/<gpu>/<org>/<model>/mlp.csv`` the shape and key columns and the
    ``.median`` columns are kept, values copied as text; the network files keep the all-reduce and
    send/recv medians of the DGX nodes.
    """
    src = Path(checkout)
    bare = not (src / "data").exists()

    def listing() -> list[str]:
        if not bare:
            return [str(p.relative_to(src)) for p in (src / "data" / "profiling").rglob("*.csv")]
        out = subprocess.run(["git", "-C", str(src), "ls-tree", "-r", "--name-only", "HEAD", "data/profiling"],
                             check=True, capture_output=True, text=True).stdout
        return out.split()

    def read(rel: str) -> list[dict[str, str]]:
        text = (src / rel).read_text() if not bare else subprocess.run(
            ["git", "-C", str(src), "show", f"HEAD:{rel}"], check=True, capture_output=True, text=True).stdout
        return list(csv.DictReader(text.splitlines()))

    dest = Path(dest)
    written = []
    for rel in listing():
        parts = rel.split("/")
        if parts[2] == "compute" and parts[3] in gpus and parts[-1] == "mlp.csv":
            out = dest / "compute" / parts[3] / f"{parts[4]}__{parts[5]}.csv"
            keep = lambda k: k.endswith(".median") or k in _SHAPE_COLS + ("num_tokens", "num_tensor_parallel_workers")
        elif parts[2] == "network" and parts[3] in {_NETWORK_OF[g] for g in gpus} and parts[-1] in (
                "all_reduce.csv", "send_recv.csv"):
            out = dest / "network" / parts[3] / parts[-1]
            keep = lambda k: k.endswith(".median") or k in ("num_workers", "size", "collective", "devices_per_node")
        else:
            continue
        rows = read(rel)
        cols = [k for k in rows[0] if k and keep(k)]
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "w", newline="", encoding="utf-8") as fh:
            w = csv.DictWriter(fh, fieldnames=cols, extrasaction="ignore", lineterminator="\n")
            w.writeheader()
            w.writerows(rows)
        written.append(out)
    lic = "LICENSE"
    if bare:
        (dest / lic).write_text(subprocess.run(["git", "-C", str(src), "show", f"HEAD:{lic}"], check=True,
                                               capture_output=True, text=True).stdout)
    else:
        shutil.copy(src / lic, dest / lic)
    return written


if __name__ == "__main__":  # python -m orchestrl.compute_sched.step_data <vidur checkout or bare git dir>
    import sys

    if len(sys.argv) != 2 or sys.argv[1] in ("-h", "--help"):
        print("usage: python -m orchestrl.compute_sched.step_data VIDUR_CHECKOUT  (rewrites compute_sched/data/vidur)")
        sys.exit(0 if len(sys.argv) == 2 else 2)
    for f in bundle_vidur(sys.argv[1]):
        print(f)
