"""The Prometheus registry behind /metrics (prometheus_client): label checks a caller notices."""

from __future__ import annotations

import pytest

from orchestrl.agents.service.metrics import MetricsRegistry


def test_samples_are_keyed_by_their_labels_and_rendered_per_label_set():
    m = MetricsRegistry()
    m.counter("commits_total", "commits", labels=("scope", "outcome"))
    m.inc("commits_total", scope="job/a", outcome="commit")
    m.inc("commits_total", 2, outcome="commit", scope="job/a")  # keyword order does not matter
    m.inc("commits_total", scope="job/b", outcome="defer")
    assert m.value("commits_total", scope="job/a", outcome="commit") == 3
    page = m.render()
    # prometheus_client writes label pairs in name order
    assert 'commits_total{outcome="commit",scope="job/a"} 3.0' in page
    assert 'commits_total{outcome="defer",scope="job/b"} 1.0' in page


@pytest.mark.parametrize("labels", [{"scope": "a"}, {"scope": "a", "outcome": "x", "extra": "y"},
                                    {"scope": "a", "result": "x"}])
def test_a_wrong_label_set_is_refused_with_the_names_expected(labels):
    m = MetricsRegistry()
    m.counter("commits_total", "commits", labels=("scope", "outcome"))
    with pytest.raises(ValueError, match=r"commits_total: labels .* given, \['scope', 'outcome'\] expected"):
        m.inc("commits_total", **labels)


def test_a_metric_declared_with_a_repeated_label_name_is_refused():
    with pytest.raises(ValueError, match="repeat a name"):
        MetricsRegistry().gauge("circuits", "circuits", labels=("device", "device"))
