"""Parse an OpenMetrics scrape into metric families, typed: prometheus_client's OpenMetrics parser carries no
annotations (its Prometheus-text twin does), so the one cast that says what it returns lives here."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import cast

from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.parser import text_string_to_metric_families

_parse = cast(Callable[[str], Iterator[Metric]], text_string_to_metric_families)


def metric_families(text: str) -> Iterator[Metric]:
    """The metric families of an OpenMetrics exposition (``application/openmetrics-text``)."""
    return _parse(text)
