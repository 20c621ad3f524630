"""``orchestrl sim figure fig16 --quick``: performance vs network cost, the Pareto frontier, PNG + CSV;
and the command's refusals (unknown figure, bad --workers, sweep options on one-process figures)."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import math

import pytest

from orchestrl.agents.cli import main
from orchestrl.sim.plot import matplotlib_available, pareto_frontier


@pytest.fixture(scope="module")
def fig16(tmp_path_factory):
    out = tmp_path_factory.mktemp("fig16")
    buf, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        rc = main(["sim", "figure", "fig16", "--quick", "--json", "--out", str(out)])
    assert rc == 0, err.getvalue()
    return json.loads(buf.getvalue()), list(csv.DictReader(open(out / "fig16.csv"))), out


def test_paper_ranges_are_compared_with_our_extremes(fig16):
    doc, points, _ = fig16
    rows = {r["label"]: r for r in doc["rows"]}
    assert doc["figure"] == "fig16"
    # the quick run's y-axis is relative to a speed it ran (it once divided by 200 Gb/s, which --quick skips:
    # every value was NaN and the PNG empty)
    assert rows and all(math.isfinite(r["ours"]) for r in doc["rows"])
    assert all(r["ours"] > 0 for label, r in rows.items() if label.startswith("ce/"))
    assert rows["ce/rfabric/ft min"]["paper"] == 1.53 and rows["ce/rfabric/ft max"]["paper"] == 2.06
    assert rows["ce/rfabric/ro min"]["paper"] == 1.61 and rows["ce/rfabric/mixnet@100"]["paper"] == 1.13
    per_speed = [rows[f"ce/rfabric/ft@{g}"]["ours"] for g in (100, 400)]
    assert rows["ce/rfabric/ft min"]["ours"] == min(per_speed) and rows["ce/rfabric/ft max"]["ours"] == max(per_speed)
    ce = {(p["fabric"], p["link_gbps"]): float(p["samples_per_s"]) / float(p["network_usd"]) for p in points}
    assert rows["ce/rfabric/ft@400"]["ours"] == pytest.approx(ce[("rfabric", "400")] / ce[("ft", "400")], rel=1e-4)


def test_faster_links_cost_more_and_oversubscription_is_cheaper_and_slower(fig16):
    _, points, _ = fig16
    p = {(r["fabric"], int(r["link_gbps"])): r for r in points}
    for f in ("ft", "ft-os", "ro", "topoopt", "mixnet", "rfabric"):
        assert float(p[(f, 400)]["network_usd"]) > float(p[(f, 100)]["network_usd"])
    for g in (100, 400):
        assert float(p[("ft-os", g)]["network_usd"]) < float(p[("ft", g)]["network_usd"])
        assert float(p[("ft-os", g)]["samples_per_s"]) < float(p[("ft", g)]["samples_per_s"])
        assert float(p[("topoopt", g)]["network_usd"]) == min(float(p[(f, g)]["network_usd"]) for f in
                                                              ("ft", "ft-os", "ro", "topoopt", "mixnet", "rfabric"))


def test_frontier_points_are_exactly_the_undominated_ones(fig16):
    _, points, out = fig16
    pts = [(float(r["network_usd"]), float(r["samples_per_s"])) for r in points]
    on = {i for i, r in enumerate(points) if r["on_frontier"] == "True"}
    def le(a, b):  # a <= b, counting values within the frontier's 1e-4 relative tolerance as equal
        return a <= b or abs(a - b) <= 1e-4 * max(abs(a), abs(b))

    for i, (c, s) in enumerate(pts):
        dominated = any(le(c2, c) and le(s, s2) and not (le(c, c2) and le(s2, s)) for c2, s2 in pts)
        assert (i in on) == (not dominated)
    assert on == set(pareto_frontier(pts))
    by = {(r["fabric"], r["link_gbps"]): r["on_frontier"] for r in points}
    for (fabric, speed), flag in by.items():  # FT and RO price and perform alike: both on it or both off
        if fabric == "ro":
            assert flag == by["ft", speed], speed
    if matplotlib_available():
        assert (out / "fig16.png").read_bytes()[:4] == b"\x89PNG"


def _run(argv):
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            rc = main(argv)
        except SystemExit as exc:
            rc = exc.code
    return rc, err.getvalue()


def test_unknown_figure_is_refused_with_the_list_of_figures():
    rc, err = _run(["sim", "figure", "fig99"])
    assert rc == 2 and "invalid choice: 'fig99'" in err and "fig13" in err and "fig16" in err


@pytest.mark.parametrize("workers", ["0", "-3"])
def test_bad_workers_is_refused_naming_the_option(workers):
    rc, err = _run(["sim", "figure", "fig13", "--quick", "--workers", workers])
    assert rc == 2 and "field '--workers'" in err and ">= 1" in err


def test_workers_that_is_not_a_number_is_refused():
    rc, err = _run(["sim", "figure", "fig14", "--workers", "many"])
    assert rc == 2 and "--workers" in err and "invalid int value" in err


def test_workers_and_ray_together_are_refused():
    rc, err = _run(["sim", "figure", "fig16", "--quick", "--workers", "2", "--ray", "local"])
    assert rc == 2 and "field '--workers'" in err and "--workers or --ray" in err


def test_a_one_process_figure_refuses_sweep_options():
    rc, err = _run(["sim", "figure", "fig23", "--workers", "2"])
    assert rc == 2 and "unrecognized arguments: --workers 2" in err
