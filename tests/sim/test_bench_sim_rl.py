"""bench/sim_rl.py's measurement (quick scale): cold vs warm iteration and where the CPU time goes."""

from __future__ import annotations

import importlib.util
import json
import pathlib

REPO = pathlib.Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_sim_rl", REPO / "bench" / "sim_rl.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_a_warm_iteration_reuses_the_weight_sync_plan_and_the_parts_add_up(capsys):
    assert _bench().main(["--quick", "--json"]) == 0
    doc = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    it = doc["sections"]["iteration"]
    assert it["gpus"] == 256 and it["target_cold_s"] == 60.0 and it["target_warm_s"] == 15.0
    cold, warm = it["rows"]
    assert (cold["run"], warm["run"]) == ("cold", "warm") and cold["requests"] == warm["requests"] == 2048
    # the weight-sync plan is made once per layout: the cold iteration plans, the warm one reuses it
    assert cold["parts_cpu_s"]["weight-sync planner"] > 0 and warm["parts_cpu_s"].get("weight-sync planner", 0) == 0
    for r in (cold, warm):
        assert r["parts_cpu_s"]["gen planner"] > 0 and r["parts_cpu_s"]["gen engine"] > 0
        assert r["parts_cpu_s"]["other"] >= -0.05  # the parts never claim more than the process used
        assert all(t > 0 for t in r["simulated_s"].values())


def test_the_growth_exponent_line_says_when_one_size_gives_nothing_to_fit():
    bench = _bench()
    # --sizes 2048: one point per run, so neither fit exists
    assert bench.exponent_line({"cold": None, "warm": None}).endswith(
        "fitted exponent of CPU seconds against GPUs: (needs two or more --sizes)")
    assert bench.exponent_line({"cold": 1.234, "warm": None}).endswith("against GPUs: cold 1.23")
    assert bench._exponent([{"gpus": 2048, "run": "cold", "cpu_s": 50.0}], "cold") is None
