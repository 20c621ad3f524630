"""Counters, gauges and histograms of the control service, rendered in the Prometheus text format.

Stdlib only: the proxy must not pull a metrics client into the core dependencies. Each metric has
a fixed name, help text and label names; a sample is keyed by its label values. All updates take
one lock, which costs far less than the device round trips they count.
"""

from __future__ import annotations

import bisect
import math
import threading
from typing import Iterable, Sequence

__all__ = ["MetricsRegistry", "LATENCY_BUCKETS_S", "declare_service_metrics"]

#: Histogram buckets for latencies in seconds: 100 us .. 2 min (robotic switches take 120 s).
LATENCY_BUCKETS_S = (1e-4, 2.5e-4, 5e-4, 1e-3, 2e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1.0, 2.5, 10.0, 30.0, 130.0)


_LE_INF = 'le="+Inf"'


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _labels(names: Sequence[str], values: Sequence[str], extra: str = "") -> str:
    parts = [f'{n}="{_escape(str(v))}"' for n, v in zip(names, values)]
    if extra:
        parts.append(extra)
    return "{" + ",".join(parts) + "}" if parts else ""


def _num(x: float) -> str:
    if math.isinf(x):
        return "+Inf" if x > 0 else "-Inf"
    return repr(float(x)) if not float(x).is_integer() else str(int(x))


class _Metric:
    def __init__(self, kind: str, name: str, help_text: str, labels: Sequence[str]) -> None:
        self.kind, self.name, self.help, self.label_names = kind, name, help_text, tuple(labels)
        if len(set(self.label_names)) != len(self.label_names):
            raise ValueError(f"metric {name}: label names {list(self.label_names)} repeat a name; give each once")
        self.samples: dict[tuple[str, ...], object] = {}

    def key(self, labels: dict[str, str]) -> tuple[str, ...]:
        # label names are distinct, so as many labels as names, each found, is exactly the names expected
        if len(labels) == len(self.label_names) and all(map(labels.__contains__, self.label_names)):
            return tuple([v if type(v) is str else str(v) for v in map(labels.__getitem__, self.label_names)])
        raise ValueError(f"metric {self.name}: labels {sorted(labels)} given, {list(self.label_names)} expected")


