"""Run files: defaults that document themselves, bundled examples, and field-level refusals."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import pytest

from orchestrl.fabric.errors import ConfigError
from orchestrl.sim.config import RunConfig, config_from_mapping, config_reference, load_run_config

REPO = Path(__file__).resolve().parents[2]
EXAMPLES = sorted((REPO / "examples" / "sim").glob("*.yaml"))


def test_every_bundled_example_loads_and_the_paper_settings_are_there():
    names = {load_run_config(p).name: load_run_config(p) for p in EXAMPLES}
    assert {"demo-64gpu", "fig13-qwen72b-2048", "fig13-qwen57b-moe-2048", "fig17-qwen235b-2048"} <= set(names)
    demo = names["demo-64gpu"]
    assert demo.cluster.gpus == 64 and demo.fabric.kind == "rfabric"
    assert Path(demo.resolve(demo.fabric.topology)).exists()  # relative to the run file, not the cwd
    big = names["fig13-qwen72b-2048"]
    lay = big.train_layout(big.cluster.train_gpus)
    assert (lay.tp, lay.pp, lay.cp) == (8, 2, 3)  # Appendix C


def test_every_field_has_a_default_and_a_help_text_in_the_reference():
    ref = config_reference()
    top = RunConfig()
    for f in fields(RunConfig):
        if f.metadata.get("internal"):
            continue
        section = getattr(top, f.name)
        subs = fields(section) if hasattr(section, "__dataclass_fields__") else ()
        for g in subs or (f,):
            path = f"{f.name}.{g.name}" if subs else f.name
            assert g.metadata["help"], path
            assert f"`{path}`" in ref
    assert config_from_mapping({}) == RunConfig()  # an empty file is the defaults


def test_a_config_survives_its_own_json():
    cfg = load_run_config(REPO / "examples" / "sim" / "fig13-qwen57b-moe-2048.yaml")
    assert config_from_mapping(cfg.to_json(), "again.yaml") == cfg


@pytest.mark.parametrize("doc, field, says", [
    ({"fabric": {"kind": "fattree"}}, "fabric.kind", "allowed: ft, ft-os, ro, topoopt, mixnet, rfabric"),
    ({"fabric": {"link_gbps": 300}}, "fabric.link_gbps", "allowed: 100, 200, 400, 800"),
    ({"fabric": {"ocs": "mems"}}, "fabric.ocs", "allowed: rotor, mems-3d, piezo, liquid-crystal, robotic"),
    ({"loop": {"mode": "async2"}}, "loop.mode", "allowed: sync, async"),
    ({"loop": {"iterations": 0}}, "loop.iterations", "out of range"),
    ({"loop": {"itrations": 3}}, "loop.itrations", "is not a known field"),
    ({"loop": {"seed": "one"}}, "loop.seed", "expected an integer"),
    ({"generation": {"policy": "vllm"}}, "generation.policy", "allowed: orchestrl, orchestrl-pp"),
    ({"generation": {"policy": "static"}}, "generation.instance", "needs an instance shape"),
    ({"generation": {"policy": "static", "instance": "afd24:16-tpx"}}, "generation.instance",
     "is not an instance shape"),
    ({"cluster": {"gpus": 64, "train_gpus": 32}, "model": "Qwen2-57B-A14B", "train": {"tp": 4, "ep": 8},
      "generation": {"policy": "static", "instance": "afd24:16-tp8", "weight_sync_tp": 4}}, "generation.instance",
     "needs 40 GPUs, the run generates on 32"),
    ({"generation": {"policy": "static", "instance": "tp1"}, "model": "Qwen2.5-72B"}, "generation.instance",
     "does not fit tp1"),
    ({"generation": {"policy": "two-phase", "instance": "tp2"}}, "generation.switch_to", "needs the shape"),
    ({"generation": {"policy": "orchestrl", "switch_to": "tp8"}}, "generation.switch_to",
     "only read by policy 'two-phase'"),
    ({"clusters": {"gpus": 64}}, "clusters", "is not a known field"),
    ({"cluster": {"gpus": 100}}, "cluster.gpus", "8-GPU servers"),
    ({"cluster": {"gpus": 64, "train_gpus": 64}}, "cluster.train_gpus", "leaving GPUs to generate"),
    ({"cluster": {"gpus": 64, "train_gpus": 24}, "train": {"tp": 8, "pp": 2}}, "cluster.train_gpus",
     "multiple of tp*cp*pp = 16"),
    ({"cluster": {"gpus": 512, "train_gpus": 256}, "model": "Qwen2-57B-A14B", "train": {"tp": 4, "ep": 128}},
     "train.ep", "does not divide the world size"),
    ({"cluster": {"gpus": 384}}, "cluster.gpus", "set fabric.topology"),
    ({"cluster": {"gpus": 128}, "fabric": {"topology": "../../examples/topology-64gpu-h800.yaml"}},
     "fabric.topology", "has 64 GPUs"),
    ({"fabric": {"topology": "missing.yaml"}}, "fabric.topology", "does not exist"),
    ({"model": "gpt-5"}, "model", "Qwen2.5-72B"),
    ({"cluster": {"gpu": "B200"}}, "cluster.gpu", "H800"),
    ({"workload": {"trace": "nope.json"}}, "workload.trace", "does not exist"),
    ({"workload": {"drift_per_step": 2.0}}, "workload.drift_per_step", "out of range"),
    ({"generation": {"weight_sync_tp": 3}}, "generation.weight_sync_tp", "KV heads"),
    ({"cluster": {"gpus": 64, "train_gpus": 48}, "generation": {"weight_sync_tp": 32}}, "generation.weight_sync_tp",
     "does not divide the 16 generation GPUs"),
])
def test_bad_fields_are_refused_with_the_file_the_field_and_the_fix(doc, field, says):
    source = str(REPO / "tests" / "sim" / "bad.yaml")
    with pytest.raises(ConfigError) as err:
        config_from_mapping(doc, source)
    assert err.value.field == field
    assert str(err.value).startswith(f"{source}: field '{field}': ") and says in str(err.value)


def test_a_missing_or_broken_file_is_refused(tmp_path):
    with pytest.raises(ConfigError, match="file does not exist"):
        load_run_config(tmp_path / "none.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("loop: [1, 2\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_run_config(bad)


def test_switching_fabric_keeps_the_run_and_revalidates():
    demo = load_run_config(REPO / "examples" / "sim" / "demo-64gpu.yaml")
    ft = demo.with_fabric("ft")
    assert ft.fabric.kind == "ft" and ft.cluster == demo.cluster and ft.workload == demo.workload
    with pytest.raises(ConfigError, match="field 'fabric.kind': unknown value 'clos'"):
        demo.with_fabric("clos")


def test_static_afd_generation_is_expressible_in_a_run_file(tmp_path):
    """§7.3.2's AFD shape as a run file's static policy: every generation GPU in 24+16-GPU AFD instances."""
    from orchestrl.sim.run import build

    doc = {"model": "Qwen2-57B-A14B", "cluster": {"gpus": 256, "train_gpus": 128},
           "fabric": {"kind": "rfabric"}, "train": {"tp": 4, "ep": 16},
           "generation": {"policy": "static", "instance": "afd24:16-tp8", "weight_sync_tp": 4},
           "workload": {"prompts_per_step": 16, "max_tokens": 4096}, "loop": {"iterations": 1}}
    sim = build(config_from_mapping(doc, str(tmp_path / "afd.yaml")))
    result = sim.stages.gen.run(sim.trace(0), 0.0)
    assert result.time_s > 0
    assert "afd24:16-tp8" in result.detail["initial_layout"] and "3x" in result.detail["initial_layout"]
