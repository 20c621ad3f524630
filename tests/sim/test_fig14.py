"""``orchestrl sim figure fig14 --quick``: per-stage time of 57B MoE normalised to FT, PNG + CSV."""

from __future__ import annotations

import contextlib
import csv
import io
import json

import pytest

from orchestrl.agents.cli import main
from orchestrl.sim.network.config import FABRICS
from orchestrl.sim.plot import matplotlib_available


@pytest.fixture(scope="module")
def fig14(tmp_path_factory):
    out = tmp_path_factory.mktemp("fig14")
    buf, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        rc = main(["sim", "figure", "fig14", "--quick", "--json", "--out", str(out)])
    assert rc == 0, err.getvalue()
    doc = json.loads(buf.getvalue())
    return doc, {r["label"]: r for r in doc["rows"]}, out


def test_one_row_per_stage_and_fabric_other_than_ft(fig14):
    doc, rows, _ = fig14
    assert doc["figure"] == "fig14"
    assert set(rows) == {f"{s}/{f}/ft" for s in ("train", "gen", "weight-sync") for f in FABRICS if f != "ft"}
    assert rows["gen/rfabric/ft"]["paper"] == 1.0 and rows["weight-sync/rfabric/ft"]["paper"] is None
    for r in rows.values():
        assert r["ours"] == pytest.approx(r["time_s"] / r["ft_s"])


def test_slow_fabrics_are_slower_in_every_stage_and_ro_matches_ft(fig14):
    _, rows, _ = fig14
    for stage in ("train", "gen", "weight-sync"):
        assert rows[f"{stage}/ro/ft"]["ours"] == pytest.approx(1.0, abs=0.01)
        assert rows[f"{stage}/ft-os/ft"]["ours"] > 1.05
        assert rows[f"{stage}/topoopt/ft"]["ours"] > 1.05
    # RFabric's circuits carry the AFD M2N and the EP all-to-all at FT's rate
    assert rows["gen/rfabric/ft"]["ours"] == pytest.approx(1.0, abs=0.05)
    assert rows["train/rfabric/ft"]["ours"] == pytest.approx(1.0, abs=0.05)


def test_csv_has_every_bar_and_the_png_is_written(fig14):
    _, _, out = fig14
    rows = list(csv.DictReader(open(out / "fig14.csv")))
    assert len(rows) == 3 * len(FABRICS)
    assert {r["stage"] for r in rows} == {"train", "gen", "weight-sync"}
    assert all(float(r["vs_ft"]) == pytest.approx(1.0) for r in rows if r["fabric"] == "ft")
    if matplotlib_available():
        assert (out / "fig14.png").read_bytes()[:4] == b"\x89PNG"
