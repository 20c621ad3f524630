"""Megatron-core rank groups: hand-derived cases, an independent derivation, and refusals."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrl.fabric.errors import ConfigError
from orchestrl.fabric.layout import GROUP_NAMES, ParallelLayout, masked_orthogonal_rank_groups, parallel_groups


def test_dense_groups_match_hand_derived_megatron_groups():
    # world 16, tp=2, pp=2, dp=4, default order tp-cp-ep-dp-pp: TP neighbours adjacent, DP stride
    # tp, PP stride tp*dp.
    g = parallel_groups(ParallelLayout(tp=2, dp=4, pp=2), range(16))
    assert g["tp"] == [[0, 1], [2, 3], [4, 5], [6, 7], [8, 9], [10, 11], [12, 13], [14, 15]]
    assert g["dp"] == [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]]
    assert g["pp"] == [[0, 8], [1, 9], [2, 10], [3, 11], [4, 12], [5, 13], [6, 14], [7, 15]]
    assert g["dp-cp"] == g["dp"]
    assert g["cp"] == [[r] for r in range(16)]


def test_megatron_docstring_example_tp2_pp4():
    # initialize_model_parallel's docstring: 16 GPUs, tp=2, pp=4 -> dp=2.
    g = parallel_groups(ParallelLayout(tp=2, dp=2, pp=4), range(16))
    assert g["dp"] == [[0, 2], [1, 3], [4, 6], [5, 7], [8, 10], [9, 11], [12, 14], [13, 15]]
    assert g["pp"] == [[0, 4, 8, 12], [1, 5, 9, 13], [2, 6, 10, 14], [3, 7, 11, 15]]


def test_context_parallel_groups_pair_tp_groups():
    # Megatron's CP docstring: 8 GPUs, tp=4, cp=2 -> CP groups [0,4], [1,5], [2,6], [3,7].
    g = parallel_groups(ParallelLayout(tp=4, cp=2), range(8))
    assert g["cp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert g["dp-cp"] == g["cp"]  # dp=1: dense gradients are reduced over CP


def test_moe_groups_with_expert_tp_defaulting_to_tp():
    lay = ParallelLayout(tp=2, ep=4, dp=4, pp=2)
    assert lay.expert_dp == 1
    g = parallel_groups(lay, range(16))
    assert g["ep"] == [[0, 2, 4, 6], [1, 3, 5, 7], [8, 10, 12, 14], [9, 11, 13, 15]]
    assert g["expert-tp"] == g["tp"]
    assert g["tp-ep"] == [list(range(8)), list(range(8, 16))]
    assert g["expert-dp"] == [[r] for r in range(16)]


def test_moe_groups_with_expert_tp_one():
    lay = ParallelLayout(tp=2, ep=4, dp=4, pp=2, expert_tp=1)
    assert lay.expert_dp == 2
    g = parallel_groups(lay, range(16))
    assert g["ep"] == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10, 11], [12, 13, 14, 15]]
    assert g["expert-dp"] == [[0, 4], [1, 5], [2, 6], [3, 7], [8, 12], [9, 13], [10, 14], [11, 15]]
    assert g["expert-tp"] == [[r] for r in range(16)]


def test_tp_pp_dp_order_from_megatron_docstring():
    # generate_masked_orthogonal_rank_groups' docstring: 8 GPUs, order tp-pp-dp, sizes 2-2-2.
    assert masked_orthogonal_rank_groups(8, [2, 2, 2], [False, False, True]) == [[0, 4], [1, 5], [2, 6], [3, 7]]
    g = parallel_groups(ParallelLayout(tp=2, pp=2, dp=2, order="tp-pp-dp"), range(8))
    assert g["dp"] == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert g["pp"] == [[0, 2], [1, 3], [4, 6], [5, 7]]


def test_groups_are_mapped_onto_the_jobs_gpus():
    gpus = [40 + 2 * r for r in range(8)]  # rank r runs on gpus[r]
    g = parallel_groups(ParallelLayout(tp=2, dp=4), gpus)
    assert g["tp"] == [[40, 42], [44, 46], [48, 50], [52, 54]]
    assert g["dp"] == [[40, 44, 48, 52], [42, 46, 50, 54]]


def _reference_groups(sizes: list[int], mask: list[bool]) -> list[list[int]]:
    """Independent derivation: ranks as a C-ordered array whose last axis is the fastest dimension."""
    ranks = np.arange(int(np.prod(sizes))).reshape(sizes[::-1])
    axes = {i: len(sizes) - 1 - i for i in range(len(sizes))}  # order index -> array axis
    outer = sorted(axes[i] for i in range(len(sizes)) if not mask[i])
    inner = sorted(axes[i] for i in range(len(sizes)) if mask[i])
    size = int(np.prod([sizes[i] for i in range(len(sizes)) if mask[i]]))
    return ranks.transpose(outer + inner).reshape(-1, size).tolist()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([1, 2, 3, 4]), min_size=2, max_size=5), st.data())
def test_masked_groups_match_independent_derivation(sizes, data):
    mask = data.draw(st.lists(st.booleans(), min_size=len(sizes), max_size=len(sizes)))
    world = int(np.prod(sizes))
    assert masked_orthogonal_rank_groups(world, sizes, mask) == _reference_groups(sizes, mask)


@settings(max_examples=60, deadline=None)
@given(tp=st.sampled_from([1, 2, 4]), cp=st.sampled_from([1, 2]), dp=st.sampled_from([1, 2, 4]),
       pp=st.sampled_from([1, 2, 3]), ep=st.sampled_from([1, 2, 4]))
def test_every_group_kind_partitions_the_job(tp, cp, dp, pp, ep):
    world = tp * cp * dp * pp
    if world % (tp * ep * pp):
        with pytest.raises(ConfigError):
            ParallelLayout(tp=tp, cp=cp, ep=ep, dp=dp, pp=pp)
        return
    lay = ParallelLayout(tp=tp, cp=cp, ep=ep, dp=dp, pp=pp)
    groups = parallel_groups(lay, range(1000, 1000 + world))
    assert set(groups) == set(GROUP_NAMES)
    expected_size = {"tp": tp, "cp": cp, "dp": dp, "dp-cp": dp * cp, "pp": pp, "ep": ep,
                     "expert-tp": lay.expert_tp_size, "tp-ep": lay.expert_tp_size * ep, "expert-dp": lay.expert_dp}
    for name, gs in groups.items():
        members = sorted(m for grp in gs for m in grp)
        assert members == list(range(1000, 1000 + world)), name
        assert {len(grp) for grp in gs} == {expected_size[name]}, name


@pytest.mark.parametrize("kwargs, field", [
    ({"tp": 0}, "tp"),
    ({"dp": 2.0}, "dp"),
    ({"tp": 2, "dp": 2, "ep": 3}, "ep"),  # expert_tp*ep*pp = 6 does not divide 4
    ({"tp": 2, "dp": 2, "order": "tp-xp-dp"}, "order"),
    ({"tp": 2, "dp": 2, "order": "dp"}, "order"),  # tp of size 2 left out of the order
    ({"tp": 2, "order": "tp-tp"}, "order"),
    # pp not last and expert dp = 8 / (1*2*2) = 2 differs from dp = 4: Megatron refuses it.
    ({"tp": 1, "dp": 4, "pp": 2, "ep": 2, "order": "tp-pp-ep-dp"}, "order"),
    # Equal DP sizes, but pp's stride is tp*cp = 2 for dense layers and expert_tp = 1 for experts,
    # so the two generators would disagree on the pipeline groups.
    ({"cp": 2, "dp": 2, "pp": 2, "ep": 2, "order": "tp-cp-pp-ep-dp"}, "order"),
])
def test_layouts_megatron_refuses_are_refused(kwargs, field):
    with pytest.raises(ConfigError) as err:
        ParallelLayout(**kwargs)
    assert err.value.field == field


def test_wrong_gpu_list_is_refused():
    with pytest.raises(ValueError, match="4 ranks but 3 GPUs"):
        parallel_groups(ParallelLayout(tp=4), [0, 1, 2])
    with pytest.raises(ValueError, match="twice"):
        parallel_groups(ParallelLayout(tp=2), [5, 5])
