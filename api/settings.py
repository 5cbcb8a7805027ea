"""API settings, read from the environment (pydantic-settings).

Every field can be set by an environment variable of the same name in upper case,
e.g. `SERVING_URL=http://serving:8501`. Settings are built once by the composition
root (`api.app.create_app`) and passed down explicitly.
"""

from __future__ import annotations

from pydantic import AnyHttpUrl, Field
from pydantic_settings import BaseSettings, SettingsConfigDict


class Settings(BaseSettings):
    """Configuration of one API process."""

    model_config = SettingsConfigDict(env_prefix="", case_sensitive=False, extra="ignore")

    serving_url: AnyHttpUrl = Field(
        default=AnyHttpUrl("http://127.0.0.1:8501"),
        description="Base URL of the serving tier's REST API (TF Serving's port 8501).",
    )
    fraud_model_name: str = Field(default="fraud", description="Servable name of the fraud model.")
    fraud_signature_name: str = Field(
        default="serving_default", description="SignatureDef the fraud model is called through."
    )
    fraud_threshold: float = Field(
        default=0.5, ge=0.0, le=1.0, description="Scores at or above this are flagged is_fraud."
    )
    serving_timeout_s: float = Field(
        default=2.0, gt=0.0, description="Whole-call timeout of one request to serving, seconds."
    )
    serving_connect_timeout_s: float = Field(
        default=0.5, gt=0.0, description="TCP connect timeout to serving, seconds."
    )
    serving_max_connections: int = Field(
        default=100, ge=1, description="Connection pool size towards serving, per API process."
    )
    model_version_ttl_s: float = Field(
        default=5.0,
        ge=0.0,
        description="How long the latest AVAILABLE model version, read from model status, "
        "is trusted before it is read again, seconds.",
    )
