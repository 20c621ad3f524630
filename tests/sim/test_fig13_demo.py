"""The end of ``orchestrl demo`` (``make demo``): the 64-GPU example simulated on FT, FT-OS and RFabric."""

from __future__ import annotations

from orchestrl.agents.demo import EXAMPLES_DIR, SIM_FABRICS, sim_comparison


def test_demo_table_has_each_fabric_its_ratio_to_ft_and_per_dollar():
    text = sim_comparison(EXAMPLES_DIR / "sim" / "demo-64gpu.yaml")
    rows = {ln.split()[0]: ln.split() for ln in text.splitlines() if ln.split() and ln.split()[0] in SIM_FABRICS}
    assert set(rows) == set(SIM_FABRICS) and "samples/$" in text
    assert float(rows["ft"][2]) == 1.0  # the reference column
    net = {f: float(r[4].replace(",", "")) for f, r in rows.items()}
    assert net["ft-os"] < net["rfabric"] < net["ft"]  # 3:1 uplinks are cheapest, OCS above the ToRs next
    sync = {f: float(r[7]) for f, r in rows.items()}
    assert sync["ft-os"] > 2 * sync["ft"]  # the weight sync crosses the oversubscribed uplinks
    assert all(0.9 < float(r[2]) <= 1.0 + 1e-9 for r in rows.values())  # generation-bound: fabrics barely matter
