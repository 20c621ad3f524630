"""Run files no cluster could execute are refused on load, naming the field to change."""

from __future__ import annotations

import json

import pytest
import yaml

from orchestrl.compute_sched.hardware import load_gpu, load_model
from orchestrl.fabric.errors import ConfigError
from orchestrl.sim.config import config_from_mapping
from orchestrl.sim.feasibility import training_memory
from orchestrl.sim.network.flowfile import load_flows


@pytest.mark.parametrize("doc,field,words", [
    ({"model": "Qwen3-235B-A22B", "cluster": {"gpus": 16, "train_gpus": 8}}, "cluster.train_gpus", "528 GB per GPU"),
    ({"model": "Qwen2.5-72B", "cluster": {"gpus": 16, "train_gpus": 8}}, "cluster.train_gpus", "162 GB per GPU"),
    ({"model": "Qwen3-235B-A22B", "cluster": {"gpus": 16}}, "cluster.gpus", "against 80 GB"),
    ({"generation": {"policy": "static", "instance": "tp16"}}, "generation.instance", "40 query heads"),
    ({"model": "Qwen2.5-72B", "cluster": {"gpus": 256, "train_gpus": 128}, "train": {"tp": 8, "pp": 2},
      "generation": {"policy": "static", "instance": "tp16"}}, "generation.instance", "spans 2 servers"),
    ({"train": {"tp": 3}}, "train.tp", "does not divide"),
    ({"train": {"ep": 2}}, "train.ep", "dense"),
    ({"cluster": {"gpus": 10 ** 9}}, "cluster.gpus", "out of range"),
])
def test_infeasible_runs_are_refused_naming_the_field(doc, field, words):
    with pytest.raises(ConfigError) as err:
        config_from_mapping(doc, "run.yaml")
    assert err.value.field == field and words in str(err.value), str(err.value)


def test_feasible_runs_of_the_examples_still_load():
    for path in ("examples/sim/fig17-qwen235b-2048.yaml", "examples/sim/fig13-qwen72b-2048.yaml",
                 "examples/sim/fig13-qwen57b-moe-2048.yaml", "examples/sim/demo-64gpu.yaml"):
        config_from_mapping(yaml.safe_load(open(path)), path)


def test_training_memory_is_megatrons_count():
    m = training_memory(load_model("Qwen2.5-14B"), load_gpu("H800"), tp=8, cp=1, ep=1, pp=1, dp=4)
    params = (14.7e9 - 2 * 152064 * 5120) / 8 + 152064 * 5120 / 8
    assert m.weights_bytes == pytest.approx(2 * params) and m.grads_bytes == pytest.approx(4 * params)
    assert m.optimizer_bytes == pytest.approx(12 * params / 4) and m.fits


def test_a_gpu_file_with_an_absurd_or_unused_rate_is_refused(tmp_path):
    base = yaml.safe_load(open("compute_sched/specs/gpus/h800.yaml"))
    (tmp_path / "fast.yaml").write_text(yaml.safe_dump({**base, "nic_bps": 1e30}))
    with pytest.raises(ConfigError, match="nic_bps"):
        config_from_mapping({"cluster": {"gpu": "fast.yaml"}}, str(tmp_path / "run.yaml"))
    (tmp_path / "nic400.yaml").write_text(yaml.safe_dump({**base, "name": "H800-400G", "nic_bps": 400e9}))
    with pytest.raises(ConfigError, match="would ignore it") as err:
        config_from_mapping({"cluster": {"gpu": "nic400.yaml"}}, str(tmp_path / "run.yaml"))
    assert err.value.field == "cluster.gpu"
    config_from_mapping({"cluster": {"gpu": "nic400.yaml"}, "fabric": {"link_gbps": 400}}, str(tmp_path / "r.yaml"))


@pytest.mark.parametrize("flow,words", [
    ({"src": 0, "dst": 8, "bytes": 1000, "start_s": 1e300}, "outside 0..86400"),
    ({"src": 0, "dst": 8, "bytes": 1e30, "start_s": 0.0}, r"is over 1e\+15"),
])
def test_flow_times_and_sizes_are_bounded(tmp_path, flow, words):
    path = tmp_path / "f.json"
    path.write_text(json.dumps({"flows": [flow]}))
    with pytest.raises(ConfigError, match=words):
        load_flows(path, 16)
