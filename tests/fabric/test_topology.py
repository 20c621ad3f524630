"""Topology construction from YAML: wiring, placement lookups, masks and refusals of bad files."""

from pathlib import Path

import networkx as nx
import pytest
import yaml

from orchestrl.fabric.errors import ConfigError
from orchestrl.fabric.topology import OCS_TECHNOLOGIES, Topology, load_topology, spec_from_mapping

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _doc(**over):
    doc = {
        "name": "t", "link_gbps": 200, "pods": {"count": 2, "servers": 4},
        "tor": {"servers_per_tor": 2, "rails_per_tor": 2, "uplinks": 4},
        "ocs_agg": {"technology": "mems-3d", "devices_per_pod": 2, "boundary_ports": 8},
        "ocs_core": {"devices": 2},
    }
    for k, v in over.items():
        doc[k] = v
    return doc


def test_table2_technologies_match_the_paper():
    assert OCS_TECHNOLOGIES["rotor"].switch_delay_s == pytest.approx(1e-5)
    assert OCS_TECHNOLOGIES["mems-3d"].radix_ports == 320
    assert OCS_TECHNOLOGIES["piezo"].switch_delay_s == pytest.approx(0.025)
    assert OCS_TECHNOLOGIES["liquid-crystal"].radix_ports == 512
    assert OCS_TECHNOLOGIES["robotic"].switch_delay_s == pytest.approx(120.0)


def test_rail_aligned_placement_and_counts():
    topo = Topology(spec_from_mapping(_doc()))
    # 2 pods x 2 racks x (8 gpus / 2 rails per ToR) = 16 ToRs, each 2 servers x 2 rails = 4 down ports
    assert len(topo.tors) == 16 and topo.gpu_count == 64
    # GPU 0 and 1 are rails 0 and 1 of server 0 -> same ToR; GPU 2 is rail 2 -> next ToR
    assert topo.tor_of_gpu(0) == topo.tor_of_gpu(1) != topo.tor_of_gpu(2)
    # servers 0 and 1 share a rack: same rail of both lands on the same ToR
    assert topo.tor_of_gpu(0) == topo.tor_of_gpu(8)
    assert topo.tor_of_gpu(0) != topo.tor_of_gpu(16)  # server 2 is in rack 1
    assert topo.pod_of_gpu(31) == 0 and topo.pod_of_gpu(32) == 1
    # uplinks striped over the two Agg devices of the PoD
    ups = topo.tors["pod0/tor0"].uplinks
    assert {p.device for p in ups} == {"pod0/agg0", "pod0/agg1"}
    # boundary fibres striped over both core devices, each port used once
    fibres = topo.boundary[0] + topo.boundary[1]
    assert {f.core.device for f in fibres} == {"core0", "core1"}
    assert len({f.core for f in fibres}) == len(fibres) == 16


def test_networkx_export_has_every_link_with_capacity():
    topo = load_topology(EXAMPLES / "topology-64gpu-h800.yaml")
    g = topo.to_networkx()
    assert sum(1 for _, d in g.nodes(data=True) if d["kind"] == "gpu") == 64
    assert nx.is_connected(g)
    # every GPU reaches every other through ToR -> Agg -> Core
    assert nx.has_path(g, "gpu0", "gpu63")
    up = g.edges["pod0/tor0", "pod0/agg0"]
    assert up["count"] == 4 and up["bps"] == pytest.approx(4 * 200e9)


def test_masked_ports_are_not_usable():
    topo = load_topology(EXAMPLES / "topology-64gpu-h800.yaml")
    first = topo.tors["pod0/tor0"].uplinks[0]
    masked = topo.with_masked([(first.device, first.port, "failed")])
    assert first not in masked.usable_uplinks("pod0/tor0")
    assert len(masked.usable_uplinks("pod0/tor0")) == len(topo.usable_uplinks("pod0/tor0")) - 1
    fibre = topo.boundary[1][0]
    masked2 = topo.with_masked([(fibre.core.device, fibre.core.port, "failed")])
    assert fibre not in masked2.usable_boundary(1)


@pytest.mark.parametrize("path", sorted(EXAMPLES.glob("topology-*.yaml")))
def test_example_topologies_load(path):
    topo = load_topology(path)
    assert topo.gpu_count in (64, 2048)


@pytest.mark.parametrize("mutate, field, fix", [
    (lambda d: d.update(link_gbps=-1), "link_gbps", "> 0"),
    (lambda d: d["pods"].update(count="two"), "pods.count", "integer"),
    (lambda d: d["tor"].update(servers_per_tor=3), "tor.servers_per_tor", "divisor of 4"),
    (lambda d: d["ocs_agg"].update(technology="mirrors"), "ocs_agg.technology", "mems-3d"),
    (lambda d: d["ocs_agg"].update(devices_per_pod=1, radix_ports=16), "ocs_agg.devices_per_pod", "devices"),
    (lambda d: d.update(colour="blue"), "colour", "link_gbps"),
    (lambda d: d.update(masked_ports=[{"device": "nope", "port": 1}]), "masked_ports[0].device", "pod0/agg0"),
    (lambda d: d.update(masked_ports=[{"device": "core0", "port": 999}]), "masked_ports[0].port", "1..320"),
])
def test_bad_topology_is_refused_naming_file_field_and_fix(tmp_path, mutate, field, fix):
    doc = _doc()
    mutate(doc)
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError) as err:
        load_topology(path)
    msg = str(err.value)
    assert str(path) in msg and f"'{field}'" in msg and fix in msg


def test_unreadable_and_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_topology(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_topology(bad)
