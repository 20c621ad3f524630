"""The paper experiments run, print paper / ours / ratio, and measure what they say they measure."""

from __future__ import annotations

import json

import pytest

from orchestrl.agents.cli import main
from orchestrl.sim.experiments.fig21 import PAPER, run as run_fig21
from orchestrl.sim.experiments.fig23 import CONFIGS


def test_fig23_prints_paper_ours_and_ratio_as_json(capsys):
    assert main(["sim", "figure", "fig23", "--quick", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["figure"] == "fig23" and len(doc["rows"]) == 2
    for row, cfg in zip(doc["rows"], CONFIGS):
        assert row["label"] == cfg.label and row["paper"] == pytest.approx(cfg.paper_reduction)
        assert row["greedy_s"] > 0 and row["uniform_s"] > 0
        assert row["ours"] == pytest.approx(1 - row["greedy_s"] / row["uniform_s"])


def test_fig21_failures_never_speed_a_stage_up_before_the_replan():
    rows = {r.label: r for r in run_fig21(quick=True)}
    assert set(rows) == {f"{kind} x{k} / {stage}" for kind, k, stage in PAPER}
    for label, r in rows.items():
        assert r.paper == PAPER[(label.split()[0], int(label.split()[1][1]), label.split("/ ")[1])]
        if label.startswith("ocs"):
            assert r.detail["before_replan"] >= 1 - 1e-9  # a dark circuit can only cost capacity
    # a GPU relaying its all-to-all through a server-mate's NIC doubles that NIC's load
    assert rows["nic-eps x1 / train"].ours > 1.5
