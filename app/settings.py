"""Configuration: one ``Settings`` object, read from the environment (SPEC §8).

Built in ``create_app`` or the CLI, never at import (STYLE convention 8). Every limit
carries a one-line reason. Environment names are SPEC §8's, unprefixed; ``GROQ_API_KEY``
and ``GROQ_BASE_URL`` are accepted as aliases so a Groq user's shell works as is.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import AliasChoices, Field
from pydantic_settings import BaseSettings, SettingsConfigDict

__all__ = ["Settings"]


class Settings(BaseSettings):
    """Every knob of the gateway. Environment first; constructor arguments override."""

    model_config = SettingsConfigDict(
        env_ignore_empty=True, extra="ignore", frozen=True, populate_by_name=True
    )

    # -- upstream ---------------------------------------------------------------------
    upstream_base_url: str = Field(
        "http://127.0.0.1:8080/v1",
        validation_alias=AliasChoices("UPSTREAM_BASE_URL", "GROQ_BASE_URL"),
        description="OpenAI-compatible base URL, ending in /v1.",
    )
    upstream_api_key: str | None = Field(
        None,
        validation_alias=AliasChoices("UPSTREAM_API_KEY", "GROQ_API_KEY"),
        repr=False,
    )
    model_id: str = Field("default", validation_alias="MODEL_ID")
    # Connect fails fast (a dead upstream should not hold a client for long); the first
    # byte may wait for prompt processing on a CPU; idle is the gap allowed between tokens.
    upstream_connect_timeout_s: float = Field(5.0, validation_alias="UPSTREAM_CONNECT_TIMEOUT_S")
    upstream_first_byte_timeout_s: float = Field(
        120.0, validation_alias="UPSTREAM_FIRST_BYTE_TIMEOUT_S"
    )
    upstream_idle_timeout_s: float = Field(60.0, validation_alias="UPSTREAM_IDLE_TIMEOUT_S")

    # -- streaming --------------------------------------------------------------------
    # 15 s: below the 30-60 s idle cut of common proxies and load balancers.
    ping_interval_s: float = Field(15.0, gt=0, validation_alias="PING_INTERVAL_S")
    # 128 frames ≈ a few KB: enough to absorb jitter, small enough that a stalled client
    # throttles the model within a fraction of a second (seed 000).
    queue_max_frames: int = Field(128, ge=1, validation_alias="QUEUE_MAX_FRAMES")
    # Long enough to reconnect after a network change; short enough to bound memory.
    resume_ttl_s: float = Field(300.0, ge=0, validation_alias="RESUME_TTL_S")
    # SPEC §3: 1 MB bodies (Starlette has no cap on JSON bodies of its own).
    max_body_bytes: int = Field(1024 * 1024, ge=1024, validation_alias="MAX_BODY_BYTES")
    # SPEC §3 limits.
    max_frame_bytes: int = Field(64 * 1024, ge=256, validation_alias="MAX_FRAME_BYTES")
    max_json_depth: int = Field(16, ge=1, le=512, validation_alias="MAX_JSON_DEPTH")
    frame_timeout_ms: int = Field(15_000, ge=1, validation_alias="FRAME_TIMEOUT_MS")
    tool_timeout_ms: int = Field(8_000, ge=1, validation_alias="TOOL_TIMEOUT_MS")
    tool_concurrency: int = Field(10, ge=1, validation_alias="TOOL_CONCURRENCY")
    repair_retries: int = Field(1, ge=0, le=3, validation_alias="REPAIR_RETRIES")

    # -- storage and ops --------------------------------------------------------------
    artifacts_dir: Path = Field(Path("artifacts"), validation_alias="ARTIFACTS_DIR")
    redis_url: str | None = Field(None, validation_alias="REDIS_URL")
    log_level: str = Field("INFO", validation_alias="LOG_LEVEL")
    log_json: bool = Field(True, validation_alias="LOG_JSON")
