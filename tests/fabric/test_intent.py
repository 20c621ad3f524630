"""Intent descriptors: loading the YAML format, refusing bad input, and the cache signature."""

from __future__ import annotations

import copy
import glob
import math
import os

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrl.fabric.errors import ConfigError
from orchestrl.fabric.intent import (PRIMITIVES, Collective, Intent, intent_from_mapping, load_intent,
                           parse_gpu_set)
from orchestrl.fabric.topology import load_topology

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
EXAMPLES = os.path.join(ROOT, "examples")


@pytest.fixture(scope="module")
def small():
    return load_topology(os.path.join(EXAMPLES, "topology-64gpu-h800.yaml"))


@pytest.fixture(scope="module")
def big():
    return load_topology(os.path.join(EXAMPLES, "topology-2048gpu.yaml"))


def _doc(**overrides):
    doc = {
        "job": "rl-job-1",
        "stage": "train",
        "period": "fwd-bwd",
        "layout": {"tp": 4, "ep": 4, "dp": 4, "pp": 2, "gpus": "0-31"},
        "collectives": [
            {"primitive": "all-to-all", "over": "ep", "bytes_per_rank": 2.0e9},
            {"primitive": "p2p", "over": "pp", "bytes_per_rank": 5.0e8},
        ],
    }
    doc.update(overrides)
    return doc


# -- the example files ------------------------------------------------------------------------


def test_every_example_intent_loads_against_its_topology(small, big):
    paths = sorted(glob.glob(os.path.join(EXAMPLES, "intents", "*.yaml")))
    names = {os.path.basename(p) for p in paths}
    assert {"train-fwd-bwd.yaml", "train-grad-sync.yaml", "train-dp-cross-pod.yaml", "weight-sync.yaml",
            "gen.yaml", "large-train-dp.yaml"} <= names
    stages = set()
    for path in paths:
        topo = big if os.path.basename(path).startswith("large-") else small
        intent = load_intent(path, topo)
        stages.add(intent.stage)
        assert math.isclose(sum(intent.primitive_mix.values()), 1.0)
        assert max(intent.members) < topo.gpu_count
    assert stages == {"train", "train-dp", "gen", "weight-sync"}


def test_example_fwd_bwd_groups_follow_megatron(small):
    intent = load_intent(os.path.join(EXAMPLES, "intents", "train-fwd-bwd.yaml"), small)
    by_label = {c.label: c for c in intent.collectives}
    assert by_label["ep"].groups[0] == (0, 4, 8, 12)
    assert by_label["tp"].groups[:2] == ((0, 1, 2, 3), (4, 5, 6, 7))
    assert by_label["pp"].groups[0] == (0, 16)


# -- the format -------------------------------------------------------------------------------


def test_explicit_groups_and_bipartite_fields(small):
    doc = _doc(layout=None, stage="gen", collectives=[
        {"primitive": "all-reduce", "groups": [[0, 8, 16, 24], "1-3"], "bytes_per_rank": 1e9},
        {"primitive": "m2n", "src_gpus": "32-47", "dst_gpus": [48, 49], "bytes_per_rank": 1e8},
        {"primitive": "weight-sync", "train_gpus": "0-31", "gen_gpus": "32-63", "model_bytes": 2.9e10},
        {"primitive": "response-stream", "gen_gpus": "32-63", "train_gpus": "0-31", "bytes_per_rank": 4e6},
    ])
    intent = intent_from_mapping(doc, "x.yaml", small)
    ar, m2n, ws, rs = intent.collectives
    assert ar.groups == ((0, 8, 16, 24), (1, 2, 3))
    assert (m2n.src_gpus[0], m2n.dst_gpus) == (32, (48, 49))
    assert (ws.src_gpus, ws.dst_gpus, ws.bytes_per_rank) == (tuple(range(32)), tuple(range(32, 64)), 2.9e10)
    assert (rs.src_gpus[0], rs.dst_gpus[-1]) == (32, 31)  # gen -> train
    assert intent.period == "fwd-bwd" and intent.template is None


def test_yaml_exponent_without_sign_is_accepted(tmp_path, small):
    # PyYAML (YAML 1.1) reads 2.0e9 as a string; users write it that way anyway.
    path = tmp_path / "i.yaml"
    path.write_text("job: j\nstage: train-dp\ncollectives:\n"
                    "  - {primitive: all-reduce, groups: [[0, 8]], bytes_per_rank: 2.0e9}\n")
    intent = load_intent(path, small)
    assert intent.collectives[0].bytes_per_rank == 2.0e9
    assert intent.period == "train-dp"  # defaults to the stage


def test_parse_gpu_set_forms():
    assert parse_gpu_set("0-2, 8,10-11", "f", "g") == (0, 1, 2, 8, 10, 11)
    assert parse_gpu_set([3, 1], "f", "g") == (3, 1)
    assert parse_gpu_set(7, "f", "g") == (7,)


