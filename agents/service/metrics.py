"""The control service's metrics on :mod:`prometheus_client`, behind a small registry with checked labels.

Each service owns one :class:`prometheus_client.CollectorRegistry` (two services in one process,
as in the tests, never share samples), and ``/metrics`` renders it with
:func:`prometheus_client.generate_latest`. :class:`MetricsRegistry` keeps the calls the service
makes by metric name (``inc``, ``set``, ``observe``) and refuses a wrong label set with the names
expected, which prometheus_client would only report as "incorrect label names".
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterable, Sequence

import prometheus_client
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

__all__ = ["MetricsRegistry", "LATENCY_BUCKETS_S", "declare_service_metrics", "CONTENT_TYPE"]

#: Histogram buckets for latencies in seconds: 100 us .. 2 min (robotic switches take 120 s).
LATENCY_BUCKETS_S = (1e-4, 2.5e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 30.0, 130.0)
CONTENT_TYPE = prometheus_client.CONTENT_TYPE_LATEST

# A counter's *_created sample doubles the page for nothing a dashboard of this service reads.
prometheus_client.disable_created_metrics()


class MetricsRegistry:
    """Named metrics of one service; :meth:`render` gives the ``/metrics`` page.

    Examples
    --------
    >>> m = MetricsRegistry()
    >>> m.counter("orchestrl_deferrals_total", "Plans deferred.", ["job"])
    >>> m.inc("orchestrl_deferrals_total", job="a")
    >>> m.histogram("orchestrl_commit_latency_seconds", "Commit latency.", buckets=(0.001, 0.01))
    >>> m.observe("orchestrl_commit_latency_seconds", 0.004)
    >>> print(m.render())  # doctest: +NORMALIZE_WHITESPACE
    # HELP orchestrl_deferrals_total Plans deferred.
    # TYPE orchestrl_deferrals_total counter
    orchestrl_deferrals_total{job="a"} 1.0
    # HELP orchestrl_commit_latency_seconds Commit latency.
    # TYPE orchestrl_commit_latency_seconds histogram
    orchestrl_commit_latency_seconds_bucket{le="0.001"} 0.0
    orchestrl_commit_latency_seconds_bucket{le="0.01"} 1.0
    orchestrl_commit_latency_seconds_bucket{le="+Inf"} 1.0
    orchestrl_commit_latency_seconds_count 1.0
    orchestrl_commit_latency_seconds_sum 0.004
    <BLANKLINE>
    """

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self._metrics: dict[str, tuple[str, object, tuple[str, ...]]] = {}  # name -> (kind, metric, label names)
        self._lock = threading.Lock()

    # -- declaration ---------------------------------------------------------------------------
    def _declare(self, kind: str, name: str, help_text: str, labels: Iterable[str], **kwargs: object) -> None:
        labels = tuple(labels)
        if len(set(labels)) != len(labels):
            raise ValueError(f"metric {name}: label names {list(labels)} repeat a name; give each once")
        with self._lock:
            old = self._metrics.get(name)
            if old is not None:
                if (old[0], old[2]) != (kind, labels):
                    raise ValueError(f"metric {name} is declared twice, as {old[0]} {old[2]} and {kind}")
                return  # declaring the same metric again (a second server on one service) is harmless
            cls = {"counter": Counter, "gauge": Gauge, "histogram": Histogram}[kind]
            metric = cls(name, help_text, labels, registry=self.registry, **kwargs)  # type: ignore[operator]
            self._metrics[name] = (kind, metric, labels)

    def counter(self, name: str, help_text: str, labels: Iterable[str] = ()) -> None:
        """Declare a monotonically increasing counter (name should end in ``_total``)."""
        self._declare("counter", name, help_text, labels)

    def gauge(self, name: str, help_text: str, labels: Iterable[str] = ()) -> None:
        """Declare a value that goes up and down."""
        self._declare("gauge", name, help_text, labels)

    def histogram(self, name: str, help_text: str, labels: Iterable[str] = (),
                  buckets: Sequence[float] = LATENCY_BUCKETS_S) -> None:
        """Declare a histogram with cumulative ``buckets`` (upper bounds, increasing)."""
        self._declare("histogram", name, help_text, labels, buckets=tuple(sorted(buckets)))

    # -- updates -------------------------------------------------------------------------------
    def _child(self, name: str, labels: dict[str, str]):  # noqa: ANN202 - a prometheus_client child metric
        kind, metric, names = self._metrics[name]
        if len(labels) != len(names) or not all(map(labels.__contains__, names)):
            raise ValueError(f"metric {name}: labels {sorted(labels)} given, {list(names)} expected")
        return kind, (metric.labels(*[str(labels[n]) for n in names]) if names else metric)  # type: ignore[attr-defined]

    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        """Add ``amount`` (>= 0) to a counter, or to a gauge."""
        self._child(name, labels)[1].inc(amount)

    def set(self, name: str, value: float, **labels: str) -> None:
        """Set a gauge."""
        self._child(name, labels)[1].set(value)

    def observe(self, name: str, value: float, **labels: str) -> None:
        """Record one observation in a histogram."""
        self._child(name, labels)[1].observe(value)

    def remove(self, name: str, **labels: str) -> None:
        """Forget one labelled sample (e.g. the gauge of a job that was removed)."""
        kind, metric, names = self._metrics[name]
        with contextlib.suppress(KeyError):
            metric.remove(*(str(labels[n]) for n in names))  # type: ignore[attr-defined]

    def value(self, name: str, **labels: str) -> float:
        """Return a counter's or gauge's value (a histogram's count); 0 when never set."""
        kind, _ = self._child(name, labels)
        sample = {"counter": name if name.endswith("_total") else name + "_total", "gauge": name,
                  "histogram": name + "_count"}[kind]
        got = self.registry.get_sample_value(sample, {k: str(v) for k, v in labels.items()})
        return 0.0 if got is None else float(got)

    # -- exposition ----------------------------------------------------------------------------
    def render(self) -> str:
        """Return every metric in the Prometheus text exposition format (version 0.0.4)."""
        return generate_latest(self.registry).decode("utf-8")


def declare_service_metrics(m: MetricsRegistry) -> MetricsRegistry:
    """Declare the control service's metrics in ``m`` and return it."""
    m.histogram("orchestrl_commit_latency_seconds", "Journalled commit: journal writes, driver round trips, switching.")
    m.histogram("orchestrl_plan_seconds", "Materialisation of one intent (aggregate, allocate, place, validate).")
    m.histogram("orchestrl_reconcile_seconds", "Reconciliation of every device to the journal.")
    m.histogram("orchestrl_audit_seconds", "One audit pass: every device's table read back and compared.")
    m.counter("orchestrl_decisions_total", "Plan decisions by outcome.", ["decision"])
    m.counter("orchestrl_deferrals_total", "Plans kept pending because the safe window was too short.", ["job"])
    m.counter("orchestrl_commits_after_window_total",
              "Commits whose switches finished after the safe window predicted when they were decided.", ["job"])
    m.counter("orchestrl_circuits_changed_total", "Full-duplex circuits made or torn down.", ["action"])
    m.counter("orchestrl_device_faults_total", "Device faults seen by commits and reconciliation.", ["kind"])
    m.counter("orchestrl_reconciliations_total", "Reconciliations of the devices to the journal.", ["outcome"])
    m.counter("orchestrl_reconcile_changes_total", "Cross-connects changed by reconciliation.")
    m.counter("orchestrl_events_total", "Collective boundary events received.", ["result"])
    m.counter("orchestrl_audits_total", "Device audits (read-back and compare) by outcome.", ["outcome"])
    m.counter("orchestrl_drift_repairs_total", "Drift repaired on a device, by outcome.", ["device", "outcome"])
    m.counter("orchestrl_storage_errors_total", "Journal writes refused by the disk (full, read-only, I/O).",
              ["kind"])
    m.gauge("orchestrl_device_up", "1 when the device answered its last read, else 0.", ["device"])
    m.gauge("orchestrl_device_drift", "Simplex cross-connects that differ from the journal on the device's last "
            "audit (missing plus unexpected).", ["device"])
    m.gauge("orchestrl_circuits", "Circuits of each job's active plan.", ["job"])
    m.gauge("orchestrl_core_circuits_asked", "OCS-Core circuits each job's last intent asked for.", ["job"])
    m.gauge("orchestrl_core_circuits_granted", "OCS-Core circuits each job's last plan got.", ["job"])
    m.gauge("orchestrl_masked_ports", "Ports kept out of planning.")
    m.gauge("orchestrl_jobs", "Registered jobs.")
    m.gauge("orchestrl_healthy", "1 when /healthz says ok, else 0.")
    return m
