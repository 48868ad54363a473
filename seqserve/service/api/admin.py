"""Admin: GET /v1/admin/config, the values this server runs with, from both sides.

`api` is this API process: its settings (the API key only as whether one is set), the engine
options they make, and what the process runs with (switch interval, log level). `engine` is
what the engine reported at start (its effective options, its process, every model's
effective scheduling), or this process's own engine with `--api-workers 0`. The two must
agree; a server started with defaults shows the same values on both sides. Behind the API key
like the model routes.
"""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from seqserve.service.api.common import app_state
from seqserve.service.core.process import observed

router = APIRouter(prefix="/v1/admin", tags=["admin"])


class ApiSide(BaseModel):
    settings: dict[str, Any] = Field(description="Effective settings (api_key: 'set' or null).")
    engine_options: dict[str, Any] = Field(description="The engine options they make.")
    process: dict[str, Any] = Field(
        description="pid, switch_interval_ms, log_level, frozen_objects in force.")


class EngineSide(BaseModel):
    mode: str = Field(description="'engine process' or 'in process' (--api-workers 0).")
    options: dict[str, Any] = Field(description="The engine's effective options.")
    process: dict[str, Any] = Field(
        description="pid, switch_interval_ms, log_level, frozen_objects in force.")
    models: dict[str, Any] = Field(description="name/version -> effective scheduling.")


class EffectiveConfig(BaseModel):
    api: ApiSide
    engine: EngineSide


def effective_config(request: Request) -> dict[str, Any]:
    state = app_state(request)
    settings = state.settings
    return {"api": {"settings": settings.effective(),
                    "engine_options": settings.engine_options().to_dict(),
                    "process": observed()},
            "engine": state.repository.engine_report()}


@router.get("/config", name="admin_config", response_model=EffectiveConfig)
async def config(request: Request) -> dict[str, Any]:
    """The effective settings of this API process and the effective options of the engine
    (never the API key)."""
    return effective_config(request)