# -- refusals name the file and field ---------------------------------------------------------


@pytest.mark.parametrize("overrides, field, words", [
    ({"stagee": "train"}, "stagee", "not a known field"),
    ({"stage": "rollout"}, "stage", "unknown value"),
    ({"job": ""}, "job", "empty"),
    ({"collectives": []}, "collectives", "empty"),
    ({"collectives": [{"primitive": "all-to-all", "over": "ep", "byte_per_rank": 1}]},
     "collectives[0].byte_per_rank", "not a known field"),
    ({"collectives": [{"primitive": "broadcast", "over": "ep", "bytes_per_rank": 1}]},
     "collectives[0].primitive", "unknown value"),
    ({"collectives": [{"primitive": "all-to-all", "over": "xp", "bytes_per_rank": 1}]},
     "collectives[0].over", "unknown value"),
    ({"collectives": [{"primitive": "all-to-all", "bytes_per_rank": 1}]}, "collectives[0].over", "exactly one"),
    ({"collectives": [{"primitive": "all-to-all", "over": "ep", "groups": [[0, 1]], "bytes_per_rank": 1}]},
     "collectives[0].over", "exactly one"),
    ({"layout": None, "collectives": [{"primitive": "all-to-all", "over": "ep", "bytes_per_rank": 1}]},
     "collectives[0].over", "layout"),
    ({"collectives": [{"primitive": "all-reduce", "groups": [[0, 64]], "bytes_per_rank": 1}]},
     "collectives[0].groups[0]", "outside the topology"),
    ({"collectives": [{"primitive": "all-reduce", "groups": [[0, 0]], "bytes_per_rank": 1}]},
     "collectives[0].groups[0]", "twice"),
    ({"collectives": [{"primitive": "all-reduce", "groups": [[0, 1]], "bytes_per_rank": -5}]},
     "collectives[0].bytes_per_rank", "out of range"),
    ({"collectives": [{"primitive": "all-reduce", "groups": [[0, 1]], "bytes_per_rank": "lots"}]},
     "collectives[0].bytes_per_rank", "number of bytes"),
    ({"collectives": [{"primitive": "m2n", "src_gpus": "0-3", "dst_gpus": "3-5", "bytes_per_rank": 1}]},
     "collectives[0].dst_gpus", "overlaps"),
    ({"collectives": [{"primitive": "weight-sync", "train_gpus": "0-31", "gen_gpus": "32-63"}]},
     "collectives[0].model_bytes", "required"),
    ({"collectives": [{"primitive": "weight-sync", "train_gpus": "0-31", "gen_gpus": "32-63",
                       "model_bytes": 1, "bytes_per_rank": 1}]}, "collectives[0].bytes_per_rank", "not a known"),
    ({"collectives": [{"primitive": "response-stream", "gen_gpus": "40-31", "train_gpus": "0",
                       "bytes_per_rank": 1}]}, "collectives[0].gen_gpus", "backwards"),
    ({"layout": {"tp": 4, "ep": 3, "dp": 4, "pp": 2, "gpus": "0-31"}}, "layout.ep", "does not divide"),
    ({"layout": {"tp": 4, "dp": 4, "pp": 2, "order": "tp-dp", "gpus": "0-31"}}, "layout.order", "missing"),
    ({"layout": {"tp": 4, "ep": 4, "dp": 4, "pp": 2, "gpus": "0-30"}}, "layout.gpus", "31 GPUs"),
    ({"layout": {"tp": 4, "ep": 4, "dp": 4, "pp": 2, "gpus": "40-71"}}, "layout.gpus", "outside"),
    ({"layout": {"tp": 4, "ep": 4, "dp": 4, "pp": 2, "gpu": "0-31"}}, "layout.gpu", "not a known field"),
])
def test_bad_intent_is_refused_naming_file_and_field(small, overrides, field, words):
    with pytest.raises(ConfigError) as err:
        intent_from_mapping(_doc(**overrides), "bad-intent.yaml", small)
    assert err.value.source == "bad-intent.yaml"
    assert err.value.field == field
    assert words in str(err.value)


def test_missing_file_is_a_config_error(tmp_path, small):
    with pytest.raises(ConfigError, match="does not exist"):
        load_intent(tmp_path / "nope.yaml", small)


def test_programmatic_collectives_are_validated():
    with pytest.raises(ConfigError, match="unknown primitive"):
        Collective("broadcast", groups=((0, 1),))
    with pytest.raises(ConfigError, match="at least one group"):
        Collective("all-reduce")
    with pytest.raises(ConfigError, match="bipartite"):
        Collective("m2n", groups=((0, 1),), src_gpus=(0,), dst_gpus=(1,))
    with pytest.raises(ConfigError, match="only weight-sync"):
        Collective("m2n", src_gpus=(0,), dst_gpus=(1,), transfers=((0, 1, 1.0),))
    with pytest.raises(ConfigError, match="stage"):
        Intent("decode", "j", "p", (Collective("p2p", ((0, 1),)),))


