"""Typed settings of the TUI."""

from __future__ import annotations

import getpass

from pydantic import BaseModel, ConfigDict, Field, SecretStr

__all__ = ["TuiConfig"]


def _login_name() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry and no LOGNAME/USER (some containers)
        return "reviewer"


class TuiConfig(BaseModel):
    """Settings of `a3r.app.tui.A3RApp`.

    Attributes:
        refresh_s: Seconds between two polls of the store and of a run's swarm server.
        request_timeout_s: Timeout of one HTTP request to a swarm server, in seconds.
        admin_token: Bearer token of the swarm servers' control routes (``None``: loopback, open).
        reviewer: Name written to ``Patch.decided_by`` for decisions taken in the TUI.
        event_tail: How many of a study's newest events the study screen shows.
    """

    model_config = ConfigDict(frozen=True)

    refresh_s: float = Field(default=2.0, gt=0.0, le=3600.0)
    request_timeout_s: float = Field(default=5.0, gt=0.0, le=600.0)
    admin_token: SecretStr | None = None
    reviewer: str = Field(default_factory=_login_name, min_length=1, max_length=100)
    event_tail: int = Field(default=50, ge=1, le=10_000)
