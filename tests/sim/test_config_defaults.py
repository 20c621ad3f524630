"""Run files: the defaults run, spec files resolve like every other path, and refusals name the cause.

In-process runs swap the training and generation stage models for the TEST FIXTURES of
``tests/sim/stage_fixtures.py`` (fabric, controller, weight sync, split search and cost are real):
what is under test is the run file, not the stage models.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

import orchestrl.sim.run

from orchestrl import sim
from orchestrl.agents.cli import main
from orchestrl.compute_sched.hardware import SPECS_DIR
from orchestrl.fabric.errors import ConfigError
from orchestrl.fabric.cost import network_cost
from orchestrl.sim.config import config_from_mapping, load_run_config
from orchestrl.sim.run import balanced_split, build
from tests.sim.stage_fixtures import fixture_stages

REPO = Path(__file__).resolve().parents[2]
QWEN14B = SPECS_DIR / "models" / "qwen2.5-14b.yaml"
ONE_POD_64 = """name: one-pod-64
link_gbps: 200
pods: {count: 1, servers: 8}
tor: {servers_per_tor: 8, uplinks: 8}
ocs_agg: {technology: mems-3d, devices_per_pod: 1}
ocs_core: {technology: mems-3d, devices: 1}
"""


@pytest.fixture
def fixtures(monkeypatch):
    monkeypatch.setattr(sim.run, "default_stages", fixture_stages)


def _write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# ------------------------------------------------------------------ defaults


def test_a_run_file_with_only_a_name_runs_on_two_pods(fixtures, tmp_path, capsys):
    """The defaults (64 GPUs, RFabric) run: the default RFabric has two PoDs, so the split is one each."""
    run = _write(tmp_path / "x.yaml", "name: x\n")
    assert main(["sim", "run", str(run), "--iterations", "2"]) == 0
    line = capsys.readouterr().out.strip()
    assert line.startswith("x: Qwen2.5-14B on rfabric 64 GPUs (32 train / 32 gen)") and "samples/s" in line


def test_the_default_rfabric_below_one_pod_is_two_pods_and_is_what_is_priced():
    cfg = config_from_mapping({"cluster": {"train_gpus": 32}}, "x.yaml")
    sim_ = build(cfg, stages_factory=fixture_stages)
    spec = sim_.topology.spec
    assert (spec.pods, spec.servers_per_pod, spec.boundary_ports_per_pod) == (2, 4, 16)  # as the §6 testbed
    assert sim_.cost.network_usd == pytest.approx(network_cost("rfabric", 64, 200, rfabric_spec=spec).network_usd)


def test_the_default_rfabric_of_full_pods_is_the_cost_models():
    """At and above one full PoD (256 GPUs) the default is the cost model's, PoDs of 32 servers."""
    from orchestrl.fabric.cost import default_rfabric_spec

    for gpus in (256, 2048):
        cfg = config_from_mapping({"cluster": {"gpus": gpus, "train_gpus": gpus // 2}}, "x.yaml")
        assert cfg.rfabric_spec() == default_rfabric_spec(gpus)


def test_a_single_pod_names_the_pod_as_the_reason_there_is_no_split(tmp_path):
    cfg = config_from_mapping({"cluster": {"gpus": 256}}, str(tmp_path / "x.yaml"))
    with pytest.raises(ConfigError) as err:
        balanced_split(cfg, fixture_stages)
    assert err.value.field == "cluster.gpus"
    assert "RFabric with 256 GPUs per PoD makes the cluster a single PoD; splits are whole PoDs" in str(err.value)
    assert "512 or more GPUs in whole PoDs of 256" in err.value.allowed
    assert "cluster.train_gpus" in err.value.allowed and "fabric.topology" in err.value.allowed
    shared = config_from_mapping({"cluster": {"gpus": 256, "train_gpus": 128}}, str(tmp_path / "x.yaml"))
    assert build(shared, stages_factory=fixture_stages).topology.spec.pods == 1  # the fix it offers works
    topo = _write(tmp_path / "one-pod.yaml", ONE_POD_64)
    cfg = config_from_mapping({"fabric": {"topology": topo.name}}, str(tmp_path / "x.yaml"))
    with pytest.raises(ConfigError, match="field 'fabric.topology': RFabric with 64 GPUs per PoD makes"):
        balanced_split(cfg, fixture_stages)


def test_a_layout_too_large_for_the_cluster_names_its_unit():
    cfg = config_from_mapping({"fabric": {"kind": "ft"}, "train": {"tp": 8, "pp": 8}}, "x.yaml")
    with pytest.raises(ConfigError) as err:
        balanced_split(cfg, fixture_stages)
    assert err.value.field == "cluster.gpus" and "tp*cp*pp = 64" in err.value.problem


def test_a_split_every_candidate_refuses_reports_that_refusal_not_no_split():
    """weight_sync_tp 64 divides none of the candidates' generation GPUs: say so, naming that field."""
    cfg = config_from_mapping({"fabric": {"kind": "ft"}, "generation": {"weight_sync_tp": 64}}, "x.yaml")
    with pytest.raises(ConfigError) as err:
        balanced_split(cfg, fixture_stages)
    assert err.value.field == "generation.weight_sync_tp" and "does not divide" in err.value.problem


def test_a_bad_trace_file_is_refused_at_load_time_with_its_own_field(tmp_path):
    trace = _write(tmp_path / "t.json", '{"name": "t", "max_tokens": 100, "requests": [], "bogus": 1}')
    with pytest.raises(ConfigError) as err:
        config_from_mapping({"workload": {"trace": trace.name}}, str(tmp_path / "x.yaml"))
    assert err.value.source == str(trace) and err.value.field == "bogus"


def test_a_bad_rank_order_is_refused_at_load_time_even_without_a_split():
    with pytest.raises(ConfigError, match="field 'train.order': unknown dimension 'xx'"):
        config_from_mapping({"train": {"order": "tp-xx-dp"}}, "x.yaml")


# ------------------------------------------------------------------ model and GPU files


def test_an_invalid_model_file_reports_its_own_field_not_that_it_is_missing(tmp_path):
    bad = _write(tmp_path / "bad.yaml", QWEN14B.read_text().replace("kv_heads: 8", "kv_heads: 7"))
    with pytest.raises(ConfigError) as err:
        config_from_mapping({"model": str(bad)}, str(tmp_path / "run.yaml"))
    assert err.value.source == str(bad) and err.value.field == "kv_heads" and "neither" not in str(err.value)
    gpu = _write(tmp_path / "gpu.yaml", "name: G\nhbm_bytes: -1\n")
    with pytest.raises(ConfigError) as err:
        config_from_mapping({"cluster": {"gpu": str(gpu)}}, str(tmp_path / "run.yaml"))
    assert err.value.source == str(gpu) and err.value.field == "hbm_bytes"


def test_only_a_name_that_is_neither_a_file_nor_bundled_gets_the_neither_error(tmp_path):
    with pytest.raises(ConfigError) as err:
        config_from_mapping({"model": "gpt-5"}, str(tmp_path / "run.yaml"))
    assert err.value.field == "model" and "neither" in err.value.problem
    assert str(tmp_path / "gpt-5") in err.value.problem and all(m in err.value.allowed for m in ("Qwen2.5-72B", "Qwen3-235B-A22B"))
    assert config_from_mapping({"model": "qwen2.5_72b"}, str(tmp_path / "run.yaml")).model_spec().name == "Qwen2.5-72B"


def test_model_and_gpu_files_resolve_against_the_run_file_not_the_cwd(tmp_path, monkeypatch):
    _write(tmp_path / "runs" / "specs" / "mine.yaml", QWEN14B.read_text().replace("name: Qwen2.5-14B", "name: Mine-14B"))
    shutil.copy(SPECS_DIR / "gpus" / "h800.yaml", tmp_path / "runs" / "specs" / "gpu.yaml")
    run = _write(tmp_path / "runs" / "run.yaml", "name: r\nmodel: specs/mine.yaml\ncluster: {gpu: specs/gpu.yaml}\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    cfg = load_run_config(run)
    assert cfg.model_spec().name == "Mine-14B" and cfg.gpu_spec().name == "H800"
    assert build(cfg, train_gpus=32, stages_factory=fixture_stages).model.name == "Mine-14B"
    # a path that exists relative to the cwd but not to the run file is not picked up
    monkeypatch.chdir(tmp_path / "runs")
    _write(tmp_path / "runs" / "sub" / "run.yaml", "name: r\nmodel: specs/mine.yaml\n")
    with pytest.raises(ConfigError, match="field 'model': 'specs/mine.yaml' is neither"):
        load_run_config(tmp_path / "runs" / "sub" / "run.yaml")
    # absolute paths are taken as they are
    absolute = _write(tmp_path / "abs" / "run.yaml", f"name: r\nmodel: {tmp_path / 'runs' / 'specs' / 'mine.yaml'}\n")
    assert load_run_config(absolute).model_spec().name == "Mine-14B"


# ------------------------------------------------------------------ sanity bounds


@pytest.mark.parametrize("doc, field", [
    ({"workload": {"prompts_per_step": 10**9}}, "workload.prompts_per_step"),
    ({"workload": {"prompts_per_step": 2049, "responses_per_prompt": 8}}, "workload.prompts_per_step"),
    ({"workload": {"responses_per_prompt": 10**6}}, "workload.responses_per_prompt"),
])
def test_a_step_past_the_sanity_bound_is_refused_before_it_runs_for_hours(doc, field):
    with pytest.raises(ConfigError) as err:
        config_from_mapping(doc, "x.yaml")
    assert err.value.field == field and "256 per GPU of the 64-GPU cluster, a sanity bound" in err.value.problem
    assert "16,384" in err.value.allowed
    assert config_from_mapping({"workload": {"prompts_per_step": 2048}}, "x.yaml")  # 16,384 responses: at the bound


def test_generation_length_is_capped_at_the_models_longest_context():
    with pytest.raises(ConfigError, match="field 'workload.max_tokens': value 1000000 is out of range"):
        config_from_mapping({"workload": {"max_tokens": 10**6}}, "x.yaml")