# -- primitive mix ----------------------------------------------------------------------------


def test_primitive_mix_is_the_share_of_closed_form_bytes():
    ar = Collective("all-reduce", groups=((0, 1, 2, 3),), bytes_per_rank=1.0)  # 2*3*1 = 6
    a2a = Collective("all-to-all", groups=((0, 1), (2, 3)), bytes_per_rank=2.0)  # 2 * 1*2 = 4
    intent = Intent("train", "j", "p", (ar, a2a))
    assert intent.primitive_mix == pytest.approx({"all-reduce": 0.6, "all-to-all": 0.4})
    assert Intent("train", "j", "p", (Collective("p2p", ((0, 1),), 0.0),)).primitive_mix == {"p2p": 0.0}


# -- signature --------------------------------------------------------------------------------


def test_signature_ignores_volumes_and_concrete_gpus(small):
    base = intent_from_mapping(_doc(), "a", small).signature()
    bigger = copy.deepcopy(_doc())
    for c in bigger["collectives"]:
        c["bytes_per_rank"] *= 7.5
    assert intent_from_mapping(bigger, "b", small).signature() == base
    moved = _doc(layout={"tp": 4, "ep": 4, "dp": 4, "pp": 2, "gpus": "32-63"})  # the job moved PoDs
    assert intent_from_mapping(moved, "c", small).signature() == base
    reordered = _doc(collectives=list(reversed(_doc()["collectives"])))
    assert intent_from_mapping(reordered, "d", small).signature() == base
    relabelled = _doc(job="other-job", period="iter-7")
    assert intent_from_mapping(relabelled, "e", small).signature() == base


def test_signature_changes_with_stage_primitive_shape_and_template(small):
    base = intent_from_mapping(_doc(), "a", small).signature()
    variants = [
        _doc(stage="train-dp"),
        _doc(template="train-dp"),
        _doc(collectives=[{"primitive": "all-gather", "over": "ep", "bytes_per_rank": 1.0},
                          {"primitive": "p2p", "over": "pp", "bytes_per_rank": 1.0}]),
        _doc(layout={"tp": 2, "ep": 8, "dp": 8, "pp": 2, "gpus": "0-31"}),  # EP groups of 8, not 4
        _doc(collectives=_doc()["collectives"][:1]),
    ]
    sigs = {intent_from_mapping(v, "v", small).signature() for v in variants}
    assert base not in sigs and len(sigs) == len(variants)


@settings(max_examples=40, deadline=None)
@given(st.permutations(range(64)), st.floats(min_value=1e-3, max_value=1e3), st.sampled_from(PRIMITIVES))
def test_signature_is_invariant_under_relabelling_gpus_and_scaling_bytes(perm, scale, primitive):
    def build(relabel, s):
        if primitive in ("m2n", "weight-sync", "response-stream"):
            c = Collective(primitive, src_gpus=tuple(relabel(g) for g in range(8)),
                           dst_gpus=tuple(relabel(g) for g in range(8, 12)), bytes_per_rank=s)
        else:
            c = Collective(primitive, groups=tuple(tuple(relabel(g) for g in range(k, k + 4)) for k in (0, 4, 8)),
                           bytes_per_rank=s)
        return Intent("gen", "j", "p", (c,))

    assert build(lambda g: g, 1.0).signature() == build(lambda g: perm[g], scale).signature()


def test_an_empty_or_huge_job_name_and_astronomical_bytes_are_refused_naming_the_field():
    import pytest as _pytest

    from orchestrl.fabric.errors import ConfigError
    from orchestrl.fabric.intent import intent_from_mapping
    from orchestrl.fabric.topology import load_topology
    from pathlib import Path

    topo = load_topology(Path(__file__).resolve().parents[2] / "examples" / "topology-64gpu-h800.yaml")
    base = {"stage": "train", "collectives": [{"primitive": "all-reduce", "groups": [[0, 1]], "bytes_per_rank": 1e9}]}
    for job, why in (("", "is empty"), ("j" * 100_000, "100000 characters")):
        with _pytest.raises(ConfigError, match=why):
            intent_from_mapping({**base, "job": job}, "i.yaml", topo)
    with _pytest.raises(ConfigError, match="bytes_per_rank"):
        intent_from_mapping({**base, "job": "j", "collectives": [{"primitive": "all-reduce", "groups": [[0, 1]],
                                                                  "bytes_per_rank": 1e300}]}, "i.yaml", topo)
    with _pytest.raises(ConfigError, match="outside fabric"):
        intent_from_mapping({**base, "job": "j", "collectives": [{"primitive": "all-reduce", "groups": ["0-30000000"],
                                                                  "bytes_per_rank": 1e9}]}, "i.yaml", topo)
