"""A finished run read from its server's run dir: the episodes of ``pool.db`` and the per-step rows of
``metrics.jsonl`` (the same data the live server serves), so the TUI shows a run after its server stopped.

The pool is opened read-only (SQLite ``mode=ro``): the TUI never writes a run dir. Episodes come back
with their calls (token ids, loss mask, logprobs); merged samples are built by the server only, so a
finished run's token view shows its calls.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from a3r.app.tui._swarm import EpisodeSummary, LiveRun
from a3r.swarmops.trained import POOL_FILE
from swarm.client import EpisodeView

__all__ = ["POOL_FILE", "RunDirReader", "run_client_id", "run_tenant", "tenant_text"]

METRICS_FILE = "metrics.jsonl"
"""The server's per-step training metrics in its run dir, one JSON row a step."""


def run_client_id(name: str | None, config: dict[str, Any] | None) -> str | None:
    """The client id whose episodes are one run's, or ``None`` (then every episode of its server is).

    a3r runs a run's workflow with ``--client-id a3r-<run name>`` (`a3r.swarmops.execution`, the run's
    name is its spec key), and several runs of a study share one server and run dir (smoke, training,
    continuation, held-out evaluation under ``a3r-eval``): their episodes are told apart by client id.
    A run a3r started has a ``purpose`` in its config; any other run keeps all its server's episodes.

    Args:
        name: The run's name (``Run.name``).
        config: The run's config (``Run.config``).
    """
    if not name or not isinstance(config, dict) or "purpose" not in config:
        return None
    return f"a3r-{name}"[:200]


def run_tenant(config: dict[str, Any] | None) -> str | None:
    """The LoRA tenant a run trained as on its stage's shared server (its config's ``tenant``), or ``None``."""
    tenant = config.get("tenant") if isinstance(config, dict) else None
    return tenant if isinstance(tenant, str) and tenant else None


def tenant_text(config: dict[str, Any] | None) -> str:
    """Where a run trained, read from its config: ``tenant of server coarse`` for a LoRA tenant of its
    stage's shared server (`a3r.swarmops.tenancy` records ``tenant`` and ``tenant_server``), else ``""``."""
    if not isinstance(config, dict) or not config.get("tenant_server"):
        return ""
    return f"tenant of server {str(config['tenant_server']).removesuffix('-tenants')}"


class RunDirReader:
    """Reads a stopped server's run dir with the interface of `a3r.app.tui._swarm.RunMonitor`.

    Args:
        server_dir: The server's run dir (``.a3r/studies/N/servers/<name>``, ``Run.run_dir``).
        keep: How many of the newest episodes a poll lists.
        client_id: Only episodes of this client (one run's; see `run_client_id`).
    """

    def __init__(
        self,
        server_dir: str | Path,
        *,
        keep: int = 100,
        client_id: str | None = None,
        tenant: str | None = None,
    ) -> None:
        self.server_dir = Path(server_dir)
        self.url = str(self.server_dir)
        self._keep = keep
        self.client_id = client_id
        self.tenant = tenant

    @staticmethod
    def holds_a_run(server_dir: str | Path | None) -> bool:
        """Whether ``server_dir`` has an episode pool to read."""
        return bool(server_dir) and (Path(str(server_dir)) / POOL_FILE).is_file()

    async def aclose(self) -> None:
        """Nothing to close: every read opens and closes the pool."""

    async def poll(self) -> LiveRun:
        """The newest episodes and every metric row; ``error`` set when the files cannot be read."""
        return await asyncio.to_thread(self._poll)

    async def episode(self, episode_id: str) -> EpisodeView:
        """One episode with its calls.

        Raises:
            LookupError: No such episode in the pool.
            sqlite3.Error: The pool cannot be read.
        """
        return await asyncio.to_thread(self._episode, episode_id)

    def _connect(self) -> contextlib.closing[sqlite3.Connection]:
        uri = f"{(self.server_dir / POOL_FILE).resolve().as_uri()}?mode=ro"
        return contextlib.closing(sqlite3.connect(uri, uri=True))

    def _poll(self) -> LiveRun:
        live = LiveRun(metrics=self._metrics())
        try:
            with self._connect() as db:
                rows = db.execute(
                    "SELECT id, task_id, status, reward, client_id FROM episodes"
                    " WHERE ? IS NULL OR client_id = ? ORDER BY seq DESC LIMIT ?",
                    (self.client_id, self.client_id, self._keep),
                ).fetchall()
        except sqlite3.Error as exc:
            live.error = f"{self.server_dir / POOL_FILE}: {exc}"
            return live
        live.episodes = [
            EpisodeSummary(episode_id=i, task_id=t, status=s, reward=r, client_id=c or "")
            for i, t, s, r, c in rows
        ]
        return live

    def _metrics(self) -> list[dict[str, Any]] | None:
        folder = self.server_dir / "tenants" / self.tenant if self.tenant else self.server_dir
        path = folder / METRICS_FILE
        try:
            lines = path.read_text(encoding="utf-8").splitlines()
        except OSError:
            return None
        rows = []
        for line in lines:
            with contextlib.suppress(ValueError):
                row = json.loads(line)
                if isinstance(row, dict):
                    rows.append(row)
        return rows

    def _episode(self, episode_id: str) -> EpisodeView:
        with self._connect() as db:
            db.row_factory = sqlite3.Row
            row = db.execute("SELECT * FROM episodes WHERE id = ?", (episode_id,)).fetchone()
            if row is None:
                raise LookupError(f"episode {episode_id} is not in {self.server_dir / POOL_FILE}")
            calls = db.execute(
                "SELECT record FROM calls WHERE episode_id = ? ORDER BY idx", (episode_id,)
            ).fetchall()
        try:
            return EpisodeView.model_validate(
                {
                    "episode_id": row["id"],
                    "task_id": row["task_id"],
                    "client_id": row["client_id"],
                    "kind": row["kind"],
                    "family": row["family"],
                    "status": row["status"],
                    "reward": row["reward"],
                    "reason": row["reason"],
                    "created_at": row["created_at"],
                    "finished_at": row["finished_at"],
                    "trained_step": row["trained_step"],
                    "calls": [json.loads(record) for (record,) in calls],
                }
            )
        except ValidationError as exc:
            raise LookupError(f"episode {episode_id}: unreadable record ({exc.errors()[0]['msg']})") from None
