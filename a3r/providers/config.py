"""Provider settings: which provider plans and writes code (`ProviderKind`) and its typed settings
(`ProviderConfig`), with API keys read from the environment as `SecretStr`s (never logged, stored or put
in an error message).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from enum import StrEnum

from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator

from a3r.errors import ProviderConfigError

__all__ = ["ProviderConfig", "ProviderKind"]


class ProviderKind(StrEnum):
    """Which provider plans and writes code."""

    offline = "offline"
    """Deterministic planning from templates; no network."""
    anthropic = "anthropic"
    """Anthropic Messages API (``ANTHROPIC_API_KEY``)."""
    openai = "openai"
    """OpenAI-compatible chat completions (``OPENAI_API_KEY``, optional base URL)."""


class ProviderConfig(BaseModel):
    """Typed provider settings (build with `from_env` to read keys from the environment).

    Attributes:
        kind: Provider kind.
        model: Model name (default per kind: ``claude-sonnet-4-6``, ``gpt-4o-mini``).
        base_url: Endpoint root (OpenAI-compatible: ``http://host:8000/v1``; Anthropic: proxy root).
        api_key: The secret (never printed: `SecretStr`).
        temperature: Sampling temperature of planning calls (``None``: the model's default; some newer
            models accept no other).
        timeout_s: Per-request timeout in seconds.
        max_retries: SDK retries of transient errors.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    kind: ProviderKind = ProviderKind.offline
    model: str | None = None
    base_url: str | None = None
    api_key: SecretStr | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    timeout_s: float = Field(default=120.0, gt=0)
    max_retries: int = Field(default=2, ge=0)

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str | None) -> str | None:
        if value is not None and not re.match(r"^https?://[^\s/]+", value):
            raise ValueError("base_url must start with http:// or https:// and name a host")
        return value

    @classmethod
    def from_env(
        cls,
        kind: ProviderKind | str,
        *,
        model: str | None = None,
        base_url: str | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> ProviderConfig:
        """Settings for ``kind`` with the API key (and OpenAI base URL) taken from the environment.

        Reads ``ANTHROPIC_API_KEY`` (and ``ANTHROPIC_BASE_URL``) or ``OPENAI_API_KEY`` (and
        ``OPENAI_BASE_URL``). A local OpenAI-compatible server given by ``base_url`` needs no key.

        Raises:
            ProviderConfigError: Unknown kind, a missing key, or a malformed base URL.
        """
        env = os.environ if environ is None else environ
        try:
            provider = ProviderKind(kind)
        except ValueError:
            raise ProviderConfigError(
                f"unknown provider {kind!r}; choose one of {', '.join(k.value for k in ProviderKind)}"
            ) from None
        key: str | None = None
        if provider is ProviderKind.anthropic:
            key = env.get("ANTHROPIC_API_KEY")
            base_url = base_url or env.get("ANTHROPIC_BASE_URL")
            if not key:
                raise ProviderConfigError("the anthropic provider needs ANTHROPIC_API_KEY in the environment")
        elif provider is ProviderKind.openai:
            key = env.get("OPENAI_API_KEY")
            base_url = base_url or env.get("OPENAI_BASE_URL")
            if not key and base_url is None:
                raise ProviderConfigError(
                    "the openai provider needs OPENAI_API_KEY in the environment (or --base-url of a local server)"
                )
        try:
            return cls(
                kind=provider,
                model=model,
                base_url=base_url,
                api_key=SecretStr(key) if key else None,
            )
        except ValidationError as exc:
            raise ProviderConfigError(
                "; ".join(f"{e['loc'][0]}: {e['msg']}" for e in exc.errors(include_input=False))
            ) from None
