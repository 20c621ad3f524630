"""The emulated cluster: namespaces, shaped links, real ranks over it, and cleanup (needs root)."""

from __future__ import annotations

import pytest

pytest.importorskip("torch", reason="the collectives runtime needs torch (the comms extra)")

import subprocess

from orchestrl.collectives.baseline import plan_flat
from orchestrl.collectives.emulation.model import synthetic_model
from orchestrl.collectives.emulation.netns import ClusterSpec
from orchestrl.collectives.emulation.runner import measure_goodput, run_sync
from orchestrl.collectives.layout import FabricLinks, GeneratorLayout, TrainerLayout
from orchestrl.collectives.plan import plan_weight_sync

CROSS_BPS = 100e6
NIC_BPS = 1e9


def _namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def test_cross_link_is_shaped_and_the_cluster_leaves_nothing_behind(emulated_cluster):
    cluster = emulated_cluster(ClusterSpec(trainers=1, gen_pods=1, gens_per_pod=1, nic_bps=NIC_BPS, cross_bps=CROSS_BPS))
    assert {h.netns for h in cluster.hosts} | {cluster.fabric_ns} <= _namespaces()
    rate = measure_goodput(cluster.trainers[0], cluster.generators[0], 4 << 20)
    assert 0.7 * CROSS_BPS < rate < 1.05 * CROSS_BPS  # TCP payload rate under the shaped line rate
    cluster.down()
    assert not any(ns.startswith(cluster.prefix) for ns in _namespaces())


def test_both_schedules_run_across_the_emulated_clusters(emulated_cluster):
    cluster = emulated_cluster(ClusterSpec(trainers=2, gen_pods=2, gens_per_pod=2, nic_bps=NIC_BPS, cross_bps=CROSS_BPS))
    params = synthetic_model(1 << 20, hidden=64)
    trainer = TrainerLayout(tp=2)
    gen = GeneratorLayout.uniform(pods=tuple(cluster.gen_pod_ids()), ranks_per_pod=2, tp=2)
    links = FabricLinks(nic_bps=NIC_BPS, cross_bps=CROSS_BPS)
    hosts = cluster.trainers + cluster.generators
    ours = run_sync(plan_weight_sync(params, trainer, gen, links, chunk_bytes=256 << 10), hosts=hosts, timeout_s=30)
    assert ours.ok and ours.verified, ours.errors()
    flat = run_sync(plan_flat(params, trainer, gen, links, chunk_bytes=256 << 10), hosts=hosts, timeout_s=30,
                    group="flat")
    assert flat.ok and flat.verified, flat.errors()


def test_without_root_the_harness_says_why(monkeypatch):
    from orchestrl.collectives.emulation import netns

    monkeypatch.setattr(netns.os, "geteuid", lambda: 1000)
    assert "root" in netns.unavailable_reason()
