"""``orchestrl sim figure fig13 --quick``: the JSON contract, PNG + CSV, and the fabric ordering a user expects.

The quick sweep is the real one at reduced size: Qwen2-57B-A14B on 512 GPUs, all six fabrics, the
product training, generation (AFD) and weight-sync stage models, run on the process pool.
"""

from __future__ import annotations

import csv
import json
from pathlib import Path

import pytest

from orchestrl.agents.cli import main
from orchestrl.sim.plot import matplotlib_available
from orchestrl.sim.network.config import FABRICS


@pytest.fixture(scope="module")
def fig13(tmp_path_factory):
    out = tmp_path_factory.mktemp("fig13")
    import io
    import contextlib

    buf, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(buf), contextlib.redirect_stderr(err):
        rc = main(["sim", "figure", "fig13", "--quick", "--json", "--workers", "2", "--out", str(out)])
    assert rc == 0, err.getvalue()
    return json.loads(buf.getvalue()), out, err.getvalue()


def _ours(doc, label):
    return next(r["ours"] for r in doc["rows"] if r["label"] == label)


def test_json_rows_carry_label_paper_ours_and_their_ratio(fig13):
    doc, _, _ = fig13
    assert doc["figure"] == "fig13" and doc["notes"]
    for r in doc["rows"]:
        assert {"label", "paper", "ours", "ratio"} <= set(r)
        if r["paper"] is None:
            assert r["ratio"] is None
        else:
            assert r["ratio"] == pytest.approx(r["ours"] / r["paper"])
    labels = {r["label"] for r in doc["rows"]}
    assert {f"57b-moe/512/{f}/ft" for f in FABRICS if f != "ft"} <= labels
    assert {"topoopt/ft min", "topoopt/ft max", "mixnet/ft mean", "rfabric/ft mean"} <= labels
    assert next(r for r in doc["rows"] if r["label"] == "mixnet/ft mean")["paper"] == 0.81


def test_writes_the_csv_of_every_case_and_the_png(fig13):
    _, out, err = fig13
    rows = list(csv.DictReader(open(out / "fig13.csv")))
    assert sorted(r["fabric"] for r in rows) == sorted(FABRICS)
    assert all(float(r["samples_per_s"]) > 0 and r["gen_layout"].endswith("afd24:16-tp8") for r in rows)
    if matplotlib_available():
        assert (out / "fig13.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    else:
        assert not (out / "fig13.png").exists() and "pip install 'orchestrl[sim]'" in err


def test_progress_says_every_fabric_runs_on_fts_split(fig13):
    _, _, err = fig13
    assert "[fig13] FT picks the splits: 1/1 cases" in err
    assert "[fig13] every fabric on FT's split: 5/5 cases" in err  # not "on its split": FT's is the only one


def test_oversubscription_and_optical_only_fabrics_lose_throughput_rail_optimised_does_not(fig13):
    doc, _, _ = fig13
    assert _ours(doc, "57b-moe/512/ft-os/ft") < 0.95  # 3:1 uplinks slow EP, M2N and the weight sync
    assert _ours(doc, "57b-moe/512/topoopt/ft") < _ours(doc, "57b-moe/512/ft-os/ft")  # host forwarding
    assert _ours(doc, "57b-moe/512/ro/ft") == pytest.approx(1.0, abs=0.01)  # non-blocking, like FT
    assert _ours(doc, "57b-moe/512/rfabric/ft") == pytest.approx(1.0, abs=0.05)
    worst = min(r["ours"] for r in doc["rows"] if r["label"].startswith("57b-moe/"))
    assert _ours(doc, "topoopt/ft min") == worst
