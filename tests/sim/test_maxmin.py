"""Progressive filling against a textbook reference, and the two properties that define max-min fairness."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from orchestrl.sim.network.maxmin import MaxMinProblem, check_max_min, incidence_matrix, reference_max_min


@st.composite
def factored_problems(draw):
    """Random own entries and class profiles with ECMP-like fractions; every flow crosses a bundle."""
    n_bundles = draw(st.integers(1, 7))
    n_flows = draw(st.integers(1, 12))
    n_classes = draw(st.integers(0, 4))
    fracs = st.sampled_from([0.0, 0.0, 0.25, 1 / 3, 0.5, 1.0])
    own = np.array(draw(st.lists(st.lists(fracs, min_size=n_bundles, max_size=n_bundles),
                                 min_size=n_flows, max_size=n_flows)))
    prof = np.array(draw(st.lists(st.lists(fracs, min_size=n_bundles, max_size=n_bundles),
                                  min_size=n_classes, max_size=n_classes))).reshape(n_classes, n_bundles)
    cls = np.array(draw(st.lists(st.integers(-1, n_classes - 1), min_size=n_flows, max_size=n_flows)))
    cap = np.array(draw(st.lists(st.sampled_from([1.0, 2.0, 3.0, 5.0, 10.0]), min_size=n_bundles,
                                 max_size=n_bundles)))
    full = own + np.where(cls[:, None] >= 0, prof[np.maximum(cls, 0)] if n_classes else 0.0, 0.0)
    own[full.sum(axis=1) == 0, 0] = 1.0  # no flow may be unbounded
    return own, cls, prof, cap


@settings(max_examples=300, deadline=None)
@given(factored_problems())
def test_factored_solver_matches_the_reference_and_is_max_min_fair(problem):
    own, cls, prof, cap = problem
    p = MaxMinProblem(sp.csr_matrix(own), cls, sp.csr_matrix(prof))
    a = incidence_matrix(p).toarray().T  # bundles x flows
    got = p.solve(cap).rate_bps
    assert np.allclose(got, reference_max_min(a, cap), rtol=1e-7, atol=1e-9)
    assert check_max_min(a, cap, got) == []


@settings(max_examples=200, deadline=None)
@given(factored_problems(), st.data())
def test_a_subset_of_active_flows_is_solved_as_if_alone_on_either_path(problem, data):
    own, cls, prof, cap = problem
    active = np.array(data.draw(st.lists(st.booleans(), min_size=len(cls), max_size=len(cls))))
    p = MaxMinProblem(sp.csr_matrix(own), cls, sp.csr_matrix(prof))
    sparse = p.solve(cap, active)
    got = sparse.rate_bps
    assert np.all(got[~active] == 0)
    if active.any():
        a = incidence_matrix(p).toarray().T[:, active]
        assert np.allclose(got[active], reference_max_min(a, cap), rtol=1e-7, atol=1e-9)
    # the event loop asks for rates only (bottleneck=False); a problem this small then runs on the
    # dense incidence, which must fill to the same rates in the same levels as the factored sparse path
    assert p.dense() is not None
    dense = p.solve(cap, active, bottleneck=False)
    assert np.allclose(dense.rate_bps, got, rtol=1e-12, atol=1e-12) and dense.levels == sparse.levels
    assert np.allclose(p.load(dense.rate_bps), incidence_matrix(p).T @ dense.rate_bps)


def test_check_max_min_catches_an_unfair_and_an_infeasible_allocation():
    a = np.array([[1.0, 1.0], [0.0, 1.0]])
    cap = np.array([10.0, 2.0])
    assert check_max_min(a, cap, np.array([8.0, 2.0])) == []
    assert any("no bottleneck" in v for v in check_max_min(a, cap, np.array([7.0, 2.0])))
    assert any("carries" in v for v in check_max_min(a, cap, np.array([9.0, 2.0])))


def test_bottleneck_reported_per_flow_is_saturated_and_crossed():
    own = sp.csr_matrix(np.array([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.5, 1.0]]))
    p = MaxMinProblem(own, np.full(3, -1), sp.csr_matrix((0, 3)))
    res = p.solve(np.array([10.0, 3.0, 100.0]))
    load = own.T @ res.rate_bps
    for f, b in enumerate(res.bottleneck):
        assert own[f, b] > 0 and load[b] == pytest.approx([10.0, 3.0, 100.0][b])


def test_a_flow_on_no_bundle_is_refused():
    p = MaxMinProblem(sp.csr_matrix(np.zeros((1, 2))), np.array([-1]), sp.csr_matrix((0, 2)))
    with pytest.raises(ValueError, match="unbounded"):
        p.solve(np.array([1.0, 1.0]))


def test_a_problem_above_the_dense_limit_is_solved_sparse(monkeypatch):
    import orchestrl.sim.network.maxmin as mm

    monkeypatch.setattr(mm, "_DENSE_MAX", 5)
    own = sp.csr_matrix(np.array([[1.0, 0.0, 0.0], [1.0, 1.0, 0.0], [0.0, 0.5, 1.0]]))
    p = MaxMinProblem(own, np.full(3, -1), sp.csr_matrix((0, 3)))
    assert p.dense() is None
    assert p.solve(np.array([10.0, 3.0, 100.0]), bottleneck=False).rate_bps.tolist() == [8.0, 2.0, 2.0]
