"""FabricSeam._expand: transfers become per-GPU-pair flows exactly as the per-transfer rule says."""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np

from orchestrl.compute_sched.netseam import Transfer
from orchestrl.sim.stages.gen_network import FabricSeam


def _by_rule(copy_gpus: np.ndarray, transfers: list[Transfer]):
    """The rule one transfer at a time: copy j, stream k from src[k % ns] to dst[k % nd], self-pairs dropped."""
    out = []
    for i, t in enumerate(transfers):
        ns, nd = len(t.src_gpus), len(t.dst_gpus)
        if not ns or not nd or t.size_bytes <= 0:
            continue
        n = max(ns, nd)
        for j in range(copy_gpus.shape[0]):
            for k in range(n):
                s, d = int(copy_gpus[j, t.src_gpus[k % ns]]), int(copy_gpus[j, t.dst_gpus[k % nd]])
                if s != d:
                    out.append((s, d, t.size_bytes / n, float(t.start_s), i))
    return out


def test_expanded_pairs_follow_the_rule_transfer_by_transfer():
    rng = random.Random(7)
    seam = SimpleNamespace(_copy_gpus=np.array([np.arange(64), np.arange(64) + 64]))
    sets = [tuple(range(4 * k, 4 * k + 4)) for k in range(16)] + [tuple(range(8)), (3,), (), (5, 9, 13)]
    transfers = [Transfer(rng.choice(sets), rng.choice(sets), rng.choice([0.0, 5e5, 1e6 * rng.random()]), "kv",
                          rng.choice([0.0, 0.25])) for _ in range(400)]
    got = FabricSeam._expand(seam, transfers)
    want = _by_rule(seam._copy_gpus, transfers)
    assert len(want) > 1000
    assert list(zip(*(a.tolist() for a in got))) == want
    assert all(len(a) == 0 for a in FabricSeam._expand(seam, [Transfer((), (1,), 1.0)]))
