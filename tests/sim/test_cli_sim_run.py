"""``orchestrl sim run``: one line, --json, a progress bar per iteration, --plot, and refusals.

In-process runs swap the training and generation stage models for the TEST FIXTURES of
``tests/sim/stage_fixtures.py`` (the weight-sync stage, fabric, controller and cost are real); the
subprocess end-to-end run uses the product stage models and is skipped where this checkout lacks them.
"""

from __future__ import annotations

import csv
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

import orchestrl.sim.run

from orchestrl import sim
from orchestrl.agents.cli import main
from tests.sim.stage_fixtures import fixture_stages

REPO = Path(__file__).resolve().parents[2]
DEMO = REPO / "examples" / "sim" / "demo-64gpu.yaml"


@pytest.fixture
def fixtures(monkeypatch):
    monkeypatch.setattr(sim.run, "default_stages", fixture_stages)


def _small(tmp_path: Path) -> Path:
    """The bundled demo with a short step, copied elsewhere (so its topology path must resolve)."""
    text = DEMO.read_text().replace("prompts_per_step: 32", "prompts_per_step: 8")
    text = text.replace("topology: ../topology-64gpu-h800.yaml", f"topology: {REPO / 'examples' / 'topology-64gpu-h800.yaml'}")
    text = text.replace("policy: orchestrl", "policy: verl-to")
    p = tmp_path / "run.yaml"
    p.write_text(text)
    return p


def test_one_line_on_stdout_and_a_progress_bar_per_iteration_on_stderr(fixtures, tmp_path, capsys):
    assert main(["sim", "run", str(_small(tmp_path)), "--iterations", "2"]) == 0
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    assert len(lines) == 1
    assert "demo-64gpu: Qwen2.5-14B on rfabric 64 GPUs (32 train / 32 gen)" in lines[0]
    assert "samples/s" in lines[0] and "samples/$" in lines[0] and "steady state" in lines[0]
    bars = [ln for ln in err.splitlines() if ln.startswith("[sim run] [")]
    assert len(bars) == 2 and "1/2" in bars[0] and "2/2" in bars[1] and bars[1].count("#") == 24


def test_json_holds_the_headline_the_cost_and_every_iteration(fixtures, tmp_path, capsys):
    assert main(["sim", "run", str(_small(tmp_path)), "--json", "--fabric", "ft", "--iterations", "3"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["fabric"] == "ft" and doc["mode"] == "async" and len(doc["result"]["iterations"]) == 3
    assert doc["samples_per_s"] == doc["result"]["throughput"]["samples_per_s"] > 0
    assert doc["samples_per_usd"] == pytest.approx(doc["samples_per_s"] * 3600 / doc["result"]["cost"]["usd_per_h"])
    assert doc["config"]["fabric"]["kind"] == "ft" and doc["result"]["cost"]["gpu_usd_per_hour"] == 5.28
    stages = doc["result"]["iterations"][0]["stages"]
    assert set(stages) == {"gen", "train", "weight-sync"} and stages["weight-sync"]["detail"]["method"] == "planned"


def test_plot_writes_the_timeline_and_its_csv_or_says_what_is_missing(fixtures, tmp_path, capsys):
    png = tmp_path / "run.png"
    rc = main(["sim", "run", str(_small(tmp_path)), "--iterations", "2", "--plot", str(png)])
    if importlib.util.find_spec("matplotlib") is None:
        assert rc == 2 and "field '--plot': needs matplotlib" in capsys.readouterr().err
        return
    assert rc == 0 and png.stat().st_size > 0
    rows = list(csv.DictReader(open(png.with_suffix(".csv"))))
    assert len(rows) == 6 and {r["stage"] for r in rows} == {"gen", "train", "weight-sync"}


def test_fields_lists_every_setting_with_its_help(capsys):
    assert main(["sim", "run", "--fields"]) == 0
    out = capsys.readouterr().out
    assert "`fabric.ocs`" in out and "Table 2" in out and "`loop.mode`" in out and "`cost.gpu_usd_per_hour`" in out


@pytest.mark.parametrize("text, says", [
    ("loop:\n  mode: fast\n", "field 'loop.mode': unknown value 'fast' (allowed: sync, async)"),
    ("cluster:\n  gpus: 64\n  train_gpus: 70\n", "field 'cluster.train_gpus': 70 of 64 GPUs"),
    ("fabric:\n  kind: rfabric\n  ocs: laser\n", "field 'fabric.ocs': unknown value 'laser'"),
    ("model: Qwen2.5-14B\nmodle: x\n", "field 'modle': is not a known field"),
])
def test_bad_input_is_refused_with_the_field_never_a_traceback(tmp_path, text, says):
    bad = tmp_path / "bad.yaml"
    bad.write_text(text)
    proc = subprocess.run([sys.executable, "-m", "orchestrl.agents.cli", "sim", "run", str(bad)], cwd=REPO,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert f"orchestrl: error: {bad}: {says}" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "orchestrl.agents.cli", "sim", "run", str(DEMO), "--iterations", "0"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "field '--iterations'" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.skipif(importlib.util.find_spec("orchestrl.sim.stages.training") is None
                    or importlib.util.find_spec("orchestrl.sim.stages.generation") is None,
                    reason="needs the training and generation stage models (issue 16, parts A and B)")
def test_the_bundled_demo_runs_end_to_end_in_a_subprocess():
    proc = subprocess.run([sys.executable, "-m", "orchestrl.agents.cli", "sim", "run", str(DEMO), "--iterations", "2",
                           "--json"], cwd=REPO, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads(proc.stdout)
    assert doc["samples_per_s"] > 0 and doc["samples_per_usd"] > 0 and len(doc["result"]["iterations"]) == 2
    assert proc.stderr.count("[sim run] [") == 2
