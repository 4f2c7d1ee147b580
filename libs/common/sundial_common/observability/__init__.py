"""Observability: the metrics registry and OpenTelemetry tracing every process records into."""
