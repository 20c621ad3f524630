"""The other half of every benchmark's quick run (see ``SECOND_FILE`` in tests/test_entry_points.py)."""

from __future__ import annotations

import pytest

from tests.test_entry_points import BENCHES, SECOND_FILE, quick_run


def test_the_second_half_names_only_benchmarks_that_exist():
    assert set(SECOND_FILE) <= set(BENCHES), sorted(set(SECOND_FILE) - set(BENCHES))


@pytest.mark.parametrize("bench", SECOND_FILE)
def test_benchmark_starts_and_finishes_quick_run(bench):
    quick_run(bench)
