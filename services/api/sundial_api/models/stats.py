"""The views of ``/v1/stats``: per-bucket execution statistics and the handler rankings."""

from __future__ import annotations

from sundial_client.models.stats import ExecutionStats, ExecutionStatsItem, HandlerRanking, HandlerStats, Percentiles
