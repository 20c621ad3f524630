"""``orchestrl sim net`` and ``orchestrl sim collective``: the contract of the issue, and refusals."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from orchestrl.agents.cli import main

REPO = Path(__file__).resolve().parents[2]
FLOWS = REPO / "examples" / "sim" / "flows-shift-64.json"


def test_sim_net_prints_one_line_by_default(capsys):
    assert main(["sim", "net", "--fabric", "ft", "--gpus", "64", "--flows", str(FLOWS)]) == 0
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "makespan 1.004 ms" in out[0] and "64 flows" in out[0]


def test_sim_net_json_follows_the_contract(capsys):
    assert main(["sim", "net", "--fabric", "rfabric", "--gpus", "64", "--flows", str(FLOWS), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert set(doc) == {"fabric", "gpus", "flows", "makespan_s", "solve_s", "events"}
    assert doc["fabric"] == "rfabric" and doc["gpus"] == 64 and doc["events"] >= 1
    assert set(doc["flows"][0]) == {"src", "dst", "bytes", "start_s", "finish_s"}
    assert max(f["finish_s"] for f in doc["flows"]) == pytest.approx(doc["makespan_s"])


def test_sim_collective_reports_nccl_tests_bus_bandwidth(capsys):
    assert main(["sim", "collective", "--fabric", "ft", "--gpus", "64", "--primitive", "all-reduce",
                 "--group-size", "8", "--stride", "8", "--bytes-per-rank", "1e9", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["busbw_bytes_per_s"] == pytest.approx(25e9, rel=0.01)
    assert doc["algbw_bytes_per_s"] * 2 * 7 / 8 == pytest.approx(doc["busbw_bytes_per_s"])
    assert main(["sim", "collective", "--fabric", "mixnet", "--gpus", "64", "--primitive", "m2n",
                 "--group-size", "16", "--bytes-per-rank", "1e8"]) == 0
    assert "busbw" in capsys.readouterr().out


@pytest.mark.parametrize("doc,field", [
    ({"flows": [{"src": 0, "dst": 64, "bytes": 1, "start_s": 0}]}, "flows[0].dst"),
    ({"flows": [{"src": 0, "dst": 1, "bytes": -1, "start_s": 0}]}, "flows[0].bytes"),
    ({"flows": [{"src": 0, "dst": 1, "bytes": 1, "start": 0}]}, "flows[0].start"),
    ({"flows": [{"src": 0, "dst": 1, "bytes": 1, "start_s": "now"}]}, "flows[0].start_s"),
    ({"flow": []}, "flow"),
])
def test_bad_flow_files_name_the_field(tmp_path, capsys, doc, field):
    path = tmp_path / "f.json"
    path.write_text(json.dumps(doc))
    assert main(["sim", "net", "--fabric", "ft", "--gpus", "64", "--flows", str(path)]) == 2
    err = capsys.readouterr().err
    assert f"field '{field}'" in err and str(path) in err and "Traceback" not in err


def test_bad_command_line_values_are_refused_without_a_traceback(capsys):
    assert main(["sim", "collective", "--fabric", "ft", "--gpus", "64", "--primitive", "all-to-all",
                 "--group-size", "7", "--bytes-per-rank", "1e6"]) == 2
    assert "--group-size" in capsys.readouterr().err
    assert main(["sim", "net", "--fabric", "ft", "--gpus", "60", "--flows", str(FLOWS)]) == 2
    assert "gpus" in capsys.readouterr().err


def test_runs_past_the_progress_threshold_report_their_phases_on_stderr():
    # The threshold is 1 s; lowering it to 0 makes any run "long" without making the test slow.
    env = {**os.environ, "ORCHESTRL_PROGRESS_AFTER_S": "0"}
    proc = subprocess.run([sys.executable, "-m", "orchestrl.agents.cli", "sim", "net", "--fabric", "rfabric", "--gpus", "64",
                           "--flows", str(FLOWS)], cwd=REPO, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr
    assert len(proc.stdout.strip().splitlines()) == 1  # stdout keeps the one-line summary
    phases = [line for line in proc.stderr.splitlines() if line.startswith("[sim")]
    assert any("routing and planning done" in p for p in phases) and any("running flows" in p for p in phases)
    quiet = subprocess.run([sys.executable, "-m", "orchestrl.agents.cli", "sim", "net", "--fabric", "ft", "--gpus", "64",
                            "--flows", str(FLOWS)], cwd=REPO, capture_output=True, text=True, timeout=240)
    assert "[sim" not in quiet.stderr  # a sub-second run stays silent


@pytest.mark.parametrize("argv,field", [
    (["sim", "net", "--fabric", "ft", "--gpus", "64", "--flows", "/nonexistent/flows.json"], "<file>"),
    (["sim", "net", "--fabric", "ft", "--gpus", "10000000", "--flows", str(FLOWS)], "--gpus"),  # refused before building
    (["sim", "net", "--fabric", "ft", "--gpus", "-8", "--flows", str(FLOWS)], "--gpus"),
    (["sim", "net", "--fabric", "topoopt", "--gpus", "8", "--flows", str(FLOWS)], "gpus"),  # one server: no panel links
    (["sim", "net", "--fabric", "ft", "--gpus", "64", "--gbps", "inf", "--flows", str(FLOWS)], "--gbps"),
    (["sim", "collective", "--fabric", "ft", "--gpus", "64", "--primitive", "all-to-all", "--group-size", "8",
      "--stride", "16", "--bytes-per-rank", "1e6"], "--stride"),
    (["sim", "collective", "--fabric", "ft", "--gpus", "64", "--primitive", "all-to-all", "--group-size", "8",
      "--bytes-per-rank", "nan"], "--bytes-per-rank"),
])
def test_bad_values_name_the_field_and_exit_2(capsys, argv, field):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"field '{field}'" in err and "allowed:" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1


def test_invalid_json_and_unknown_fabric_through_the_package_entry_point(tmp_path):
    bad = tmp_path / "flows.json"
    bad.write_text('{"flows": [')
    for argv, needle in ((["--fabric", "ft", "--flows", str(bad)], "is not valid JSON"),
                         (["--fabric", "fat-tree", "--flows", str(FLOWS)], "invalid choice: 'fat-tree'")):
        proc = subprocess.run([sys.executable, "-m", "orchestrl.agents.cli", "sim", "net", "--gpus", "64", *argv], cwd=REPO,
                              capture_output=True, text=True, timeout=240)
        assert proc.returncode == 2 and needle in proc.stderr and "Traceback" not in proc.stderr
        assert proc.stdout == ""


def test_figure_reports_progress_per_configuration():
    env = {**os.environ, "ORCHESTRL_PROGRESS_AFTER_S": "0"}
    proc = subprocess.run([sys.executable, "-m", "orchestrl.agents.cli", "sim", "figure", "fig23", "--quick", "--json"],
                          cwd=REPO, capture_output=True, text=True, timeout=240, env=env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["figure"] == "fig23"
    assert "fig23 EP64_DP2_1GB done" in proc.stderr and "fig23 TP4_CP8_DP4_1GB done" in proc.stderr
