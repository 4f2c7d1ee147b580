"""The batch create body (`POST /v1/jobs:batch`): up to 1,000 job bodies, each validated as a single create."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

MAX_BATCH = 1000


class JobBatch(BaseModel):
    model_config = ConfigDict(extra="forbid")

    jobs: list[dict[str, Any]] = Field(
        min_length=1, max_length=MAX_BATCH, description=f"1 to {MAX_BATCH} job bodies, as for `POST /v1/jobs`."
    )
