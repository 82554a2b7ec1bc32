"""Live data of a run from its swarm server: status, per-step metrics and recently ended episodes.

`RunMonitor` is polled by the run screen from an exclusive async worker (one poll at a time, never on
the UI's critical path). Each poll returns a `LiveRun` snapshot; a server that is down or answers an
error yields a snapshot with ``error`` set rather than an exception, so the screen keeps refreshing.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import httpx
from pydantic import BaseModel, ValidationError

from swarm.client import AsyncSwarmClient, ClientError, EpisodeView, RetryPolicy, StatusView, SwarmError

__all__ = ["EpisodeSummary", "LiveRun", "RunMonitor"]

_ENDED_KINDS = ("episode.finished", "episode.aborted", "episode.infra_failure")
_NO_RETRY = RetryPolicy(attempts=1, max_wait_s=0.0, deadline_s=0.0)


class EpisodeSummary(BaseModel):
    """An ended episode as announced on the server's event stream."""

    episode_id: str
    task_id: str = ""
    status: str
    """``finished``, ``aborted`` or ``infra_failure``."""
    reward: float | None = None
    client_id: str = ""
    """The client that ran it (a3r's runs: ``a3r-<run name>``, see `a3r.app.tui._run_dir.run_client_id`)."""


@dataclass
class LiveRun:
    """One poll of a run's server.

    Attributes:
        status: ``GET /api/v1/status``, or ``None`` when the server could not be read.
        metrics: Per-step training metrics (``GET /api/v1/metrics``, ``ServerStepMetrics`` rows by field
            name, for drawing any of them), oldest first; ``None`` when the server serves no metrics
            route (404) or they could not be read.
        episodes: Recently ended episodes, newest first.
        error: Why the server could not be read, in one line.
    """

    status: StatusView | None = None
    metrics: list[dict[str, Any]] | None = None
    episodes: list[EpisodeSummary] = field(default_factory=list)
    error: str | None = None

    def series(self, name: str) -> list[float]:
        """Values of one per-step metric (e.g. ``reward_mean``), oldest first; missing steps skipped."""
        return [
            float(row[name])
            for row in self.metrics or []
            if isinstance(row.get(name), int | float) and not isinstance(row.get(name), bool)
        ]


class RunMonitor:
    """Polls one swarm server for the run screen.

    Args:
        url: Base URL of the server (``Run.server_url``).
        admin_token: Bearer token of its control routes, if it has one.
        timeout_s: Timeout of each request, in seconds.
        keep: How many recently ended episodes to remember.
        client_id: Only episodes of this client (one run's, when several runs share the server).
        tenant: The LoRA tenant the run trains as (its metrics, ``GET /api/v1/tenants/{id}/metrics``);
            ``None``: the server's one policy.
    """

    def __init__(
        self,
        url: str,
        *,
        admin_token: str | None = None,
        timeout_s: float = 5.0,
        keep: int = 100,
        client_id: str | None = None,
        tenant: str | None = None,
    ):
        self.url = url.rstrip("/")
        self.client_id = client_id
        self.tenant = tenant
        self._client = AsyncSwarmClient(
            self.url, admin_token=admin_token, client_id="a3r-tui", timeout_s=timeout_s, retry=_NO_RETRY
        )
        self._keep = keep
        self._since = 0
        self._uptime_s = -1.0
        self._episodes: OrderedDict[str, EpisodeSummary] = OrderedDict()

    async def aclose(self) -> None:
        """Close the HTTP connections."""
        await self._client.aclose()

    async def poll(self) -> LiveRun:
        """Read status, metrics and new episode events; never raises for server or network errors."""
        live = LiveRun()
        try:
            live.status = await self._client.status()
        except (httpx.HTTPError, SwarmError, ValidationError) as exc:
            live.error = _one_line(self.url, exc)
            live.episodes = self._newest_first()
            return live
        if live.status.uptime_s < self._uptime_s:  # restarted: its event numbering starts again
            self._since = 0
        self._uptime_s = live.status.uptime_s
        try:
            rows = (
                await self._client.tenant_metrics(self.tenant)
                if self.tenant is not None
                else await self._client.metrics()
            )
            live.metrics = [row.model_dump() for row in rows]
        except ClientError as exc:
            if exc.status_code != 404:
                live.error = _one_line(self.url, exc)
        except (httpx.HTTPError, SwarmError, ValidationError) as exc:
            live.error = _one_line(self.url, exc)
        try:
            await self._read_events()
        except (httpx.HTTPError, SwarmError, ValidationError) as exc:
            live.error = _one_line(self.url, exc)
        live.episodes = self._newest_first()
        return live

    async def episode(self, episode_id: str) -> EpisodeView:
        """The token-level record of one episode.

        Raises:
            ClientError: The server answered an error (404 for an unknown episode).
            httpx.HTTPError: The server could not be reached.
        """
        return await self._client.get_episode(episode_id)

    async def _read_events(self) -> None:
        for event in await self._client.events(since=self._since):
            self._since = max(self._since, event.seq)
            if event.kind not in _ENDED_KINDS:
                continue
            data = event.data  # episode.* events: episode_id, task_id, client_id and, when finished, reward
            summary = EpisodeSummary(
                episode_id=data["episode_id"],
                task_id=str(data.get("task_id", "")),
                status=event.kind.removeprefix("episode."),
                reward=data.get("reward"),
                client_id=str(data.get("client_id") or ""),
            )
            if self.client_id is not None and summary.client_id != self.client_id:
                continue
            self._episodes.pop(summary.episode_id, None)
            self._episodes[summary.episode_id] = summary
            while len(self._episodes) > self._keep:
                self._episodes.popitem(last=False)

    def _newest_first(self) -> list[EpisodeSummary]:
        return list(reversed(self._episodes.values()))


def _one_line(url: str, exc: BaseException) -> str:
    if isinstance(exc, httpx.TransportError):
        return f"cannot reach {url}: {type(exc).__name__}"
    if isinstance(exc, httpx.HTTPStatusError):
        return f"{url}: HTTP {exc.response.status_code}"
    return f"{url}: {str(exc).splitlines()[0] if str(exc) else type(exc).__name__}"
