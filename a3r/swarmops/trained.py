"""What each trainer step trained, read from a server's episode pool (``pool.db`` in its run dir): the
episode metrics of the finished train episodes a step consumed, by step.

The pool records, per episode, the step whose update consumed it (``trained_step``, zero-signal groups
included), so a run's reward-part curves (`a3r.study.analysis.step_parts`) count the episodes its steps
trained and nothing that finished after the last batch was taken. Opened read-only (SQLite
``mode=ro``); a3r never writes a server's run dir.
"""

from __future__ import annotations

import contextlib
import json
import math
import sqlite3
from pathlib import Path

__all__ = ["POOL_FILE", "trained_metrics"]

POOL_FILE = "pool.db"
"""The server's episode pool in its run dir."""


def trained_metrics(
    server_dir: Path, *, after_step: int, up_to_step: int | None = None, tenant: str | None = None
) -> list[tuple[int, dict[str, float]]] | None:
    """The episode metrics of the finished train episodes that steps after ``after_step`` (up to
    ``up_to_step``) consumed: where runs share a server and its run dir (a continuation, the smoke run
    and the training after it), the ones the steps of one run trained.

    Args:
        server_dir: The server's run dir (holds ``pool.db``).
        after_step: The policy step the run started from: only later steps count (this run's).
        up_to_step: The last step the run covers (``None``: every later step).
        tenant: The LoRA tenant whose steps count (a run that trained as a tenant of a shared server:
            its steps are numbered on its own); ``None``: the server's one policy.

    Returns:
        ``(trained step, finite metrics)`` per episode, in step order then pool order; ``None`` when
        the pool is missing or cannot be read (the caller falls back to the client's records).
    """
    path = server_dir / POOL_FILE
    if not path.is_file():
        return None
    try:
        uri = f"{path.resolve().as_uri()}?mode=ro"
        with contextlib.closing(sqlite3.connect(uri, uri=True)) as db:
            rows = db.execute(
                "SELECT trained_step, metrics FROM episodes WHERE kind = 'train' AND status = 'finished' "
                "AND trained_step > ? AND trained_step <= ?"
                + (" AND tenant = ?" if tenant is not None else "")
                + " ORDER BY trained_step, seq",
                (after_step, up_to_step if up_to_step is not None else 2**62)
                + ((tenant,) if tenant is not None else ()),
            ).fetchall()
    except sqlite3.Error:
        return None
    trained = []
    for step, text in rows:
        try:
            metrics = json.loads(text or "{}")
        except ValueError:
            metrics = {}
        if not isinstance(metrics, dict):
            metrics = {}
        finite = {
            str(k): float(v)
            for k, v in metrics.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)
        }
        trained.append((int(step), finite))
    return trained
