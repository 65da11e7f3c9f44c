"""A lint for Prometheus expositions: prometheus-client's parser plus Prometheus' naming rules.

    problems = lint_exposition(body)          # [] when every family follows the rules
    names = series_names(body)                # every name a query can select (with _total, _bucket, ...)

The rules (https://prometheus.io/docs/practices/naming/): snake_case names under the
``tidemark_`` prefix, HELP on every family, a type (never untyped), counters exposed as
``_total``, base units (seconds, never milliseconds; durations, lags, ages, cadences and
intervals in ``_seconds``; timestamps in ``_timestamp_seconds`` with values that are Unix seconds),
histograms in ``_seconds`` with ordered ``le`` buckets up to ``+Inf``, snake_case labels that
are neither reserved (``__*``, ``le``, ``quantile`` outside their types) nor the target's own
(``job``, ``instance``), and finite values. prometheus-client's ``<counter>_created`` and
``<histogram>_created`` gauges (OpenMetrics' creation timestamps) are its own convention: allowed.
"""
from __future__ import annotations

import math
import re

from prometheus_client.parser import text_string_to_metric_families

NAME = re.compile(r"^tidemark_[a-z0-9]+(_[a-z0-9]+)*$")
LABEL = re.compile(r"^[a-z][a-z0-9_]*$")
TIME_WORDS = ("duration", "lag", "age", "latency", "timestamp", "holds_back", "cadence", "interval")
NOT_BASE_UNITS = ("_ms", "_millis", "_milliseconds", "_microseconds", "_minutes", "_hours", "_days")
TARGET_LABELS = {"job", "instance"}
UNIX_SECONDS = (1e9, 1e10)  # 2001..2286: an epoch in milliseconds (1.7e12) is out


def series_names(body: str) -> set[str]:
    """Every series name in ``body`` a query can name (empty families included)."""
    names: set[str] = set()
    for family in text_string_to_metric_families(body):
        names.add(family.name)
        suffixes = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count")}.get(family.type, ())
        names.update(family.name + s for s in suffixes)
        names.update(s.name for s in family.samples)
    return names


def lint_exposition(body: str) -> list[str]:
    problems: list[str] = []
    families = list(text_string_to_metric_families(body))
    created = {f"{f.name}_created" for f in families if f.type in ("counter", "histogram")}
    typed = re.findall(r"^# TYPE (\S+)", body, re.MULTILINE)  # the parser silently merges a repeated family
    problems += [f"{name}: the family appears {typed.count(name)} times" for name in sorted(set(typed))
                 if typed.count(name) > 1]
    for family in families:
        name, kind = family.name, family.type
        if name in created and kind == "gauge":
            continue
        where = f"{name} ({kind})"
        if not NAME.match(name):
            problems.append(f"{where}: not a snake_case name under the tidemark_ prefix")
        if not family.documentation.strip():
            problems.append(f"{where}: no HELP text")
        if kind not in ("counter", "gauge", "histogram"):
            problems.append(f"{where}: type {kind}, not counter, gauge or histogram")
        if any(name.endswith(bad) or f"{bad}_" in name for bad in NOT_BASE_UNITS):
            problems.append(f"{where}: not in base units (seconds)")
        if any(word in name for word in TIME_WORDS) and not name.endswith("_seconds"):
            problems.append(f"{where}: a time must be in seconds, named ..._seconds")
        if kind != "counter" and name.endswith("_total"):
            problems.append(f"{where}: only counters end in _total")
        if name.endswith(("_count", "_sum", "_bucket")):
            problems.append(f"{where}: _count, _sum and _bucket are reserved for histograms")
        if kind == "histogram" and not name.endswith("_seconds"):
            problems.append(f"{where}: a histogram of durations is in seconds")
        buckets: dict[tuple, list[float]] = {}
        for sample in family.samples:
            labels = dict(sample.labels)
            for label in labels:
                if kind == "histogram" and label == "le":
                    continue
                if label.startswith("__") or not LABEL.match(label) or label in ("le", "quantile"):
                    problems.append(f"{where}: label {label!r} is reserved or not snake_case")
                if label in TARGET_LABELS:
                    problems.append(f"{where}: label {label!r} clashes with the scrape target's own label")
            if kind == "counter" and not sample.name.endswith(("_total", "_created")):
                problems.append(f"{where}: counter sample {sample.name} does not end in _total")
            if kind == "histogram" and sample.name.endswith("_bucket"):
                le = labels.pop("le")
                buckets.setdefault(tuple(sorted(labels.items())), []).append(math.inf if le == "+Inf" else float(le))
            if not math.isfinite(sample.value):
                problems.append(f"{where}: {sample.name}{labels} = {sample.value} is not finite")
            elif name.endswith("_timestamp_seconds") and not UNIX_SECONDS[0] <= sample.value <= UNIX_SECONDS[1]:
                problems.append(f"{where}: {sample.value} is not a Unix timestamp in seconds")
        for series, bounds in buckets.items():
            if bounds != sorted(bounds) or bounds[-1] != math.inf:
                problems.append(f"{where}: buckets {bounds} for {dict(series)} are not ordered up to +Inf")
    return problems
