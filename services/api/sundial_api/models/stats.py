"""The views of ``/v1/stats``: per-bucket execution statistics and the handler rankings.

Defined in :mod:`sundial_client.models.stats` (the views are defined once, for the API and the client).
"""

from __future__ import annotations

from sundial_client.models.stats import ExecutionStats, ExecutionStatsItem, HandlerRanking, HandlerStats, Percentiles
