"""Seeds and intervals, expressive network inputs, and the optional htsim cross-check."""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from orchestrl.fabric.errors import ConfigError
from orchestrl.sim.experiments.common import Row, aggregate_rows, format_rows, mean_ci, ordering_note, separated
from orchestrl.sim.network.build import build_fabric
from orchestrl.sim.network.config import SimConfig
from orchestrl.sim.network.events import FlowSet
from orchestrl.sim.network.htsim import connection_matrix, find_htsim, htsim_topology, run_htsim
from orchestrl.sim.network.netsim import NetworkSim


def test_rows_over_seeds_carry_mean_and_a_95_percent_interval():
    per_seed = [[Row("a", 1.2, 1.0), Row("b", None, 2.0)], [Row("a", 1.2, 1.2), Row("b", None, 2.1)],
                [Row("a", 1.2, 1.1), Row("b", None, 2.2)]]
    rows = aggregate_rows(per_seed, (0, 1, 2))
    a = rows[0]
    m, lo, hi = mean_ci([1.0, 1.2, 1.1])
    assert a.ours == pytest.approx(1.1) and (a.detail["ci_low"], a.detail["ci_high"]) == (lo, hi)
    assert a.detail["seeds"] == 3 and a.detail["per_seed"] == [1.0, 1.2, 1.1]
    assert "95% interval" in format_rows("t", rows, "x")
    assert separated(rows[0], rows[1]) and "intervals separate" in ordering_note(rows[0], rows[1])
    close = aggregate_rows([[Row("c", None, 1.0)], [Row("c", None, 1.3)]], (0, 1))[0]
    assert not separated(a, close) and "no ordering claimed" in ordering_note(a, close)


def test_oversubscription_mtu_and_same_server_routing_are_inputs():
    perm = FlowSet(np.arange(192), (np.arange(192) + 96) % 192, np.full(192, 1e8), np.zeros(192))
    t = {o: NetworkSim("ft-os", gpus=192, config=SimConfig(oversubscription=o)).time_flows(perm).makespan_s
         for o in (1, 3)}
    assert t[3] > 2.5 * t[1]  # 3:1 leaves: cross-leaf traffic at a third of the rate
    pair = FlowSet([0], [1], [1e9], [0.0])
    nv = NetworkSim("ft", gpus=16).time_flows(pair).makespan_s
    nic = NetworkSim("ft", gpus=16, config=SimConfig(intra_server="network")).time_flows(pair).makespan_s
    assert nic > 5 * nv  # one NIC per host: the pair leaves the server at 200 Gb/s instead of NVLink's 1.6 Tb/s
    hop = {m: NetworkSim("ft", gpus=16, config=SimConfig(mtu_bytes=m)).time_flows(FlowSet([0], [8], [0.0], [0.0]))
           for m in (1500, 9216)}
    assert hop[9216].makespan_s > hop[1500].makespan_s  # store-and-forward of one MTU per hop
    with pytest.raises(ConfigError, match="oversubscription"):
        SimConfig(oversubscription=0)


def test_run_files_take_the_network_knobs():
    from orchestrl.sim.config import config_from_mapping

    cfg = config_from_mapping({"fabric": {"ocs_delay_s": 1.0, "mtu_bytes": 4096, "same_server": "network"}}, "r.yaml")
    assert cfg.fabric.ocs_delay_s == 1.0 and cfg.fabric.mtu_bytes == 4096
    with pytest.raises(ConfigError, match="fabric.ocs_delay_s"):
        config_from_mapping({"fabric": {"ocs_delay_s": -1}}, "r.yaml")


def test_htsim_case_is_written_in_its_formats_and_refused_where_it_cannot_be():
    fab = build_fabric("ft-os", 192, SimConfig(intra_server="network", mtu_bytes=9000))
    topo = htsim_topology(fab, 200)
    assert "Radix_Down 48" in topo and "Oversubscribed 3" in topo and "Tiers 2" in topo
    cm = connection_matrix(FlowSet([0, 5], [9, 100], [1000, 2000], [0.0, 0.0]), 192)
    assert cm.splitlines()[2] == "0->9 id 1 start 0 size 1000"
    with pytest.raises(ConfigError, match="start_s"):
        connection_matrix(FlowSet([0], [9], [1000], [0.5]), 192)
    with pytest.raises(ConfigError, match="unequal bundles|equal leaves"):
        htsim_topology(build_fabric("ft", 200), 200)
    with pytest.raises(ConfigError, match="not a Clos"):
        htsim_topology(build_fabric("topoopt", 64), 200)


@pytest.mark.skipif(find_htsim() is None, reason="no htsim binary (set ORCHESTRL_HTSIM; docs/sim.md)")
def test_a_permutation_through_htsim_is_close_to_the_fluid_model(tmp_path):
    fab = build_fabric("ft", 128, SimConfig(intra_server="network", mtu_bytes=9000))
    rng = np.random.default_rng(1)
    dst = rng.permutation(128)
    dst[dst == np.arange(128)] = (dst[dst == np.arange(128)] + 1) % 128
    flows = FlowSet(np.arange(128), dst, np.full(128, 4e6), np.zeros(128))
    from orchestrl.sim.network.events import simulate

    fluid = simulate(flows, fab.state()).makespan_s
    run = run_htsim(find_htsim(), fab, flows, 200, str(tmp_path))
    assert np.all(np.isfinite(run.finish_s))
    assert -0.15 < fluid / run.makespan_s - 1 < 0.05  # the fluid model is optimistic, by a few per cent here


def test_sim_net_engine_htsim_says_how_to_build_it_when_absent(tmp_path, monkeypatch, capsys):
    from orchestrl.agents.cli import main

    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("ORCHESTRL_HTSIM", raising=False)
    flows = tmp_path / "f.json"
    flows.write_text(json.dumps({"flows": [{"src": 0, "dst": 40, "bytes": 1000000, "start_s": 0.0}]}))
    rc = main(["sim", "net", "--fabric", "ft", "--gpus", "128", "--flows", str(flows), "--engine", "htsim",
               "--same-server", "network"])
    err = capsys.readouterr().err
    assert rc == 2 and "csg-htsim" in err and "--htsim" in err and os.environ["PATH"] == "/nonexistent"
