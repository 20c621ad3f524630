"""Figures 17, 18 and 22 (--quick): paper / ours / ratio as JSON, a CSV of every row, and the effects they measure."""

from __future__ import annotations

import csv
import json
import math

import pytest

from orchestrl.sim.experiments import fig17, fig18, fig22


def _doc(module, tmp_path, capsys, *extra):
    assert module.main(["--quick", "--json", "--out", str(tmp_path), *extra]) == 0
    return json.loads(capsys.readouterr().out)


def _csv(path):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh))


@pytest.fixture(scope="module")
def fig17_doc(tmp_path_factory):
    out = tmp_path_factory.mktemp("fig17")
    results = fig17.sweep(quick=True, workers=2)
    rows = fig17.rows_of(results)
    from orchestrl.sim.experiments.rowsplot import write_rows

    csv_path, _, _ = write_rows("fig17", rows, out, title="t", ylabel="y")
    return rows, results, csv_path


def test_fig17_rows_carry_the_papers_numbers_and_ours(fig17_doc):
    rows, _, csv_path = fig17_doc
    by = {r.label: r for r in rows}
    assert list(by) == ["sched-only", "fabric-only", "orchestrl", "ft+sched",
                        "tpd/sched-only", "tpd/fabric-only", "tpd/orchestrl", "tpd/ft+sched",
                        "tpd-purchase/sched-only", "tpd-purchase/fabric-only", "tpd-purchase/orchestrl",
                        "tpd-purchase/ft+sched"]
    # the purchase accounting weighs the network as §7.2.3 does: a larger share than GPU rental gives it
    assert by["tpd-purchase/orchestrl"].detail["network_share_purchase"] > 3 * by["tpd/orchestrl"].detail[
        "network_share_rental"]
    assert (by["sched-only"].paper, by["fabric-only"].paper, by["orchestrl"].paper) == (1.18, 1.56, 2.01)
    assert (by["tpd/sched-only"].paper, by["tpd/fabric-only"].paper, by["tpd/orchestrl"].paper) == (1.18, 1.79, 2.31)
    assert by["ft+sched"].paper is None and by["ft+sched"].ratio is None
    assert all(math.isfinite(r.ours) and r.ours > 0 for r in rows)
    assert [r["label"] for r in _csv(csv_path)] == list(by)


def test_fig17_tpd_is_throughput_over_each_fabrics_own_price(fig17_doc):
    rows, results, _ = fig17_doc
    by = {r.label: r for r in rows}
    res = {r["label"]: r for r in results}
    # same fabric, same price: the scheduler's TPD gain is its throughput gain
    assert by["tpd/sched-only"].ours == pytest.approx(by["sched-only"].ours, rel=1e-9)
    for label in ("fabric-only", "orchestrl", "ft+sched"):
        price = res["baseline"]["usd_per_hour"] / res[label]["usd_per_hour"]
        assert by[f"tpd/{label}"].ours == pytest.approx(by[label].ours * price, rel=1e-9)
    assert res["ft+sched"]["usd_per_hour"] > res["orchestrl"]["usd_per_hour"] > res["baseline"]["usd_per_hour"] * 0.99


def test_fig17_the_scheduler_gains_on_both_fabrics(fig17_doc):
    rows, results, _ = fig17_doc
    by = {r.label: r.ours for r in rows}
    res = {r["label"]: r for r in results}
    assert by["sched-only"] > 1.0 and by["orchestrl"] > by["fabric-only"]
    # the fixed scheduler is veRL-TO's static TP; OrchestrRL's changes the layout during the step
    assert res["baseline"]["policy"] == "verl-to" and res["orchestrl"]["policy"] == "orchestrl"


def test_fig18_rfabric_speeds_the_afd_phase_and_kv_migration_not_the_reload(tmp_path, capsys):
    doc = _doc(fig18, tmp_path, capsys)
    rows = {r["label"]: r for r in doc["rows"]}
    assert list(rows) == ["afd-phase", "switch", "kv-migration", "tp-phase", "step"]
    assert rows["afd-phase"]["paper"] == pytest.approx(0.833) and rows["step"]["paper"] == pytest.approx(0.893)
    assert rows["kv-migration"]["paper"] == pytest.approx(0.417) and rows["switch"]["paper"] is None
    # FT-OS's 3:1 uplinks slow the AFD M2N exchange and the KV transfers; weights come from host memory on both
    assert rows["afd-phase"]["ours"] < 1.0 and rows["kv-migration"]["ours"] < 1.0 and rows["step"]["ours"] < 1.0
    assert rows["switch"]["ours"] == pytest.approx(1.0)
    fabrics = {f["fabric"]: f for f in doc["fabrics"]}
    for f in fabrics.values():  # the phases add up to the step
        assert f["afd-phase"] + f["switch"] + f["kv-migration"] + f["tp-phase"] == pytest.approx(f["step"], rel=1e-9)
        assert f["migration_methods"].get("transfer", 0) > 0
    assert [r["label"] for r in _csv(tmp_path / "fig18.csv")] == list(rows)


def test_fig22_each_stage_responds_to_the_ocs_delay_as_its_slack_allows(tmp_path, capsys):
    doc = _doc(fig22, tmp_path, capsys)
    rows = {r["label"]: r for r in doc["rows"]}
    for stage in fig22.STAGES:
        got = [rows[f"{stage}/{lab}"]["ours"] for lab in ("0.01ms", "25ms", "120s")]
        assert 1.0 - 1e-9 <= got[0] <= got[1] <= got[2], (stage, got)
        # RotorNet's 10 us: free for Train and Weight Sync; Gen pays 2 x 94 layers x 10 us per ~20 ms step
        assert got[0] < (1.15 if stage == "gen" else 1.01)
    # weight sync pays one switch plus the gate's 10% guard, whatever the delay
    ws = next(c for c in doc["cases"] if c["stage"] == "weight-sync" and c["delay_s"] == 120.0)
    assert ws["reconfiguration_s"] == pytest.approx(132.0)
    # training switches its two period plans every step: 2 x T_ocs on the critical path
    tr = next(c for c in doc["cases"] if c["stage"] == "train" and c["delay_s"] == 120.0)
    assert tr["reconfig_wait_s"] == pytest.approx(240.0)
    # Gen pays 2 T_ocs per layer of every decode step: far more than the other stages
    assert rows["gen/25ms"]["ours"] > 10 * rows["train/25ms"]["ours"]
    assert rows["gen/max"]["paper"] == 325.0 and rows["gen/max"]["ours"] == rows["gen/120s"]["ours"]
    assert rows["gen/min>=1ms"]["ours"] == rows["gen/25ms"]["ours"]  # the quick sweep's smallest delay >= 1 ms
    # the plot is each stage's slowdown against the delay, not the summary rows of Gen's range
    from orchestrl.sim.experiments.rowsplot import rows_over_seeds

    xlabel, series = fig22.curves(rows_over_seeds(fig22.rows_of, doc["cases"]))  # the means over the seeds
    assert set(series) == set(fig22.STAGES) and "T_ocs" in xlabel
    assert sorted(series["gen"]) == sorted((r["delay_s"], r["ours"]) for lab, r in rows.items()
                                           if lab.startswith("gen/") and "instant_s" in r)


def test_the_new_figures_are_commands():
    from orchestrl.agents.cli.cmd_sim import _FIGURES

    assert {"fig17", "fig18", "fig22"} <= set(_FIGURES)
