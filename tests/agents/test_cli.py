"""The ``orchestrl`` command as operators and scripts use it: real subprocesses, real files."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = REPO / "examples"


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "orchestrl.agents.cli", *args], cwd=REPO, input=stdin, text=True,
                          capture_output=True, timeout=240)


@pytest.mark.parametrize("argv", [[], ["fabric"], ["fabric", "plan"], ["fabric", "allocate"], ["demo"]])
def test_help_is_available_everywhere(argv):
    out = run(*argv, "--help")
    assert out.returncode == 0 and "usage: orchestrl" in out.stdout


def test_show_prints_component_counts_of_the_2048_gpu_example():
    out = run("fabric", "show", "--topology", str(EXAMPLES / "topology-2048gpu.yaml"), "--json")
    assert out.returncode == 0, out.stderr
    summary = json.loads(out.stdout)
    assert summary["gpus"] == 2048 and summary["pods"] == 8


def test_allocate_follows_the_json_contract_for_every_method():
    for method in ("greedy", "uniform", "optimal"):
        out = run("fabric", "allocate", "--input", str(EXAMPLES / "allocate-problem.json"), "--method", method)
        assert out.returncode == 0, out.stderr
        doc = json.loads(out.stdout)
        assert set(doc) == {"method", "circuits", "pair_time_s", "max_pair_time_s", "unserved"}
        assert doc["method"] == method
        per_endpoint = {}
        for c in doc["circuits"]:
            for e in (c["a"], c["b"]):
                per_endpoint[e] = per_endpoint.get(e, 0) + c["count"]
        assert max(per_endpoint.values()) <= 4  # every endpoint of the example has 4 ports


def test_allocate_reads_stdin_and_lists_unserved_pairs():
    problem = {"link_bps": 1e9, "endpoints": {"a": 1, "b": 1, "c": 1},
               "demand": [{"src": "a", "dst": "b", "bytes": 5}, {"src": "a", "dst": "c", "bytes": 1}]}
    out = run("fabric", "allocate", "--input", "-", stdin=json.dumps(problem))
    doc = json.loads(out.stdout)
    assert doc["unserved"] == [["a", "c"]]
    assert doc["max_pair_time_s"] == pytest.approx(8 * 5 / 1e9)


def test_bad_input_exits_2_with_file_and_field(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"link_bps": -1, "endpoints": {}, "demand": []}))
    out = run("fabric", "allocate", "--input", str(bad))
    assert out.returncode == 2
    assert "bad.json" in out.stderr and "link_bps" in out.stderr and "Traceback" not in out.stderr

    topo = tmp_path / "t.yaml"
    topo.write_text((EXAMPLES / "topology-64gpu-h800.yaml").read_text().replace("link_gbps: 200", "link_gbps: fast"))
    out = run("fabric", "show", "--topology", str(topo))
    assert out.returncode == 2 and "t.yaml" in out.stderr and "link_gbps" in out.stderr


def test_plan_prints_a_summary_and_full_json():
    args = ("fabric", "plan", "--topology", str(EXAMPLES / "topology-64gpu-h800.yaml"),
            "--intent", str(EXAMPLES / "intents" / "weight-sync.yaml"))
    text = run(*args)
    assert text.returncode == 0, text.stderr
    assert "core  pod0 - pod1" in text.stdout and "port use per device" in text.stdout
    doc = json.loads(run(*args, "--json").stdout)
    assert doc["accepted"] and doc["plan"]["circuits"]


def test_cost_table_lists_every_fabric():
    out = run("fabric", "cost", "--json")
    rows = json.loads(out.stdout)
    assert {r["design"] for r in rows} >= {"fat-tree", "fat-tree-os3", "rfabric", "topoopt", "mixnet"}
    ratio = {(r["design"], r["link_gbps"]): r["network_usd"] for r in rows}
    assert ratio[("rfabric", 400)] < ratio[("fat-tree", 400)]


def test_demo_plans_two_iterations_and_hits_the_cache_on_the_second():
    out = run("demo")
    assert out.returncode == 0, out.stderr
    assert out.stdout.count("cache hit") == 4 and "REFUSED" not in out.stdout
    assert "template cache: 4 entries, 4 hits, 4 misses" in out.stdout
    # Once the gates have seen an iteration, every period commits (or needs no change) at the first
    # window of its granularity, and an intent is never announced after its window has passed.
    assert "REJECT" not in out.stdout and "FAILED" not in out.stdout
    periods = out.stdout.split("=== RL iteration 2 ===")[1].split("--- period")[1:]
    assert len(periods) == 4 and all(re.search(r"(COMMIT|UNCHANGED) +attempt [12] ", p) for p in periods), periods
    assert not re.search(r"\(-[\d.]+ \w+ left", out.stdout)
