"""RollArt's cross-cluster weight copies announced to a real control proxy (over emulated switches) as
``weight-sync`` intents, like any other job's; and the run file's ``fabric`` section refused field by field."""

from __future__ import annotations

import asyncio

import httpx
import pytest
import yaml

from orchestrl.agents.agentic.config import load_run
from orchestrl.agents.agentic.session import run_config
from orchestrl.fabric.errors import ConfigError
from tests.agents.conftest import EXAMPLES, TOPOLOGY_64

EXAMPLE = EXAMPLES / "agentic" / "frozenlake-math.yaml"


def _run_file(tmp_path, fabric, **rollout):
    doc = yaml.safe_load(EXAMPLE.read_text())
    doc["rollout"].update({"iterations": 2, "batch_groups": 1, "train_step_s": 0.05, **rollout})
    doc["fabric"] = fabric
    path = tmp_path / "run.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_each_cross_cluster_copy_reaches_the_control_proxy_as_a_weight_sync_intent(tmp_path, monkeypatch):
    from orchestrl.agents.lab import EmulatedFabric
    with EmulatedFabric(TOPOLOGY_64, tmp_path / "lab", profile="test") as lab:
        lab.start_switches()
        proxy = lab.start_proxy()
        job = httpx.post(proxy.url + "/v1/jobs", json={"job": "agentic-rl", "gpus": "0-63"},
                         headers={"Authorization": f"Bearer {lab.operator_token}"}, timeout=30).json()
        monkeypatch.setenv("ORCHESTRL_JOB_TOKEN", job["token"])
        path = _run_file(tmp_path, {"proxy_url": proxy.url, "job": "agentic-rl", "train_gpus": "0-31",
                                    "gen_gpus": "32-63"})
        summary = asyncio.run(run_config(load_run(path)))
        rows = httpx.get(proxy.url + "/v1/decisions", params={"job": "agentic-rl", "limit": 50},
                         headers={"Authorization": f"Bearer {job['token']}"}, timeout=30).json()["decisions"]
    fab = summary["fabric"]
    assert fab["intents_announced"] >= 2  # one copy per published version
    assert fab["intents_answered"] == fab["intents_announced"] and fab["errors"] == 0, fab
    assert {r["template"] for r in rows} == {"weight-sync"}
    # the first intent is deferred (no weight-sync-begin yet), then committed inside the window the copy's
    # marker opened; later copies find the circuits standing
    d = fab["decisions"]
    assert d[0] == "defer" and "commit" in d, d
    assert set(d[d.index("commit") + 1:]) <= {"unchanged", "commit"}, d
    commit = next(r for r in rows if r["decision"] == "commit")
    assert "after weight-sync-begin" in commit["reason"] and commit["window_s"] > 0, commit
    assert fab["events_sent"] >= 3 * fab["intents_announced"] - 3  # marker, start, end per copy (the last may be cut)


def test_the_fabric_section_is_refused_field_by_field(tmp_path, monkeypatch):
    bad_url = _run_file(tmp_path, {"proxy_url": "127.0.0.1:8080", "train_gpus": "0-31", "gen_gpus": "32-63"})
    with pytest.raises(ConfigError, match=r"run.yaml: field 'fabric.proxy_url'.*http\(s\)"):
        load_run(bad_url)
    bad_gpus = _run_file(tmp_path, {"proxy_url": "http://127.0.0.1:9", "train_gpus": "0-x", "gen_gpus": "32-63"})
    with pytest.raises(ConfigError, match="fabric.train_gpus"):
        load_run(bad_gpus)
    ok = _run_file(tmp_path, {"proxy_url": "http://127.0.0.1:9", "token_env": "NO_SUCH_TOKEN_VAR",
                              "train_gpus": "0-31", "gen_gpus": "32-63"})
    monkeypatch.delenv("NO_SUCH_TOKEN_VAR", raising=False)
    with pytest.raises(ConfigError, match="fabric.token_env.*NO_SUCH_TOKEN_VAR is not set"):
        asyncio.run(run_config(load_run(ok)))


@pytest.mark.parametrize("asynchronous", [True, False])
def test_each_version_is_announced_and_copied_once_on_either_path(asynchronous):
    """veRL's synchronous path starts the copy at the suspend point; it must not announce or copy a version twice."""
    from orchestrl.agents.agentic.weights import LinkSpec, WeightUpdater
    calls = []

    class Agent:  # HostAgent's calls, recorded
        def announce(self, doc, t_s=None):
            calls.append(("intent", doc["stage"]))

        def marker(self, kind, window_hint_s=None, t_s=None):
            calls.append(kind)

        def collective_start(self, comm, stage, primitive, t_s=None):
            calls.append("start")

        def collective_end(self, comm, stage, primitive, t_s=None):
            calls.append("end")

    async def go():
        w = WeightUpdater(LinkSpec(1e6, 1e9, 1e9, setup_s=0.0), asynchronous=asynchronous, agent=Agent())
        for v in (1, 2):
            w.publish(v)
            await w.update(v)
        w.close()
        return w

    w = asyncio.run(go())
    assert calls == [("intent", "weight-sync"), "weight-sync-begin", "start", "end"] * 2
    assert w.intents == 2 and len(w.waited_s) == 2
