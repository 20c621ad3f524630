"""Memo tables of the control service: what is remembered, by what, and what never is."""

import pytest

from orchestrl.agents.service.memo import IdentityMemo, IntentMemo, PlanMemo
from orchestrl.fabric.controller import MaterializeResult
from orchestrl.fabric.errors import ConfigError
from orchestrl.fabric.topology import FabricSpec, Topology


def _topology() -> Topology:
    return Topology(FabricSpec(name="t", link_bps=1e11, servers_per_pod=2))


def _doc(**layout) -> dict:
    return {"job": "j", "stage": "train", "layout": {"tp": 8, "dp": 2, "gpus": "0-15", **layout},
            "collectives": [{"primitive": "all-reduce", "over": "dp", "bytes_per_rank": 1e6}]}


def test_an_intent_document_is_parsed_once_per_content_and_topology():
    memo, topo = IntentMemo(), _topology()
    first = memo.parse(_doc(), "intent", topo)
    assert memo.parse(dict(reversed(list(_doc().items()))), "intent", topo) is first  # key order is no content
    assert memo.parse(_doc(tp=4, dp=4), "intent", topo) is not first
    assert memo.parse(_doc(), "intent", topo.with_masked([])) is not first  # another topology object


def test_a_refused_document_is_refused_every_time():
    memo, topo = IntentMemo(), _topology()
    for _ in range(2):
        with pytest.raises(ConfigError, match="gpus"):
            memo.parse(_doc(gpus="0-7"), "intent", topo)


def test_only_accepted_plans_are_remembered():
    memo, topo, calls = PlanMemo(), _topology(), []
    intent = IntentMemo().parse(_doc(), "intent", topo)

    def result(accepted: bool) -> MaterializeResult:
        calls.append(accepted)
        return MaterializeResult(None, accepted, False, "train", "sig")
    assert memo.materialize(intent, topo, lambda: "train", lambda: result(False)) == (result(False), False)
    calls.clear()
    got, remembered = memo.materialize(intent, topo, lambda: "train", lambda: result(True))
    assert not remembered and calls == [True]
    got, remembered = memo.materialize(intent, topo, lambda: "train", lambda: result(True))
    assert remembered and got.cache_hit and calls == [True]  # not computed again
    assert not memo.materialize(intent, topo, lambda: "other template", lambda: result(True))[1]


def test_identity_memo_is_bounded_and_matches_by_identity():
    memo = IdentityMemo(size=2)
    keys = [object() for _ in range(3)]
    for k in keys:
        memo.get((k,), lambda: 1)
    assert len(memo) == 2 and memo.get((keys[0],), lambda: "recomputed") == "recomputed"
