"""Every tensor a sync reads from or writes into is checked before a byte moves."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch", reason="the collectives runtime needs torch (the comms extra)")

from orchestrl.collectives.layout import FabricLinks, GeneratorLayout, GeneratorRank, ParamSpec, TrainerLayout  # noqa: E402
from orchestrl.collectives.plan import plan_weight_sync  # noqa: E402
from orchestrl.collectives.sharding import Sharding  # noqa: E402
from orchestrl.collectives.targets import check_tensor, resolve_targets  # noqa: E402
from orchestrl.fabric.errors import ConfigError  # noqa: E402

CPU = torch.device("cpu")


def _schedule():
    params = [ParamSpec("w", (8, 4), "bfloat16", tp_dim=0),
              ParamSpec("experts.w13_weight[1]", (4, 4), "bfloat16", tp_dim=0, trainer=Sharding.fused(2, 2),
                        engine=Sharding.fused(2, 2), expert=1, num_experts=2),
              ParamSpec("embed", (6, 4), "bfloat16", tp_dim=0, aliases=("head",))]
    return plan_weight_sync(params, TrainerLayout(), GeneratorLayout((GeneratorRank(1, 2, 0), GeneratorRank(1, 2, 1))),
                            FabricLinks(nic_bps=1e9))


@pytest.mark.parametrize("tensor,problem", [
    (torch.zeros(4, 4, dtype=torch.float32), "torch.float32 tensor but the parameter is bfloat16"),
    (torch.zeros(8, 4, dtype=torch.bfloat16), "has shape (8, 4) but this rank's shard is (4, 4)"),
    (torch.zeros(4, 8, dtype=torch.bfloat16).t(), "shape (8, 4)"),
    (torch.zeros(8, 4, dtype=torch.bfloat16)[::2], "not contiguous"),
    (torch.zeros(4, 4, dtype=torch.bfloat16, device="meta"), "is on meta but the transport moves data on cpu"),
    ([[0.0] * 4] * 4, "is list, not a tensor"),
])
def test_a_wrong_target_is_refused_naming_the_parameter_and_the_problem(tensor, problem):
    with pytest.raises(ConfigError, match="field 'w'") as info:
        resolve_targets(_schedule(), 1, {"w": tensor}, CPU)
    assert problem in str(info.value)


def test_stacked_expert_slices_and_untied_aliases_are_resolved():
    sch = _schedule()
    w13 = torch.zeros(1, 2, 4, dtype=torch.bfloat16)  # this engine rank keeps expert 1 as slice 0
    embed, head = torch.zeros(3, 4, dtype=torch.bfloat16), torch.zeros(3, 4, dtype=torch.bfloat16)
    got = resolve_targets(sch, 2, {"w": torch.zeros(4, 4, dtype=torch.bfloat16), "experts.w13_weight": w13,
                                   "embed": embed, "head": head}, CPU, first_expert={"experts.w13_weight": 1},
                          required=True)
    assert got[1][0].data_ptr() == w13.data_ptr() and got[2] == [embed, head]
    tied = resolve_targets(sch, 2, {"embed": embed, "head": embed}, CPU)
    assert tied[2] == [embed]  # tied in the engine as well: written once


def test_a_parameter_without_a_destination_is_refused_when_nothing_else_would_take_it():
    with pytest.raises(ConfigError, match="has no destination tensor"):
        resolve_targets(_schedule(), 1, {}, CPU, required=True)


def test_check_tensor_accepts_a_matching_tensor():
    t = torch.zeros(2, 3, dtype=torch.bfloat16)
    assert check_tensor(t, where="x", name="y", shape=(2, 3), dtype="bfloat16", device=CPU) is t