class MetricsRegistry:
    """A set of named metrics; :meth:`render` gives the ``/metrics`` page.

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
    orchestrl_deferrals_total{job="a"} 1
    # HELP orchestrl_commit_latency_seconds Commit latency.
    # TYPE orchestrl_commit_latency_seconds histogram
    orchestrl_commit_latency_seconds_bucket{le="0.001"} 0
    orchestrl_commit_latency_seconds_bucket{le="0.01"} 1
    orchestrl_commit_latency_seconds_bucket{le="+Inf"} 1
    orchestrl_commit_latency_seconds_sum 0.004
    orchestrl_commit_latency_seconds_count 1
    <BLANKLINE>
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._metrics: dict[str, _Metric] = {}
        self._buckets: dict[str, tuple[float, ...]] = {}

    # -- declaration ---------------------------------------------------------------------------
    def _declare(self, kind: str, name: str, help_text: str, labels: Iterable[str]) -> None:
        labels = tuple(labels)
        with self._lock:
            old = self._metrics.get(name)
            if old is not None and (old.kind, old.label_names) != (kind, labels):
                raise ValueError(f"metric {name} is declared twice, as {old.kind} {old.label_names} and {kind}")
            if old is None:  # declaring the same metric again (a second server on one service) is harmless
                self._metrics[name] = _Metric(kind, name, help_text, labels)

    def counter(self, name: str, help_text: str, labels: Iterable[str] = ()) -> None:
        """Declare a monotonically increasing counter (name should end in ``_total``)."""
        self._declare("counter", name, help_text, labels)

    def gauge(self, name: str, help_text: str, labels: Iterable[str] = ()) -> None:
        """Declare a value that goes up and down."""
        self._declare("gauge", name, help_text, labels)

    def histogram(self, name: str, help_text: str, labels: Iterable[str] = (),
                  buckets: Sequence[float] = LATENCY_BUCKETS_S) -> None:
        """Declare a histogram with cumulative ``buckets`` (upper bounds, increasing)."""
        self._declare("histogram", name, help_text, labels)
        self._buckets[name] = tuple(sorted(buckets))

    # -- updates -------------------------------------------------------------------------------
    def inc(self, name: str, amount: float = 1.0, **labels: str) -> None:
        """Add ``amount`` (>= 0) to a counter, or to a gauge."""
        m = self._metrics[name]
        with self._lock:
            k = m.key(labels)
            m.samples[k] = float(m.samples.get(k, 0.0)) + amount  # type: ignore[arg-type]

    def set(self, name: str, value: float, **labels: str) -> None:
        """Set a gauge."""
        m = self._metrics[name]
        with self._lock:
            m.samples[m.key(labels)] = float(value)

    def observe(self, name: str, value: float, **labels: str) -> None:
        """Record one observation in a histogram."""
        m = self._metrics[name]
        bounds = self._buckets[name]
        with self._lock:
            k = m.key(labels)
            counts, total = m.samples.get(k, ([0] * len(bounds), [0.0, 0]))  # type: ignore[misc]
            i = bisect.bisect_left(bounds, value)
            if i < len(bounds):
                counts[i] += 1
            total[0] += value
            total[1] += 1
            m.samples[k] = (counts, total)

    def value(self, name: str, **labels: str) -> float:
        """Return a counter's or gauge's value (a histogram's count); 0 when never set."""
        m = self._metrics[name]
        with self._lock:
            s = m.samples.get(m.key(labels))
        if s is None:
            return 0.0
        return float(s[1][1]) if isinstance(s, tuple) else float(s)  # type: ignore[index]

    # -- exposition ----------------------------------------------------------------------------
    def render(self) -> str:
        """Return every metric in the Prometheus text exposition format (version 0.0.4)."""
        out: list[str] = []
        with self._lock:
            for m in self._metrics.values():
                out.append(f"# HELP {m.name} {m.help}")
                out.append(f"# TYPE {m.name} {m.kind}")
                for key, s in sorted(m.samples.items()):
                    if m.kind != "histogram":
                        out.append(f"{m.name}{_labels(m.label_names, key)} {_num(s)}")  # type: ignore[arg-type]
                        continue
                    counts, (total, n) = s  # type: ignore[misc]
                    running = 0
                    for bound, c in zip(self._buckets[m.name], counts):
                        running += c
                        le = 'le="' + _num(bound) + '"'
                        out.append(f"{m.name}_bucket{_labels(m.label_names, key, le)} {running}")
                    out.append(f"{m.name}_bucket{_labels(m.label_names, key, _LE_INF)} {n}")
                    out.append(f"{m.name}_sum{_labels(m.label_names, key)} {_num(total)}")
                    out.append(f"{m.name}_count{_labels(m.label_names, key)} {n}")
        return "\n".join(out) + "\n"


def declare_service_metrics(m: MetricsRegistry) -> MetricsRegistry:
    """Declare the control service's metrics in ``m`` and return it."""
    m.histogram("orchestrl_commit_latency_seconds", "Journalled commit: journal writes, driver round trips, switching.")
    m.histogram("orchestrl_plan_seconds", "Materialisation of one intent (aggregate, allocate, place, validate).")
    m.histogram("orchestrl_reconcile_seconds", "Reconciliation of every device to the journal.")
    m.counter("orchestrl_decisions_total", "Plan decisions by outcome.", ["decision"])
    m.counter("orchestrl_deferrals_total", "Plans kept pending because the safe window was too short.", ["job"])
    m.counter("orchestrl_circuits_changed_total", "Full-duplex circuits made or torn down.", ["action"])
    m.counter("orchestrl_device_faults_total", "Device faults seen by commits and reconciliation.", ["kind"])
    m.counter("orchestrl_reconciliations_total", "Reconciliations of the devices to the journal.", ["outcome"])
    m.counter("orchestrl_reconcile_changes_total", "Cross-connects changed by reconciliation.")
    m.counter("orchestrl_events_total", "Collective boundary events received.", ["result"])
    m.gauge("orchestrl_circuits", "Circuits of each job's active plan.", ["job"])
    m.gauge("orchestrl_masked_ports", "Ports kept out of planning.")
    m.gauge("orchestrl_jobs", "Registered jobs.")
    return m
