"""sundial_api: the HTTP API — register jobs, read executions — as a FastAPI app (:func:`create_app`)."""

from __future__ import annotations

from sundial_api.app import create_app
from sundial_api.settings import ApiSettings

__all__ = ["ApiSettings", "create_app"]
